"""Packet compression: the codecs a worker may apply to each array of a
packet (``worker.compression``).

:func:`compress` compresses integer arrays (images, masks) of at least ``COMPRESS_MIN_BYTES``
where that saves over 10%, and leaves float arrays, which barely compress, raw. :func:`decompress`
inflates untrusted data to exactly the size the wire header declared, or raises
:class:`~netrl.errors.MalformedMessage`: a payload that would inflate beyond it (a decompression
bomb) stops there. :mod:`netrl.protocol.wire` records the codec per array.
"""

from __future__ import annotations

import threading
from typing import Any, Literal

import lz4.block
import numpy as np
import zstandard

from netrl.errors import MalformedMessage

__all__ = ["CODECS", "COMPRESS_MIN_BYTES", "Codec", "check_declared_size", "compress", "decompress"]

Codec = Literal["none", "zstd", "lz4"]
CODECS = ("none", "zstd", "lz4")
COMPRESS_MIN_BYTES = 1024


class _Compressors(threading.local):
    """Reused (de)compressor objects, one pair per thread: creating them per message costs more
    than small payloads, and python-zstandard's objects must not be used by two threads at once (a
    trainer's network thread decodes packets while its training thread replays the sample log)."""

    def __init__(self) -> None:
        self.zstd_c = zstandard.ZstdCompressor(level=1)
        self.zstd_d = zstandard.ZstdDecompressor()


_compressors = _Compressors()


def compress(arr: np.ndarray, codec: Codec) -> tuple[str, Any]:
    """Compress integer data (images, masks) where it pays; float vectors barely
    compress and stay raw."""
    raw = np.ascontiguousarray(arr).data.cast("B")
    if codec == "none" or arr.dtype.kind == "f" or raw.nbytes < COMPRESS_MIN_BYTES:
        return "none", raw
    packed = _compressors.zstd_c.compress(raw) if codec == "zstd" else lz4.block.compress(raw, store_size=False)
    if len(packed) > 0.9 * raw.nbytes:
        return "none", raw
    return codec, packed


def check_declared_size(name: str, codec: str, data: memoryview, nbytes: int) -> None:
    """What can be checked without decompressing: the size a zstd frame declares
    (lz4 blocks declare none)."""
    if codec != "zstd":
        return
    try:
        declared = zstandard.frame_content_size(data)
    except Exception as exc:  # not even a zstd frame header
        raise MalformedMessage(f"array {name!r}: zstd data does not decompress ({exc})") from None
    if declared not in (nbytes, -1):
        raise MalformedMessage(f"array {name!r}: zstd frame declares "
                               f"{declared} bytes, expected {nbytes}")


def decompress(name: str, codec: str, data: memoryview, nbytes: int) -> bytes:
    """Inflate array ``name`` to exactly ``nbytes`` bytes (MalformedMessage otherwise,
    never more memory)."""
    check_declared_size(name, codec, data, nbytes)
    try:
        if codec == "zstd":
            out = _compressors.zstd_d.decompress(data, max_output_size=nbytes)
        else:
            out = lz4.block.decompress(data, uncompressed_size=nbytes)
    except Exception as exc:  # every codec failure is a malformed message, never a crash
        raise MalformedMessage(f"array {name!r}: {codec} data does "
                               f"not decompress ({exc})") from None
    if len(out) != nbytes:
        raise MalformedMessage(f"array {name!r}: decompressed to "
                               f"{len(out)} bytes, expected {nbytes}")
    return out
