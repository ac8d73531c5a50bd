"""Synchronous, version-synced collection (``trainer.collection: sync``): the trainer's half.

Calling sequence, one iteration per batch (the loop's ``_sync_step``; packets go in through
:mod:`netrl.training.ingest`, versions out through :mod:`netrl.training.publish`)::

    publish v (the weights carry the announcement: sync, rollout_fragment_length, batch_mode)
    ingest packets: transitions of version v go into the RolloutMemory; others are late
        (counted, logged, left out)
    until the memory holds frames_per_batch transitions, or sync_timeout_s passed with some:
        the shortfall is logged
    agent.train(memory.sample())   # once: the agent runs its epochs and minibatches inside
    memory.clear(); publish v + 1

Each worker collects ``rollout_fragment_length`` steps per env under the newest version it
holds, sends them and waits for a newer version (:mod:`netrl.worker.runners.sync`). The RL half:
nothing here imports the network.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any, Literal

import numpy as np

from netrl.samples.columns import Buffer
from netrl.util import worth_logging

__all__ = ["BATCH_MODES", "BatchMode", "SyncBatches", "check_sync"]

log = logging.getLogger(__name__)

BatchMode = Literal["truncate_episodes", "complete_episodes"]
BATCH_MODES = ("truncate_episodes", "complete_episodes")


def check_sync(frames_per_batch: int, rollout_fragment_length: int, batch_mode: str, sync_timeout_s: float) -> None:
    """Raise ValueError naming every setting of sync collection that is out of range."""
    problems = [f"{name} must be an integer >= 1 (got {value!r})"
                for name, value in (("frames_per_batch", frames_per_batch),
                                    ("rollout_fragment_length", rollout_fragment_length))
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1]
    if batch_mode not in BATCH_MODES:
        problems.append(f"batch_mode must be one of {', '.join(BATCH_MODES)} (got {batch_mode!r})")
    if not (isinstance(sync_timeout_s, (int, float)) and sync_timeout_s > 0):
        problems.append(f"sync_timeout_s must be > 0 (got {sync_timeout_s!r})")
    if problems:
        raise ValueError("sync collection: " + "; ".join(problems))


class SyncBatches:
    """The batch under collection: which version it takes, what arrived from whom, and the waits."""

    def __init__(self, frames_per_batch: int, rollout_fragment_length: int, batch_mode: BatchMode,
                 sync_timeout_s: float) -> None:
        check_sync(frames_per_batch, rollout_fragment_length, batch_mode, sync_timeout_s)
        self.frames_per_batch, self.fragment = int(frames_per_batch), int(rollout_fragment_length)
        self.batch_mode: BatchMode = batch_mode
        self.timeout_s = float(sync_timeout_s)
        self.version = -1  # the version this batch takes (-1: none published yet)
        self.opened = time.monotonic()
        self.steps = 0  # transitions of this batch stored so far
        self.late_samples = 0  # in all: transitions of another version, never trained on
        self.late_by_worker: Counter[str] = Counter()
        self.delivered: dict[str, float] = {}  # worker -> when its newest transition of this
                                               # batch arrived
        self.previous: dict[str, float] = {}  # the workers of the batch before, and when their
                                              # last rows arrived
        self.trainer_wait_s = 0.0  # the newest iteration's wait for samples
        self.worker_wait_s = 0.0  # the newest iteration's mean wait of the workers for
                                  # weights, as seen here
        self.shortfalls = 0  # batches trained short after the timeout

    def announcement(self) -> dict[str, Any]:
        """What the weights tell the workers (see :mod:`netrl.worker.runners.sync`)."""
        return {"mode": "sync", "fragment": self.fragment, "batch_mode": self.batch_mode}

    def open(self, version: int) -> None:
        """Batch ``version`` starts (its weights were just published): the workers of the last one
        now wait for them, from when their last rows arrived."""
        now = time.monotonic()
        if self.delivered:
            self.worker_wait_s = float(np.mean([now - t for t in self.delivered.values()]))
            self.previous = self.delivered
        self.version, self.opened, self.steps, self.delivered = version, now, 0, {}

    def admit(self, buf: Buffer) -> int:
        """Mark the transitions of another version than the batch's as late (loss weight 0:
        the memory leaves them out), count and log them; returns the transitions of
        this batch's version."""
        ends = ~(buf.reset | buf.context)
        wrong = ends & (buf.policy_version != self.version)
        late = int(wrong.sum())
        if late:
            buf.weight = np.where(wrong, np.float32(0.0), np.float32(1.0))
            self.late_samples += late
            self.late_by_worker[buf.worker] += late
            if worth_logging(self.late_samples, first=5, every=100) or late == int(ends.sum()):
                versions = sorted(set(buf.policy_version[wrong].tolist()))
                log.info("%d late samples of worker %s (weights %s) left out of "
                         "batch v%d, which takes v%d only (%d late in all)",
                         late, buf.worker, ", ".join(f"v{v}" for v in versions), self.version,
                         self.version, self.late_samples)
        kept = int(ends.sum()) - late
        if kept:
            self.delivered[buf.worker] = time.monotonic()
        return kept

    def stored(self, steps: int) -> None:
        self.steps += steps

    def full(self) -> bool:
        return self.steps >= self.frames_per_batch

    def timed_out(self) -> bool:
        return time.monotonic() - self.opened >= self.timeout_s

    def waiting_for(self) -> list[str]:
        """Workers of the batch before that have delivered nothing to this one."""
        return sorted(w for w in self.previous if w not in self.delivered)

    def short(self) -> None:
        """The timeout passed with fewer than frames_per_batch transitions: say so,
        and who did not deliver."""
        self.shortfalls += 1
        missing = self.waiting_for()
        log.warning("batch v%d is trained with %d of trainer.frames_per_batch %d env "
                    "steps after trainer.sync_timeout_s (%.1f s): %s",
                    self.version, self.steps, self.frames_per_batch,
                    self.timeout_s, f"no samples from {', '.join(missing)}, "
                                    f"which delivered to the batch before"
                    if missing else "every worker of the batch before delivered: "
                                    "frames_per_batch may be more than the workers collect "
                                    "per version (workers x envs x rollout_fragment_length)")

    def live(self) -> dict[str, Any]:
        return {"collection": "sync", "batch_version": self.version, "batch_steps": self.steps,
                "frames_per_batch": self.frames_per_batch, "waiting_for": self.waiting_for(),
                "late_samples": self.late_samples, "trainer_wait_s": self.trainer_wait_s,
                "worker_wait_s": self.worker_wait_s}

    def metrics(self) -> dict[str, Any]:
        return {"late_samples": self.late_samples, "trainer_wait_s": self.trainer_wait_s,
                "worker_wait_s": self.worker_wait_s, "batch_steps": self.steps, "short_batches": self.shortfalls}
