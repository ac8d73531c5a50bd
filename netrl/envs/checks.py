"""The checks netrl runs on every env before use: the spaces it can carry, observations and actions that fit them,
and a sample compressor's signature. Each names the leaf or argument that is wrong and says what to do."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np

from netrl.limits import Bounds, ValueLimits
from netrl.util import takes_args

__all__ = ["check_action", "check_observation", "check_sample_compressor", "check_spaces", "fit_problem",
           "value_limits"]


def check_spaces(observation_space: gymnasium.Space, action_space: gymnasium.Space) -> None:
    """Raise ValueError, naming the space, unless netrl can carry these spaces (Box leaves, Box actions)."""

    def leaves(space: gymnasium.Space, path: str) -> None:
        if isinstance(space, gymnasium.spaces.Tuple):
            for i, s in enumerate(space.spaces):
                leaves(s, f"{path}[{i}]")
        elif isinstance(space, gymnasium.spaces.Dict):
            for k, s in space.spaces.items():
                leaves(s, f"{path}[{k!r}]")
        elif not isinstance(space, gymnasium.spaces.Box):
            raise ValueError(f"{path} is a {type(space).__name__}; netrl needs Box leaves (wrap or flatten it)")

    leaves(observation_space, "observation_space")
    if not isinstance(action_space, gymnasium.spaces.Box):
        raise ValueError(f"action_space is a {type(action_space).__name__}; netrl carries Box actions only (its "
                         "samples, memories and SAC agent, whatever the TrainingAgent): give the env a Box action "
                         "space, e.g. a score per choice that the env turns into its choice with argmax")


def fit_problem(value: Any, space: gymnasium.Space, path: str) -> str | None:
    """Why ``value`` does not fit ``space`` (naming the leaf, e.g. ``observation_space[2]``), or None if it does.

    Box leaves must have the space's shape and a dtype that casts to the space's within its kind (float64 to float32
    is fine, float to int is not). Tuple spaces take tuples or lists of as many parts, Dict spaces dicts with the
    same keys."""
    if isinstance(space, gymnasium.spaces.Tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(space.spaces):
            got = f"a {type(value).__name__}"
            if isinstance(value, (tuple, list)):
                got = f"{len(value)} part{'' if len(value) == 1 else 's'}"
            return f"{path} is a Tuple of {len(space.spaces)} parts, got {got}"
        for i, (v, s) in enumerate(zip(value, space.spaces, strict=True)):
            problem = fit_problem(v, s, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(space, gymnasium.spaces.Dict):
        if not isinstance(value, dict) or set(value) != set(space.spaces):
            got = f"keys {sorted(value)}" if isinstance(value, dict) else f"a {type(value).__name__}"
            return f"{path} is a Dict with keys {sorted(space.spaces)}, got {got}"
        for k, s in space.spaces.items():
            problem = fit_problem(value[k], s, f"{path}[{k!r}]")
            if problem:
                return problem
        return None
    try:
        arr = np.asarray(value)
    except Exception as exc:  # e.g. a CUDA tensor
        return f"{path} expects a numpy array, got a {type(value).__name__} that numpy cannot read ({exc})"
    want_shape, want_dtype = tuple(space.shape or ()), np.dtype(space.dtype or np.float32)
    if arr.shape != want_shape:
        return f"{path} expects shape {want_shape}, got shape {arr.shape} ({type(value).__name__} of {arr.dtype})"
    if not np.can_cast(arr.dtype, want_dtype, casting="same_kind"):
        return f"{path} expects dtype {want_dtype}, got {arr.dtype}, which does not cast to it"
    return None


def check_observation(obs: Any, space: gymnasium.Space, what: str) -> None:
    """Raise ValueError, naming the leaf, unless ``obs`` (``what``: where it came from) fits ``space``. The worker
    checks its first observations: one that does not fit would fail much later, in the actor or on the trainer."""
    problem = fit_problem(obs, space, "observation_space")
    if problem:
        raise ValueError(f"{what} does not fit the env's observation_space: {problem}. Make the env's reset() and "
                         "step() return observations shaped like observation_space (with rtgym: the interface's "
                         "reset() and get_obs_rew_terminated_info() must match get_observation_space(); a number for "
                         "a Box of shape (1,) must be an array of 1)")


def check_action(act: Any, space: gymnasium.Space, actor: str) -> None:
    """Raise ValueError, naming the leaf, unless the action ``actor.act`` returned fits ``space``."""
    problem = fit_problem(act, space, "action_space")
    if problem:
        raise ValueError(f"ActorModule.act ({actor}.act) returned an action that does not fit the env's "
                         f"action_space: {problem}. act() receives a batch of one observation and must return one "
                         "action shaped like action_space, as a numpy array (drop the batch dimension, e.g. a[0] "
                         "or a.squeeze(0))")


def check_sample_compressor(compressor: Callable[..., Any]) -> None:
    """Raise TypeError unless ``compressor`` takes netrl's (and tmrl >= 0.5's) six arguments."""
    if not takes_args(compressor, 6):
        raise TypeError(f"sample_compressor {getattr(compressor, '__name__', compressor)!r} must take 6 arguments, "
                        "(act, obs, rew, terminated, truncated, info), and return them in that order. tmrl before "
                        "0.5 (and its older tutorial) used 5, (prev_act, obs, rew, done, info): split done into "
                        "terminated (the episode ended) and truncated (it was cut short, e.g. by a time limit)")


def value_limits(observation_space: gymnasium.Space, action_space: gymnasium.Space,
                 max_abs_reward: float = math.inf) -> ValueLimits:
    """The values rows of these spaces may hold, by leaf name as packets carry them (``obs/1``, ``act``).

    A float Box leaf is bounded by the space's finite bounds (infinite ones leave only finiteness to check); an
    integer Box leaf by its bounds where they are narrower than its dtype's range; a Discrete or MultiDiscrete leaf
    by ``start`` to ``start + n - 1``. Other spaces' leaves are only checked for finiteness."""
    bounds: dict[str, Bounds] = {}

    def walk(space: gymnasium.Space, name: str, path: str) -> None:
        if isinstance(space, gymnasium.spaces.Tuple):
            for i, s in enumerate(space.spaces):
                walk(s, f"{name}/{i}", f"{path}[{i}]")
        elif isinstance(space, gymnasium.spaces.Dict):
            for k, s in space.spaces.items():
                walk(s, f"{name}/{k}", f"{path}[{k!r}]")
        elif isinstance(space, gymnasium.spaces.Box):
            found = _box_bounds(space, path)
            if found is not None:
                bounds[name] = found
        elif isinstance(space, gymnasium.spaces.Discrete):  # a range of integers: exact bounds
            first = int(space.start)
            bounds[name] = Bounds(np.array(first), np.array(first + int(space.n) - 1), path, exact=True)
        elif isinstance(space, gymnasium.spaces.MultiDiscrete):
            starts = np.asarray(space.start, np.int64)
            bounds[name] = Bounds(starts, starts + np.asarray(space.nvec, np.int64) - 1, path, exact=True)

    walk(observation_space, "obs", "observation_space")
    walk(action_space, "act", "action_space")
    return ValueLimits(bounds, max_abs_reward)


def _box_bounds(space: gymnasium.spaces.Box, path: str) -> Bounds | None:
    """A Box's bounds, or None where they bound nothing a row's dtype could hold (unbounded floats, full-range
    integers such as uint8 images: checking them would cost a pass over every frame and refuse nothing)."""
    low = np.broadcast_to(np.asarray(space.low, np.float64), space.shape)
    high = np.broadcast_to(np.asarray(space.high, np.float64), space.shape)
    kind = np.dtype(space.dtype).kind
    if kind == "f":
        return Bounds(low, high, path) if np.isfinite(low).any() or np.isfinite(high).any() else None
    if kind in "iu":
        info = np.iinfo(np.dtype(space.dtype).str)
        return Bounds(low, high, path, exact=True) if (low > info.min).any() or (high < info.max).any() else None
    return None
