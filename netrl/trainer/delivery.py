"""Exactly-once delivery on the trainer side: which packets arrived, and the log that keeps them.

Every sample packet is identified by its *stream* (``worker/session``, one per worker process
run) and its sequence number. :class:`Deliveries` remembers the packets that entered the replay
memory, as ranges of sequence numbers per stream (a worker that dropped packets leaves a gap,
not an ever-growing set). :class:`SampleLog` appends every new packet to disk *before* the trainer
acknowledges it, so a killed trainer rebuilds its replay memory by replaying the log: what was
acknowledged is never lost, and what was not is resent by the server.
"""

from __future__ import annotations

import bisect
import errno
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from netrl.errors import NetrlError
from netrl.storage.segments import Position, Record, SegmentLog, check_meta
from netrl.util import worth_logging

__all__ = ["Deliveries", "SampleLog", "write_failed"]

log = logging.getLogger(__name__)


class Deliveries:
    """Sequence numbers seen per stream, kept as sorted, merged, inclusive ranges.

    Both are bounded, so that a worker sending every other sequence number, or a new session per
    packet, cannot grow the trainer's memory and checkpoints without limit: beyond ``max_ranges``
    gaps in a stream the oldest gap is taken as delivered (a packet from it arriving later is
    dropped as a duplicate), and beyond ``max_streams`` the stream added to longest ago is
    forgotten (a packet resent from it would be taken again). Either is logged. An honest worker's
    gaps are filled by its resends within seconds, and a stream is one worker process run.
    """

    def __init__(self, streams: dict[str, list[list[int]]] | None = None, max_ranges: int = 1024,
                 max_streams: int = 10_000) -> None:
        self._ranges: dict[str, list[list[int]]] = {k: [list(r) for r in v] for k, v in (streams or {}).items()}
        self.max_ranges, self.max_streams = max_ranges, max_streams
        self.gaps_closed = self.streams_forgotten = 0

    def seen(self, stream: str, seq: int) -> bool:
        ranges = self._ranges.get(stream, [])
        i = bisect.bisect_right(ranges, [seq, float("inf")]) - 1
        return i >= 0 and ranges[i][0] <= seq <= ranges[i][1]

    def add(self, stream: str, seq: int) -> bool:
        """Record ``seq``; returns False if it was already there (a duplicate)."""
        if self.seen(stream, seq):
            return False
        ranges = self._ranges.pop(stream, [])
        self._ranges[stream] = ranges  # last in the dict: the stream added to most recently
        i = bisect.bisect_left(ranges, [seq, seq])
        ranges.insert(i, [seq, seq])
        # merge with the neighbours it touches
        if i + 1 < len(ranges) and ranges[i + 1][0] == seq + 1:
            ranges[i][1] = ranges.pop(i + 1)[1]
        if i > 0 and ranges[i - 1][1] == seq - 1:
            ranges[i - 1][1] = ranges.pop(i)[1]
        if len(ranges) > self.max_ranges:
            first = ranges.pop(0)
            self.gaps_closed += 1
            if worth_logging(self.gaps_closed):
                log.warning("stream %s has over %d gaps in its sequence numbers: "
                            "packets %d to %d are taken as delivered (%d gaps closed so "
                            "far); a packet from them arriving later is dropped as a duplicate",
                            stream, self.max_ranges, first[1] + 1, ranges[0][0] - 1, self.gaps_closed)
            ranges[0][0] = first[0]
        if len(self._ranges) > self.max_streams:
            oldest = next(iter(self._ranges))
            del self._ranges[oldest]
            self.streams_forgotten += 1
            if worth_logging(self.streams_forgotten):
                log.warning("over %d worker sessions sent packets: forgot which packets %s sent, "
                            "the session added to longest ago (%d forgotten so far)",
                            self.max_streams, oldest, self.streams_forgotten)
        return True

    def count(self, stream: str | None = None) -> int:
        """Packets seen (in one stream, or in all)."""
        streams = [stream] if stream is not None else list(self._ranges)
        return sum(hi - lo + 1 for s in streams for lo, hi in self._ranges.get(s, []))

    def streams(self) -> dict[str, list[list[int]]]:
        return {k: [list(r) for r in v] for k, v in self._ranges.items()}

    def to_json(self) -> dict[str, list[list[int]]]:
        return self.streams()


class SampleLog:
    """The trainer's log of accepted packets, trimmed to what the replay memory can still hold.

    Each record's metadata is ``{"stream", "seq", "rows", "recv_version"}``. Whole segments are
    deleted once the segments after them hold at least ``keep_rows`` rows.
    """

    def __init__(self, directory: str | Path, keep_rows: int, fsync: bool = False,
                 segment_bytes: int = 64 << 20) -> None:
        self.keep_rows = keep_rows
        self._rows: dict[int, int] = {}  # segment -> rows, for trimming
        try:
            self.log = SegmentLog(directory, segment_bytes=segment_bytes, fsync=fsync,
                                  what="trainer's sample log folder", meta_check=_meta_problem)
        # damage is skipped and reported inside; this is the disk or the folder refusing
        except OSError as exc:
            raise _unreadable(directory, exc) from None
        for rec in self.read():
            self._rows[rec.position.segment] = self._rows.get(rec.position.segment, 0) + int(rec.meta["rows"])

    def append(self, frames: Sequence[Any], stream: str, seq: int, rows: int, recv_version: int) -> Position:
        pos = self.log.append(frames, {"stream": stream, "seq": seq, "rows": rows, "recv_version": recv_version})
        self._rows[pos.segment] = self._rows.get(pos.segment, 0) + rows
        self._trim()
        return pos

    def _trim(self) -> None:
        segments = sorted(self._rows)
        while len(segments) > 1 and sum(self._rows[s] for s in segments[1:]) >= self.keep_rows:
            oldest = segments.pop(0)
            self.log.drop_before(Position(oldest + 1, 0))
            del self._rows[oldest]

    def read(self, since: Position | None = None) -> Iterator[Record]:
        try:
            yield from self.log.read(since)
        except OSError as exc:
            raise _unreadable(self.log.dir, exc) from None

    def end(self) -> Position:
        return self.log.end()

    def close(self) -> None:
        self.log.close()


def _meta_problem(meta: Any) -> str | None:
    """What is wrong with a logged packet's metadata (see :class:`SampleLog`), or None."""
    problem = check_meta(meta, {"stream": str, "seq": int, "rows": int})
    if problem is None and not (type(meta.get("recv_version")) is int and meta["recv_version"] >= -1):
        problem = (f"its metadata's 'recv_version' is "
                   f"{meta.get('recv_version')!r:.40}, not an int >= -1")
    return problem


def _unreadable(directory: str | Path, exc: OSError) -> NetrlError:
    return NetrlError(f"cannot read the trainer's sample log in {directory}: {exc}")


def write_failed(what: str, path: Path, exc: OSError) -> str:
    """Advice for a failed write: the path, the OS error and what to do."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = ("free disk space there, or move the run folder to a "
               "disk with room and point weights_folder at it")
    else:
        fix = ("check that this process can write there "
               "(permissions, a read-only or failing disk, ulimit -n)")
    return f"could not write {what} {path} ({exc}): {fix}"
