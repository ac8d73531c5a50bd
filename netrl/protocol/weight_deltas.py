"""Deltas between two versions of a model's encoding, and the checksum a worker verifies.

Internal; numpy, zstandard and zlib only. A delta carries version v of a format against version
``base`` of the same format::

    payload = zstd(shuffle4(encoding(v) - encoding(base)))     bytes minus bytes, modulo 256; the
                                                               frame header holds the content size
    shuffle4: byte 0 of every 4-byte word, then byte 1 of each, byte 2, byte 3 (a tail under 4 bytes
              stays last)

The trainer makes them (:func:`delta_encode`, :func:`crc`), the server relays them as bytes, and a
worker applies them (:func:`delta_apply`) and checks the result against the crc.
"""

from __future__ import annotations

import threading
import zlib

import numpy as np
import zstandard

from netrl.protocol.weight_format_base import FormatError, byte_view

__all__ = ["crc", "delta_apply", "delta_encode"]

_state = threading.local()  # zstd (de)compressors are not thread-safe: one pair per thread


def _zstd_c(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_state, "compressors", None)
    if cache is None:
        cache = _state.compressors = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def _zstd_d() -> zstandard.ZstdDecompressor:
    if not hasattr(_state, "decompressor"):
        _state.decompressor = zstandard.ZstdDecompressor()
    return _state.decompressor


def _shuffle(x: np.ndarray) -> np.ndarray:
    """Byte 0 of every 4-byte word, then byte 1 of each, ...: a small change leaves the
    sign/exponent bytes of a float equal, so their difference makes long runs of zeros."""
    head = x.nbytes // 4 * 4
    out = np.empty_like(x)
    out[:head].reshape(4, -1)[:] = x[:head].reshape(-1, 4).T
    out[head:] = x[head:]
    return out


# A delta is the byte-wise difference modulo 256, not the XOR: just as exact, and where an int8 code
# moves by one step (most do, between two versions of a training actor) the difference is 1 or 255
# whatever the code, while the XOR takes many values; zstd makes int8 deltas 17% smaller (2% for
# float32) on a 1M-parameter actor.
def _minus(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.subtract(a, b, out=out)  # uint8: wraps modulo 256


def _plus(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.add(a, b, out=out)


def delta_encode(base: np.ndarray, new: np.ndarray, level: int = 3) -> np.ndarray:
    """The compressed delta that turns encoding ``base`` into encoding ``new`` (of the same size
    and format)."""
    base, new = byte_view(base, "the base encoding"), byte_view(new, "the new encoding")
    if base.nbytes != new.nbytes:
        raise FormatError(f"a delta needs two encodings of one size: the base has {base.nbytes} "
                          f"bytes, the new version {new.nbytes}")
    diff = np.empty_like(new)
    _minus(new, base, diff)
    return np.frombuffer(_zstd_c(level).compress(_shuffle(diff).data), np.uint8)


def delta_apply(base: np.ndarray, payload: np.ndarray | bytes | memoryview, encoded: int,
                out: np.ndarray | None = None) -> np.ndarray:
    """The encoding ``payload`` (from :func:`delta_encode`) leads to from encoding ``base``, in
    ``out`` (which may be ``base`` itself) or a new array. ``encoded`` is the size the sender
    declares; a payload that declares or inflates to another size (a decompression bomb included)
    raises FormatError before using more memory."""
    base = byte_view(base, "the base encoding")
    if base.nbytes != encoded:
        raise FormatError(f"the delta is against a {encoded}-byte encoding, but the base held has "
                          f"{base.nbytes} bytes (another format or layout?)")
    if isinstance(payload, (bytes, memoryview)):
        data = payload
    else:
        data = byte_view(payload, "the delta").data
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise FormatError(f"the delta is not a zstd frame ({exc})") from None
    if declared != encoded:
        said = "no size" if declared == -1 else f"{declared} bytes"
        raise FormatError(f"the delta declares {said}, but the encoding it makes has {encoded} "
                          "bytes")
    try:  # bounded: the output buffer is the declared size, and the data must fill it exactly
        shuffled = _zstd_d().decompress(data, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise FormatError(f"the delta does not decompress to {encoded} bytes ({exc})") from None
    if len(shuffled) != encoded:
        raise FormatError(f"the delta decompresses to {len(shuffled)} bytes, expected {encoded}")
    if out is None:
        out = np.empty(encoded, np.uint8)
    target = byte_view(out, "out")
    if target.nbytes != encoded or not target.flags.writeable:
        raise FormatError(f"cannot apply a {encoded}-byte delta into a {target.nbytes}-byte "
                          f"{'' if target.flags.writeable else 'read-only '}buffer")
    x = np.frombuffer(shuffled, np.uint8)
    diff = np.empty(encoded, np.uint8)
    head = encoded // 4 * 4
    diff[:head].reshape(-1, 4)[:] = x[:head].reshape(4, -1).T
    diff[head:] = x[head:]
    _plus(base, diff, target)
    return out


def crc(encoding: np.ndarray) -> int:
    """zlib.crc32 of an encoding: the worker checks it after applying a delta or receiving a full
    version."""
    return zlib.crc32(byte_view(encoding, "the encoding").data)
