"""tmrl's ``GenericGymEnv`` wrapper (the checks netrl runs on every env
are in :mod:`netrl.envs.checks`).

``GenericGymEnv`` builds any registered Gymnasium env, including rtgym's ``real-time-gym-v1``
and ``real-time-gym-ts-v1`` (pass ``id="rtgym:real-time-gym-ts-v1"`` and
``gym_kwargs={"config": ...}``), keeps Gymnasium's passive env checker on, and turns float64
observations into float32 as tmrl does; discrete leaves (Discrete, MultiDiscrete, MultiBinary)
stay integers. Observations are always fresh arrays: rtgym reuses its action-buffer arrays between
steps, so they are copied here.
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium
import numpy as np

from netrl.envs.realtime import rtgym_timeouts
from netrl.errors import ConfigError
from netrl.samples.columns import tree_map
from netrl.samples.spaces import default_value

__all__ = ["GenericGymEnv", "float32_space"]

log = logging.getLogger(__name__)


def float32_space(space: gymnasium.Space) -> gymnasium.Space:
    """The same space with float64 boxes turned into float32 boxes."""
    if isinstance(space, gymnasium.spaces.Box) and space.dtype == np.float64:
        return gymnasium.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), dtype=np.float32)
    if isinstance(space, gymnasium.spaces.Tuple):
        return gymnasium.spaces.Tuple(tuple(float32_space(s) for s in space.spaces))
    if isinstance(space, gymnasium.spaces.Dict):
        return gymnasium.spaces.Dict({k: float32_space(s) for k, s in space.spaces.items()})
    return space


def _copy_obs(obs: Any) -> Any:
    def leaf(x: Any) -> Any:
        arr = np.array(x, copy=True)
        return arr.astype(np.float32) if arr.dtype == np.float64 else arr

    return tree_map(leaf, obs)


class GenericGymEnv(gymnasium.Wrapper):
    """``gymnasium.make(id, **gym_kwargs)`` with float32 observations that are copies, never views.

    Args:
        id: a registered env id; ``"module:EnvId"`` imports ``module`` first (e.g.
            ``"rtgym:real-time-gym-ts-v1"``; rtgym's ``real-time-gym-v1`` gets a warning: it is not
            thread-safe, and a worker runs threads).
        gym_kwargs: keyword arguments for ``gymnasium.make``.
    """

    def __init__(self, id: str = "Pendulum-v1", gym_kwargs: dict[str, Any] | None = None) -> None:
        if id.rpartition(":")[2] == "real-time-gym-v1":
            log.warning("%s is rtgym's env that is not thread-safe, and a RolloutWorker runs "
                        "threads beside it (its network thread; the env's calls run on a thread of "
                        "their own): use \"%s\", the thread-safe one, with the same config",
                        id, id.replace("real-time-gym-v1", "real-time-gym-ts-v1"))
        try:
            env = gymnasium.make(id, **(gym_kwargs or {}))
        except TypeError as exc:  # most often a keyword the env does not take
            raise ConfigError([f"gymnasium.make({id!r}, **{gym_kwargs}) failed: {exc}; "
                               f"check the keyword arguments"], "GenericGymEnv gym_kwargs "
                                             "(env.kwargs in config.json)") from None
        super().__init__(env)
        self.observation_space = float32_space(self.env.observation_space)
        # rtgym warns once per late time step: counted and summarised instead (netrl.envs.realtime)
        self._timeouts = (rtgym_timeouts() if type(env.unwrapped).__module__.startswith("rtgym")
                          else None)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return _copy_obs(obs), info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, rew, terminated, truncated, info = self.env.step(action)
        return _copy_obs(obs), float(rew), bool(terminated), bool(truncated), info

    def close(self) -> None:
        super().close()
        if self._timeouts is not None:
            self._timeouts.flush()

    @property
    def default_action(self) -> np.ndarray:
        """The action recorded with the first observation of an episode: rtgym's default
        action, else a valid action of the space (zeros where the space holds them, e.g. a
        Discrete's ``start``)."""
        default = getattr(self.env.unwrapped, "default_action", None)
        space = self.action_space
        if default is None:
            return np.asarray(default_value(space))
        return np.array(default, dtype=space.dtype, copy=True)
