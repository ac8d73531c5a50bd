"""A netrl :class:`~netrl.samples.Batch` as a TensorDict in TorchRL's layout, for TorchRL's losses.

:func:`to_tensordict` lays a batch out as TorchRL's collectors and replay buffers do (batch size
``[B]``, or ``[B, T]`` for a memory's sequences)::

    "observation"                          batch.obs (a Dict/Tuple observation: one nested key per
                                           entry, ("observation", "pos"); a Tuple's: "0", "1"...);
                                           ``observation_key`` names another key ("pixels"), or
                                           maps a Dict's entries to root keys of their own
    "action"                               batch.act; Discrete/MultiDiscrete encoded (``discrete``)
    ("next", "observation")                batch.next_obs, laid out as "observation"
    ("next", "reward")                     batch.rew                        [..., 1] float
    ("next", "done")                       terminated | truncated           [..., 1] bool
    ("next", "terminated"), ("next", "truncated")                           [..., 1] bool
    "priority_weight"                      batch.weight (importance x staleness), when there is one
    ("collector", "traj_ids")              extra["episode"] (ring memories), ["traj_ids"] (rollout):
                                           new at each reset and each break in a worker's stream,
                                           as a collector's trajectory ids are new at each reset
    ("collector", "netrl_traj_ids")        extra["traj"]: a worker env's unbroken stream of rows,
                                           across its episodes (TorchRL has no such key)
    "index"                                extra["index"]: absolute rows, for a priority update
    "mask", ("collector", "mask")          extra["mask"]: a sequence's real steps      [B, T] bool
                                           (the second, SliceSampler's key, masks TorchRL's
                                           losses' reductions: LossModule.loss_mask_key "auto")
    "steps_to_next_obs", "gamma"           extra["steps_to_next_obs"], extra["discount"] (n-step;
                                           TorchRL's MultiStep's keys and shape)        [...]
    ("next", <name>)                       extra["info/<name>"] (an info entry of the step's result)
                                           extra["next_<name>"] (a view's window for next_obs)
    <name>                                 every other extra, as named: the actor's extra outputs
                                           (already TorchRL's names: "action_log_prob",
                                           "state_value"...), recurrent state ("recurrent_state_h"),
                                           views ("prev_actions"), synced models' versions

TorchRL 0.14's losses read importance weights from ``"priority_weight"`` (older TorchRL wrote
``"_weight"``) and write their TD errors to ``"td_error"``. Tensors are placed, not copied: the
observations, actions (Box), extras and weights are the batch's own tensors, the reward a view of
its own; only the flags (float in a Batch, bool here) and encoded discrete actions are new.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal

import gymnasium
import torch
from tensordict import TensorDict

from netrl.samples.batch import Batch
from netrl.samples.spaces import space_kind

__all__ = [
    "DiscreteEncoding",
    "ObservationKey",
    "decode_action",
    "encode_action",
    "extra_key",
    "observation_entries",
    "observation_layout",
    "place_observation",
    "to_tensordict",
]

# one_hot: TorchRL's default for Discrete actions (GymEnv's OneHot spec, QValueActor's, DQNLoss's
# action_space="one_hot"), int64; categorical: the index (GymEnv(categorical_action_encoding=True))
DiscreteEncoding = Literal["one_hot", "categorical"]
ENCODINGS: tuple[DiscreteEncoding, ...] = ("one_hot", "categorical")

# the keys of a transition itself: an extra placed there would overwrite one
_TAKEN_ROOT = frozenset({"observation", "action", "next", "priority_weight", "collector"})
# where the observation goes: one key (nested for a Dict), or a Dict's entries -> root keys
ObservationKey = str | Mapping[str, str]
_TAKEN_NEXT = frozenset({"observation", "reward", "done", "terminated", "truncated"})
_RENAMED: dict[str, str | tuple[str, str]] = {
    "traj": ("collector", "netrl_traj_ids"),
    "traj_ids": ("collector", "traj_ids"),
    "episode": ("collector", "traj_ids"),
    "discount": "gamma",
}


def to_tensordict(
    batch: Batch,
    observation_space: gymnasium.Space,
    action_space: gymnasium.Space,
    discrete: DiscreteEncoding = "one_hot",
    observation_key: ObservationKey = "observation",
) -> TensorDict:
    """``batch`` in TorchRL's layout (the module docstring's table), on the batch's device.

    Args:
        batch: a netrl batch, as any memory's ``sample()`` returns it.
        observation_space: the env's; says which observation entries are nested.
        action_space: the env's; says how Discrete and MultiDiscrete actions are encoded.
        discrete: ``"one_hot"`` (TorchRL's default) or ``"categorical"`` (the action's index,
            ``start`` subtracted).
        observation_key: the key the observation goes under (``"pixels"`` for TorchRL's pixel
            envs and CNN policies), or for a Dict observation a mapping ``{entry: key}`` placing
            each entry at a root key of its own (``{"image": "pixels", "speed": "observation"}``).

    Raises:
        ValueError: an extra's name would land on a key of the transition itself, the action
            space is one the encoding cannot take, or ``observation_key`` is not one a batch of
            this observation space can take.
    """
    obs_keys = observation_layout(observation_key, observation_space)
    size = batch.rew.shape
    term, trunc = batch.terminated.bool(), batch.truncated.bool()
    nxt: dict[str, Any] = {
        **place_observation(batch.next_obs, obs_keys),
        "reward": batch.rew.unsqueeze(-1),
        "done": (term | trunc).unsqueeze(-1),
        "terminated": term.unsqueeze(-1),
        "truncated": trunc.unsqueeze(-1),
    }
    out: dict[str, Any] = {
        **place_observation(batch.obs, obs_keys),
        "action": encode_action(batch.act, action_space, discrete),
        "next": nxt,
    }
    if batch.weight is not None:
        out["priority_weight"] = batch.weight
    collector: dict[str, Any] = {}
    for name, key in _layout(tuple(batch.extra), tuple(obs_keys.values())):
        value = batch.extra[name]
        if isinstance(key, str):
            out[key] = value
        else:
            (collector if key[0] == "collector" else nxt)[key[1]] = value
    if "mask" in batch.extra:  # SliceSampler's key too: TorchRL's losses reduce over it
        collector["mask"] = batch.extra["mask"]
    if collector:
        out["collector"] = collector
    return TensorDict(out, batch_size=size, device=batch.rew.device)


def extra_key(name: str, names: frozenset[str] = frozenset()) -> str | tuple[str, str]:
    """Where ``batch.extra[name]`` goes in the TensorDict (the module docstring's table);
    ``names``: the batch's other extras (``next_<name>`` goes to ``("next", <name>)`` when
    ``<name>`` is one)."""
    if name in _RENAMED:
        return _RENAMED[name]
    if name.startswith("info/"):
        return ("next", name[5:])
    if name.startswith("next_") and name[5:] in names:
        return ("next", name[5:])
    return name


@functools.lru_cache(maxsize=64)
def _layout(names: tuple[str, ...], obs_keys: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """(extra name, key) for a batch's extras, checked once per set of names: a batch's extras
    are the same from one batch to the next. ``obs_keys``: the observation's root keys."""
    layout: list[tuple[str, Any]] = []
    seen: dict[Any, str] = {}
    given = frozenset(names)
    taken_root = _TAKEN_ROOT | set(obs_keys)
    taken_next = _TAKEN_NEXT | set(obs_keys)
    for name in names:
        key = extra_key(name, given)
        taken = (
            key in taken_root
            if isinstance(key, str)
            else key[0] == "next" and key[1] in taken_next
        )
        if taken or key in seen:
            what = (
                f"the key {key!r} of the transition itself"
                if taken
                else f"{seen[key]!r}'s key {key!r}"
            )
            raise ValueError(
                f"batch.extra[{name!r}] would land on {what} in the TensorDict: "
                f"rename that extra output or info entry"
            )
        seen[key] = name
        layout.append((name, key))
    return layout


