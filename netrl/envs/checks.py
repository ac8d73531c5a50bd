"""The checks netrl runs on every env before use: the spaces it can carry, observations and
actions that fit them, and a sample compressor's signature. Each names the leaf or argument
that is wrong and says what to do."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np

from netrl.samples.spaces import integer_range, space_kind
from netrl.samples.value_limits import Bounds, ValueLimits
from netrl.util import takes_args

__all__ = ["ACTION_MASK", "check_action", "check_observation", "check_sample_compressor", "check_spaces",
           "fit_problem", "fit_problems", "mask_problem", "mask_size", "space_problems", "value_limits"]


# Gymnasium's, PettingZoo's and TorchRL's key for the actions allowed in a state
ACTION_MASK = "action_mask"
_LEAVES = (gymnasium.spaces.Box, gymnasium.spaces.Discrete, gymnasium.spaces.MultiDiscrete,
           gymnasium.spaces.MultiBinary)
_WHY_NOT = {"Text": "encode the text as a Box or MultiDiscrete of character codes",
            "Sequence": "pad it to a fixed length and add a MultiBinary mask of the valid entries",
            "Graph": "pad its nodes and edges to fixed-size Boxes",
            "OneOf": "use a Dict with one entry per choice and a Discrete saying which one holds"}


def space_problems(observation_space: gymnasium.Space, action_space: gymnasium.Space) -> list[str]:
    """Every reason netrl cannot carry these spaces, each naming the leaf
    (``observation_space['mask']``), or [].

    Observations are Box, Discrete, MultiDiscrete and MultiBinary leaves, within Tuple and Dict
    spaces; actions are one such leaf. A Dict observation's ``action_mask`` entry must fit the
    action space (see :func:`mask_size`)."""
    problems: list[str] = []

    def leaves(space: gymnasium.Space, path: str) -> None:
        if isinstance(space, gymnasium.spaces.Tuple):
            for i, s in enumerate(space.spaces):
                leaves(s, f"{path}[{i}]")
        elif isinstance(space, gymnasium.spaces.Dict):
            for k, s in space.spaces.items():
                leaves(s, f"{path}[{k!r}]")
        elif not isinstance(space, _LEAVES):
            name = type(space).__name__
            fix = _WHY_NOT.get(name, "wrap the env to turn it into one of them")
            problems.append(f"{path} is a {name}, which netrl cannot carry: its "
                            f"leaves must be Box, Discrete, MultiDiscrete or "
                            f"MultiBinary spaces within Tuple and Dict spaces ({fix})")

    leaves(observation_space, "observation_space")
    if not isinstance(action_space, _LEAVES):
        problems.append(f"action_space is a {type(action_space).__name__}; netrl "
                        f"carries Box, Discrete, MultiDiscrete and MultiBinary "
                        f"actions: give the env one of them (a Tuple of choices "
                        f"can be a MultiDiscrete, a Dict of Boxes one Box)")
    if isinstance(observation_space, gymnasium.spaces.Dict) and ACTION_MASK in observation_space.spaces:
        problem = _mask_space_problem(observation_space.spaces[ACTION_MASK], action_space)
        if problem:
            problems.append(problem)
    return problems


def check_spaces(observation_space: gymnasium.Space, action_space: gymnasium.Space) -> None:
    """Raise ValueError, naming every leaf netrl cannot carry (see :func:`space_problems`)."""
    problems = space_problems(observation_space, action_space)
    if problems:
        raise ValueError("; ".join(problems))


def mask_size(action_space: gymnasium.Space) -> int | None:
    """How many entries an action mask of ``action_space`` has: ``n`` for a Discrete, ``sum(nvec)``
    for a 1-D MultiDiscrete (one entry per choice of each part, as TorchRL and PettingZoo flatten
    it); None for the others."""
    if isinstance(action_space, gymnasium.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gymnasium.spaces.MultiDiscrete) and len(action_space.shape) == 1:
        return int(np.sum(action_space.nvec))
    return None


def _mask_space_problem(mask: gymnasium.Space, action_space: gymnasium.Space) -> str | None:
    where = f"observation_space[{ACTION_MASK!r}]"
    size = mask_size(action_space)
    if size is None:
        return (f"{where} is an action mask, but the "
                f"action_space is a {type(action_space).__name__}"
                f"{' of more than one dimension' if space_kind(action_space) == 'MultiDiscrete' else ''}: "
                f"masks are for Discrete and 1-D MultiDiscrete "
                f"actions (rename the entry if it is not a mask)")
    is_box = isinstance(mask, gymnasium.spaces.Box)
    if not (is_box or isinstance(mask, gymnasium.spaces.MultiBinary)) or np.dtype(mask.dtype).kind not in "biu":
        dtype = f" of {mask.dtype}" if is_box else ""
        return (f"{where} is a {type(mask).__name__}{dtype}; an action mask is a "
                f"MultiBinary({size}) or an integer or bool Box of shape ({size},)")
    if mask.shape != (size,):
        return (f"{where} has shape {mask.shape}; the action_space "
                f"{action_space} needs a mask of shape ({size},), one entry per action")
    return None


def mask_problem(obs: Any, action_space: gymnasium.Space, path: str = "observation_space") -> str | None:
    """Why the action mask in ``obs`` (a dict with an ``action_mask`` entry) allows no action, or
    None: an actor could not choose, nor a target bootstrap from that state. A MultiDiscrete
    needs an allowed choice in each part."""
    if not isinstance(obs, dict) or ACTION_MASK not in obs:
        return None
    mask = np.asarray(obs[ACTION_MASK])
    if mask.dtype.kind not in "biu" or mask.ndim != 1:
        return None  # a layout problem, named by fit_problem
    parts = [int(n) for n in np.ravel(action_space.nvec)] if isinstance(action_space, gymnasium.spaces.MultiDiscrete) \
        else [mask.shape[0]]
    bounds = np.cumsum([0, *parts])
    if bounds[-1] != mask.shape[0]:
        return None
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        if not mask[a:b].any():
            part = f" for part {i} of the action (entries {a}..{b - 1})" if len(parts) > 1 else ""
            return (f"{path}[{ACTION_MASK!r}] allows no action{part}: a state that is "
                    f"not terminal must allow one (1 or True marks an allowed action)")
    return None


def fit_problem(value: Any, space: gymnasium.Space, path: str) -> str | None:
    """Why ``value`` does not fit ``space`` (naming the leaf, e.g. ``observation_space[2]``), or
    None if it does.

    Box leaves must have the space's shape and a dtype that casts to the space's within its kind
    (float64 to float32 is fine, float to int is not); Discrete, MultiDiscrete and MultiBinary
    leaves integers (or bools) of the space's shape within its values. Tuple spaces take tuples or
    lists of as many parts, Dict spaces dicts with the same keys."""
    problems = fit_problems(value, space, path)
    return problems[0] if problems else None


def fit_problems(value: Any, space: gymnasium.Space, path: str) -> list[str]:
    """Every reason ``value`` does not fit ``space``, one per leaf (see :func:`fit_problem`)."""
    if isinstance(space, gymnasium.spaces.Tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(space.spaces):
            got = f"a {type(value).__name__}"
            if isinstance(value, (tuple, list)):
                got = f"{len(value)} part{'' if len(value) == 1 else 's'}"
            return [f"{path} is a Tuple of {len(space.spaces)} parts, got {got}"]
        return [p for i, (v, s) in enumerate(zip(value, space.spaces, strict=True))
                for p in fit_problems(v, s, f"{path}[{i}]")]
    if isinstance(space, gymnasium.spaces.Dict):
        if not isinstance(value, dict) or set(value) != set(space.spaces):
            got = f"keys {sorted(value)}" if isinstance(value, dict) else f"a {type(value).__name__}"
            return [f"{path} is a Dict with keys {sorted(space.spaces)}, got {got}"]
        return [p for k, s in space.spaces.items() for p in fit_problems(value[k], s, f"{path}[{k!r}]")]
    problem = _leaf_fit_problem(value, space, path)
    return [problem] if problem else []


def _leaf_fit_problem(value: Any, space: gymnasium.Space, path: str) -> str | None:
    try:
        arr = np.asarray(value)
    except Exception as exc:  # e.g. a CUDA tensor
        return (f"{path} expects a numpy array, got a "
                f"{type(value).__name__} that numpy cannot read ({exc})")
    want_shape, want_dtype = tuple(space.shape or ()), np.dtype(space.dtype or np.float32)
    if arr.shape != want_shape:
        return (f"{path} expects shape {want_shape}, got shape "
                f"{arr.shape} ({type(value).__name__} of {arr.dtype})")
    found = integer_range(space)
    # Discrete, MultiDiscrete, MultiBinary: integers (or bools) within the space's range
    if found is not None:
        kind = space_kind(space)
        if arr.dtype.kind not in "biu":
            return f"{path} is a {kind}, whose values are integers; got {arr.dtype} ({_short(arr)})"
        low, high = found
        bad = (arr < low) | (arr > high)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            element = f" element {at[0] if len(at) == 1 else at}" if at else ""
            return (f"{path}{element} is {int(arr[at])}, outside the "
                    f"{kind}'s values {int(low[at])}..{int(high[at])}")
        return None
    if not np.can_cast(arr.dtype, want_dtype, casting="same_kind"):
        return f"{path} expects dtype {want_dtype}, got {arr.dtype}, which does not cast to it"
    return None


def _short(arr: np.ndarray) -> str:
    text = np.array2string(arr, threshold=8, precision=4)
    return text if len(text) <= 80 else text[:77] + "..."


def _box_bound_problem(value: Any, space: gymnasium.Space, path: str) -> str | None:
    """Why a Box action is outside its bounds (beyond the float rounding margin the
    trainer allows), or None."""
    if not isinstance(space, gymnasium.spaces.Box):
        return None
    arr = np.asarray(value, np.float64)
    bounds = _box_bounds(space, path)
    if bounds is None or arr.shape != bounds.shape:
        return None
    bad = (arr < bounds.lo) | (arr > bounds.hi)
    if not bad.any():
        return None
    at = tuple(int(i) for i in np.argwhere(bad)[0])
    element = f" element {at[0] if len(at) == 1 else at}" if at else ""
    return f"{path}{element} is {float(arr[at]):g}, outside the Box's bounds {bounds.describe(at)}"


def check_observation(obs: Any, space: gymnasium.Space, what: str, action_space: gymnasium.Space | None = None,
                      terminal: bool = False) -> None:
    """Raise ValueError, naming the leaf, unless ``obs`` (``what``: where it came from) fits
    ``space`` and, given the ``action_space``, its action mask allows an action (unless the state is
    ``terminal``). The worker checks its first observations: one that does not fit would fail much
    later, in the actor or on the trainer."""
    problem = fit_problem(obs, space, "observation_space")
    if problem is None and action_space is not None and not terminal:
        problem = mask_problem(obs, action_space)
    if problem:
        raise ValueError(f"{what} does not fit the env's observation_space: {problem}. "
                         f"Make the env's reset() and step() return observations shaped "
                         f"like observation_space (with rtgym: the interface's reset() and "
                         f"get_obs_rew_terminated_info() must match get_observation_space(); a "
                         f"number for a Box of shape (1,) must be an array of 1)")


def check_action(act: Any, space: gymnasium.Space, actor: str) -> None:
    """Raise ValueError, naming the leaf, unless the action ``actor.act``
    returned fits ``space``."""
    problem = fit_problem(act, space, "action_space") or _box_bound_problem(act, space, "action_space")
    if problem:
        raise ValueError(f"ActorModule.act ({actor}.act) returned an action that does not fit "
                         f"the env's action_space: {problem}. act() receives a batch of one "
                         f"observation and must return one action shaped like action_space, as a "
                         f"numpy array (drop the batch dimension, e.g. a[0] or a.squeeze(0))")


def check_sample_compressor(compressor: Callable[..., Any]) -> None:
    """Raise TypeError unless ``compressor`` takes netrl's (and tmrl >= 0.5's) six arguments."""
    if not takes_args(compressor, 6):
        raise TypeError(f"sample_compressor {getattr(compressor, '__name__', compressor)!r} must "
                        f"take 6 arguments, (act, obs, rew, terminated, truncated, "
                        f"info), and return them in that order. tmrl before 0.5 (and "
                        f"its older tutorial) used 5, (prev_act, obs, rew, done, "
                        f"info): split done into terminated (the episode ended) "
                        f"and truncated (it was cut short, e.g. by a time limit)")


def value_limits(observation_space: gymnasium.Space, action_space: gymnasium.Space,
                 max_abs_reward: float = math.inf) -> ValueLimits:
    """The values rows of these spaces may hold, by leaf name as packets carry
    them (``obs/1``, ``act``).

    A float Box leaf is bounded by the space's finite bounds (infinite ones leave only
    finiteness to check); an integer Box leaf by its bounds where they are narrower than its
    dtype's range; a Discrete or MultiDiscrete leaf by ``start`` to ``start + n - 1``, a
    MultiBinary leaf by 0 and 1."""
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
        elif (ints := integer_range(space)) is not None:  # a range of integers: exact bounds
            bounds[name] = Bounds(ints[0], ints[1], path, exact=True)

    walk(observation_space, "obs", "observation_space")
    walk(action_space, "act", "action_space")
    return ValueLimits(bounds, max_abs_reward)


def _box_bounds(space: gymnasium.spaces.Box, path: str) -> Bounds | None:
    """A Box's bounds, or None where they bound nothing a row's dtype could hold (unbounded
    floats, full-range integers such as uint8 images: checking them would cost a pass over every
    frame and refuse nothing)."""
    low = np.broadcast_to(np.asarray(space.low, np.float64), space.shape)
    high = np.broadcast_to(np.asarray(space.high, np.float64), space.shape)
    kind = np.dtype(space.dtype).kind
    if kind == "f":
        return Bounds(low, high, path) if np.isfinite(low).any() or np.isfinite(high).any() else None
    if kind in "iu":
        info = np.iinfo(np.dtype(space.dtype).str)
        return Bounds(low, high, path, exact=True) if (low > info.min).any() or (high < info.max).any() else None
    return None
