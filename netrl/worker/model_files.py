"""The worker's weight files: the newest policy at ``model_path`` (loaded at start), and its history."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import torch

from netrl.errors import CheckpointError
from netrl.protocol.weights import check_weights, load_weights
from netrl.storage.weight_files import read_weights_file, write_weights_file

__all__ = ["load_model_file", "save_model_file"]

log = logging.getLogger(__name__)


def load_model_file(path: str, actor: torch.nn.Module, standalone: bool) -> int | None:
    """Load the weights saved at ``path`` into ``actor``; their version, or None when they were ignored (a file that
    cannot be read, or does not fit the actor: the server sends the current weights). A standalone worker has no
    other weights, so a file it cannot read raises CheckpointError."""
    try:
        state, meta = read_weights_file(path)
    except CheckpointError as exc:  # e.g. truncated by a power cut while it was being saved
        if standalone:  # its only weights: running the actor untrained instead would go unnoticed
            raise CheckpointError(f"{exc}: this standalone worker runs the weights in it; copy the trainer's "
                                  "policy.pt (and its .json) there again, or delete it to run untrained") from None
        log.warning("ignoring %s, which cannot be read (%s): the server sends the current weights once this worker "
                    "is connected, and they replace the file", path, exc)
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
    """Save weights (an actor or its state_dict) with their version and the trainer session that made them."""
    write_weights_file(path, module, {"version": version, "trainer_session": session, "saved_at": time.time()})
