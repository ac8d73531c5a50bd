"""Packets into the memory: what the training loop does with each packet a source hands it.

In order, for each packet (:meth:`Ingester.add`):

1. values beyond what the spaces and the config allow: the packet is refused whole (see
   :mod:`netrl.training.safeguards`); values valid but implausible for this run, or a worker
   quarantined or revoked: as :mod:`netrl.training.plausibility` says;
2. with ``normalize_obs``, its observations are merged into the statistics, each row once;
3. sync collection: the transitions of the batch's version go into the memory, the rest are late
   (:mod:`netrl.training.sync`); async: those of a policy more than ``max_policy_lag`` versions old
   get ``stale_sample_weight``, and the packet goes into the memory;
4. the round's counts: env steps, policy lags, stale samples and episode returns.

A packet the statistics or the memory cannot take (a ValueError, e.g. image bytes that do not
decode) costs itself, not the run: skipped, logged and counted in ``unstored``. A packet replayed
from the sample log after a restart (``new=False``) goes into the memory again, but its counts
were made when it first arrived.
"""

from __future__ import annotations

import logging

import numpy as np

from netrl.envs.normalize import ObsNormalizer
from netrl.memory.base import MemoryDataloading
from netrl.memory.prefetch import BatchesAhead
from netrl.samples.columns import Buffer, tree_map
from netrl.training.plausibility import Plausibility
from netrl.training.rounds import RoundStats
from netrl.training.safeguards import Safeguards
from netrl.training.settings import TrainingSettings
from netrl.training.sync import SyncBatches
from netrl.util import worth_logging

__all__ = ["Ingester"]

log = logging.getLogger(__name__)


class Ingester:
    """The loop's intake of packets (module docstring), made by ``TrainingOffline.build``."""

    def __init__(self, memory: MemoryDataloading, settings: TrainingSettings,
                 safeguards: Safeguards, obs_norm: ObsNormalizer | None,
                 sync: SyncBatches | None, plausibility: Plausibility | None = None) -> None:
        self.memory, self.safeguards, self.obs_norm, self.sync = memory, safeguards, obs_norm, sync
        self.plausibility = plausibility
        self.max_policy_lag = settings.max_policy_lag
        self.stale_weight = np.float32(settings.stale_sample_weight)
        self.memory_size = settings.memory_size  # the memory's (build resolves it)
        self.unstored = 0  # packets skipped for a ValueError of the statistics or the memory
        # while an epoch runs: no gather may read what changes
        self.batches: BatchesAhead | None = None

    def add(self, buf: Buffer, new: bool, version: int, counts: RoundStats) -> int:
        """Take one packet; returns its env steps (0 when refused or skipped). ``version`` is the
        actor's newest published version, ``counts`` the round's. Policy lag is measured against the
        trainer's version when the packet *arrived* (``buf.recv_version``), so replaying the sample
        log makes the same staleness decisions."""
        if self.safeguards.refuse(buf, new):  # values beyond the spaces or the config
            return 0
        if self.plausibility is not None and not self.plausibility.admit(buf, new):
            return 0  # held in quarantine, or refused
        if self.obs_norm is not None and not self._learn_obs_stats(buf):
            return 0
        if self.sync is not None:
            return self._add_sync(buf, new, version, counts)
        ends = ~(buf.reset | buf.context)
        recv = buf.recv_version if buf.recv_version >= 0 else version
        lag = recv - np.maximum(buf.policy_version, 0)
        stale = ends & (lag > self.max_policy_lag) if self.max_policy_lag is not None else None
        if stale is not None and stale.any():
            buf.weight = np.where(stale, self.stale_weight, np.float32(1.0))
        # what the memory keeps: a packet longer than the memory keeps only its newest rows, and the
        # count (and the pacing built on it) must not claim the others
        size = self.memory_size
        kept = ends[-size:] if size and len(ends) > size else ends
        steps = int(np.count_nonzero(kept))
        if not self._store(buf, steps):
            return 0
        if new:
            if stale is not None:
                counts.stale += int(stale.sum())
            _count(counts, buf, steps, lag[ends])
        return steps

    def _add_sync(self, buf: Buffer, new: bool, version: int, counts: RoundStats) -> int:
        """Sync collection: the batch's version into the memory, the rest counted late. A
        packet replayed from the sample log belongs to a batch trained before the restart:
        the new batch starts fresh."""
        assert self.sync is not None
        if not new:
            return 0
        ends = ~(buf.reset | buf.context)
        steps = int(np.count_nonzero(ends))
        kept = self.sync.admit(buf)
        if kept:
            if not self._store(buf, steps):
                return 0
            self.sync.stored(kept)
        _count(counts, buf, steps, version - np.maximum(buf.policy_version[ends], 0))
        return steps

    def _learn_obs_stats(self, buf: Buffer) -> bool:
        """Merge a packet's observations into ``obs_norm`` (also one replayed from the
        sample log: the statistics are rebuilt with the memory); False, with the packet
        skipped, when they do not fit."""
        assert self.obs_norm is not None
        if self.batches is not None:
            self.batches.settle()  # no gather may read the statistics while they change
        try:  # each row once: context rows repeat the previous packet's last rows
            self.obs_norm.update(tree_map(lambda col: col[~buf.context], buf.obs))
        except ValueError as exc:
            self._skip(buf, exc, "")
            return False
        return True

    def _store(self, buf: Buffer, steps: int) -> bool:
        if self.batches is not None:
            self.batches.settle()  # no gather may read the memory while it changes
        try:
            self.memory.append_buffer(buf)
        except ValueError as exc:
            self._skip(buf, exc, f" ({steps} samples) could not be stored and")
            return False
        return True

    def _skip(self, buf: Buffer, exc: Exception, what: str) -> None:
        self.unstored += 1
        if worth_logging(self.unstored, first=5, every=100):
            log.error("packet %d of worker %s%s is skipped (%d so "
                      "far): %s", buf.seq, buf.worker, what,
                      self.unstored, exc)


def _count(counts: RoundStats, buf: Buffer, steps: int, lags: np.ndarray) -> None:
    counts.samples += steps
    counts.add_lags(lags)
    for ep in buf.episodes:
        (counts.test_returns if ep.test else counts.returns).append(ep.ret)
