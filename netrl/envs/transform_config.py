"""``env.transforms`` in config.json: a list of transforms, each an object with its TorchRL class
name and its options, applied in order around every env of the pipeline
(:mod:`netrl.envs.transforms`)::

    "env": {"transforms": [{"name": "GrayScale"}, {"name": "Resize", "w": 84, "h": 84},
                           {"name": "FrameSkipTransform", "frame_skip": 4},
                           {"name": "RewardClipping", "clamp_min": -1, "clamp_max": 1},
                           {"name": "ObservationNorm"}]}

An ``ObservationNorm`` without ``loc`` and ``scale`` is the running statistics the trainer
learns and syncs to the workers (``env.normalize_obs``, which it turns on): applied where
observations are used (the worker's act, the trainer's batches) rather than to what the memory
stores, so it must come after every transform that changes observations. Imports nothing heavy
until a list is given.
"""

from __future__ import annotations

import difflib
import inspect
import json
from collections.abc import Callable
from functools import partial
from typing import Any

__all__ = ["compose_from_config", "synced_obs_norm", "transform_problems", "transformed"]

KEY = "env.transforms"
OBS_CHANGING = ("Resize", "GrayScale", "ObservationNorm")


def _classes() -> dict[str, type]:
    from netrl.envs import transforms as t

    return {c.__name__: c for c in (t.Resize, t.GrayScale, t.FrameSkipTransform, t.RewardScaling,
                                     t.RewardClipping, t.ObservationNorm, t.StepCounter)}


def _is_synced(entry: Any) -> bool:
    return (isinstance(entry, dict) and entry.get("name") == "ObservationNorm"
            and "loc" not in entry and "scale" not in entry)


def synced_obs_norm(entries: Any) -> bool:
    """Whether ``entries`` hold an ObservationNorm of the synced statistics (no loc, no scale)."""
    return isinstance(entries, list) and any(_is_synced(e) for e in entries)


def _entry_problem(i: int, entry: Any, classes: dict[str, type]) -> str | None:
    if not isinstance(entry, dict):
        return (f'entry {i} must be an object such as {{"name": "Resize", "w": 84}} '
                f"(got {json.dumps(entry)})")
    name = entry.get("name")
    if not isinstance(name, str) or name not in classes:
        close = difflib.get_close_matches(str(name), classes, n=1)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        return (f"entry {i} names the transform {json.dumps(name)}, which netrl does not "
                f"have{hint}: one of {', '.join(classes)}")
    options = {k: v for k, v in entry.items() if k != "name"}
    if _is_synced(entry):
        if options:
            return (f"entry {i} (ObservationNorm without loc and scale: the synced statistics of "
                    f"env.normalize_obs) takes no options (got {', '.join(sorted(options))}); "
                    f"its clip is env.normalize_obs_clip")
        return None
    params = [p for p in inspect.signature(classes[name]).parameters if p != "self"]
    unknown = sorted(set(options) - set(params))
    if unknown:
        return (f"entry {i} ({name}) has no option {', '.join(unknown)} (its options: "
                f"{', '.join(params)})")
    try:
        classes[name](**options)
    except (TypeError, ValueError) as exc:
        return f"entry {i} ({name}): {exc}"
    return None


def transform_problems(entries: list[Any]) -> list[str]:
    """What is wrong with the ``env.transforms`` list, each naming its entry (1-based)."""
    if not entries:
        return []
    classes = _classes()
    problems = [p for i, e in enumerate(entries, 1)
                if (p := _entry_problem(i, e, classes)) is not None]
    synced = [i for i, e in enumerate(entries, 1) if _is_synced(e)]
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


def compose_from_config(entries: list[dict[str, Any]]) -> Any:
    """The :class:`~netrl.envs.transforms.Compose` of ``env.transforms`` (the synced
    ObservationNorm left out: env.normalize_obs applies it), or None when there is nothing to
    apply around the env. ValueError naming every bad entry."""
    problems = transform_problems(entries)
    if problems:
        raise ValueError(f"{KEY}: {'; '.join(problems)}")
    from netrl.envs.transforms import Compose

    classes = _classes()
    built = [classes[e["name"]](**{k: v for k, v in e.items() if k != "name"})
             for e in entries if not _is_synced(e)]
    return Compose(*built) if built else None


def _make(env_cls: Callable[[], Any], transform: Any) -> Any:
    return transform.wrap(env_cls())


def transformed(env_cls: Callable[[], Any], transform: Any) -> Callable[[], Any]:
    """An env class whose envs are ``env_cls()``'s seen through ``transform`` (a copy each)."""
    return partial(_make, env_cls, transform)
