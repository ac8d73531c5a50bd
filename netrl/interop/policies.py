"""TensorDictActor: a TorchRL policy (``TensorDictModule``, ``TensorDictSequential``,
``ProbabilisticActor``, ``QValueActor``...) as the netrl :class:`~netrl.actor.ActorModule` a worker
runs.

A pipeline builds it from the spaces, with a factory for the policy (``netrl.partial`` keeps it
picklable)::

    def make_policy(observation_space, action_space):   # -> a TensorDictModule
        ...                                              # reading "observation", writing "action"

    actor_module_cls = partial(TensorDictActor, policy=make_policy)

``act`` lays the observations out as :func:`~netrl.interop.tensordicts.to_tensordict` does
(``"observation"``, nested for Dict observations), runs the policy under TorchRL's exploration type
(random on a worker's training episodes, deterministic when ``test``) and returns the ``"action"``
(decoded from one-hot or index to netrl's Discrete action). The policy's other out_keys (a
``ProbabilisticActor``'s ``"action_log_prob"``, ``"loc"``, ``"scale"``; a ``QValueActor``'s
``"action_value"``) are its extra outputs: recorded with each row, they reach the trainer as
``batch.extra`` and come back under the same names in the TensorDict. Their shapes and dtypes are
found once, by running the policy on the observation space's default value at construction;
``extra_keys`` keeps only some of them. The weights are the policy's: ``state_dict()`` is the
policy's under ``"module."``, which the trainer publishes and a worker's ``TensorDictActor`` built
from the same factory loads.

Recurrent policies: a policy holding TorchRL's ``LSTMModule`` or ``GRUModule`` declares their
hidden states as netrl's per-env recurrent state (:meth:`recurrent_state`, under the modules'
own in_keys: ``"recurrent_state_h"``, ``"recurrent_state_c"``, shaped ``(layers, hidden)``). The
worker keeps one per env, zeros at each episode start (:mod:`netrl.worker.recurrent`), and feeds
it with each observation; the policy runs one step (sequential mode, ``"is_init"`` False: the
worker already reset the state) and its ``("next", <key>)`` outputs are the state the env
carries on. The state that entered each step travels with the step's row, and reaches the
trainer's batch under the same keys, where a recurrent loss starts each sequence from it.

Exploration schedules: an ``EGreedyModule``'s epsilon or an ``AdditiveGaussianModule``'s sigma
anneals with ``.step(frames)``, which TorchRL's scripts call with the frames their collector
produced. Here the worker does: each training act steps them by the env steps it acted for (test
episodes do not count), so epsilon after N env steps is TorchRL's after ``step(N)`` (within
float32 rounding: the linear schedule is set at once, not looped frame by frame). The
annealed value is the worker's own and stays out of :meth:`state_dict`, so the trainer's weights
do not reset it each version; the copies a worker loads versions into share the count. Each
worker anneals over its own env steps (give ``annealing_num_steps`` per worker). An
``OrnsteinUhlenbeckProcessModule`` is refused: its noise is a per-env state its TensorDict
carries from step to step, which a row does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import (
    AdditiveGaussianModule,
    EGreedyModule,
    GRUModule,
    LSTMModule,
    OrnsteinUhlenbeckProcessModule,
    set_recurrent_mode,
)

from netrl.actor import ActorModule
from netrl.interop.tensordicts import (
    DiscreteEncoding,
    ObservationKey,
    decode_action,
    observation_layout,
    place_observation,
)
from netrl.samples.columns import ExtraSpec, check_extra_spec, tree_map
from netrl.samples.spaces import default_value

__all__ = ["PolicyFactory", "TensorDictActor", "recurrent_modules"]

PolicyFactory = Callable[[gymnasium.Space, gymnasium.Space], torch.nn.Module]
# what each schedule anneals: the buffer its step() moves
_ANNEALED = {EGreedyModule: "eps", AdditiveGaussianModule: "sigma"}


class _Frames:
    """The env steps a worker's actor acted for, shared by the copies a worker loads versions
    into (``copy.deepcopy`` keeps it shared), so a swapped-in copy's schedule catches up."""

    def __init__(self) -> None:
        self.n = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> _Frames:
        return self


