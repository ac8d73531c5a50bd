"""What every env transform shares (:mod:`netrl.envs.transforms` holds the transforms): the
:class:`Transform` interface, :class:`Compose`, the wrapper layer that gives a transformed env its
spaces and declared reward range, and :class:`LeafTransform` for transforms of observation
leaves."""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np

from netrl.util import declared_reward_range

__all__ = ["Compose", "LeafTransform", "Transform", "TransformedEnv"]


class Transform:
    """One change to what an env shows. A subclass overrides what it changes: the observation
    space and :meth:`observation`, :meth:`reward`, or the whole :meth:`reset` and :meth:`step`
    (which call the env they wrap)."""

    def transform_observation_space(self, space: Any) -> Any:
        """The observation space after this transform (ValueError when it does not apply)."""
        return space

    def observation(self, obs: Any) -> Any:
        return obs

    def reward(self, reward: float) -> float:
        return reward

    def transform_reward_range(self, lo: float, hi: float) -> tuple[float, float]:
        """The rewards' range after this transform, from the env's declared one (the trainer
        refuses rewards outside the range an env declares)."""
        r = sorted((self.reward(lo), self.reward(hi)))
        return r[0], r[1]

    def reset(self, env: Any, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = env.reset(seed=seed, options=options)
        return self.observation(obs), info

    def step(self, env: Any, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, rew, terminated, truncated, info = env.step(action)
        return self.observation(obs), self.reward(rew), terminated, truncated, info

    def wrap(self, env: Any) -> Any:
        """``env`` seen through a copy of this transform."""
        return _Layer(env, copy.deepcopy(self))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


_WRAP_FIRST = ("a Compose resets and steps through the layers it wraps an env in (each keeps its "
               "transform's state): call reset and step on Compose(...).wrap(env)")


class Compose(Transform):
    """Transforms applied in order, the first next to the env (TorchRL's ``Compose``)."""

    def __init__(self, *transforms: Transform) -> None:
        for t in transforms:
            if not isinstance(t, Transform):
                raise TypeError(f"Compose takes netrl.envs.transforms.Transform objects "
                                f"(got {t!r})")
        self.transforms = list(transforms)

    def transform_observation_space(self, space: Any) -> Any:
        for t in self.transforms:
            space = t.transform_observation_space(space)
        return space

    def observation(self, obs: Any) -> Any:
        for t in self.transforms:
            obs = t.observation(obs)
        return obs

    def reward(self, reward: float) -> float:
        for t in self.transforms:
            reward = t.reward(reward)
        return reward

    def reset(self, env: Any, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        raise TypeError(_WRAP_FIRST)

    def step(self, env: Any, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        raise TypeError(_WRAP_FIRST)

    def wrap(self, env: Any) -> Any:
        for t in self.transforms:
            env = t.wrap(env)
        return env

    def __repr__(self) -> str:
        return f"Compose({', '.join(map(repr, self.transforms))})"


def TransformedEnv(env: Any, transform: Transform) -> Any:  # TorchRL's name
    """``env`` seen through ``transform`` (TorchRL's ``TransformedEnv(env, transform)``)."""
    return transform.wrap(env)


class _Layer(gymnasium.Wrapper):
    """One transform around one env: its spaces, its reset and step."""

    def __init__(self, env: Any, transform: Transform) -> None:
        super().__init__(env)
        self.transform = transform
        self.observation_space = transform.transform_observation_space(env.observation_space)
        declared = declared_reward_range(env, finite=False)
        if declared is not None:
            self.reward_range = transform.transform_reward_range(*declared)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        return self.transform.reset(self.env, seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self.transform.step(self.env, action)

    @property
    def default_action(self) -> Any:
        """The wrapped env's (rtgym's action of a reset row), which no transform changes."""
        return getattr(self.env, "default_action", None)


def _map_tree(node: Any, name: str, fn: Callable[[str, Any], Any], spaces: bool) -> Any:
    """``node`` (a space or an observation) with each leaf replaced by ``fn(name, leaf)``."""
    if spaces and isinstance(node, gymnasium.spaces.Tuple):
        return gymnasium.spaces.Tuple(tuple(_map_tree(s, f"{name}/{i}", fn, spaces)
                                            for i, s in enumerate(node.spaces)))
    if spaces and isinstance(node, gymnasium.spaces.Dict):
        return gymnasium.spaces.Dict({k: _map_tree(s, f"{name}/{k}", fn, spaces)
                                      for k, s in node.spaces.items()})
    if not spaces and isinstance(node, (tuple, list)):
        return type(node)(_map_tree(x, f"{name}/{i}", fn, spaces) for i, x in enumerate(node))
    if not spaces and isinstance(node, dict):
        return {k: _map_tree(x, f"{name}/{k}", fn, spaces) for k, x in node.items()}
    return fn(name, node)


class LeafTransform(Transform, abc.ABC):
    """A transform of some observation leaves: ``in_keys`` names them, or every leaf that
    :meth:`fits` is taken."""

    def __init__(self, in_keys: Sequence[str] | None) -> None:
        self.in_keys = None if in_keys is None else tuple(in_keys)
        self._leaves: set[str] = set()

    @abc.abstractmethod
    def fits(self, space: Any) -> str | None:
        """Why this transform cannot apply to the leaf space ``space``, or None."""

    @abc.abstractmethod
    def leaf_space(self, name: str, space: Any) -> Any:
        """The space of leaf ``name`` after the transform (noting what :meth:`leaf` needs)."""

    @abc.abstractmethod
    def leaf(self, name: str, x: np.ndarray) -> np.ndarray:
        """Leaf ``name``'s value after the transform."""

    def transform_observation_space(self, space: Any) -> Any:
        found: dict[str, str | None] = {}
        self._leaves = set()  # (a space seen before is forgotten)

        def one(name: str, leaf: Any) -> Any:
            found[name] = self.fits(leaf)
            take = found[name] is None if self.in_keys is None else name in self.in_keys
            if not take:
                return leaf
            if found[name] is not None:
                raise ValueError(f"{self!r} cannot apply to observation leaf {name} "
                                 f"({leaf}): {found[name]}")
            self._leaves.add(name)
            return self.leaf_space(name, leaf)

        out = _map_tree(space, "obs", one, spaces=True)
        missing = sorted(set(self.in_keys or ()) - set(found))
        if missing:
            raise ValueError(f"{self!r}: the observation has no leaf {', '.join(missing)} (its "
                             f"leaves: {', '.join(found)})")
        if not self._leaves:
            why = "; ".join(f"{n}: {w}" for n, w in found.items())
            raise ValueError(f"{self!r} applies to no leaf of the observation space {space} "
                             f"({why})")
        return out

    def observation(self, obs: Any) -> Any:
        if not self._leaves:
            raise RuntimeError(f"{self!r} has not seen an observation space: wrap an env with it "
                               f"(transform.wrap(env)) or call transform_observation_space first")
        if not isinstance(obs, (tuple, list, dict)):  # a Box observation, the common case
            return self.leaf("obs", obs)
        return _map_tree(obs, "obs", lambda n, x: self.leaf(n, x) if n in self._leaves else x,
                         spaces=False)
