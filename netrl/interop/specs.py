"""TorchRL specs as Gymnasium spaces, and a TorchRL env's tensordicts checked against its specs.

The mapping, leaf by leaf (a leaf's TorchRL key becomes a Dict space's key; nested Composites
become nested Dicts)::

    Bounded, Unbounded (float or int)    Box (float64 narrowed to float32, as GenericGymEnv)
    Unbounded, Bounded of bool           MultiBinary
    Categorical, shape () or (1,)        Discrete(n)
    Categorical, other shapes            MultiDiscrete (n everywhere)
    OneHot(n)                            Discrete(n)        (the one-hot vector <-> its index)
    MultiCategorical(nvec)               MultiDiscrete(nvec)
    MultiOneHot(nvec)                    MultiDiscrete(nvec) (each one-hot block <-> its index)
    Binary(n)                            MultiBinary(n)
    Composite                            Dict

Anything else (NonTensor, Stacked, Choice...) is refused with a ValueError naming its key and
spec. :func:`check_tensordict` checks what TorchRL's ``check_env_specs`` checks of a rollout:
every key the specs declare is there, no key is there that none declares, and each has the
spec's shape (after the env's batch dims) and dtype and values within it; a ValueError names the
key.

Each :class:`Leaf` converts whole batches: values keep any leading batch dims (one env: none).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import gymnasium
import numpy as np
import torch
from torchrl.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    OneHot,
    Unbounded,
)

__all__ = ["Expected", "Leaf", "action_leaf", "check_reset", "check_step", "check_tensordict",
           "expected", "key_label", "leaves", "spec_label", "watch_from_inside"]

_DONE = [("done",), ("terminated",), ("truncated",)]

Key = tuple[str, ...]


class Leaf(NamedTuple):
    """One spec leaf: its key, spec, Gymnasium space, and its values converted both ways (batched:
    any leading dims are kept)."""

    key: Key
    spec: Any
    space: gymnasium.Space
    to_numpy: Callable[[torch.Tensor], np.ndarray]
    to_tensor: Callable[[Any, tuple[int, ...]], torch.Tensor]


def key_label(key: Key) -> str:
    """A key as TorchRL users write it: ``"observation"``, ``("next", "reward")``."""
    return repr(key[0]) if len(key) == 1 else repr(key)


def spec_label(spec: Any) -> str:
    return f"{type(spec).__name__}(shape={list(spec.shape)}, dtype={spec.dtype})"


def _np_dtype(dtype: torch.dtype) -> np.dtype:
    return np.dtype(torch.empty((), dtype=dtype).numpy().dtype)


def _as_tensor(dtype: torch.dtype, shape: tuple[int, ...]) -> Callable[..., torch.Tensor]:
    def convert(value: Any, batch: tuple[int, ...]) -> torch.Tensor:
        return torch.as_tensor(np.asarray(value)).to(dtype).reshape((*batch, *shape))

    return convert


def _binary(shape: tuple[int, ...]) -> gymnasium.spaces.MultiBinary:
    return gymnasium.spaces.MultiBinary(shape[0] if len(shape) == 1 else list(shape) or 1)


def _box(spec: Any, key: Key) -> Leaf:
    dtype = _np_dtype(spec.dtype)
    shape = tuple(spec.shape)
    if dtype.kind == "b":
        return Leaf(key, spec, _binary(shape),
                    lambda t: t.numpy().astype(np.int8), _as_tensor(spec.dtype, shape))
    narrow = dtype == np.float64  # netrl's actors and GenericGymEnv use float32
    out = np.dtype(np.float32) if narrow else dtype
    if isinstance(spec, Bounded):
        low, high = spec.space.low.cpu().numpy(), spec.space.high.cpu().numpy()
    elif dtype.kind == "f":
        low, high = np.full(shape, -np.inf), np.full(shape, np.inf)
    else:
        info = np.iinfo(dtype)
        low, high = np.full(shape, info.min), np.full(shape, info.max)
    space = gymnasium.spaces.Box(np.broadcast_to(low, shape).astype(out),
                                 np.broadcast_to(high, shape).astype(out), shape, out)
    to_numpy = ((lambda t: t.numpy().astype(np.float32)) if narrow else (lambda t: t.numpy()))
    return Leaf(key, spec, space, to_numpy, _as_tensor(spec.dtype, shape))


def _one_hot(spec: Any, key: Key, nvec: list[int]) -> Leaf:
    """A OneHot (one block) or MultiOneHot: an index per block."""
    bounds = np.cumsum([0, *nvec])
    eyes = [torch.eye(n, dtype=spec.dtype) for n in nvec]

    def to_numpy(t: torch.Tensor) -> np.ndarray:
        idx = [t[..., a:b].to(torch.uint8).argmax(-1) for a, b in itertools.pairwise(bounds)]
        return torch.stack(idx, -1).numpy() if len(nvec) > 1 else idx[0].numpy()

    def to_tensor(value: Any, batch: tuple[int, ...]) -> torch.Tensor:
        idx = torch.as_tensor(np.asarray(value), dtype=torch.int64).reshape((*batch, len(nvec)))
        return torch.cat([eye[idx[..., i]] for i, eye in enumerate(eyes)], -1)

    if len(nvec) == 1:
        space: gymnasium.Space = gymnasium.spaces.Discrete(nvec[0])
    else:
        space = gymnasium.spaces.MultiDiscrete(nvec)
    return Leaf(key, spec, space, to_numpy, to_tensor)


def _categorical(spec: Any, key: Key) -> Leaf:
    shape = tuple(spec.shape)
    if isinstance(spec, MultiCategorical):
        nvec = spec.nvec.cpu().numpy().astype(np.int64)
        space: gymnasium.Space = gymnasium.spaces.MultiDiscrete(nvec.reshape(shape))
        return Leaf(key, spec, space, lambda t: t.numpy().astype(np.int64),
                    _as_tensor(spec.dtype, shape))
    n = int(spec.space.n)
    if shape in ((), (1,)):
        return Leaf(key, spec, gymnasium.spaces.Discrete(n),
                    lambda t: t.numpy().astype(np.int64).reshape(t.shape[:t.dim() - len(shape)]),
                    _as_tensor(spec.dtype, shape))
    return Leaf(key, spec, gymnasium.spaces.MultiDiscrete(np.full(shape, n, np.int64)),
                lambda t: t.numpy().astype(np.int64), _as_tensor(spec.dtype, shape))


def leaf(spec: Any, key: Key, role: str = "observation") -> Leaf:
    """The Gymnasium leaf of one TorchRL spec leaf; ValueError naming ``key`` and the spec where
    there is none."""
    # the order matters: Binary and MultiCategorical are Categoricals, MultiOneHot a OneHot
    if isinstance(spec, Binary):
        shape = tuple(spec.shape)
        return Leaf(key, spec, _binary(shape),
                    lambda t: t.numpy().astype(np.int8), _as_tensor(spec.dtype, shape))
    if isinstance(spec, MultiOneHot):
        return _one_hot(spec, key, [int(n) for n in spec.nvec])
    if isinstance(spec, OneHot):
        return _one_hot(spec, key, [int(spec.space.n)])
    if isinstance(spec, Categorical):
        return _categorical(spec, key)
    if isinstance(spec, (Bounded, Unbounded)) and type(spec).__name__ != "NonTensor":
        return _box(spec, key)
    raise ValueError(f"the TorchRL env's {role} key {key_label(key)} has the spec "
                     f"{spec_label(spec)}, which has no Gymnasium space netrl carries (Bounded, "
                     f"Unbounded, Categorical, OneHot, MultiCategorical, MultiOneHot, Binary "
                     f"within Composites): drop the key (ExcludeTransform) or turn it into one "
                     f"of them")


def leaves(spec: Any, skip: Iterable[Key] = (), role: str = "observation") -> list[Leaf]:
    """The leaves of a Composite (its nested Composites walked), but the keys of ``skip``."""
    skipped = set(skip)
    out: list[Leaf] = []

    def walk(node: Any, prefix: Key) -> None:
        for name, child in node.items():
            key = (*prefix, name)
            if isinstance(child, Composite):
                walk(child, key)
            elif key not in skipped:
                out.append(leaf(child, key, role))

    walk(spec, ())
    return out


def action_leaf(spec: Any) -> Leaf:
    """The one leaf of an env's full action spec; ValueError where it has several (netrl's
    actions are one array)."""
    found = leaves(spec, role="action")
    if len(found) != 1:
        names = ", ".join(key_label(x.key) for x in found) or "none"
        raise ValueError(f"the TorchRL env has {len(found)} action keys ({names}): netrl's workers "
                         f"send one action array per step; give the env one action key")
    return found[0]


def _short(value: torch.Tensor) -> str:
    return str(value.flatten()[:6].tolist())[:-1] + (", ...]" if value.numel() > 6 else "]")


def _bounds(spec: Any) -> str:
    space = getattr(spec, "space", None)
    low, high = getattr(space, "low", None), getattr(space, "high", None)
    if low is None or high is None:
        n = getattr(space, "n", None)
        return "" if n is None else f", n={n}"
    return f", low {_short(low)}, high {_short(high)}"


def _present(td: Any) -> set[Key]:
    keys = td.keys(include_nested=True, leaves_only=True)
    return {(k,) if isinstance(k, str) else tuple(k) for k in keys}


def check_tensordict(td: Any, specs: dict[Key, Any], batch: tuple[int, ...], where: str,
                     allowed: Iterable[Key] = ()) -> None:
    """``td`` holds every key of ``specs`` with its spec's shape (after ``batch``) and dtype, and
    no key but those and ``allowed``; ValueError naming the key and ``where`` (e.g. "step()'s
    ("next", ...)") otherwise."""
    present = _present(td)
    for key, spec in specs.items():
        if key not in present:
            raise ValueError(f"{where} has no key {key_label(key)}, which the env's specs declare "
                             f"({spec_label(spec)}): return it from _reset/_step, or drop it "
                             f"from the spec")
        value = td.get(key)
        shape = (*batch, *spec.shape)
        if tuple(value.shape) != shape:
            raise ValueError(f"{where}'s {key_label(key)} has shape {list(value.shape)}, but its "
                             f"spec says {list(shape)} (batch {list(batch)} + "
                             f"{spec_label(spec)}): fix the env's output or its spec")
        if value.dtype != spec.dtype:
            raise ValueError(f"{where}'s {key_label(key)} has dtype {value.dtype}, but its spec "
                             f"says {spec.dtype} ({spec_label(spec)}): fix the env's output or "
                             f"its spec")
        if not spec.is_in(value):
            raise ValueError(f"{where}'s {key_label(key)} holds {_short(value)}, outside its spec "
                             f"({spec_label(spec)}{_bounds(spec)}): fix the env's output or its "
                             f"spec")
    extra = present - set(specs) - set(allowed)
    if extra:
        names = ", ".join(sorted(key_label(k) for k in extra))
        raise ValueError(f"{where} holds {names}, which none of the env's specs declares: add "
                         f"it to the observation_spec, or drop it")


class Expected(NamedTuple):
    """What one env's tensordicts hold: a reset's keys and specs, a step's ("next"), the state
    keys either may hold, and the action keys a reset may give back (a batch's reset passes its
    input through)."""

    reset: dict[Key, Any]
    step: dict[Key, Any]
    state: list[Key]
    action: list[Key]


def _keys(keys: Iterable[Any]) -> list[Key]:
    return [(k,) if isinstance(k, str) else tuple(k) for k in keys]


def _flat(spec: Any) -> dict[Key, Any]:
    return {k: spec[k] for k in _keys(spec.keys(True, True))}


def expected(env: Any, one: Callable[[Any], Any] = lambda spec: spec) -> Expected:
    """What ``env``'s tensordicts hold, its specs seen through ``one`` (a batched env's: one env's
    spec)."""
    reset = {**_flat(one(env.full_observation_spec)), **_flat(one(env.full_done_spec))}
    return Expected(reset, {**reset, **_flat(one(env.full_reward_spec))},
                    _keys(env.full_state_spec.keys(True, True)),
                    _keys(env.full_action_spec.keys(True, True)))


def check_reset(td: Any, want: Expected, batch: tuple[int, ...], where: str) -> None:
    check_tensordict(td, want.reset, batch, where,
                     allowed=[*want.state, *want.action, ("_reset",)])


def check_step(td: Any, want: Expected, batch: tuple[int, ...], where: str) -> None:
    """A step's output (the ``next`` of what ``env.step`` returns)."""
    check_tensordict(td, want.step, batch, f"{where}'s 'next'", allowed=want.state)


def watch_from_inside(env: Any, steps: int) -> Any:
    """``env`` (one env of a ``SerialEnv`` or ``ParallelEnv``) with its first reset and first
    ``steps`` steps (and the resets among them) checked from inside the batch, which writes its
    envs' outputs into buffers of the specs' dtypes: a wrong dtype would be cast, and a missing key
    read as zeros, without a word.

    The checks sit on the env object itself, not in a wrapper (a ``TransformedEnv`` costs every
    step): on its ``reset`` and its own ``_step``, which a batch calls, until the checks are done;
    then the class's methods run again. The done keys may be missing here: TorchRL completes them
    outside ``_step`` (the batch's own checks see them)."""
    want = expected(env)
    step_specs = {k: v for k, v in want.step.items() if k not in _DONE}
    where = f"TorchRL env {type(getattr(env, 'base_env', env)).__name__}: "
    own_reset, own_step = env.reset, env._step
    left = steps

    def done() -> None:  # the class's own methods from here on: no cost per call
        del env.reset
        if "_step" in vars(env):
            del env._step

    def reset(*args: Any, **kwargs: Any) -> Any:
        out = own_reset(*args, **kwargs)
        check_reset(out, want, (), f"{where}reset()")
        if left <= 0:
            done()
        return out

    def step(td: Any) -> Any:
        nonlocal left
        out = own_step(td)
        check_tensordict(out, step_specs, (), f"{where}step()'s 'next'",
                         allowed=[*want.state, *_DONE])
        left -= 1
        if left <= 0:
            done()
        return out

    env.reset = reset
    if steps:
        env._step = step
    return env
