"""The worker's weight files: the newest policy at ``model_path`` (loaded at
start), and its history."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from netrl.errors import CheckpointError
from netrl.protocol.weights import check_weights, load_weights
from netrl.storage.weight_files import read_weights_file, remove_stale_temps, write_weights_file

__all__ = ["ModelFiles", "load_model_file", "save_model_file"]

log = logging.getLogger(__name__)
worker_log = logging.getLogger("netrl.worker.worker")  # the worker's own lines, under its logger


def load_model_file(path: str, actor: torch.nn.Module, standalone: bool) -> int | None:
    """Load the weights saved at ``path`` into ``actor``; their version, or None when they
    were ignored (a file that cannot be read, or does not fit the actor: the server sends
    the current weights). A standalone worker has no other weights, so a file it cannot
    read raises CheckpointError."""
    try:
        state, meta = read_weights_file(path)
    except CheckpointError as exc:  # e.g. truncated by a power cut while it was being saved
        if standalone:  # its only weights: running the actor untrained instead would go unnoticed
            raise CheckpointError(f"{exc}: this standalone worker runs the weights in "
                                  f"it; copy the trainer's policy.pt (and its .json) "
                                  f"there again, or delete it to run untrained") from None
        log.warning("ignoring %s, which cannot be read (%s): the server sends the current "
                    "weights once this worker is connected, and they replace the file", path, exc)
        return None
    problems = check_weights(actor, state)
    if problems:
        log.warning("ignoring %s, which does not fit this actor: %s", path, "; ".join(problems[:3]))
        return None
    load_weights(actor, state)
    version = int(meta.get("version", -1))
    log.info("loaded policy v%d from %s", version, path)
    return version


def save_model_file(path: str, module: torch.nn.Module | Mapping[str, torch.Tensor], version: int,
                    session: str) -> None:
    """Save weights (an actor or its state_dict) with their version and the trainer
    session that made them."""
    write_weights_file(path, module, {"version": version, "trainer_session": session, "saved_at": time.time()})


class ModelFiles:
    """A worker's weight files: the newest version at ``path`` (None: none kept), and every
    ``every``-th received one as ``<history>_v000123.pt`` (0: none)."""

    def __init__(self, path: str | None, history: str | None, every: int) -> None:
        self.path, self.history, self.every = path, history, every
        self._saved = 0  # versions saved so far

    def load(self, actor: torch.nn.Module, standalone: bool) -> int | None:
        """At start: the weights at ``path`` loaded into ``actor``; their version, or None (see
        :func:`load_model_file`). Clears what a worker killed while saving left."""
        for folder in {Path(p).parent for p in (self.path, self.history) if p}:
            remove_stale_temps(folder)
        if self.path and Path(self.path).exists():
            return load_model_file(self.path, actor, standalone)
        # deployment with a mistyped path would run an untrained policy
        if standalone and self.path:
            worker_log.warning("%s does not exist: this standalone worker "
                               "runs its actor as initialised, untrained",
                        self.path)
        return None

    def save(self, module: torch.nn.Module | Mapping[str, torch.Tensor], version: int, session: str) -> None:
        """Keep the newest weights (an actor or its state_dict), and every
        N-th in the history. The worker calls it on a thread of its own
        (see :class:`~netrl.worker.weight_receiver.WeightReceiver`)."""
        if not self.path:
            return
        save_model_file(self.path, module, version, session)
        self._saved += 1
        if self.every and self.history and self._saved % self.every == 0:
            save_model_file(f"{self.history}_v{version:06d}.pt", module, version, session)
