"""The torch threads a Trainer or a RolloutWorker runs with (internal): ``python -m netrl``'s
``torch_threads``, applied by the classes too, as the role starts."""

from __future__ import annotations

import logging

import torch

__all__ = ["apply_torch_threads"]

log = logging.getLogger(__name__)


def apply_torch_threads(threads: int | None, who: str) -> None:
    """``torch.set_num_threads(threads)`` for the role ``who`` as it starts, logged (None:
    torch's setting stays). The setting is the process's: the last role started in a
    process sets it for all."""
    if threads is None:
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    log.info("%s: torch uses %d thread%s (torch_threads%s)",
             who, threads, "" if threads == 1 else "s",
             "" if before == threads else f"; torch had {before}")
