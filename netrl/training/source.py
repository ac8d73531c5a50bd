"""SampleSource: what the training loop talks to, to get samples and to send weights.

The networked Trainer's link to the server is one (:mod:`netrl.trainer.link`); so is, for the
single-process baseline, a local worker (:mod:`netrl.local`). Beyond these methods, the loop uses
what a source has of ``publish(..., model=name)`` (further models), ``taken_model_version(name)``
and ``announce(...)`` (sync collection), and does without what it lacks.
"""

from __future__ import annotations

from typing import Protocol

import torch

from netrl.samples.columns import Buffer

__all__ = ["SampleSource"]


class SampleSource(Protocol):
    """Where the training loop gets samples and sends weights."""

    def fetch(self) -> list[Buffer]:
        """Every packet received since the last call (never blocks)."""

    def wait(self, timeout: float) -> None:
        """Block until new packets may be available, at most ``timeout`` seconds."""

    def publish(self, actor: torch.nn.Module, version: int, trained_steps: int) -> None:
        """Send the actor's weights as ``version``."""

    def progress(self, trained_steps: int, samples: int, wanted: int) -> None:
        """Tell the workers' pacing how many samples the trainer wants in total."""

    def taken_version(self) -> int:
        """The newest weight version that may hold other weights than this loop's (e.g. an
        earlier trainer session's, still with the server and the workers), or -1. The loop
        numbers its versions after it."""
