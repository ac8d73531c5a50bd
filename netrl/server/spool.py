"""The server's spool: sample packets kept on disk until the trainer acknowledges them.

The server spools a packet when no trainer is connected, or when the packets it holds in memory
reach ``server.max_queue_bytes``; it acknowledges the worker as soon as the packet is on disk.
Bundles for the trainer take spooled packets first. ``HEAD`` (a small JSON file, replaced
atomically at most every 0.2 s, soon after the last acknowledgement, and on close) marks the oldest
packet the trainer has not acknowledged: a restarted server resumes from there, so a server crash
loses nothing that was spooled. Packets delivered in the last moments before a crash are delivered
again; the trainer discards the duplicates.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from netrl.errors import NetrlError
from netrl.protocol.wire import frames_nbytes, restamp
from netrl.storage.folderlock import sync_folder
from netrl.storage.segments import Position, Record, SegmentLog, check_meta

__all__ = ["Spool", "SpooledPacket"]

log = logging.getLogger(__name__)


class SpooledPacket(NamedTuple):
    position: Position
    meta: dict[str, Any]  # {"worker", "session", "seq", "steps", "inflated"}
    frames: list[Any]  # as spooled, with the header of an older netrl's packet at
                       # today's version (restamp)
    nbytes: int


class Spool:
    """A disk queue with a persistent head, a read cursor, and out-of-order acknowledgements.

    Construct (no I/O), then :meth:`open`, which reads the folder, and :meth:`close`. ``max_bytes``
    caps the packets waiting; ``by_worker`` counts their bytes by worker name (for the relay's
    per-worker share). On disk, the folder can also hold the acknowledged start of the oldest
    segment, and emptied segment files kept for reuse (see :mod:`netrl.storage.segments`): as
    many as fit in a quarter of ``max_bytes``, so a small spool keeps none.
    """

    def __init__(self, directory: str | Path, max_bytes: int, fsync: bool = False,
                 segment_bytes: int = 64 << 20) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.fsync, self.segment_bytes = fsync, segment_bytes
        self.log: SegmentLog  # the folder's log, from open() on
        self._opened = False
        # what waits on disk: nothing known until open() counts it from the head
        self.head = self._cursor = self._head_saved = Position(0, 0)
        self.steps = self.bytes = self.packets = self._damage_seen = 0
        self.by_worker: collections.Counter[str] = collections.Counter()
        # packets handed out and not yet acknowledged, in log order: pos -> (next,
        # steps, bytes, worker)
        self._outstanding: collections.OrderedDict[Position, tuple[Position, int, int, str]] = \
            collections.OrderedDict()
        self._acked: set[Position] = set()
        self._head_saved_at = 0.0
        self._head_failing = False

    def open(self) -> Spool:
        """Open the folder (created if missing; a torn tail is cut) and count the packets
        waiting from the saved head. Does nothing on an open spool. Returns the spool, so that
        ``Spool(...).open()`` reads as one step."""
        if self._opened:
            return self
        try:  # damage is skipped and reported inside; this is the disk or the folder refusing
            self.log = SegmentLog(self.dir, segment_bytes=self.segment_bytes, fsync=self.fsync,
                                  recycle=min(4, self.max_bytes // 4 // self.segment_bytes), meta_check=_meta_problem)
            self.head = self._load_head()
            self._recount()  # sets steps, bytes, by_worker, packets
        except OSError as exc:
            raise NetrlError(f"cannot read the server's spool in {self.dir}: {exc}") from None
        self._cursor = self._head_saved = self.head
        self._opened = True
        if self.packets:
            log.info("spool %s holds %d packets (%d samples) from before this start",
                     self.dir, self.packets,
                     self.steps)
        return self

    def _load_head(self) -> Position:
        path = self.dir / "HEAD"
        if not path.exists():
            return self.log.start()
        start, end = self.log.start(), self.log.end()
        problem = "is unreadable"
        try:
            data = json.loads(path.read_text())
            saved = Position(int(data["segment"]), int(data["offset"]))
            if min(saved) < 0:
                raise ValueError(f"it holds a negative position {tuple(saved)}")
            # Past here HEAD reads well; a position no packet starts at is either HEAD's
            # damage or the spool's there.
            problem = f"leads to {tuple(max(saved, start))}, where the spool has no readable packet"
            # the head's own segment is only dropped once the head has left it
            if saved.segment < start.segment:
                log.warning("%s: segment files %08d.seg to %08d.seg are missing "
                            "(deleted by hand?): the packets in them that the trainer "
                            "had not acknowledged are lost", self.dir, saved.segment,
                            start.segment - 1)
            head = max(saved, start)
            if head > end:
                raise ValueError(f"it points past the spool's end {tuple(end)}")
            if not self.log.starts_record(head):
                raise ValueError(f"no packet starts at {tuple(head)}")
        # resending is safe: duplicates are dropped
        except (ValueError, KeyError, TypeError, OverflowError) as exc:
            log.warning("%s %s (%s): the spool is sent again from its start, %s; the trainer "
                        "discards packets it already has", path, problem, exc, tuple(start))
            return start
        return head

    def _save_head(self) -> None:
        tmp = self.dir / "HEAD.tmp"
        with tmp.open("w") as f:
            f.write(json.dumps({"segment": self.head.segment, "offset": self.head.offset}))
            # before the segments the head left are dropped, after a power cut too
            if self.log.fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, self.dir / "HEAD")
        if self.log.fsync:
            sync_folder(self.dir)

    def fits(self, nbytes: int) -> bool:
        return self.bytes + nbytes <= self.max_bytes

    def push(self, frames: list[Any], meta: dict[str, Any]) -> None:
        self.log.append(frames, meta)
        size = frames_nbytes(frames)
        self.steps += int(meta["steps"])
        self.bytes += size
        self.by_worker[meta["worker"]] += size
        self.packets += 1

    def take(self, more: Callable[[int, int, int, int, int, int], bool]) -> list[SpooledPacket]:
        """Packets from the read cursor: the first one, then each next one while
        ``more(packets, samples, bytes, next_bytes, inflated, next_inflated)`` (what is taken so
        far, and the size of the next packet, on the wire and decoded: ``meta["inflated"]``, or its
        wire size in a spool written before it was kept) says so. A packet an older netrl spooled
        comes out at today's protocol version (see :data:`~netrl.protocol.wire.STORED_VERSIONS`)."""
        out: list[SpooledPacket] = []
        steps = nbytes = inflated = 0
        for rec in self.log.read(self._cursor):
            size = _size(rec)
            decoded = max(size, int(rec.meta.get("inflated", 0)))
            if out and not more(len(out), steps, nbytes, size, inflated, decoded):
                break
            out.append(SpooledPacket(rec.position, rec.meta, restamp(rec.frames), size))
            self._outstanding[rec.position] = (rec.next, int(rec.meta["steps"]), size, rec.meta["worker"])
            self._cursor = rec.next
            steps += int(rec.meta["steps"])
            nbytes += size
            inflated += decoded
        # read to the end: what the log skipped (damage, which it reports) is never read again
        else:
            self._cursor = self.log.end()
        if self.log.damaged != self._damage_seen:
            self._recount()
        return out

    def _recount(self) -> None:
        """Count the packets waiting from the head: at start, and after the log skipped damage
        that :meth:`push` had counted."""
        waiting = [(int(rec.meta["steps"]), _size(rec), rec.meta["worker"]) for rec in self.log.read(self.head)]
        # after reading: what this read found is counted already
        self._damage_seen = self.log.damaged
        self.steps = sum(steps for steps, _, _ in waiting)
        self.bytes = sum(size for _, size, _ in waiting)
        self.by_worker = collections.Counter()
        for _, size, worker in waiting:
            self.by_worker[worker] += size
        self.packets = len(waiting)

    def pending(self) -> bool:
        """True if packets wait behind the read cursor."""
        return self._cursor < self.log.end()

    def ack(self, position: Position) -> None:
        """The trainer has this packet: advance the head over every leading acknowledged packet."""
        if position not in self._outstanding:
            return
        self._acked.add(position)
        moved = False
        while self._outstanding and next(iter(self._outstanding)) in self._acked:
            first, (nxt, steps, size, worker) = self._outstanding.popitem(last=False)
            self._acked.discard(first)
            self.head = nxt
            self.steps -= steps
            self.bytes -= size
            self.by_worker[worker] -= size
            if self.by_worker[worker] <= 0:
                del self.by_worker[worker]
            self.packets -= 1
            moved = True
        if moved:
            self.tick()

    def tick(self) -> None:
        """Record a head that moved since it was last saved: acknowledgements save it at most
        every 0.2 s, so the last ones of a burst wait for this call (the server's loop makes it
        every pass). Until then, the segments the head left stay on disk."""
        if self.head != self._head_saved and time.monotonic() - self._head_saved_at > 0.2:
            self._persist_head()

    def _persist_head(self) -> None:
        self._head_saved_at = time.monotonic()
        if self.head == self._head_saved:
            return
        try:
            self._save_head()
            if self.head.segment != self._head_saved.segment:
                self.log.drop_before(self.head)
        # tried again at the next acknowledgement; until then a crash only resends packets
        except OSError as exc:
            if not self._head_failing:
                log.warning("could not record the spool's head in %s (%s): packets the trainer "
                            "already has would be sent again after a restart", self.dir, exc)
            self._head_failing = True
            return
        if self._head_failing:
            log.info("the spool's head in %s is recorded again", self.dir)
        self._head_failing = False
        self._head_saved = self.head

    def untake(self, first: Position) -> None:
        """Give back the packets of the latest :meth:`take`, from ``first`` on
        (their send failed)."""
        for pos in [p for p in self._outstanding if p >= first]:
            del self._outstanding[pos]
            self._acked.discard(pos)
        self._cursor = min(self._cursor, first)

    def rewind(self) -> None:
        """The trainer went away: everything it did not acknowledge will be read again."""
        self._cursor = self.head
        self._outstanding.clear()
        self._acked.clear()

    def close(self) -> None:
        """Record the head and close the log's file (an append opens it again). Nothing to do on a
        spool never opened."""
        if not self._opened:
            return
        self._persist_head()
        self.log.close()


def _meta_problem(meta: Any) -> str | None:
    """What is wrong with a spooled packet's metadata (see :class:`SpooledPacket`), or None."""
    return check_meta(meta, {"worker": str, "session": str, "seq": int, "steps": int}, {"inflated": int})


def _size(rec: Record) -> int:
    return sum(f.nbytes for f in rec.frames)
