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

A packet that would give its worker more than its share of the memory's rows (every row counts,
reset and context rows too) is refused before step 3, and counted per worker in ``over_share``
(:meth:`Ingester.share_cap`): one worker key sending far more rows than the others would otherwise
overwrite their rows in the ring. Its rows already stored stay; as the ring overwrites them, its
packets are taken again. Memories that do not keep each row's worker (a tmrl memory, the sync
loop's batch) are not capped.

A packet the statistics or the memory cannot take (a ValueError, e.g. image bytes that do not
decode) costs itself, not the run: skipped, logged and counted in ``unstored``. A packet replayed
from the sample log after a restart (``new=False``) goes into the memory again, but its counts
were made when it first arrived.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from netrl.envs.normalize import ObsNormalizer
from netrl.memory.base import MemoryDataloading
from netrl.memory.owners import OwnedRows, worker_key
from netrl.memory.prefetch import BatchesAhead
from netrl.samples.columns import Buffer, tree_map
from netrl.training.plausibility import Plausibility
from netrl.training.rounds import RoundStats
from netrl.training.safeguards import Safeguards
from netrl.training.settings import TrainingSettings
from netrl.training.standing import Standing
from netrl.training.sync import SyncBatches
from netrl.util import worth_logging

__all__ = ["Ingester"]

log = logging.getLogger(__name__)

# An equal share, plus a quarter: workers of about the same speed hold about an equal share each,
# and exactly that as a cap would refuse one whenever the ring's oldest rows are another's.
SHARE_HEADROOM = 1.25
# A worker counts among those sharing the memory while a packet of its was stored this recently.
# Not "while it holds rows": the rows of a worker that left sit at the ring's tail until others
# overwrite them, and equal shares that counted it would forbid them to (no one could store).
RECENT_S = 30.0


class Ingester:
    """The loop's intake of packets (module docstring), made by ``TrainingOffline.build``."""

    def __init__(self, memory: MemoryDataloading, settings: TrainingSettings,
                 safeguards: Safeguards, obs_norm: ObsNormalizer | None,
                 sync: SyncBatches | None, reward_range: tuple[float, float] | None = None) -> None:
        self.memory, self.safeguards, self.obs_norm, self.sync = memory, safeguards, obs_norm, sync
        # values valid but implausible, quarantine and revocation
        self.plausibility = Plausibility(settings.implausible, settings.implausible_factor,
                                         reward_range, settings.memory_size or 1_000_000, self)
        self.max_policy_lag = settings.max_policy_lag
        self.stale_weight = np.float32(settings.stale_sample_weight)
        self.memory_size = settings.memory_size  # the memory's (build resolves it)
        self.unstored = 0  # packets skipped for a ValueError of the statistics or the memory
        self.max_share, self.min_share = settings.max_worker_share, settings.min_worker_share
        self.over_share: dict[str, int] = {}  # per worker name: packets refused over its share
        self.over_share_rows: dict[str, int] = {}  # and their rows
        self.owned = memory if isinstance(memory, OwnedRows) else None  # None: not capped
        self.clock = time.monotonic
        self._stored_at: dict[str, float] = {}  # per worker: when a packet of its was last stored
        # while an epoch runs: no gather may read what changes
        self.batches: BatchesAhead | None = None
        self.standing = Standing(self)  # what the operator sees and asks (--status, --lift)

    def exchange(self, source: object, add: Callable[[Buffer], int]) -> int:
        """The loop's ingest, first: revocations heard of and asked for
        (:meth:`Plausibility.exchange`), then lifts and the workers' standing
        (:meth:`Standing.exchange`, which ingests released packets with ``add``); the env steps
        added."""
        self.plausibility.exchange(source)
        return self.standing.exchange(source, add)

    def add(self, buf: Buffer, new: bool, version: int, counts: RoundStats,
            checked: bool = False) -> int:
        """Take one packet; returns its env steps (0 when refused or skipped). ``version`` is the
        actor's newest published version, ``counts`` the round's. Policy lag is measured against the
        trainer's version when the packet *arrived* (``buf.recv_version``), so replaying the sample
        log makes the same staleness decisions."""
        if self.safeguards.refuse(buf, new, checked):  # values beyond the spaces or the config
            return 0
        if not self.plausibility.admit(buf, new):
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

    def share_cap(self, worker: str, recent: set[str] | None = None) -> int:
        """The most rows of the memory ``worker`` may hold: ``memory.max_worker_share`` of them,
        or, when that is 0, an equal share of the workers sharing it (those with a packet stored
        in the last :data:`RECENT_S` seconds, and ``worker``), plus a quarter, at least
        ``memory.min_worker_share``. ``recent``: those workers, when the caller has them."""
        assert self.owned is not None
        share = self.max_share
        if not share:
            recent = self.recent_workers() if recent is None else recent
            share = max(SHARE_HEADROOM / len(recent | {worker_key(worker)}), self.min_share)
        return max(1, int(min(share, 1.0) * self.owned.memory_size))

    def recent_workers(self) -> set[str]:
        """The workers with a packet stored in the last :data:`RECENT_S` seconds."""
        since = self.clock() - RECENT_S
        self._stored_at = {w: t for w, t in self._stored_at.items() if t >= since}
        return set(self._stored_at)

    def _over_share(self, buf: Buffer) -> bool:
        """Whether ``buf`` would take its worker over :meth:`share_cap` (counted and logged)."""
        if self.owned is None:
            return False
        name = worker_key(buf.worker)  # every session of a worker: a restart starts a new one
        cap, after = self.share_cap(name), self.owned.rows_after(name, len(buf))
        if after <= cap:
            self._stored_at[name] = self.clock()
            return False
        refused = self.over_share[name] = self.over_share.get(name, 0) + 1
        self.over_share_rows[name] = self.over_share_rows.get(name, 0) + len(buf)
        if worth_logging(refused, first=3, every=100):
            log.warning("packet %d of worker %s (%d rows) is refused: the worker would hold %d "
                        "of the replay memory's %d rows, over its share of %d (memory."
                        "max_worker_share %g, %d workers storing lately); %d of its packets "
                        "refused so far", buf.seq, buf.worker or "(unnamed)", len(buf), after,
                        self.owned.memory_size, cap, self.max_share,
                        len(self.recent_workers() | {name}), refused)
        return True

    def drop_worker(self, worker: str) -> int:
        """The memory's :meth:`~netrl.memory.base.MemoryDataloading.drop_worker`, once no batch is
        being gathered from it: the call for the training loop's own thread to make."""
        if self.batches is not None:
            self.batches.settle()
        return self.memory.drop_worker(worker)

    def set_quarantined(self, worker: str, flag: bool) -> int:
        """The memory's :meth:`~netrl.memory.base.MemoryDataloading.set_quarantined`, once no
        batch is being gathered from it."""
        if self.batches is not None:
            self.batches.settle()
        return self.memory.set_quarantined(worker, flag)

    def _store(self, buf: Buffer, steps: int) -> bool:
        if self._over_share(buf):
            return False
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
