"""A partially observed env: some entries of a flat Box observation left out
(config key ``env.hide_obs``).

Pendulum-v1 observes ``[cos(theta), sin(theta), angular velocity]``; ``env.hide_obs:
[2]`` leaves the velocity out, so a policy that sees one observation cannot know it and needs
memory (a recurrent actor, ``agent.recurrent``) or a window of past observations::

    {"env": {"id": "Pendulum-v1", "hide_obs": [2]}, "agent": {"recurrent": "gru"},
     "memory": {"sequence_length": 16, "burn_in": 4}}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np

from netrl.envs.gym import GenericGymEnv

__all__ = ["HiddenObs", "partially_observed"]


class HiddenObs(gymnasium.ObservationWrapper):
    """``env`` with the entries ``hide`` of its flat Box observation left out."""

    def __init__(self, env: gymnasium.Env, hide: Sequence[int]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gymnasium.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"env.hide_obs leaves entries out of a flat "
                             f"Box observation; this env observes {space}")
        out = [i for i in hide if not 0 <= i < space.shape[0]]
        if out or len(set(hide)) >= space.shape[0]:
            raise ValueError(f"env.hide_obs {list(hide)} must name distinct entries of "
                             f"the {space.shape[0]} this env observes (0 to "
                             f"{space.shape[0] - 1}), and leave at least one")
        self.keep = np.array([i for i in range(space.shape[0]) if i not in set(hide)])
        self.observation_space = gymnasium.spaces.Box(space.low[self.keep], space.high[self.keep],
                                                      dtype=space.dtype)

    def observation(self, observation: Any) -> Any:
        return np.asarray(observation)[self.keep]

    @property
    def default_action(self) -> Any:
        return getattr(self.env, "default_action", None)


def partially_observed(id: str, gym_kwargs: dict[str, Any], hide: Sequence[int]) -> gymnasium.Env:
    """The gym pipeline's env ``id`` with the observation entries ``hide`` left out."""
    return HiddenObs(GenericGymEnv(id, gym_kwargs), hide)
