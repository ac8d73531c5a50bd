"""Trainer checkpoints under ``<run_dir>/checkpoint/``: tensors in a torch
file, everything else in JSON.

::

    checkpoint/agent_000007.pt      agent.state_dict(): model, target networks, optimisers, entropy
                                    coefficient
    checkpoint/state_000007.json    counters, weight version, sample-log position, delivery state,
                                    config
    checkpoint/CURRENT              {"number": 7}: the newest complete checkpoint
    checkpoint/PUBLISHED            {"version": 93, "models": {"obs_norm": 12}}: the newest weight
                                    version this run has sent out, and that of each further model
                                    (netrl.protocol.models)

A checkpoint is written file by file and becomes current only when ``CURRENT`` is atomically
replaced, so a crash mid-save leaves the previous checkpoint intact. Tensors are loaded with
``torch.load(weights_only=True)``; nothing is pickled. The replay memory itself is rebuilt from the
trainer's sample log (see :mod:`netrl.trainer.delivery`).

``PUBLISHED`` is replaced before each weight version leaves the trainer, so a restarted trainer
numbers after every version a worker or the server may still hold, even when the server
restarted too and forgot them.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from netrl.errors import CheckpointError
from netrl.storage.folderlock import sync_folder
from netrl.storage.weight_files import torch_load, torch_save

__all__ = ["exists", "load_checkpoint", "load_state", "nonfinite_entries", "published_models", "published_version",
           "record_published",
           "save_checkpoint"]

log = logging.getLogger(__name__)

FORMAT = 1


def _dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoint"


def _replace(tmp: Path, dest: Path, fsync: bool) -> None:
    if fsync:
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
    os.replace(tmp, dest)
    if fsync:  # the new name, too
        sync_folder(dest.parent)


def exists(run_dir: Path) -> bool:
    return (_dir(run_dir) / "CURRENT").exists()


def nonfinite_entries(state: Any, prefix: str = "") -> list[str]:
    """Key paths of the floating-point tensors in a nested dict/list ``state`` that
    hold a NaN or an infinity."""
    if isinstance(state, torch.Tensor):
        finite = not (state.is_floating_point() or state.is_complex()) or bool(torch.isfinite(state).all())
        return [] if finite else [prefix or "(the tensor)"]
    if isinstance(state, dict):
        return [p for k, v in state.items() for p in nonfinite_entries(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(state, (list, tuple)):
        return [p for i, v in enumerate(state) for p in nonfinite_entries(v, f"{prefix}[{i}]")]
    return []


def _named(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def save_checkpoint(run_dir: Path, agent_state: dict[str, Any], state: dict[str, Any], fsync: bool = False) -> Path:
    """Write a new checkpoint and make it current; returns the state file's path.

    Raises:
        CheckpointError: the agent's state holds a NaN or an infinity (nothing is written: a restart
            would resume from the poison).
    """
    bad = nonfinite_entries(agent_state)
    if bad:
        raise CheckpointError(f"not saving a checkpoint: the agent's {_named(bad)} hold NaN or "
                              f"infinity; the previous checkpoint in {_dir(run_dir)} is "
                              f"intact, and a restarted trainer resumes from it")
    folder = _dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    number = _current(folder) + 1
    agent_file, state_file = folder / f"agent_{number:06d}.pt", folder / f"state_{number:06d}.json"
    torch_save(agent_state, folder / "agent.tmp")
    _replace(folder / "agent.tmp", agent_file, fsync)
    (folder / "state.tmp").write_text(json.dumps({**state, "format": FORMAT, "agent_file": agent_file.name}))
    _replace(folder / "state.tmp", state_file, fsync)
    _set_current(folder, number, fsync)
    for old in list(folder.glob("agent_*.pt")) + list(folder.glob("state_*.json")):
        # keep the previous one too, in case this one is damaged
        if int(old.stem.split("_")[1]) < number - 1:
            old.unlink()
    return state_file


def _set_current(folder: Path, number: int, fsync: bool = False) -> None:
    (folder / "CURRENT.tmp").write_text(json.dumps({"number": number}))
    _replace(folder / "CURRENT.tmp", folder / "CURRENT", fsync)


def record_published(run_dir: Path, version: int, fsync: bool = False, models: dict[str, int] | None = None) -> None:
    """Note ``version`` as the newest this run has published (before it is sent), and ``models``'
    newest versions of the further models (each one's own counter). Raises OSError."""
    folder = _dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "PUBLISHED.tmp").write_text(json.dumps({"version": version, **({"models": models} if models else {})}))
    _replace(folder / "PUBLISHED.tmp", folder / "PUBLISHED", fsync)


def published_version(run_dir: Path) -> int:
    """The newest weight version this run has published, or 0 when none is noted.

    Raises:
        CheckpointError: the note is unreadable.
    """
    return _published(run_dir)[0]


