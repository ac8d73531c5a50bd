"""``env.transforms`` in config.json, and the options of every transform, checked without
importing Gymnasium (the server checks the config too). The transforms are in
:mod:`netrl.envs.transforms`; each entry is an object with a TorchRL class name and its options,
applied in order around every env of the pipeline::

    "env": {"transforms": [{"name": "GrayScale"}, {"name": "Resize", "w": 84, "h": 84},
                           {"name": "FrameSkipTransform", "frame_skip": 4},
                           {"name": "RewardClipping", "clamp_min": -1, "clamp_max": 1},
                           {"name": "ObservationNorm"}]}

An ``ObservationNorm`` without ``loc`` and ``scale`` is the running statistics the trainer
learns and syncs to the workers (``env.normalize_obs``, which it turns on): applied where
observations are used (the worker's act, the trainer's batches) rather than to what the memory
stores, so it must come after every transform that changes observations.
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
from collections.abc import Callable
from typing import Any

__all__ = ["OPTIONS", "check_options", "is_synced", "synced_obs_norm", "transform_problems"]

Check = Callable[[Any], "str | None"]


def _int(lo: int | None = None, hi: int | None = None) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, numbers.Integral) or isinstance(v, bool):
            ok = False
        else:
            ok = (lo is None or int(v) >= lo) and (hi is None or int(v) <= hi)
        if ok:
            return None
        if lo is not None and hi is not None:
            return f"an integer from {lo} to {hi}"
        return "an integer" + (f" >= {lo}" if lo is not None else "")
    return check


def _number(v: Any) -> str | None:
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
    return None if ok else "a finite number"


def _nonzero(v: Any) -> str | None:
    return _number(v) or (None if v != 0 else "a finite number other than 0")


def _numbers(nonzero: bool) -> Check:
    """A finite number or nested lists of them (an array that broadcasts to a leaf)."""
    def check(v: Any) -> str | None:
        if isinstance(v, (list, tuple)):
            return next((p for p in map(check, v) if p), None) if v else "not an empty list"
        return (_nonzero if nonzero else _number)(v)
    return check


def _optional(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _keys(v: Any) -> str | None:
    ok = v is None or (isinstance(v, (list, tuple)) and v
                       and all(isinstance(k, str) and k.startswith("obs") for k in v))
    return None if ok else 'null or a list of observation leaf names ("obs", "obs/0"...)'


def _permutation(v: Any) -> str | None:
    ok = isinstance(v, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool)
                                              for d in v) \
        and sorted(v) == list(range(-len(v), 0)) and len(v) >= 1
    return None if ok else "a reordering of -n ... -1, such as [-1, -3, -2]"


def _interpolation(v: Any) -> str | None:
    return None if v in ("bilinear", "nearest", "area") else '"bilinear", "nearest" or "area"'


# each transform's options (as its class takes them) and what each must be; the required ones
OPTIONS: dict[str, dict[str, Check]] = {
    "Resize": {"w": _int(1, 65536), "h": _optional(_int(1, 65536)),
               "interpolation": _interpolation, "in_keys": _keys},
    "PermuteTransform": {"dims": _permutation, "in_keys": _keys},
    "GrayScale": {"in_keys": _keys},
    "CatFrames": {"N": _int(1, 1024), "dim": _int(-32, -1), "in_keys": _keys},
    "FrameSkipTransform": {"frame_skip": _int(1, 10_000)},
    "RewardScaling": {"loc": _number, "scale": _nonzero, "standard_normal": _boolean},
    "RewardClipping": {"clamp_min": _optional(_number), "clamp_max": _optional(_number)},
    "ObservationNorm": {"loc": _numbers(False), "scale": _numbers(True),
                        "standard_normal": _boolean, "in_keys": _keys},
    "StepCounter": {"max_steps": _optional(_int(1))},
}
REQUIRED = {"Resize": ("w",), "CatFrames": ("N",), "PermuteTransform": ("dims",)}
OBS_CHANGING = ("Resize", "PermuteTransform", "GrayScale", "CatFrames", "ObservationNorm")


def check_options(name: str, options: dict[str, Any]) -> list[str]:
    """What is wrong with ``options`` for the transform ``name`` (a known one)."""
    known = OPTIONS[name]
    problems = [f"has no option {k} (its options: {', '.join(known)})"
                for k in sorted(set(options) - set(known))]
    problems += [f"needs the option {k}" for k in REQUIRED.get(name, ()) if k not in options]
    for k, v in options.items():
        what = known[k](v) if k in known else None
        if what:
            problems.append(f"{k} must be {what} (got {json.dumps(v, default=repr)})")
    lo, hi = options.get("clamp_min"), options.get("clamp_max")
    if name == "RewardClipping" and not problems and lo is not None and hi is not None and lo > hi:
        problems.append(f"clamp_min must be <= clamp_max (got {lo}, {hi})")
    return problems


def is_synced(entry: Any) -> bool:
    """Whether ``entry`` is an ObservationNorm of the synced statistics (no loc, no scale)."""
    return (isinstance(entry, dict) and entry.get("name") == "ObservationNorm"
            and "loc" not in entry and "scale" not in entry)


def synced_obs_norm(entries: Any) -> bool:
    """Whether ``entries`` hold an ObservationNorm of the synced statistics."""
    return isinstance(entries, list) and any(is_synced(e) for e in entries)


def _entry_problem(i: int, entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return (f'entry {i} must be an object such as {{"name": "Resize", "w": 84}} '
                f"(got {json.dumps(entry)})")
    name = entry.get("name")
    if not isinstance(name, str) or name not in OPTIONS:
        close = difflib.get_close_matches(str(name), OPTIONS, n=1)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        return (f"entry {i} names the transform {json.dumps(name)}, which netrl does not "
                f"have{hint}: one of {', '.join(OPTIONS)}")
    options = {k: v for k, v in entry.items() if k != "name"}
    if is_synced(entry):
        if options:
            return (f"entry {i} (ObservationNorm without loc and scale: the synced statistics of "
                    f"env.normalize_obs) takes no options (got {', '.join(sorted(options))}); "
                    f"its clip is env.normalize_obs_clip")
        return None
    problems = check_options(name, options)
    return f"entry {i} ({name}) {'; '.join(problems)}" if problems else None


def transform_problems(entries: list[Any]) -> list[str]:
    """What is wrong with the ``env.transforms`` list, each naming its entry (1-based)."""
    problems = [p for i, e in enumerate(entries, 1) if (p := _entry_problem(i, e)) is not None]
    synced = [i for i, e in enumerate(entries, 1) if is_synced(e)]
    if len(synced) > 1:
        problems.append(f"entries {', '.join(map(str, synced))} are each an ObservationNorm of "
                        f"the synced statistics: give one")
    elif synced:
        later = [f"{i} ({e['name']})" for i, e in enumerate(entries, 1)
                 if i > synced[0] and isinstance(e, dict) and e.get("name") in OBS_CHANGING]
        if later:
            problems.append(f"entry {synced[0]} (ObservationNorm of the synced statistics) is "
                            f"applied to the observations as they are used, after every "
                            f"transform, but entries {', '.join(later)} change them after it: "
                            f"move it to the end")
    return problems