def observation_layout(key: ObservationKey, space: gymnasium.Space) -> dict[str, str]:
    """``{entry: root key}`` for ``observation_key`` (``{"": key}``: the whole observation under
    one key), checked: ValueError naming what cannot hold the observation."""
    if isinstance(key, str):
        if key in _TAKEN_ROOT - {"observation"} or not key:
            raise ValueError(
                f"observation_key {key!r} is a key of the transition itself: name another"
            )
        return {"": key}
    if not isinstance(space, gymnasium.spaces.Dict):
        raise ValueError(
            f"observation_key maps Dict entries to keys ({dict(key)}), but the observation "
            f"space is {space}: pass one key"
        )
    entries = {str(k) for k in space.spaces}
    if set(key) != entries:
        raise ValueError(
            f"observation_key maps the entries {sorted(key)}; the observation space's are "
            f"{sorted(entries)}: map each exactly once"
        )
    values = list(key.values())
    bad = sorted({v for v in values if v in _TAKEN_ROOT - {"observation"} or not v})
    if bad or len(set(values)) != len(values):
        raise ValueError(
            f"observation_key {dict(key)} puts an entry on a transition key {bad} or two "
            f"entries on one key: give each entry a key of its own"
        )
    return dict(key)


def place_observation(obs: Any, keys: Mapping[str, str]) -> dict[str, Any]:
    """The observation's root entries: ``{key: obs}`` (nested for a Dict), or each Dict entry
    under its own key (``keys`` from :func:`observation_layout`)."""
    if "" in keys:
        return {keys[""]: observation_entries(obs)}
    return {key: observation_entries(obs[entry]) for entry, key in keys.items()}