def recurrent_modules(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The ``LSTMModule``/``GRUModule`` inside ``module``, in order."""
    return [m for m in module.modules() if isinstance(m, (LSTMModule, GRUModule))]


class TensorDictActor(ActorModule):
    """A TorchRL policy as an :class:`~netrl.actor.ActorModule` (see the module docstring).

    Args:
        observation_space, action_space: the env's.
        policy: a factory ``(observation_space, action_space) -> module``, or the module itself
            (a ``TorchRLAgent`` wraps its loss's actor so).
        discrete: the policy's Discrete action encoding, ``"one_hot"`` (TorchRL's default) or
            ``"categorical"``.
        extra_keys: which out_keys beyond ``"action"`` travel as extra outputs; None: all (the
            recurrent state excepted: it travels as such).
        observation_key: where the policy reads the observation (:func:`~netrl.interop.
            tensordicts.to_tensordict`'s): ``"pixels"`` for a CNN policy, or a Dict's entries
            mapped to keys.

    Raises:
        ValueError: the policy writes no ``"action"``, an out_key to keep is not one it writes, or
            is not a name netrl's rows can carry (a nested key, say: leave it out with
            ``extra_keys``); a recurrent module's state keys are nested; the policy holds an
            ``OrnsteinUhlenbeckProcessModule``.
    """

    def __init__(
        self,
        observation_space: gymnasium.Space,
        action_space: gymnasium.Space,
        policy: PolicyFactory | torch.nn.Module,
        discrete: DiscreteEncoding = "one_hot",
        extra_keys: Sequence[str] | None = None,
        observation_key: ObservationKey = "observation",
    ) -> None:
        super().__init__(observation_space, action_space)
        self.module = (
            policy
            if isinstance(policy, torch.nn.Module)
            else policy(observation_space, action_space)
        )
        self.discrete = discrete
        self._obs_keys = observation_layout(observation_key, observation_space)
        self._state = _state_spec(self.module)
        self._schedules = _schedules(self)
        self._frames, self._applied = _Frames(), 0
        self._extras = self._probe(extra_keys)
        if self._schedules:  # the annealed values are the worker's (module docstring)
            self.register_state_dict_post_hook(_drop_annealed)  # type: ignore[no-untyped-call]
            self.register_load_state_dict_pre_hook(_keep_annealed)  # type: ignore[no-untyped-call]

    def extra_outputs(self) -> ExtraSpec:
        return dict(self._extras)

    def recurrent_state(self) -> ExtraSpec:
        return dict(self._state)

    def forward(self, td: TensorDict) -> TensorDict:
        out: TensorDict = self.module(td)
        return out

    def act(self, obs: Any, test: bool = False, state: dict[str, Any] | None = None) -> Any:
        if self._schedules and not test:
            self._anneal(0)  # a copy swapped in catches up on the worker's count
        td = self._run(
            obs, ExplorationType.DETERMINISTIC if test else ExplorationType.RANDOM, state
        )
        actions = tree_map(
            lambda t: t.detach().cpu().numpy(),
            decode_action(td.get("action"), self.action_space, self.discrete),
        )
        if self._schedules and not test:
            self._anneal(int(td.batch_size[0]))
        extras = {name: td.get(name) for name in self._extras}
        if self._state:
            new_state = {k: td.get(("next", k)) for k in self._state}
            return (actions, new_state, extras) if self._extras else (actions, new_state)
        return (actions, extras) if self._extras else actions

    def schedule_frames(self) -> int:
        """The env steps this worker's schedules were stepped by (0: no schedule)."""
        return self._frames.n if self._schedules else 0

    def _anneal(self, frames: int) -> None:
        """Count ``frames`` more env steps and set the schedules to the count: the linear
        schedule ``step(n)`` follows, computed at once (``step`` loops per frame, 50 µs each on
        this machine: 0.8 ms per act of 16 envs), so it equals TorchRL's within float32 rounding;
        nothing once a schedule has reached its end."""
        self._frames.n += frames
        count = self._frames.n
        if count == self._applied:
            return
        for module in self._schedules:
            steps = int(module.annealing_num_steps)
            if self._applied >= steps:
                continue
            name = _ANNEALED[type(module)]
            init = float(getattr(module, f"{name}_init"))
            end = float(getattr(module, f"{name}_end"))
            value = end if count >= steps else max(end, init - count * (init - end) / steps)
            getattr(module, name).fill_(value)
        self._applied = count

    def _run(
        self, obs: Any, exploration: ExplorationType, state: dict[str, Any] | None = None
    ) -> TensorDict:
        """The policy's output TensorDict for a batch of observations (and a recurrent policy's
        state entering the step; None: zeros)."""
        first: list[torch.Tensor] = []
        tree_map(lambda t: first.append(t) if not first else None, obs)
        size, device = first[0].shape[:1], first[0].device
        td = TensorDict(place_observation(obs, self._obs_keys), batch_size=size, device=device)
        if self._state:
            for key, (shape, dtype) in self._state.items():
                value = None if state is None else state.get(key)
                if value is None:  # the initial state
                    kind = getattr(torch, np.dtype(dtype).name)
                    value = torch.zeros(*size, *shape, dtype=kind, device=device)
                td.set(key, value)
            # the worker zeroes a state at each episode start: no reset for the module to do
            td.set("is_init", torch.zeros(*size, 1, dtype=torch.bool, device=device))
        with torch.no_grad(), set_exploration_type(exploration), set_recurrent_mode(False):
            out: TensorDict = self.module(td)
        return out

    def _probe(self, extra_keys: Sequence[str] | None) -> ExtraSpec:
        """The extra outputs' (shape, dtype): one deterministic run on a default observation."""
        name = type(self.module).__name__
        obs = tree_map(
            lambda a: torch.as_tensor(np.asarray(a), device=self.device).unsqueeze(0),
            default_value(self.observation_space),
        )
        keys_before = set(self._observation_keys()) | set(self._state) | {"is_init"}
        keys_before |= {("next", k) for k in self._state}
        td = self._run(obs, ExplorationType.DETERMINISTIC)
        written = [
            k
            for k in td.keys(include_nested=True, leaves_only=True)
            if k not in keys_before and k != "action"
        ]
        if "action" not in td.keys():
            raise ValueError(
                f"the TorchRL policy {name} wrote no 'action' (it wrote {written}): a "
                f'TensorDictActor needs the action under "action"'
            )
        if extra_keys is not None:
            missing = sorted(set(extra_keys) - {k for k in written if isinstance(k, str)})
            if missing:
                raise ValueError(
                    f"extra_keys {missing} are not among what the policy {name} "
                    f"writes besides the action: {written}"
                )
            written = list(extra_keys)
        nested = [k for k in written if not isinstance(k, str)]
        if nested:
            raise ValueError(
                f"the policy {name} writes the nested keys {nested}, which a row cannot "
                f"carry as extra outputs: pass extra_keys= without them"
            )
        spec = {
            k: (tuple(td.get(k).shape[1:]), str(td.get(k).detach().cpu().numpy().dtype))
            for k in written
        }
        check_extra_spec(spec, f"TensorDictActor({name})")
        return spec

    def _observation_keys(self) -> list[Any]:
        if "" not in self._obs_keys:  # Dict entries at root keys of their own
            return list(self._obs_keys.values())
        found: list[Any] = []

        def walk(space: gymnasium.Space, prefix: tuple[str, ...]) -> None:
            children = getattr(space, "spaces", None)
            if isinstance(children, dict):
                for k, s in children.items():
                    walk(s, (*prefix, str(k)))
            elif isinstance(children, (tuple, list)):
                for i, s in enumerate(children):
                    walk(s, (*prefix, str(i)))
            else:
                found.append(prefix if len(prefix) > 1 else prefix[0])

        walk(self.observation_space, (self._obs_keys[""],))
        return found


def _state_spec(policy: torch.nn.Module) -> ExtraSpec:
    """The recurrent state of the policy's LSTM/GRU modules: their hidden-state in_keys ->
    ((layers x directions, size), float32), as TorchRL's primers shape it per env."""
    spec: dict[str, Any] = {}
    for module in recurrent_modules(policy):
        rnn: Any = module.lstm if isinstance(module, LSTMModule) else module.gru
        layers = int(rnn.num_layers) * (2 if rnn.bidirectional else 1)
        sizes = [int(rnn.hidden_size)]
        if isinstance(module, LSTMModule):  # h is the projection's size, c the cell's
            sizes = [int(getattr(rnn, "proj_size", 0)) or sizes[0], sizes[0]]
        in_keys: list[Any] = list(getattr(module, "in_keys", []))
        keys = [k for k in in_keys[1:] if k != "is_init"]
        for key, size in zip(keys, sizes, strict=True):
            if not isinstance(key, str):
                raise ValueError(
                    f"the {type(module).__name__}'s state key {key!r} is nested; a row carries "
                    f'recurrent state under a plain name ("recurrent_state_h"): rename it'
                )
            spec[key] = ((layers, size), "float32")
    if spec:
        check_extra_spec(spec, "TensorDictActor recurrent state")
    return spec


def _schedules(actor: torch.nn.Module) -> list[Any]:
    """The policy's exploration modules with an annealing schedule; an Ornstein-Uhlenbeck one
    refused (module docstring)."""
    found = []
    for name, module in actor.named_modules():
        if isinstance(module, OrnsteinUhlenbeckProcessModule):
            raise ValueError(
                f"the policy's {name} is an OrnsteinUhlenbeckProcessModule, whose noise is a "
                f"per-env state carried in its TensorDict from step to step, which netrl's rows "
                f"do not carry: use AdditiveGaussianModule (uncorrelated noise) instead"
            )
        if type(module) in _ANNEALED:
            found.append(module)
    return found


def _annealed_names(actor: torch.nn.Module) -> list[str]:
    return [
        f"{name}.{_ANNEALED[type(m)]}"
        for name, m in actor.named_modules()
        if type(m) in _ANNEALED
    ]


def _drop_annealed(
    module: torch.nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any
) -> None:
    """state_dict post-hook: the annealed values stay the worker's (module docstring)."""
    for name in _annealed_names(module):
        state.pop(prefix + name, None)


def _keep_annealed(module: torch.nn.Module, state: dict[str, Any], prefix: str, *_: Any) -> None:
    """load_state_dict pre-hook: a state without the annealed values keeps this actor's."""
    for name in _annealed_names(module):
        if prefix + name not in state:
            state[prefix + name] = module.get_buffer(name)
