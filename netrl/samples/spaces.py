"""How each kind of Gymnasium space travels: its leaves' dtypes on the wire and in
memory, and their default values.

``Box`` leaves keep their space's dtype (an integer image stays uint8;
:class:`~netrl.envs.gym.GenericGymEnv` turns float64 boxes into float32 ones). ``Discrete``,
``MultiDiscrete`` and ``MultiBinary`` leaves travel as integer arrays in the smallest integer dtype
that holds their values (:func:`smallest_int_dtype`): a ``Discrete`` is a scalar per row.

Numpy only, and gymnasium is never imported here: the server checks packets against the
trainer's schema (:meth:`netrl.protocol.schema.SampleSchema.from_spaces`) and never loads
gymnasium, so spaces are recognised by the names of their classes (subclasses included), which
the caller's gymnasium defined.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

__all__ = ["SpaceKind", "carried_sample", "default_value", "integer_range", "smallest_int_dtype", "space_kind",
           "storage_dtype"]

SpaceKind = Literal["Box", "Discrete", "MultiDiscrete", "MultiBinary", "Tuple", "Dict", "other"]
_KINDS: tuple[SpaceKind, ...] = ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Tuple", "Dict")
# Unsigned first where the values allow it (uint8 holds an image's or a 256-way choice's values);
# never uint64, which torch barely supports.
_UNSIGNED = (np.uint8, np.uint16, np.uint32, np.int64)
_SIGNED = (np.int8, np.int16, np.int32, np.int64)


def space_kind(space: Any) -> SpaceKind:
    """Which of gymnasium's spaces ``space`` is (or derives from); ``"other"`` for
    the rest (Text, Graph...)."""
    for cls in type(space).__mro__:
        if cls.__module__.startswith("gymnasium.spaces") and cls.__name__ in _KINDS:
            return cls.__name__  # one of _KINDS
    return "other"


def integer_range(space: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The inclusive bounds of a Discrete, MultiDiscrete or MultiBinary leaf's values
    (per element), else None."""
    kind = space_kind(space)
    if kind == "Discrete":
        first = int(space.start)
        return np.array(first, np.int64), np.array(first + int(space.n) - 1, np.int64)
    if kind == "MultiDiscrete":
        starts = np.broadcast_to(np.asarray(space.start, np.int64), space.shape)
        return starts.copy(), starts + np.asarray(space.nvec, np.int64) - 1
    if kind == "MultiBinary":
        return np.zeros(space.shape, np.int64), np.ones(space.shape, np.int64)
    return None


def smallest_int_dtype(low: int, high: int) -> np.dtype[Any]:
    """The smallest of uint8/16/32 (for ``low >= 0``), int8/16/32 and int64
    that holds ``low..high``."""
    for dtype in _UNSIGNED if low >= 0 else _SIGNED:
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return np.dtype(dtype)
    raise ValueError(f"no integer dtype holds the values {low}..{high}")


def storage_dtype(space: Any) -> np.dtype[Any]:
    """The dtype a leaf of ``space`` travels and is stored in (``space`` is a leaf:
    not a Tuple or Dict)."""
    found = integer_range(space)
    if found is not None:
        low, high = found
        return smallest_int_dtype(int(low.min(initial=0)), int(high.max(initial=0)))
    return np.dtype(space.dtype if space.dtype is not None else np.float32)


def carried_sample(space: Any) -> Any:
    """A random value of ``space`` as a worker carries it: tuples and dicts of arrays in
    their storage dtypes."""
    kind = space_kind(space)
    if kind == "Tuple":
        return tuple(carried_sample(s) for s in space.spaces)
    if kind == "Dict":
        return {k: carried_sample(s) for k, s in space.spaces.items()}
    return np.asarray(space.sample()).astype(storage_dtype(space))


def default_value(space: Any) -> Any:
    """A valid value of ``space`` for a placeholder (an episode's first row's action): zeros
    where the space holds them, else its lowest values (a ``Discrete(3, start=1)``'s 1, a
    Box's low bound)."""
    kind = space_kind(space)
    if kind == "Tuple":
        return tuple(default_value(s) for s in space.spaces)
    if kind == "Dict":
        return {k: default_value(s) for k, s in space.spaces.items()}
    dtype = storage_dtype(space)
    found = integer_range(space)
    if found is None and kind == "Box":
        found = (np.broadcast_to(space.low, space.shape), np.broadcast_to(space.high, space.shape))
    if found is None:
        return np.zeros(space.shape or (), dtype)
    low, high = found
    return np.clip(np.zeros(np.shape(low)), low, high).astype(dtype)
