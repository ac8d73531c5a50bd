"""Env transforms on the worker, with TorchRL's names and meanings: :class:`Resize`,
:class:`PermuteTransform`, :class:`GrayScale`, :class:`CatFrames`, :class:`FrameSkipTransform`,
:class:`RewardScaling`, :class:`RewardClipping`, :class:`ObservationNorm`, :class:`StepCounter`,
composed by :class:`Compose`.

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

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import gymnasium
import numpy as np

from netrl.envs.transform_base import Compose, LeafTransform, Transform, TransformedEnv
from netrl.envs.transform_config import check_options, is_synced, transform_problems

__all__ = ["CatFrames", "Compose", "FrameSkipTransform", "GrayScale", "ObservationNorm",
           "PermuteTransform", "Resize",
           "RewardClipping", "RewardScaling", "StepCounter", "Transform", "TransformedEnv",
           "applies_transforms", "compose_from_config", "resize_matrix", "transformed"]

Interpolation = Literal["bilinear", "nearest", "area"]
GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights (ITU-R 601-2 luma)


def _checked(name: str, **options: Any) -> None:
    """ValueError naming every bad option (the checks config.json's entries get)."""
    problems = check_options(name, options)
    if problems:
        raise ValueError(f"{name} {'; '.join(problems)}")


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


class Resize(LeafTransform):
    """Resize images to ``h`` x ``w`` (TorchRL's ``Resize(w, h)``): the last two axes of each
    image leaf, ``(..., H, W) -> (..., h, w)``."""

    def __init__(self, w: int, h: int | None = None, interpolation: Interpolation = "bilinear",
                 in_keys: Sequence[str] | None = None) -> None:
        super().__init__(in_keys)
        _checked("Resize", w=w, h=h, interpolation=interpolation, in_keys=in_keys)
        h = w if h is None else h
        self.w, self.h, self.interpolation = w, h, interpolation
        self._mats: dict[str, tuple[np.ndarray, np.ndarray, Any]] = {}

    def fits(self, space: Any) -> str | None:
        if not isinstance(space, gymnasium.spaces.Box) or len(space.shape) < 2:
            return "not a Box of at least 2 dimensions (..., H, W)"
        if len(space.shape) == 3 and space.shape[-1] in (1, 3, 4) and space.shape[0] > 4:
            # resizing (W, C) as if it were (H, W) would be silent nonsense
            return (f"its shape {space.shape} looks like a channels-last image (H, W, C): put a "
                    f"PermuteTransform with dims [-1, -3, -2] before it")
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


class PermuteTransform(LeafTransform):
    """The last ``len(dims)`` axes of each leaf reordered (TorchRL's ``PermuteTransform``):
    ``dims`` is a permutation of ``-len(dims) ... -1``; ``[-1, -3, -2]`` turns a channels-last
    image ``(H, W, C)`` into ``(C, H, W)``, what :class:`Resize` and :class:`GrayScale` take."""

    def __init__(self, dims: Sequence[int], in_keys: Sequence[str] | None = None) -> None:
        super().__init__(in_keys)
        _checked("PermuteTransform", dims=list(dims), in_keys=in_keys)
        self.dims = tuple(int(d) for d in dims)

    def fits(self, space: Any) -> str | None:
        if not isinstance(space, gymnasium.spaces.Box) or len(space.shape) < len(self.dims):
            return f"not a Box of at least {len(self.dims)} dimensions"
        return None

    def _axes(self, ndim: int) -> list[int]:
        return list(range(ndim - len(self.dims))) + [ndim + d for d in self.dims]

    def leaf_space(self, name: str, space: Any) -> Any:
        axes = self._axes(len(space.shape))
        return gymnasium.spaces.Box(space.low.transpose(axes), space.high.transpose(axes),
                                    dtype=space.dtype)

    def leaf(self, name: str, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        return np.ascontiguousarray(x.transpose(self._axes(x.ndim)))


class GrayScale(LeafTransform):
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


class ObservationNorm(LeafTransform):
    """Fixed affine normalisation of float leaves (TorchRL's ``ObservationNorm``):
    ``obs * scale + loc``, or ``(obs - loc) / scale`` with ``standard_normal``, in float32.
    ``loc`` and ``scale`` are numbers or nested lists that broadcast to the leaf's shape. The
    running statistics the trainer syncs to the workers are ``env.normalize_obs``
    (:mod:`netrl.envs.normalize`; in config.json, an ObservationNorm entry without loc and
    scale)."""

    def __init__(self, loc: Any = 0.0, scale: Any = 1.0, standard_normal: bool = False,
                 in_keys: Sequence[str] | None = None) -> None:
        super().__init__(in_keys)
        _checked("ObservationNorm", loc=np.asarray(loc).tolist(), scale=np.asarray(scale).tolist(),
                 standard_normal=standard_normal, in_keys=in_keys)
        self.loc = np.asarray(loc, np.float32)
        self.scale = np.asarray(scale, np.float32)
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


class CatFrames(LeafTransform):
    """The last ``N`` observations of a leaf concatenated along ``dim`` (TorchRL's ``CatFrames``
    with ``padding="same"``): at a reset, ``N`` copies of the first; newest last. After a
    :class:`FrameSkipTransform`, the frames are those the agent saw, one per step."""

    def __init__(self, N: int, dim: int = -3,  # TorchRL's N
                 in_keys: Sequence[str] | None = None) -> None:
        super().__init__(in_keys)
        _checked("CatFrames", N=N, dim=dim, in_keys=in_keys)
        self.N, self.dim = N, dim
        self._frames: dict[str, np.ndarray] = {}
        self._fresh = True

    def fits(self, space: Any) -> str | None:
        if not isinstance(space, gymnasium.spaces.Box) or len(space.shape) < -self.dim:
            return f"not a Box with an axis {self.dim}"
        return None

    def leaf_space(self, name: str, space: Any) -> Any:
        return gymnasium.spaces.Box(np.concatenate([space.low] * self.N, axis=self.dim),
                                    np.concatenate([space.high] * self.N, axis=self.dim),
                                    dtype=space.dtype)

    def reset(self, env: Any, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = env.reset(seed=seed, options=options)
        self._fresh = True
        return self.observation(obs), info

    def step(self, env: Any, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, rew, terminated, truncated, info = env.step(action)
        self._fresh = False
        return self.observation(obs), rew, terminated, truncated, info

    def leaf(self, name: str, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if self._fresh or name not in self._frames:
            self._frames[name] = np.concatenate([x] * self.N, axis=self.dim)
        else:  # shift the window by one frame along dim
            stacked = np.moveaxis(self._frames[name], self.dim, 0)
            size = x.shape[self.dim]
            stacked[:-size] = stacked[size:].copy()
            stacked[-size:] = np.moveaxis(x, self.dim, 0)
        return self._frames[name].copy()


# -- reward and step transforms ---------------------------------------------------------------
class RewardScaling(Transform):
    """``reward * scale + loc``, or ``(reward - loc) / scale`` with ``standard_normal``
    (TorchRL's ``RewardScaling``)."""

    def __init__(self, loc: float = 0.0, scale: float = 1.0,
                 standard_normal: bool = False) -> None:
        _checked("RewardScaling", loc=loc, scale=scale, standard_normal=standard_normal)
        self.loc, self.scale, self.standard_normal = float(loc), float(scale), standard_normal

    def reward(self, reward: float) -> float:
        if self.standard_normal:
            return (reward - self.loc) / self.scale
        return reward * self.scale + self.loc


class RewardClipping(Transform):
    """The reward clipped to ``[clamp_min, clamp_max]`` (TorchRL's ``RewardClipping``; a bound
    left None does not clip)."""

    def __init__(self, clamp_min: float | None = None, clamp_max: float | None = None) -> None:
        _checked("RewardClipping", clamp_min=clamp_min, clamp_max=clamp_max)
        lo = -math.inf if clamp_min is None else float(clamp_min)
        hi = math.inf if clamp_max is None else float(clamp_max)
        self.clamp_min, self.clamp_max = clamp_min, clamp_max
        self._lo, self._hi = lo, hi

    def reward(self, reward: float) -> float:
        return min(max(reward, self._lo), self._hi)


class FrameSkipTransform(Transform):
    """Each action repeated ``frame_skip`` times in the env it wraps (TorchRL's
    ``FrameSkipTransform``): the rewards are summed, the last observation and info are returned,
    and the repeats stop at the end of an episode."""

    def __init__(self, frame_skip: int = 1) -> None:
        _checked("FrameSkipTransform", frame_skip=frame_skip)
        self.frame_skip = frame_skip

    def transform_reward_range(self, lo: float, hi: float) -> tuple[float, float]:
        # a sum of 1 to frame_skip rewards (fewer at an episode's end)
        return min(lo, lo * self.frame_skip), max(hi, hi * self.frame_skip)

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
        _checked("StepCounter", max_steps=max_steps)
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


# -- from config.json ------------------------------------------------------------------------------
_CLASSES: dict[str, type[Transform]] = {c.__name__: c for c in (
    Resize, PermuteTransform, GrayScale, CatFrames, FrameSkipTransform, RewardScaling, RewardClipping,
    ObservationNorm, StepCounter)}


def compose_from_config(entries: list[dict[str, Any]]) -> Compose | None:
    """The :class:`Compose` of ``env.transforms`` (the synced ObservationNorm left out:
    env.normalize_obs applies it), or None when there is nothing to apply around the env.
    ValueError naming every bad entry."""
    problems = transform_problems(entries)
    if problems:
        raise ValueError(f"env.transforms: {'; '.join(problems)}")
    built = [_CLASSES[e["name"]](**{k: v for k, v in e.items() if k != "name"})
             for e in entries if not is_synced(e)]
    return Compose(*built) if built else None


def _make(env_cls: Callable[[], Any], transform: Transform) -> Any:
    return transform.wrap(env_cls())


def transformed(env_cls: Callable[[], Any], transform: Transform) -> Callable[[], Any]:
    """An env class whose envs are ``env_cls()``'s seen through ``transform`` (a copy each)."""
    return functools.partial(_make, env_cls, transform)


def applies_transforms(env_cls: Any) -> bool:
    """Whether ``env_cls`` came from :func:`transformed` (a pipeline that applied them itself)."""
    return isinstance(env_cls, functools.partial) and env_cls.func is _make
