"""What a sample's values may be: finite, within the bounds its spaces promise, and
rewards within the config's bound.

Checks pass on messages that fit every layout check and still stop learning: an observation,
action or reward of ±3e38 is finite, but a few of them make the losses NaN. :class:`ValueLimits`
refuses such a packet whole, naming the field, the row and the value. The trainer builds the limits
from its spaces (:func:`netrl.envs.checks.value_limits`) and checks every packet before it enters
the replay memory, those rebuilt from the sample log included; it sends the bounds of floating-point
leaves to the server in its SCHEMA, so that the server refuses such packets at its edge and tells
the worker why. Numpy only: the server uses this module too.

Leaves are named as packets name them (``obs/1``, ``act``) and shown as
``obs[1]``, ``act``, ``rew``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from netrl.samples.columns import Buffer, flatten

__all__ = ["RTOL", "Bounds", "ValueLimits", "field_label"]

# The margin a bound gets, relative to max(|bound|, 1): float rounding (float32's is 6e-8
# relative) never refuses an honest row, and the values that break training (1e6 times a bound and
# more) are refused all the same.
RTOL = 1e-5
# per-element bounds of a leaf sent to the server; a larger leaf's are checked by the trainer
MAX_WIRE_ELEMENTS = 4096


_MIN, _MAX, _GE, _LE = np.minimum.reduce, np.maximum.reduce, np.greater_equal, np.less_equal
_ALL = np.logical_and.reduce


def field_label(name: str) -> str:
    """How messages name a leaf: ``obs/1/speed`` -> ``obs[1][speed]``."""
    head, *rest = name.split("/")
    return head + "".join(f"[{part}]" for part in rest)


def _margin(bound: np.ndarray) -> np.ndarray:
    return RTOL * np.maximum(np.abs(bound), 1.0)


@dataclass(frozen=True, eq=False)
class Bounds:
    """Inclusive bounds of one leaf, per element of a row (``-inf``/``inf``:
    unbounded on that side).

    ``exact`` (integer and discrete leaves) takes them as they are; float leaves get
    the :data:`RTOL` margin."""

    low: np.ndarray
    high: np.ndarray
    space: str  # where they come from, for messages: "observation_space[1]", "action_space"
    exact: bool = False
    lo: np.ndarray = field(init=False, repr=False)  # with the margin
    hi: np.ndarray = field(init=False, repr=False)
    # both bounds finite everywhere: a leaf within them is finite too (see ValueLimits._passes)
    finite: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        low, high = np.asarray(self.low, np.float64), np.asarray(self.high, np.float64)
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        object.__setattr__(self, "lo", low if self.exact else low - _margin(low))
        object.__setattr__(self, "hi", high if self.exact else high + _margin(high))
        object.__setattr__(self, "finite", bool(np.isfinite(low).all() and np.isfinite(high).all()))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.low.shape)

    def describe(self, at: tuple[int, ...]) -> str:
        return f"[{float(self.low[at]):g}, {float(self.high[at]):g}]"


def _first(bad: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """The row and the element (within the row) of the first True of ``bad`` (rows first)."""
    flat = int(np.flatnonzero(bad)[0])
    index = np.unravel_index(flat, bad.shape)
    return int(index[0]), tuple(int(i) for i in index[1:])


def _where(row: int, element: tuple[int, ...]) -> str:
    return f"row {row}" + (f", element "
                           f"{element[0] if len(element) == 1 else element}" if element else "")


class ValueLimits:
    """Bounds per leaf name, and the largest reward magnitude. Leaves without bounds are
    only checked for finiteness.

    Args:
        bounds: leaf name (``obs/0``, ``act``) -> its :class:`Bounds`. A packet leaf whose
            per-row shape differs from its bounds' (a sample compressor changed it) is
            only checked for finiteness.
        max_abs_reward: rewards beyond it in magnitude are refused (``trainer.max_abs_reward``).
    """

    def __init__(self, bounds: Mapping[str, Bounds] | None = None, max_abs_reward: float = math.inf) -> None:
        self.bounds = dict(bounds or {})
        self.max_abs_reward = float(max_abs_reward)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ValueLimits) and self.to_wire(everything=True) == other.to_wire(everything=True)

    __hash__ = None  # type: ignore[assignment]  # mutable content, compared by value

    def __repr__(self) -> str:
        return f"ValueLimits({sorted(self.bounds)}, max_abs_reward={self.max_abs_reward:g})"

    def only(self, names: set[str]) -> ValueLimits:
        """These limits with the bounds of ``names`` only (the leaves a sample compressor
        sends as they are)."""
        return ValueLimits({k: b for k, b in self.bounds.items() if k in names}, self.max_abs_reward)

    # -- checks ------------------------------------------------------------------------------------
    def problem(self, leaves: Mapping[str, np.ndarray], rew: np.ndarray, reset: np.ndarray | None = None) -> str | None:
        """Why these columns break the limits (field, row, value and what to do), or
        None if they keep them.

        ``reset`` marks rows whose action is a placeholder (an episode's first observation): their
        actions must be finite but need not be within the action space."""
        if self._passes(leaves, rew):
            return None
        for name, arr in leaves.items():
            found = self._leaf_problem(name, np.asarray(arr), reset)
            if found:
                return found
        rew = np.asarray(rew)
        if rew.size and rew.dtype.kind in "fc":
            bad = ~np.isfinite(rew)
            if bad.any():
                row, _ = _first(bad)
                return f"rew row {row} is {rew[row]}: rewards must be finite numbers"
        if rew.size and not float(np.max(np.abs(rew))) <= self.max_abs_reward:
            row, _ = _first(np.abs(rew) > self.max_abs_reward)
            return (f"rew row {row} is {float(rew[row]):g}, beyond "
                    f"trainer.max_abs_reward ({self.max_abs_reward:g}): check the "
                    f"env's reward, or raise trainer.max_abs_reward if rewards "
                    f"this large are meant (scaling them down trains better)")
        return None

    def _passes(self, leaves: Mapping[str, np.ndarray], rew: np.ndarray) -> bool:
        """True if every leaf and reward is surely within the limits, in two reductions per leaf:
        the common case, on every packet of the relay and the trainer. False sends the packet
        through the full checks, which find and name the problem (or pass it: a reset row's
        action outside the space). Equivalent because a row within finite bounds is finite, and a
        NaN fails every comparison (np.min and np.max propagate it)."""
        for name, leaf in leaves.items():
            arr = np.asarray(leaf)
            b = self.bounds.get(name)
            if (b is not None and arr.dtype.kind in "fiu" and arr.ndim >= 1
                    and arr.shape[1:] == b.shape):
                if not b.finite and arr.dtype.kind == "f" and not np.isfinite(arr).all():
                    return False  # an infinite bound lets an infinite value through min and max
                # the ufuncs themselves: ndarray.min and .all add a Python layer each, per leaf
                if arr.shape[0] and not (_ALL(_GE(_MIN(arr, 0), b.lo), None)
                                         and _ALL(_LE(_MAX(arr, 0), b.hi), None)):
                    return False
            elif arr.dtype.kind in "fc" and arr.size and not np.isfinite(arr).all():
                return False
        rew = np.asarray(rew)
        if not rew.size:
            return True
        if math.isinf(self.max_abs_reward):
            return rew.dtype.kind not in "fc" or bool(np.isfinite(rew).all())
        return float(np.max(np.abs(rew))) <= self.max_abs_reward

    def _leaf_problem(self, name: str, arr: np.ndarray, reset: np.ndarray | None) -> str | None:
        if arr.ndim == 0 or arr.shape[0] == 0:
            return None
        if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
            row, element = _first(~np.isfinite(arr))
            return (f"{field_label(name)} {_where(row, element)} is "
                    f"{arr[(row, *element)]}: values must be finite")
        b = self.bounds.get(name)
        if b is None or tuple(arr.shape[1:]) != b.shape or arr.dtype.kind not in "fiu":
            return None
        rows = arr
        if reset is not None and (name == "act" or name.startswith("act/")) and reset.any():
            rows = arr[~np.asarray(reset, bool)]
            if rows.shape[0] == 0:
                return None
        # two reductions, not a boolean array the size of the packet: most packets pass
        if (rows.min(axis=0) >= b.lo).all() and (rows.max(axis=0) <= b.hi).all():
            return None
        bad = (rows < b.lo) | (rows > b.hi)
        row, element = _first(bad)
        if rows is not arr:  # the row number in the packet, not among its non-reset rows
            row = int(np.flatnonzero(~np.asarray(reset, bool))[row])
        value = arr[(row, *element)]
        kind = "observation" if name.startswith("obs") else "action"
        fix = ("clip it in the env, or widen the space's bounds" if kind == "observation" else
               "the worker's actor chose it: keep actions within the action space")
        return (f"{field_label(name)} {_where(row, element)} is {value:g}, "
                f"outside {b.space}'s bounds {b.describe(element)}: {fix}")

    def buffer_problem(self, buf: Buffer) -> str | None:
        """:meth:`problem` for a packet's columns, its extra outputs and info entries included
        (``extra[<name>]``, ``info[<name>]``: finite)."""
        _, act = flatten(buf.act, "act")
        _, obs = flatten(buf.obs, "obs")
        extra = [(f"extra/{name}", col) for name, col in buf.extra.items()] if buf.extra else []
        extra += [(f"info/{name}", col) for name, col in (getattr(buf, "info", None) or {}).items()]
        return self.problem(dict(act + obs + extra), buf.rew, buf.reset)

    # -- the SCHEMA message ------------------------------------------------------------------------
    def to_wire(self, everything: bool = False) -> dict[str, Any]:
        """The limits the server can check cheaply: float leaves' bounds (the server leaves
        compressed integer arrays compressed) with at most :data:`MAX_WIRE_ELEMENTS` elements,
        unless uniform; ``everything``: all of them."""
        bounds = []
        for name, b in sorted(self.bounds.items()):
            if not everything and (b.exact or (b.low.size > MAX_WIRE_ELEMENTS and not _uniform(b))):
                continue
            bounds.append([name, _wire_values(b.low), _wire_values(b.high), list(b.shape), b.space, b.exact])
        reward = None if math.isinf(self.max_abs_reward) else self.max_abs_reward
        return {"max_abs_reward": reward, "bounds": bounds}

    @classmethod
    def from_wire(cls, body: Any, leaves: Mapping[str, tuple[str, tuple[int, ...]]]) -> ValueLimits:
        """Parse :meth:`to_wire`'s output for a schema with these ``leaves`` (untrusted:
        raises ValueError)."""
        if not isinstance(body, dict) or set(body) != {"max_abs_reward", "bounds"}:
            raise ValueError("limits must be a map with max_abs_reward and bounds")
        reward = body["max_abs_reward"]
        if reward is not None and (not isinstance(reward, (int, float)) or isinstance(reward, bool)
                                   or not reward > 0 or math.isnan(reward)):
            raise ValueError(f"limits max_abs_reward must be a positive "
                             f"number or null (got {reward!r})")
        if not isinstance(body["bounds"], list) or len(body["bounds"]) > len(leaves):
            raise ValueError("limits bounds must be a list of at most one entry per leaf")
        bounds: dict[str, Bounds] = {}
        for entry in body["bounds"]:
            if not isinstance(entry, list) or len(entry) != 6:
                raise ValueError("a limits bound must be [name, low, high, shape, space, exact]")
            name, low, high, shape, space, exact = entry
            if name not in leaves or name in bounds or not isinstance(space, str) or len(space) > 200:
                raise ValueError(f"limits name a leaf the schema lacks, "
                                 f"twice, or without its space ({name!r})")
            if list(leaves[name][1]) != shape or not isinstance(exact, bool):
                raise ValueError(f"limits of {name!r} have shape {shape!r}; "
                                 f"the schema says {list(leaves[name][1])}")
            size = math.prod(leaves[name][1])
            lo, hi = _parse_values(low, size, name, -math.inf), _parse_values(high, size, name, math.inf)
            if not (lo <= hi).all():
                raise ValueError(f"limits of {name!r} have a low bound above the high one")
            row = leaves[name][1]
            bounds[name] = Bounds(np.broadcast_to(lo.reshape(row) if lo.size != 1 else lo[0], row).copy(),
                                  np.broadcast_to(hi.reshape(row) if hi.size != 1 else hi[0], row).copy(), space, exact)
        return cls(bounds, math.inf if reward is None else float(reward))


def _uniform(b: Bounds) -> bool:
    return bool(b.low.size == 0 or ((b.low == b.low.flat[0]).all() and (b.high == b.high.flat[0]).all()))


def _wire_values(values: np.ndarray) -> float | list[float | None] | None:
    """One number for uniform bounds, else one per element; None stands for an infinite bound."""
    flat = [None if math.isinf(v) else float(v) for v in values.reshape(-1).tolist()]
    return flat[0] if flat and all(v == flat[0] for v in flat) else flat


def _parse_values(values: Any, size: int, name: str, unbounded: float) -> np.ndarray:
    items = values if isinstance(values, list) else [values]
    if (isinstance(values, list) and len(values) != size) or len(items) > MAX_WIRE_ELEMENTS:
        raise ValueError(f"limits of {name!r} have {len(items)} values for {size} elements")
    if any(v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v)) for v in items):
        raise ValueError(f"limits of {name!r} hold something other than numbers and nulls")
    return np.array([unbounded if v is None else float(v) for v in items], np.float64)
