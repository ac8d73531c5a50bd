"""One record of a segment log on disk: its byte layout, and reading it back.

A record holds one message's frames plus a small metadata map::

    record  = magic "NRL3" | crc32c (u32) | segment number (u32) | header length (u32)
              | data length (u64) | header | data
    header  = msgpack {"m": metadata, "l": [length of each frame]}
    data    = the frames, concatenated

The CRC (CRC-32C, computed in hardware) covers the segment number, header and data, so a recycled
segment file's old records never pass for new ones. :func:`read_record` reads one record or says why
there is none (:data:`TORN`, :data:`FOREIGN`, :data:`DAMAGED`); :func:`next_record` finds where
reading can resume after damage. :class:`~netrl.storage.segments.SegmentLog` writes records in this
layout and decides what to do about each problem.
"""

from __future__ import annotations

import mmap
import struct
from typing import Any

import crc32c
import msgpack

__all__ = ["DAMAGED", "FOREIGN", "HEAD", "MAGIC", "MAX_SEGMENT", "SEG", "TORN", "next_record",
           "other_format", "read_record", "renumbered"]

MAGIC = b"NRL3"
HEAD = struct.Struct("<4sIIIQ")  # magic, crc, segment number, header length, data length
SEG = struct.Struct("<I")  # the segment number, as the crc covers it
MAX_HEADER = 1 << 20
MAX_SEGMENT = 2**32 - 1  # the header's u32

TORN = "torn"  # the record runs past the end of the file: a write cut short
# no record of this segment starts here: an old record of a recycled file, or garbage
FOREIGN = "foreign"
DAMAGED = "damaged"  # a whole record of this segment whose checksum or header is wrong


def next_record(f: Any, offset: int, segment: int, size: int) -> int | None:
    """Where the first valid record of ``segment`` after ``offset`` starts (the end of a damaged
    stretch), or None if none does before ``size`` (a torn or damaged tail)."""
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        start = data.find(MAGIC, offset + 1, size)
        while start != -1:
            if isinstance(read_record(f, start, segment, size), tuple):
                return start
            start = data.find(MAGIC, start + 1, size)
    return None


def renumbered(f: Any, offset: int, segment: int, size: int) -> bool:
    """True if the bytes at ``offset`` are a whole record of ``segment`` whose magic or segment
    number alone is wrong (its checksum, which covers the segment number it was written with,
    matches ``segment``): damage, not a recycled file's old record, which matches the segment number
    it names."""
    f.seek(offset)
    head = f.read(HEAD.size)
    if len(head) < HEAD.size:
        return False
    _, crc, _, header_len, data_len = HEAD.unpack(head)
    if header_len > MAX_HEADER or offset + HEAD.size + header_len + data_len > size:
        return False
    rest = f.read(header_len + data_len)
    return crc32c.crc32c(rest, crc32c.crc32c(SEG.pack(segment))) == crc


def other_format(f: Any, offset: int) -> bytes | None:
    """The magic of another netrl log format if a record of one starts at ``offset``, else None."""
    f.seek(offset)
    magic = f.read(len(MAGIC))
    return magic if len(magic) == len(MAGIC) and magic[:3] == MAGIC[:3] and magic != MAGIC else None


def read_record(f: Any, offset: int, segment: int,
                size: int) -> tuple[int, dict[str, Any], list[memoryview]] | str:
    """(next offset, metadata, frames) of the record of ``segment`` at ``offset`` in a file of
    ``size`` bytes, or why there is none: :data:`TORN`, :data:`FOREIGN` or :data:`DAMAGED`."""
    f.seek(offset)
    head = f.read(HEAD.size)
    if len(head) < HEAD.size:
        return TORN
    magic, crc, seg, header_len, data_len = HEAD.unpack(head)
    if magic != MAGIC or seg != segment:
        return FOREIGN
    if header_len > MAX_HEADER:
        return DAMAGED
    # checked before reading: a damaged length can be huge
    if offset + HEAD.size + header_len + data_len > size:
        return TORN
    header = f.read(header_len)
    body = f.read(data_len)
    if crc32c.crc32c(body, crc32c.crc32c(header, crc32c.crc32c(SEG.pack(seg)))) != crc:
        return DAMAGED
    try:
        parsed = msgpack.unpackb(header, raw=False)
        meta, lengths = parsed["m"], parsed["l"]
    except Exception:  # intact by its checksum, yet not a header this code wrote
        return DAMAGED
    if not (isinstance(lengths, list) and all(type(n) is int and n >= 0 for n in lengths)
            and sum(lengths) == data_len):
        return DAMAGED
    view = memoryview(body)
    frames, pos = [], 0
    for n in lengths:
        frames.append(view[pos:pos + n])
        pos += n
    return offset + HEAD.size + header_len + data_len, meta, frames