def published_models(run_dir: Path) -> dict[str, int]:
    """The newest version this run has published of each further model ({} when
    none is noted, as in a note an older netrl wrote). Raises CheckpointError when
    the note is unreadable."""
    return _published(run_dir)[1]


def _published(run_dir: Path) -> tuple[int, dict[str, int]]:
    path = _dir(run_dir) / "PUBLISHED"
    try:
        note = json.loads(path.read_text())
        return int(note["version"]), {str(k): int(v) for k, v in note.get("models", {}).items()}
    except FileNotFoundError:
        return 0, {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path} is unreadable ({exc}); it holds the newest weight "
                              f"version this run sent out. If no server or worker still "
                              f"holds this run's weights, remove it: versions then continue "
                              f"after the checkpoint's and the sample log's newest") from None


def _current(folder: Path) -> int:
    pointer = folder / "CURRENT"
    if not pointer.exists():
        return 0
    try:
        return int(json.loads(pointer.read_text())["number"])
    except (ValueError, KeyError, TypeError) as exc:
        why = f"{pointer} is unreadable ({exc})"
    numbers = _complete(folder)
    if not numbers:
        raise CheckpointError(f"{why}, and {folder} holds no complete checkpoint: "
                              f"remove {pointer} to start this run afresh (the "
                              f"sample log is kept and replayed)") from None
    log.warning("%s: using checkpoint %d, the newest whose files are all there", why, numbers[-1])
    return numbers[-1]


def _complete(folder: Path) -> list[int]:
    """Numbers of the checkpoints whose state and agent files are both present, oldest first."""
    numbers = []
    for state in folder.glob("state_*.json"):
        number = state.stem.removeprefix("state_")
        if number.isdigit() and (folder / f"agent_{number}.pt").exists():
            numbers.append(int(number))
    return sorted(numbers)


class _Unreadable(CheckpointError):
    """A checkpoint file that cannot be read: damaged, so an older checkpoint
    may stand in for it."""


def _read(folder: Path, number: int, tensors: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(agent_state, state) of checkpoint ``number``; agent_state is {} unless ``tensors``."""
    state_file = folder / f"state_{number:06d}.json"
    try:
        state: dict[str, Any] = json.loads(state_file.read_text())
    except (OSError, ValueError) as exc:
        raise _Unreadable(f"cannot read {state_file}: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{state_file} has format {found!r}; "
                              f"this netrl reads format {FORMAT}")
    if not tensors:
        return {}, state
    try:
        agent_state = torch_load(folder / str(state.get("agent_file")))
    except CheckpointError as exc:
        raise _Unreadable(str(exc)) from None
    bad = nonfinite_entries(agent_state)
    if bad:  # an older netrl saved poisoned training; the one before may be healthy
        raise _Unreadable(f"checkpoint {number} holds NaN or infinity in the agent's {_named(bad)}")
    return agent_state, state


def _load(run_dir: Path, tensors: bool) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
    """(number, agent_state, state) of the current checkpoint, or of the newest older one that
    reads when the current one is damaged (save_checkpoint keeps the previous checkpoint for
    this); None when there is none."""
    folder = _dir(run_dir)
    number = _current(folder)
    if number == 0:
        return None
    try:
        return number, *_read(folder, number, tensors)
    except _Unreadable as exc:
        damaged = str(exc)
    for older in reversed([n for n in _complete(folder) if n < number]):
        try:
            got = _read(folder, older, tensors)
        except _Unreadable:
            continue
        log.warning("%s: resuming from checkpoint %d, the one before "
                    "it; the training since then is done again",
                    damaged, older)
        # the trainer resumes from it: the next save replaces the damaged one, and keeps this one
        if tensors:
            try:
                _set_current(folder, older)
            except OSError as exc:
                log.warning("could not make checkpoint %d current in %s (%s): the next save keeps "
                            "the damaged checkpoint as the one before it", older, folder, exc)
        return older, *got
    raise CheckpointError(f"{damaged}, and no older checkpoint in {folder} reads "
                          f"either: remove {folder / 'CURRENT'} to start this "
                          f"run afresh (the sample log is kept and replayed)")


def load_state(run_dir: Path) -> dict[str, Any] | None:
    """The current checkpoint's state (counters, epoch, config...) without its tensors, or
    None when there is none.

    Raises:
        CheckpointError: no checkpoint's state reads, or it is from an incompatible format.
    """
    got = _load(run_dir, tensors=False)
    return got[2] if got is not None else None


def load_checkpoint(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(agent_state, state) of the current checkpoint (or the previous one, with a warning, when the
    current one is damaged), or None when there is none.

    Raises:
        CheckpointError: no checkpoint reads, or it is from an incompatible format.
    """
    got = _load(run_dir, tensors=True)
    if got is None:
        return None
    number, agent_state, state = got
    log.info("loaded checkpoint %d from %s (epoch %d, %d training steps, weights v%d)",
             number, _dir(run_dir),
             state["epoch"], state["total_updates"], state["version"])
    return agent_state, state
