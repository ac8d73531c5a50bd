"""Env transforms on the worker, with TorchRL's names and meanings: :class:`Resize`,
:class:`GrayScale`, :class:`FrameSkipTransform`, :class:`RewardScaling`, :class:`RewardClipping`,
:class:`ObservationNorm`, :class:`StepCounter`, composed by :class:`Compose`.

Calling sequence::

    t = Compose(GrayScale(), Resize(84, 84), FrameSkipTransform(4), RewardClipping(-1, 1))
    env = t.wrap(gymnasium_env)        # or TransformedEnv(env, t); its spaces are the new ones
    obs, info = env.reset(seed=0)      # obs through GrayScale, then Resize
    obs, rew, terminated, truncated, info = env.step(action)

As in TorchRL, the first transform sits next to the env: observations and rewards go through the
transforms in list order, and a :class:`FrameSkipTransform` repeats the step of the env wrapped
by the transforms before it. Each wrapped env gets its own copies of the transforms (a
:class:`StepCounter` counts per env, also in a vector env). config.json lists them under
``env.transforms`` (:mod:`netrl.envs.transform_config`).

Observations are gymnasium observations, not TensorDicts: a transform on observations applies to
the leaves named in ``in_keys`` (the names :func:`netrl.samples.flatten` gives: ``"obs"`` for a
Box observation, ``"obs/0"``, ``"obs/key"`` in a Tuple or Dict), by default to every leaf it fits.
Images are channel-first, ``(..., C, H, W)``, as TorchRL's after ``ToTensorImage``; integer
images stay integers (rounded half to even), so a replay stores the bytes the env would have.
"""

from __future__ import annotations

import abc
import copy
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import gymnasium
import numpy as np

__all__ = ["Compose", "FrameSkipTransform", "GrayScale", "ObservationNorm", "Resize",
           "RewardClipping", "RewardScaling", "StepCounter", "Transform", "TransformedEnv",
           "resize_matrix"]

