"""Env info to the trainer: the ``info`` entries a pipeline declares (:class:`InfoKey`: name, dtype,
per-row shape, default), which a worker records from every env step as a column.

Row ``k`` holds ``info[name]`` from the call that returned row ``k``'s observation: a step's info
for a step row, the reset's info for a reset row (an episode's first observation). A vector env's
terminal row takes the info of the step that ended the episode (Gymnasium's ``final_info``), not
the reset's that came with it. A key missing from an info is the declared ``default`` where there
is one; without one, the worker stops with a ValueError that names the key and the call (``reset``
or ``step``), since a zero made up for it would train on a value the env never gave.

The columns travel as ``info/<name>`` (checked at the server and the trainer against the
trainer's declaration, as extra outputs are), memories store them as ``info/<name>`` columns, and
batches carry them as ``batch.extra["info/<name>"]``, the value at the row the transition ends at
(the info that came with ``next_obs``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

__all__ = ["MAX_INFO_KEYS", "InfoKey", "InfoSpec", "check_info_keys", "info_spec", "info_values",
           "store_info"]

MAX_INFO_KEYS = 16
# an extra output's or info key's name: a lowercase identifier of at most 32 characters
EXTRA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,31}")
InfoSpec = dict[str, tuple[tuple[int, ...], str]]  # name -> (per-row shape, numpy dtype string),
                                                   # an ExtraSpec's form


class InfoKey(NamedTuple):
    """One ``info`` entry a worker records per row: ``info[name]``, stored as ``dtype`` with the
    per-row ``shape``; ``default`` (None: none) stands in where an info lacks it."""

    name: str
    dtype: str = "float32"
    shape: tuple[int, ...] = ()
    default: float | int | bool | None = None


def check_info_keys(keys: Any, owner: str) -> tuple[InfoKey, ...]:
    """``keys`` (InfoKeys, or tuples or dicts of their fields) as InfoKeys with a canonical dtype;
    ValueError naming ``owner`` and the entry that is not a lowercase identifier of at most 32
    characters with a numeric or boolean dtype of at most 8 bytes, a shape of at most 8
    non-negative ints and a default its dtype holds, or that repeats a name."""
    if isinstance(keys, (str, bytes, Mapping)) or not hasattr(keys, "__iter__"):
        raise ValueError(f"{owner} must be a list of info keys (name, dtype, shape, default), "
                         f"e.g. [InfoKey('is_success', 'bool')] (got {keys!r:.80})")
    out: list[InfoKey] = []
    for entry in keys:
        key = _key(entry, owner)
        where = f"{owner} entry {key.name!r}"
        if not isinstance(key.name, str) or not EXTRA_NAME.fullmatch(key.name):
            raise ValueError(f"{owner} names an info key {key.name!r}: use a lowercase "
                             f"identifier of at most 32 characters ([a-z_][a-z0-9_]*), the "
                             f"key the env's info holds")
        try:
            dtype = np.dtype(key.dtype)
            shape = tuple(key.shape)
        except (TypeError, ValueError):
            raise ValueError(f"{where} has dtype {key.dtype!r} and shape {key.shape!r}: give "
                             f"a numpy dtype ('float32', 'int64', 'bool'...) and a tuple of "
                             f"ints") from None
        if dtype.kind not in "biuf" or dtype.itemsize > 8:
            raise ValueError(f"{where} has dtype {dtype}: the wire carries numbers and bools of "
                             f"at most 8 bytes (float32, int64, bool...)")
        if len(shape) > 8 or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"{where} has shape {key.shape!r}: at most 8 non-negative ints")
        if key.default is not None and not _holds(dtype, key.default):
            raise ValueError(f"{where} has the default {key.default!r}, which its dtype "
                             f"{dtype} cannot hold")
        if any(k.name == key.name for k in out):
            raise ValueError(f"{owner} names the info key {key.name!r} twice")
        out.append(InfoKey(key.name, dtype.name, shape, key.default))
    if len(out) > MAX_INFO_KEYS:
        raise ValueError(f"{owner} declares {len(out)} info keys; at most {MAX_INFO_KEYS}")
    return tuple(out)


def _key(entry: Any, owner: str) -> InfoKey:
    try:
        if isinstance(entry, Mapping):
            return InfoKey(**entry)
        return InfoKey(*entry) if not isinstance(entry, str) else InfoKey(entry)
    except TypeError:
        raise ValueError(f"{owner} entry {entry!r:.80} is not an info key: give "
                         f"{{'name': ..., 'dtype': ..., 'shape': [...], 'default': ...}} (all "
                         f"but name optional) or InfoKey(name, dtype, shape, default)") from None


def _holds(dtype: np.dtype[Any], value: Any) -> bool:
    if isinstance(value, bool) or dtype.kind == "b":
        return isinstance(value, bool) or (dtype.kind != "b" and value in (0, 1))
    if isinstance(value, int):
        return dtype.kind == "f" or np.iinfo(dtype).min <= value <= np.iinfo(dtype).max
    return isinstance(value, float) and dtype.kind == "f" and math.isfinite(value)


def info_spec(keys: tuple[InfoKey, ...]) -> InfoSpec:
    """The declaration as the wire's layout sees it: name -> (shape, dtype)."""
    return {k.name: (tuple(k.shape), k.dtype) for k in keys}


def info_values(keys: tuple[InfoKey, ...], info: Any, call: str) -> dict[str, Any]:
    """The declared entries of ``info`` (what ``call``, "reset" or "step", returned), defaults
    where it lacks them; ValueError naming a missing key that has no default."""
    have = info if isinstance(info, Mapping) else {}
    out: dict[str, Any] = {}
    for key in keys:
        value = have.get(key.name, key.default)
        if value is None:
            raise ValueError(f"the env's {call}() returned an info without {key.name!r}, an info "
                             f"key the pipeline declares (its info holds {sorted(have)[:8]}): "
                             f"return it from every {call}(), or declare a default, e.g. "
                             f"InfoKey({key.name!r}, {key.dtype!r}, default=0)")
        out[key.name] = value
    return out


def store_info(cols: dict[str, np.ndarray], i: int, info: Mapping[str, Any] | None) -> None:
    """Row ``i`` of the info columns ``cols`` (name -> column): ``info``'s values, exactly the
    declared ones (None: zeros); ValueError naming an entry of another shape, or of a kind its
    column cannot hold as it is (numpy would broadcast a scalar, truncate a float into an int, or
    wrap an int)."""
    if info is not None and info.keys() != cols.keys():
        raise ValueError(f"a row's info entries {sorted(info)} differ from the info keys "
                         f"declared ({sorted(cols)})")
    for name, col in cols.items():
        if info is None:
            col[i] = 0
            continue
        value = np.asarray(info[name])
        want = col.dtype
        fits = (np.can_cast(value.dtype, want, "same_kind")
                or (value.dtype.kind in "biu" and want.kind in "iu"))
        if fits and want.kind in "iu" and value.dtype.kind in "biu" and value.size:
            fits = np.iinfo(want).min <= int(value.min()) and int(value.max()) <= np.iinfo(want).max
        if value.shape != col.shape[1:] or not fits:
            raise ValueError(f"info[{name!r}] is {value.dtype} {value.shape} "
                             f"({value.ravel()[:4]!r:.60}) in a row; the pipeline declares it "
                             f"{want} {col.shape[1:]}: make the env return that, or declare what "
                             f"it returns")
        col[i] = value