def observation_entries(obs: Any) -> Any:
    """A Dict observation as nested entries, a Tuple's as entries "0", "1"...; a tensor as it is."""
    if isinstance(obs, dict):
        return {str(k): observation_entries(v) for k, v in obs.items()}
    if isinstance(obs, (tuple, list)):
        return {str(i): observation_entries(v) for i, v in enumerate(obs)}
    return obs


def encode_action(act: Any, space: Any, discrete: DiscreteEncoding = "one_hot") -> Any:
    """netrl's actions (as a batch holds them) as TorchRL's: Box and MultiBinary as they are,
    Discrete as int64 one-hot ``[..., n]`` or index ``[...]``, MultiDiscrete as TorchRL's
    MultiOneHot (the components' one-hots side by side) or indices; Dict/Tuple entry by entry."""
    if discrete not in ENCODINGS:
        raise ValueError(f"discrete must be one of {ENCODINGS} (got {discrete!r})")
    kind = space_kind(space)
    if kind == "Dict":
        return {str(k): encode_action(act[k], s, discrete) for k, s in space.spaces.items()}
    if kind == "Tuple":
        return {
            str(i): encode_action(a, s, discrete)
            for i, (a, s) in enumerate(zip(act, space.spaces, strict=True))
        }
    if kind == "Discrete":
        index = act.long() - int(space.start)
        return (
            index if discrete == "categorical" else torch.nn.functional.one_hot(index, int(space.n))
        )
    if kind == "MultiDiscrete":
        nvec = [int(n) for n in space.nvec.reshape(-1)]
        start = torch.as_tensor(space.start, device=act.device).long()
        index = act.long() - start
        if discrete == "categorical":
            return index
        if len(space.shape) != 1:
            raise ValueError(
                f"a one-hot MultiDiscrete action must be one-dimensional (got {space}); "
                f'pass discrete="categorical"'
            )
        return torch.cat(
            [torch.nn.functional.one_hot(index[..., i], n) for i, n in enumerate(nvec)], -1
        )
    return act


def decode_action(action: Any, space: Any, discrete: DiscreteEncoding = "one_hot") -> Any:
    """The inverse of :func:`encode_action` for a policy's output: TorchRL's action as netrl's
    (an index ``+ start``; a one-hot's argmax)."""
    kind = space_kind(space)
    if kind == "Dict":
        return {k: decode_action(action[str(k)], s, discrete) for k, s in space.spaces.items()}
    if kind == "Tuple":
        return tuple(decode_action(action[str(i)], s, discrete) for i, s in enumerate(space.spaces))
    if kind == "Discrete":
        index = action.long() if discrete == "categorical" else action.argmax(-1)
        return index + int(space.start)
    if kind == "MultiDiscrete":
        start = torch.as_tensor(space.start, device=action.device).long()
        if discrete == "categorical":
            return action.long() + start
        parts = torch.split(action, [int(n) for n in space.nvec.reshape(-1)], -1)
        return torch.stack([p.argmax(-1) for p in parts], -1) + start
    return action
