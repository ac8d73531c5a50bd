"""Trainer checkpoints under ``<run_dir>/checkpoint/``: tensors in a torch file, everything else in JSON.

::

    checkpoint/agent_000007.pt      agent.state_dict(): model, target networks, optimisers, entropy coefficient
    checkpoint/state_000007.json    counters, weight version, sample-log position, delivery state, config
    checkpoint/CURRENT              {"number": 7}: the newest complete checkpoint
    checkpoint/PUBLISHED            {"version": 93}: the newest weight version this run has sent out

A checkpoint is written file by file and becomes current only when ``CURRENT`` is atomically replaced, so a crash
mid-save leaves the previous checkpoint intact. Tensors are loaded with ``torch.load(weights_only=True)``; nothing is
pickled. The replay memory itself is rebuilt from the trainer's sample log (see :mod:`netrl.delivery`).

``PUBLISHED`` is replaced before each weight version leaves the trainer, so a restarted trainer numbers after every
version a worker or the server may still hold, even when the server restarted too and forgot them.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from netrl.errors import CheckpointError
from netrl.weights import torch_save

__all__ = ["exists", "load_checkpoint", "load_state", "published_version", "record_published", "save_checkpoint"]

log = logging.getLogger(__name__)

FORMAT = 1


def _dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoint"


def _replace(tmp: Path, dest: Path, fsync: bool) -> None:
    if fsync:
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
    os.replace(tmp, dest)


def exists(run_dir: Path) -> bool:
    return (_dir(run_dir) / "CURRENT").exists()


def save_checkpoint(run_dir: Path, agent_state: dict[str, Any], state: dict[str, Any], fsync: bool = False) -> Path:
    """Write a new checkpoint and make it current; returns the state file's path."""
    folder = _dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    number = _current(folder) + 1
    agent_file, state_file = folder / f"agent_{number:06d}.pt", folder / f"state_{number:06d}.json"
    torch_save(agent_state, folder / "agent.tmp")
    _replace(folder / "agent.tmp", agent_file, fsync)
    (folder / "state.tmp").write_text(json.dumps({**state, "format": FORMAT, "agent_file": agent_file.name}))
    _replace(folder / "state.tmp", state_file, fsync)
    (folder / "CURRENT.tmp").write_text(json.dumps({"number": number}))
    _replace(folder / "CURRENT.tmp", folder / "CURRENT", fsync)
    for old in list(folder.glob("agent_*.pt")) + list(folder.glob("state_*.json")):
        if int(old.stem.split("_")[1]) < number - 1:  # keep the previous one too, in case this one is damaged
            old.unlink()
    return state_file


def record_published(run_dir: Path, version: int, fsync: bool = False) -> None:
    """Note ``version`` as the newest this run has published (before it is sent). Raises OSError."""
    folder = _dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "PUBLISHED.tmp").write_text(json.dumps({"version": version}))
    _replace(folder / "PUBLISHED.tmp", folder / "PUBLISHED", fsync)


def published_version(run_dir: Path) -> int:
    """The newest weight version this run has published, or 0 when none is noted.

    Raises:
        CheckpointError: the note is unreadable.
    """
    path = _dir(run_dir) / "PUBLISHED"
    try:
        return int(json.loads(path.read_text())["version"])
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is unreadable ({exc}); it holds the newest weight version this run sent "
                              "out. If no server or worker still holds this run's weights, remove it: versions then "
                              "continue after the checkpoint's and the sample log's newest") from None


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
        raise CheckpointError(f"{why}, and {folder} holds no complete checkpoint: remove {pointer} to start this "
                              "run afresh (the sample log is kept and replayed)") from None
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


def _load_state(folder: Path) -> tuple[int, dict[str, Any]] | None:
    number = _current(folder)
    if number == 0:
        return None
    state_file = folder / f"state_{number:06d}.json"
    try:
        state: dict[str, Any] = json.loads(state_file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {state_file}: {exc}") from None
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{state_file} has format {state.get('format')!r}; this netrl reads format {FORMAT}")
    return number, state


def load_state(run_dir: Path) -> dict[str, Any] | None:
    """The current checkpoint's state (counters, epoch, config...) without its tensors, or None when there is none.

    Raises:
        CheckpointError: the state file is unreadable or from an incompatible format.
    """
    got = _load_state(_dir(run_dir))
    return got[1] if got is not None else None


def load_checkpoint(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(agent_state, state) of the current checkpoint, or None when there is none.

    Raises:
        CheckpointError: the checkpoint is torn, unreadable or from an incompatible format.
    """
    folder = _dir(run_dir)
    got = _load_state(folder)
    if got is None:
        return None
    number, state = got
    agent_file = folder / state["agent_file"]
    try:
        agent_state = torch.load(agent_file, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read {agent_file}: {exc}") from None
    log.info("loaded checkpoint %d from %s (epoch %d, %d training steps, weights v%d)", number, folder,
             state["epoch"], state["total_updates"], state["version"])
    return agent_state, state
