"""What may go to the server's spool: each worker's share of it, and a rest after the disk refused.

Each connected worker is sure of its share of the spool, ``max_bytes`` split evenly between them
(see :mod:`netrl.server.relay`): a worker past its share spools only into room that the others'
unused shares do not need. A disk that refuses an append (full, too many open files) is not tried
again for a second, so the server's loop does not fail on every pass; the packets stay with their
workers, or in memory, and nothing is lost. :class:`~netrl.server.relay.SampleRelay` decides when a
packet is spooled and asks :class:`SpoolGate` whether it may be, and to write it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from netrl.server.counters import ServerCounters
from netrl.server.peers import QueuedPacket
from netrl.server.spool import Spool

__all__ = ["SpoolGate"]

log = logging.getLogger(__name__)


class SpoolGate:
    """The spool's shares and its rest after a refusal, counted in ``stats``; ``workers`` names the
    connected workers, who share the spool."""

    def __init__(self, spool: Spool, stats: ServerCounters,
                 workers: Callable[[], Collection[str]]) -> None:
        self.spool, self.stats, self.workers = spool, stats, workers
        self.retry_at = 0.0  # after the disk refused: no append is tried before this time
        self._last_error = self._last_share_warning = 0.0

    def resting(self, now: float) -> bool:
        """Whether the spool rests after a refusal (a spool that failed is left alone a second)."""
        return now < self.retry_at

    def share_ok(self, packet: QueuedPacket) -> bool:
        """Whether ``packet`` may go to the spool as far as the workers' shares go: within its
        worker's share, or into room that no other connected worker's unused share needs. A worker
        with nothing spooled may always spool one packet, so that a share smaller than a packet
        cannot shut it out."""
        used, workers = self.spool.by_worker, self.workers()
        share = self.spool.max_bytes // max(1, len(workers))
        mine = used.get(packet.worker, 0)
        if mine == 0 or mine + packet.nbytes <= share:
            return True
        kept = sum(max(0, share - used.get(w, 0)) for w in workers if w != packet.worker)
        return self.spool.bytes + packet.nbytes + kept <= self.spool.max_bytes

    def over_share(self, packet: QueuedPacket) -> str:
        """Count and log (at most every 10 s) a packet refused for its worker's share of the spool;
        the NACK's reason."""
        self.stats.spool_share_refusals += 1
        workers, mine = len(self.workers()), self.spool.by_worker.get(packet.worker, 0)
        reason = (f"worker {packet.worker!r} has {mine} bytes in the spool, and {packet.nbytes} "
                  f"more would pass its share ({self.spool.max_bytes} bytes between {workers} "
                  "connected workers) into the room kept for the others")
        now = time.monotonic()
        if now - self._last_share_warning > 10:
            self._last_share_warning = now
            log.warning("refused a packet for the spool: %s; it resends once the trainer takes "
                        "spooled packets (server.spool_max_bytes sets the spool's size; %d refused "
                        "so far)", reason, self.stats.spool_share_refusals)
        return reason

    def push(self, packet: QueuedPacket) -> bool:
        """Append ``packet`` to the spool; False (logged, counted) if the disk refuses it (full, too
        many files) or the spool rests after such a refusal."""
        if self.resting(time.monotonic()):
            return False
        try:
            self.spool.push(packet.frames, {"worker": packet.worker, "session": packet.session,
                                            "seq": packet.seq, "steps": packet.steps,
                                            "inflated": packet.trainer_bytes})
        except OSError as exc:
            self.failed(exc)
            return False
        self.stats.samples_spooled += packet.steps
        return True

    def failed(self, exc: OSError) -> None:
        """The disk refused the spool: the packets stay with their workers (or in memory), nothing
        is lost; the spool rests a second."""
        self.stats.spool_errors += 1
        now = time.monotonic()
        self.retry_at = now + 1.0
        if now - self._last_error > 10:
            self._last_error = now
            log.error("cannot use the spool in %s (%s); packets stay with their workers until it "
                      "works again: free disk space there, or raise the open-file limit (ulimit "
                      "-n) (%d spool errors so far)", self.spool.dir, exc, self.stats.spool_errors)
