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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from netrl.actor import ActorModule
from netrl.interop.tensordicts import DiscreteEncoding, decode_action, observation_entries
from netrl.samples.columns import ExtraSpec, check_extra_spec, tree_map
from netrl.samples.spaces import default_value

__all__ = ["PolicyFactory", "TensorDictActor"]

PolicyFactory = Callable[[gymnasium.Space, gymnasium.Space], torch.nn.Module]


class TensorDictActor(ActorModule):
    """A TorchRL policy as an :class:`~netrl.actor.ActorModule` (see the module docstring).

    Args:
        observation_space, action_space: the env's.
        policy: a factory ``(observation_space, action_space) -> module``, or the module itself
            (a ``TorchRLAgent`` wraps its loss's actor so).
        discrete: the policy's Discrete action encoding, ``"one_hot"`` (TorchRL's default) or
            ``"categorical"``.
        extra_keys: which out_keys beyond ``"action"`` travel as extra outputs; None: all.

    Raises:
        ValueError: the policy writes no ``"action"``, an out_key to keep is not one it writes, or
            is not a name netrl's rows can carry (a nested key, say: leave it out with
            ``extra_keys``).
    """

    def __init__(
        self,
        observation_space: gymnasium.Space,
        action_space: gymnasium.Space,
        policy: PolicyFactory | torch.nn.Module,
        discrete: DiscreteEncoding = "one_hot",
        extra_keys: Sequence[str] | None = None,
    ) -> None:
        super().__init__(observation_space, action_space)
        self.module = (
            policy
            if isinstance(policy, torch.nn.Module)
            else policy(observation_space, action_space)
        )
        self.discrete = discrete
        self._extras = self._probe(extra_keys)

    def extra_outputs(self) -> ExtraSpec:
        return dict(self._extras)

    def forward(self, td: TensorDict) -> TensorDict:
        out: TensorDict = self.module(td)
        return out

    def act(self, obs: Any, test: bool = False) -> Any:
        td = self._run(obs, ExplorationType.DETERMINISTIC if test else ExplorationType.RANDOM)
        actions = tree_map(
            lambda t: t.detach().cpu().numpy(),
            decode_action(td.get("action"), self.action_space, self.discrete),
        )
        if not self._extras:
            return actions
        return actions, {name: td.get(name) for name in self._extras}

    def _run(self, obs: Any, exploration: ExplorationType) -> TensorDict:
        """The policy's output TensorDict for a batch of observations."""
        observation = observation_entries(obs)
        first: list[torch.Tensor] = []
        tree_map(lambda t: first.append(t) if not first else None, obs)
        td = TensorDict(
            {"observation": observation}, batch_size=first[0].shape[:1], device=first[0].device
        )
        with torch.no_grad(), set_exploration_type(exploration):
            out: TensorDict = self.module(td)
        return out

    def _probe(self, extra_keys: Sequence[str] | None) -> ExtraSpec:
        """The extra outputs' (shape, dtype): one deterministic run on a default observation."""
        name = type(self.module).__name__
        obs = tree_map(
            lambda a: torch.as_tensor(np.asarray(a), device=self.device).unsqueeze(0),
            default_value(self.observation_space),
        )
        keys_before = set(self._observation_keys())
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

        walk(self.observation_space, ("observation",))
        return found