Interpolation = Literal["bilinear", "nearest", "area"]
GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights (ITU-R 601-2 luma)


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

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        return self.transform.reset(self.env, seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self.transform.step(self.env, action)

    @property
    def default_action(self) -> Any:
        """The wrapped env's (rtgym's action of a reset row), which no transform changes."""
        return getattr(self.env, "default_action", None)


# -- observation transforms ------------------------------------------------------------------------
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


class _LeafTransform(Transform, abc.ABC):
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


def _box_bounds(space: Any, shape: tuple[int, ...]) -> Any:
    """A Box of ``shape`` and ``space``'s dtype spanning the lowest low to the highest high:
    what a convex mix of ``space``'s values can be."""
    return gymnasium.spaces.Box(np.min(space.low), np.max(space.high), shape, space.dtype)


def _mix(x: np.ndarray, out: np.ndarray, space: Any) -> np.ndarray:
    """``out`` (float64) in the leaf's dtype: integers rounded half to even, within the bounds."""
    if np.issubdtype(x.dtype, np.integer):
        return np.clip(np.rint(out), space.low.flat[0], space.high.flat[0]).astype(x.dtype)
    return np.clip(out, space.low.flat[0], space.high.flat[0]).astype(x.dtype)


def resize_matrix(n_in: int, n_out: int, interpolation: Interpolation) -> np.ndarray:
    """The ``(n_out, n_in)`` matrix that resizes one axis: each row's weights are >= 0 and sum
    to 1. bilinear: half-pixel centres, no antialiasing (torch's ``align_corners=False``);
    nearest: input ``floor(i * n_in / n_out)`` (torch's ``nearest``); area: the mean over the
    input span each output pixel covers (OpenCV's ``INTER_AREA``, for shrinking)."""
    m = np.zeros((n_out, n_in))
    scale = n_in / n_out
    for i in range(n_out):
        if interpolation == "nearest":
            m[i, min(math.floor(i * scale), n_in - 1)] = 1.0
        elif interpolation == "bilinear":
            x = max((i + 0.5) * scale - 0.5, 0.0)
            x0 = min(math.floor(x), n_in - 1)
            x1 = min(x0 + 1, n_in - 1)
            m[i, x0] += 1.0 - (x - x0)
            m[i, x1] += x - x0
        else:
            lo, hi = i * scale, (i + 1) * scale
            for j in range(math.floor(lo), min(math.ceil(hi), n_in)):
                m[i, j] = (min(hi, j + 1) - max(lo, j)) / scale
    return m


class Resize(_LeafTransform):
    """Resize images to ``h`` x ``w`` (TorchRL's ``Resize(w, h)``): the last two axes of each
    image leaf, ``(..., H, W) -> (..., h, w)``."""

    def __init__(self, w: int, h: int | None = None, interpolation: Interpolation = "bilinear",
                 in_keys: Sequence[str] | None = None) -> None:
        super().__init__(in_keys)
        h = w if h is None else h
        if not (isinstance(w, int) and isinstance(h, int) and w >= 1 and h >= 1):
            raise ValueError(f"Resize needs w and h integers >= 1 (got w={w!r}, h={h!r})")
        if interpolation not in ("bilinear", "nearest", "area"):
            raise ValueError(f'Resize interpolation must be "bilinear", "nearest" or "area" '
                             f"(got {interpolation!r})")
        self.w, self.h, self.interpolation = w, h, interpolation
        self._mats: dict[str, tuple[np.ndarray, np.ndarray, Any]] = {}

    def fits(self, space: Any) -> str | None:
        if not isinstance(space, gymnasium.spaces.Box) or len(space.shape) < 2:
            return "not a Box of at least 2 dimensions (..., H, W)"
        return None

    def leaf_space(self, name: str, space: Any) -> Any:
        *lead, h_in, w_in = space.shape
        out = _box_bounds(space, (*lead, self.h, self.w))
        self._mats[name] = (resize_matrix(h_in, self.h, self.interpolation),
                            resize_matrix(w_in, self.w, self.interpolation).T.copy(), out)
        return out

    def leaf(self, name: str, x: np.ndarray) -> np.ndarray:
        rows, cols, space = self._mats[name]
        return _mix(x, rows @ x.astype(np.float64) @ cols, space)


class GrayScale(_LeafTransform):
    """RGB to luma (TorchRL's ``GrayScale``): ``(..., 3, H, W) -> (..., 1, H, W)``, as
    ``0.2989 R + 0.587 G + 0.114 B``."""

    def __init__(self, in_keys: Sequence[str] | None = None) -> None:
        super().__init__(in_keys)
        self._spaces: dict[str, Any] = {}

    def fits(self, space: Any) -> str | None:
        if not isinstance(space, gymnasium.spaces.Box) or len(space.shape) < 3 \
                or space.shape[-3] != 3:
            return "not a Box (..., 3, H, W) of RGB images, channels first"
        return None

    def leaf_space(self, name: str, space: Any) -> Any:
        shape = (*space.shape[:-3], 1, *space.shape[-2:])
        self._spaces[name] = out = _box_bounds(space, shape)
        return out

    def leaf(self, name: str, x: np.ndarray) -> np.ndarray:
        xf = x.astype(np.float64)
        gray = (GRAY[0] * xf[..., 0:1, :, :] + GRAY[1] * xf[..., 1:2, :, :]
                + GRAY[2] * xf[..., 2:3, :, :])
        return _mix(x, gray, self._spaces[name])


class ObservationNorm(_LeafTransform):
    """Fixed affine normalisation of float leaves (TorchRL's ``ObservationNorm``):
    ``obs * scale + loc``, or ``(obs - loc) / scale`` with ``standard_normal``, in float32.
    ``loc`` and ``scale`` are numbers or nested lists that broadcast to the leaf's shape. The
    running statistics the trainer syncs to the workers are ``env.normalize_obs``
    (:mod:`netrl.envs.normalize`; in config.json, an ObservationNorm entry without loc and
    scale)."""

    def __init__(self, loc: Any = 0.0, scale: Any = 1.0, standard_normal: bool = False,
                 in_keys: Sequence[str] | None = None) -> None:
        super().__init__(in_keys)
        self.loc = np.asarray(loc, np.float32)
        self.scale = np.asarray(scale, np.float32)
        if not (np.isfinite(self.loc).all() and np.isfinite(self.scale).all()) \
                or (self.scale == 0).any():
            raise ValueError(f"ObservationNorm needs finite loc and scale, scale never 0 "
                             f"(got loc={loc!r}, scale={scale!r})")
        self.standard_normal = bool(standard_normal)

    def fits(self, space: Any) -> str | None:
        if not isinstance(space, gymnasium.spaces.Box) or space.dtype.kind != "f":
            return "not a float Box"
        try:
            np.broadcast_shapes(self.loc.shape, self.scale.shape, space.shape)
        except ValueError:
            return (f"loc {self.loc.shape} and scale {self.scale.shape} do not broadcast to "
                    f"its shape {space.shape}")
        if np.broadcast_shapes(self.loc.shape, self.scale.shape, space.shape) != space.shape:
            return f"loc and scale would change its shape {space.shape}"
        return None

    def _apply(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if self.standard_normal:
            return (x - self.loc) / self.scale
        return x * self.scale + self.loc

    def leaf_space(self, name: str, space: Any) -> Any:
        # the bounds by the same float32 arithmetic as the values: rounding is monotone, so
        # every transformed value lies within them
        with np.errstate(invalid="ignore", over="ignore"):
            a, b = self._apply(space.low), self._apply(space.high)
        return gymnasium.spaces.Box(np.minimum(a, b), np.maximum(a, b), space.shape, np.float32)

    def leaf(self, name: str, x: np.ndarray) -> np.ndarray:
        return self._apply(x)


# -- reward and step transforms --------------------------------------------------------------------
class RewardScaling(Transform):
    """``reward * scale + loc``, or ``(reward - loc) / scale`` with ``standard_normal``
    (TorchRL's ``RewardScaling``)."""

    def __init__(self, loc: float = 0.0, scale: float = 1.0,
                 standard_normal: bool = False) -> None:
        if not (math.isfinite(loc) and math.isfinite(scale)) or scale == 0:
            raise ValueError(f"RewardScaling needs finite loc and scale, scale not 0 "
                             f"(got loc={loc!r}, scale={scale!r})")
        self.loc, self.scale, self.standard_normal = float(loc), float(scale), standard_normal

    def reward(self, reward: float) -> float:
        if self.standard_normal:
            return (reward - self.loc) / self.scale
        return reward * self.scale + self.loc


class RewardClipping(Transform):
    """The reward clipped to ``[clamp_min, clamp_max]`` (TorchRL's ``RewardClipping``; a bound
    left None does not clip)."""

    def __init__(self, clamp_min: float | None = None, clamp_max: float | None = None) -> None:
        lo = -math.inf if clamp_min is None else float(clamp_min)
        hi = math.inf if clamp_max is None else float(clamp_max)
        if math.isnan(lo) or math.isnan(hi) or lo > hi:
            raise ValueError(f"RewardClipping needs clamp_min <= clamp_max (got {clamp_min!r}, "
                             f"{clamp_max!r})")
        self.clamp_min, self.clamp_max = clamp_min, clamp_max
        self._lo, self._hi = lo, hi

    def reward(self, reward: float) -> float:
        return min(max(reward, self._lo), self._hi)


class FrameSkipTransform(Transform):
    """Each action repeated ``frame_skip`` times in the env it wraps (TorchRL's
    ``FrameSkipTransform``): the rewards are summed, the last observation and info are returned,
    and the repeats stop at the end of an episode."""

    def __init__(self, frame_skip: int = 1) -> None:
        if not (isinstance(frame_skip, int) and frame_skip >= 1):
            raise ValueError(f"FrameSkipTransform needs frame_skip an integer >= 1 "
                             f"(got {frame_skip!r})")
        self.frame_skip = frame_skip

    def step(self, env: Any, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        total = 0.0
        for _ in range(self.frame_skip):
            obs, rew, terminated, truncated, info = env.step(action)
            total += float(rew)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


class StepCounter(Transform):
    """Steps since the reset, as ``info["step_count"]`` (TorchRL's ``StepCounter``), and with
    ``max_steps`` the episode truncated at that count."""

    def __init__(self, max_steps: int | None = None) -> None:
        if max_steps is not None and not (isinstance(max_steps, int) and max_steps >= 1):
            raise ValueError(f"StepCounter needs max_steps an integer >= 1 or None "
                             f"(got {max_steps!r})")
        self.max_steps = max_steps
        self._count = 0

    def reset(self, env: Any, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = env.reset(seed=seed, options=options)
        self._count = 0
        return obs, {**info, "step_count": 0}

    def step(self, env: Any, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, rew, terminated, truncated, info = env.step(action)
        self._count += 1
        if self.max_steps is not None and self._count >= self.max_steps:
            truncated = True
        return obs, rew, terminated, bool(truncated), {**info, "step_count": self._count}
