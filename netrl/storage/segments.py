"""Append-only logs of messages on disk: the server's spool and the trainer's sample log.

A log is a folder of numbered segment files of records, each one message's frames plus a small
metadata map, checksummed (:mod:`netrl.storage.records` draws their layout and reads them back).

Opening a log scans the last segment and cuts a torn tail, which is what a crash mid-write leaves (a
damaged last record is cut too, with a warning; a last segment of another netrl log format is moved
aside whole, as ``*.seg.foreign``). Damage anywhere else (a flipped byte, a missing segment file, an
intact record whose metadata the log's owner cannot use) loses only the records it touches: readers
skip to the next valid record and a warning names the file and the bytes lost, once per damaged
stretch. Nothing in a damaged file is cut or rewritten. Records are written with one ``writev`` and
no copy of the data, so a killed process loses nothing it appended; ``fsync=True`` also survives a
power cut, at a cost.

Segments are recycled: a dropped segment file is kept (as ``*.free``, up to ``recycle`` of them) and
overwritten in place as a later segment, because writing into pages the page cache already holds is
several times faster than into fresh ones (on this project's VMs, 2-10 GB/s against 370 MB/s). A
recycled file still holds its old records past the new ones; each record names its segment, so an
old record never passes for a new one.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import crc32c
import msgpack

from netrl.storage.folderlock import make_folder, sync_folder
from netrl.storage.records import (
    DAMAGED,
    FOREIGN,
    HEAD,
    MAGIC,
    MAX_SEGMENT,
    SEG,
    TORN,
    next_record,
    other_format,
    read_record,
    renumbered,
)

__all__ = ["Position", "Record", "SegmentLog", "check_meta"]

log = logging.getLogger(__name__)


def _flat(frame: Any) -> Any:
    """A frame as writev and crc32c take it, len() its size: bytes and a zmq.Frame's buffer (a
    flat byte view already) as they are, no new view per frame on every append; anything else
    viewed as bytes."""
    if type(frame) is bytes:
        return frame
    view = getattr(frame, "buffer", frame)
    if type(view) is memoryview and view.ndim == 1 and view.format == "B":
        return view
    return memoryview(view).cast("B")

class Position(NamedTuple):
    """Where a record starts: (segment number, byte offset). Orders like the log."""

    segment: int
    offset: int


class Record(NamedTuple):
    position: Position
    next: Position  # where the following record starts
    meta: dict[str, Any]
    frames: list[memoryview]


class SegmentLog:
    """An append-only log of messages in ``directory``. Not thread-safe: one owner thread."""

    def __init__(self, directory: str | Path, segment_bytes: int = 64 << 20, fsync: bool = False,
                 readonly: bool = False, recycle: int = 4, what: str = "log folder",
                 meta_check: Callable[[Any], str | None] | None = None) -> None:
        self.dir = Path(directory)
        # what is wrong with a record's metadata (None: nothing): an intact record the owner
        # cannot use (another version's, or not its own) is skipped and reported like damage
        # instead of failing the reader
        self.meta_check = meta_check
        # *.seg files whose names this log never writes, already warned about
        self._strays: set[str] = set()
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.recycle = recycle  # dropped segment files kept for reuse
        self.readonly = readonly  # for inspecting a log another process writes: never repairs,
                                  # stops at a torn tail
        if not readonly:
            make_folder(self.dir, what)
        self._file: int | None = None  # the current segment's descriptor, positioned at ``_end``
        self._segments: list[int] | None = None  # cached listing; this log is the only writer
        self._reported: set[Position] = set()  # damaged stretches already warned about, by
                                               # where they start
        self.damaged = 0  # damaged stretches and missing files found so far: a reader's
                          # totals may need a recount
        segments = self.segments()
        gaps = [(low + 1, high - 1) for low, high in itertools.pairwise(segments) if high > low + 1]
        # segments are only ever dropped from the start, so a gap is a file lost or deleted by hand
        if gaps:
            names = [", ".join(self._path(s).name for s in range(first, last + 1)) if last - first < 3
                     else f"{self._path(first).name} to {self._path(last).name}" for first, last in gaps]
            log.warning("%s: segment files %s are missing between %s and "
                        "%s: the records they held are lost",
                        self.dir, ", ".join(names), self._path(segments[0]).name, self._path(segments[-1]).name)
        self._segment = segments[-1] if segments else 1
        # numbers start again at 1: a free file's old records could carry them
        if not segments and not readonly:
            for free in self.dir.glob("*.free"):
                free.unlink()
        if readonly:
            self._end = self._path(self._segment).stat().st_size if segments else 0
        else:
            self._end = self._repair(self._segment) if segments else 0

    # -- files -------------------------------------------------------------------------------------
    def _path(self, segment: int) -> Path:
        return self.dir / f"{segment:08d}.seg"

    def segments(self) -> list[int]:
        if self._segments is None or self.readonly:
            found = []
            for path in self.dir.glob("*.seg"):
                number = int(path.stem) if path.stem.isdigit() else -1
                if 0 < number <= MAX_SEGMENT and path.name == self._path(number).name:
                    found.append(number)
                elif path.name not in self._strays:
                    self._strays.add(path.name)
                    log.warning("%s: ignoring %s, not a segment file name "
                                "this log writes (%s to %s)", self.dir,
                                path.name, self._path(1).name, self._path(MAX_SEGMENT).name)
            self._segments = sorted(found)
        return list(self._segments)

    def _repair(self, segment: int) -> int:
        """Return the end of the last valid record of ``segment``, truncating anything after it.
        Damage with valid records after it is skipped (and reported), not cut."""
        path = self._path(segment)
        size = path.stat().st_size
        end = 0
        problem = TORN
        with path.open("rb") as f:
            while end < size:
                parsed = read_record(f, end, segment, size)
                if isinstance(parsed, tuple):
                    end = parsed[0]
                    continue
                after = next_record(f, end, segment, size)
                if after is None:
                    problem = parsed
                    break
                self._report(Position(segment, end), after)
                end = after
        if end < size:
            why = "fails its checksum"
            with path.open("rb") as f:
                if problem == FOREIGN and renumbered(f, end, segment, size):
                    problem, why = DAMAGED, "has a damaged magic or segment number"
                other = other_format(f, end)
            if end == 0 and other:  # the whole file: another netrl version's log, kept for it
                aside = path.with_name(path.name + ".foreign")
                os.replace(path, aside)
                self._segments = None
                log.warning("%s holds records of another netrl log format (%r, this version writes "
                            "%r), which this version cannot read: moved aside to %s, untouched",
                            path, other, MAGIC, aside.name)
                return 0
            if problem == DAMAGED:  # acknowledged once, so its loss is reported
                log.warning("%s: the last record, at offset %d, %s (damaged on "
                            "disk, or a write cut short by a crash): its %d bytes are "
                            "dropped and the records in them lost", path, end, why,
                            size - end)
            else:
                log.info("%s: cut %d bytes after the last record (a "
                         "torn write, or a recycled file's old records)",
                         path, size - end)
            with path.open("r+b") as f:
                f.truncate(end)
        return end

    def _report(self, start: Position, resume: int, what: str | None = None) -> None:
        """Warn (once) that the bytes from ``start`` to ``resume`` in its segment hold no readable
        record (or, with ``what``, a record it describes); a ``start`` offset of -1 stands for the
        whole file, deleted while in use."""
        if start in self._reported:
            return
        self._reported.add(start)
        self.damaged += 1
        path = self._path(start.segment)
        if start.offset < 0:
            log.warning("%s was deleted while in use: the records it held are lost", path)
        elif what is not None:
            log.warning("%s %s at offset %d: its %d bytes are skipped and the samples in them lost",
                        path, what,
                        start.offset, resume - start.offset)
        else:
            log.warning("%s is damaged from offset %d to %d: the records in those %d bytes "
                        "are lost and skipped; the records around them are read as usual",
                        path, start.offset, resume,
                        resume - start.offset)

    def end(self) -> Position:
        return Position(self._segment, self._end)

    def start(self) -> Position:
        segments = self.segments()
        return Position(segments[0] if segments else self._segment, 0)

    def starts_record(self, position: Position) -> bool:
        """True if a record (even a damaged one) starts at ``position``, or it is the end of a
        segment: a place a reader can start from."""
        if position == self.end():
            return True
        if position.segment not in self.segments():
            return False
        path = self._path(position.segment)
        size = self._end if position.segment == self._segment else path.stat().st_size
        if position.offset in (0, size):
            return True
        with path.open("rb") as f:
            found = read_record(f, position.offset, position.segment, size)
        return isinstance(found, tuple) or found == DAMAGED

    def size_bytes(self, since: Position | None = None) -> int:
        """Bytes of records from ``since`` (default: the start) to the end."""
        total = 0
        for seg in self.segments():
            if since is not None and seg < since.segment:
                continue
            size = self._end if seg == self._segment else self._path(seg).stat().st_size
            total += size - (since.offset if since is not None and seg == since.segment else 0)
        return total

    # -- writing -----------------------------------------------------------------------------------
    def append(self, frames: Sequence[Any], meta: dict[str, Any]) -> Position:
        """Write one record and flush it; returns its position."""
        if self.readonly:
            raise OSError(f"{self.dir} was opened read-only")
        views = [_flat(f) for f in frames]
        header = msgpack.packb({"m": meta, "l": [len(v) for v in views]})
        data_len = sum(len(v) for v in views)
        if self._end > 0 and self._end + HEAD.size + len(header) + data_len > self.segment_bytes:
            self._roll()
        crc = crc32c.crc32c(header, crc32c.crc32c(SEG.pack(self._segment)))
        for v in views:
            crc = crc32c.crc32c(v, crc)
        fd = self._open_current()
        pos = Position(self._segment, self._end)
        parts = [HEAD.pack(MAGIC, crc, self._segment, len(header), data_len), header, *views]
        total = len(parts[0]) + len(header) + data_len
        try:
            written = os.writev(fd, parts)
            # a short write (rare: disk full, signals): finish it, or fail loudly
            if written != total:
                rest = b"".join(bytes(p) for p in parts)[written:]
                while rest:
                    n = os.write(fd, rest)
                    if n <= 0:
                        raise OSError(f"could not append to {self._path(self._segment)}")
                    rest = rest[n:]
            if self.fsync:
                os.fsync(fd)
        except OSError:
            self._cut_back(fd)
            raise
        self._end += total
        return pos

    def _cut_back(self, fd: int) -> None:
        """After a failed append (a full disk): drop what it wrote, so the next record
        starts where it should."""
        try:  # shrinking a file needs no space, so this holds even on a full disk
            os.ftruncate(fd, self._end)
            os.lseek(fd, self._end, os.SEEK_SET)
        except OSError as exc:
            log.error("could not cut a failed append off %s (%s): "
                      "reopening it will cut the torn record",
                      self._path(self._segment), exc)

    def _open_current(self) -> int:
        """The current segment's descriptor, opening it (a recycled file if one is free) at
        the end of its records."""
        if self._file is None:
            path = self._path(self._segment)
            free = sorted(self.dir.glob("*.free"))
            new = not path.exists()
            if free and new:
                # overwritten in place: its pages are already in the page cache
                os.replace(free[0], path)
            self._file = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            os.lseek(self._file, self._end, os.SEEK_SET)
            # or a power cut could lose the new file's name, and every record in it
            if new and self.fsync:
                sync_folder(self.dir)
            if self._segments is not None and self._segment not in self._segments:
                self._segments.append(self._segment)
        return self._file

    def _roll(self) -> None:
        if self._file is not None:
            # a closed segment ends at its last record, even a recycled one
            os.ftruncate(self._file, self._end)
        self.close()
        self._segment += 1
        self._end = 0

    def close(self) -> None:
        if self._file is not None:
            os.close(self._file)
            self._file = None

    # -- reading -----------------------------------------------------------------------------------
    def read(self, since: Position | None = None, limit: int | None = None) -> Iterator[Record]:
        """Records from ``since`` (default: the start) to the end, in order, read one at a time."""
        count = 0
        for seg in self.segments():
            if since is not None and seg < since.segment:
                continue
            path = self._path(seg)
            offset = since.offset if since is not None and seg == since.segment else 0
            try:
                size = self._end if seg == self._segment else path.stat().st_size
                f = path.open("rb")
            except FileNotFoundError:  # deleted while this log is open (the listing is cached)
                self._segments = None
                self._report(Position(seg, -1), 0)
                continue
            with f:
                while offset < size:
                    parsed = read_record(f, offset, seg, size)
                    if not isinstance(parsed, tuple):
                        after = next_record(f, offset, seg, size)
                        if after is None and self.readonly and seg == self._segment:
                            return  # the writer is mid-record
                        other = other_format(f, offset)
                        self._report(Position(seg, offset), size if after is None else after,
                                     f"holds records of another netrl log "
                                     f"format ({other!r})" if other else None)
                        if after is None:
                            break
                        offset = after
                        continue
                    nxt, meta, frames = parsed
                    problem = self.meta_check(meta) if self.meta_check is not None else None
                    if problem is not None:
                        self._report(Position(seg, offset), nxt,
                                     f"holds a record this version of netrl cannot use ({problem})")
                        offset = nxt
                        continue
                    yield Record(Position(seg, offset), Position(seg, nxt), meta, frames)
                    count += 1
                    if limit is not None and count >= limit:
                        return
                    offset = nxt

    def drop_before(self, position: Position) -> int:
        """Drop whole segments that end before ``position`` (kept for reuse, up to ``recycle``
        files, else deleted); returns how many were dropped."""
        dropped = 0
        free = len(list(self.dir.glob("*.free")))
        for seg in self.segments():
            if seg < position.segment and seg != self._segment:
                if free < self.recycle:
                    os.replace(self._path(seg), self._path(seg).with_suffix(".free"))
                    free += 1
                else:
                    self._path(seg).unlink()
                dropped += 1
        if dropped:
            self._segments = None
        return dropped


def check_meta(meta: Any, required: dict[str, type], optional: dict[str, type] | None = None) -> str | None:
    """What is wrong with a record's metadata for an owner that needs the ``required``
    keys and may read the ``optional`` ones, with these types (ints non-negative, never
    bools); None if nothing."""
    if not isinstance(meta, dict):
        return f"its metadata is a {type(meta).__name__}, not a map"
    for key, kind in {**required, **(optional or {})}.items():
        if key not in meta:
            if key in required:
                return f"its metadata has no {key!r}"
            continue
        value = meta[key]
        if type(value) is not kind or (isinstance(value, int) and value < 0):
            wanted = "a non-negative int" if kind is int else f"a {kind.__name__}"
            return f"its metadata's {key!r} is {value!r:.40}, not {wanted}"
    return None
