"""Weight formats: how one version of a model's flat buffer is encoded, and deltas between two versions.

Internal; numpy, zstandard and zlib only (no torch), so the server may import it, although it never decodes.

A model's *flat buffer* is the one :func:`netrl.protocol.weights.flat_layout` describes: its tensors in
``layout = [[name, dtype, shape, offset], ...]`` order, each at a multiple of 64 bytes, zero padding between.
A format encodes the float32 tensors of that buffer of at least ``EXACT_BELOW`` (64) elements; a smaller one (an
action scale, a temperature) and a tensor of any other dtype travel raw, bit-exact, in every format. The structure
of an encoding follows from the layout alone (:meth:`WeightFormat.encoded_nbytes`).

Byte layout of the built-in encodings (``n`` elements per tensor; each tensor's part starts at a multiple of
8 bytes of the encoding, zero padding after it, so that :meth:`WeightFormat.decode` views it in place)::

    float32    the flat buffer itself (rank 0, exact)
    float16    float32 tensor: n x <f2, IEEE half precision, rounded to nearest even    | other tensor: its raw bytes
               ("float32 tensor" here: one of at least EXACT_BELOW elements; a smaller one is an "other tensor")
    bfloat16   float32 tensor: n x <u2, the top 16 bits of each float32, rounded to nearest even (NaN stays NaN)
    int8       float32 tensor: r x <f4 scales, padding, then n x i1 codes in [-127, 127] (C order);
               r = shape[0] for a tensor of >= 2 dims (one scale per output channel), else 1; value = code * scale

A delta carries version v of a format against version ``base`` of the same format::

    payload = zstd(shuffle4(encoding(v) - encoding(base)))     bytes minus bytes, modulo 256; the frame header
                                                               holds the content size
    shuffle4: byte 0 of every 4-byte word, then byte 1 of each, byte 2, byte 3 (a tail under 4 bytes stays last)

The calling sequence (the trainer encodes and deltas, the server relays bytes, the worker applies and decodes)::

    fmt = get_format("int8"); encoder = fmt.encoder(layout)       # one encoder per model: int8 keeps its scales
    e1 = encoder.encode(flat_v1); e2 = encoder.encode(flat_v2)      # uint8 arrays, fmt.encoded_nbytes(layout) each
    payload = delta_encode(e1, e2); check = crc(e2)                 # trainer
    e2 = delta_apply(e1, payload, encoded=e2.nbytes)                # worker: then crc(e2) == check, or need_full
    fmt.decode(e2, layout, out)                                     # out: a zeroed flat buffer of the layout
"""

from __future__ import annotations

import functools
import math
import threading
import zlib
from typing import Any, NamedTuple

import numpy as np
import zstandard

from netrl.errors import MalformedMessage, ProtocolError
from netrl.protocol.wire import FORMAT_NAME, check_layout

__all__ = ["FORMAT_NAME", "Encoder", "FormatError", "WeightFormat", "crc", "delta_apply", "delta_encode",
           "flat_nbytes", "format_names", "formats_for", "get_format", "register_format", "sends_deltas"]

_FLOAT32 = "<f4"
_FLAT_ALIGN = 64  # as netrl.protocol.weights.flat_layout places tensors
_PART_ALIGN = 8  # each tensor's part of an encoding: every dtype can be viewed in place
_SETTINGS = {"delta": ["float32"], "auto": ["float32", "float16", "int8"]}  # network.weight_format beyond a name


class FormatError(ProtocolError):
    """An encoding, a delta or a format name is not what it must be; the message names what was wrong."""


class Entry(NamedTuple):
    """One tensor of a layout, worked out once per layout."""
    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    offset: int  # in the flat buffer
    size: int  # elements

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def float32(self) -> bool:
        return self.dtype.str == _FLOAT32

    @property
    def lossy(self) -> bool:
        """Whether a lossy format encodes it: a float32 tensor of at least EXACT_BELOW elements."""
        return self.float32 and self.size >= EXACT_BELOW

    @property
    def rows(self) -> int:
        """Output channels: int8's scales per tensor."""
        return self.shape[0] if len(self.shape) >= 2 else 1


# Smaller float32 tensors travel raw, exact, in every format: an actor's action scale and offset, a temperature, a
# one-unit head's bias. Quantising them moves every action (2.0 in int8 is 2.0020, outside a [-2, 2] action space,
# and the server refuses such actions), and they cost nothing.
EXACT_BELOW = 64


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


def _plan(layout: Any) -> tuple[tuple[Entry, ...], int]:
    """The entries of a layout and the size of its flat buffer (FormatError when the layout is malformed: see
    :func:`netrl.protocol.wire.check_layout`). Worked out once per layout: a decode per version reuses it."""
    try:
        key: tuple[Any, ...] | None = tuple((name, dtype, tuple(shape), offset)
                                            for name, dtype, shape, offset in layout)
        hash(key)
    except (TypeError, ValueError):  # not [[name, dtype, shape, offset], ...] of plain values
        key = None
    try:
        if key is None:
            check_layout(layout, 1 << 62)  # names the problem
            raise FormatError(f"the layout must be a list of [name, dtype, shape, offset] (got {str(layout)[:60]})")
        return _checked_plan(key)
    except MalformedMessage as exc:
        raise FormatError(str(exc)) from None


@functools.lru_cache(maxsize=64)
def _checked_plan(key: tuple[Any, ...]) -> tuple[tuple[Entry, ...], int]:
    layout = [[name, dtype, list(shape), offset] for name, dtype, shape, offset in key]
    check_layout(layout, 1 << 62)  # the structure first: then the sizes below are well defined
    nbytes = max(_align(offset + math.prod(shape) * np.dtype(dtype).itemsize, _FLAT_ALIGN)
                 for _, dtype, shape, offset in key)
    tensors = tuple(Entry(name, np.dtype(dtype), tuple(shape), offset, math.prod(shape))
                    for name, dtype, shape, offset in key)
    return tensors, nbytes


def _entries(layout: list[list[Any]]) -> tuple[Entry, ...]:
    return _plan(layout)[0]


def flat_nbytes(layout: list[list[Any]]) -> int:
    """The size of the flat buffer ``layout`` describes (as :func:`netrl.protocol.weights.flat_layout` makes it)."""
    return _plan(layout)[1]


def _bytes(arr: np.ndarray, what: str) -> np.ndarray:
    """A 1-D uint8 view of a C-contiguous array (FormatError otherwise: copying would hide a wrong argument)."""
    if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
        raise FormatError(f"{what} must be a C-contiguous numpy array (got {type(arr).__name__})")
    return arr.reshape(-1).view(np.uint8)


def _tensor(buf: np.ndarray, dtype: Any, count: int, offset: int) -> np.ndarray:
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset) if count else np.empty(0, dtype)


class Encoder:
    """Encodes successive versions of one model in one format; may keep state between them (int8's scales).

    :meth:`encode` returns a new array per version, which the encoder never writes again (the trainer keeps it as
    the base of the next delta); float32's is the flat buffer passed in itself."""

    def encode(self, flat: np.ndarray) -> np.ndarray:
        """The uint8 encoding of one version, given its flat buffer (uint8, in the encoder's layout)."""
        raise NotImplementedError


class WeightFormat:
    """A way to encode a model's flat buffer. Subclass it, set the attributes, implement :meth:`decode` and either
    :meth:`encode` (stateless) or :meth:`encoder`, then :func:`register_format` it on the trainer and the workers.

    ``rank`` orders formats by fidelity (0: exact) for ``auto``; ``deltas = True`` makes the trainer send deltas
    between versions too when ``network.weight_format`` names this format."""

    name: str = ""
    exact: bool = False
    rank: int = 1
    promise: str = ""
    deltas: bool = False

    def encoder(self, layout: list[list[Any]]) -> Encoder:
        """An encoder for successive versions of a model with this layout (FormatError for a malformed layout)."""
        return _StatelessEncoder(self, layout)

    def encode(self, flat: np.ndarray, layout: list[list[Any]]) -> np.ndarray:
        """The encoding of one version (for a format that keeps no state between versions)."""
        raise NotImplementedError(f"format {self.name!r} defines neither encode() nor encoder()")

    def encoded_nbytes(self, layout: list[list[Any]]) -> int | None:
        """The size of every encoding of a model with this layout; None: it varies."""
        return None

    def decode(self, encoding: np.ndarray, layout: list[list[Any]], out: np.ndarray) -> None:
        """Write the flat buffer an encoding stands for into ``out`` (a zeroed uint8 flat buffer of the layout,
        whose padding stays zero). Raises FormatError on an encoding that does not fit the layout."""
        raise NotImplementedError

    def max_error(self, original: np.ndarray, decoded: np.ndarray, layout: list[list[Any]]) -> float:
        """The largest absolute difference over the float32 weights between two flat buffers (NaN where both are
        NaN counts as equal); inf when a tensor of another dtype differs at all."""
        worst = 0.0
        for e in _entries(layout):
            a, b = (_tensor(buf, e.dtype, e.size, e.offset) for buf in (original, decoded))
            if not e.lossy:
                if a.tobytes() != b.tobytes():
                    return math.inf
                continue
            if e.size:
                with np.errstate(invalid="ignore", over="ignore"):
                    diff = np.abs(a.astype(np.float64) - b)
                both_nan = np.isnan(a) & np.isnan(b)
                diff[both_nan] = 0.0
                worst = max(worst, float(np.nan_to_num(diff, nan=math.inf).max()))
        return worst

    def _sizes(self, layout: list[list[Any]], encoded: np.ndarray, out: np.ndarray) -> tuple[Entry, ...]:
        """The layout's entries, after checking the sizes of an encoding and of the buffer it decodes into."""
        tensors, nbytes = _plan(layout)
        want = self.encoded_nbytes(layout)
        if want is not None and encoded.nbytes != want:
            raise FormatError(f"a {self.name} encoding of this layout has {want} bytes, not {encoded.nbytes}")
        if out.nbytes != nbytes or not out.flags.writeable:
            raise FormatError(f"the layout's flat buffer has {nbytes} bytes; cannot decode into a "
                              f"{'read-only ' if not out.flags.writeable else ''}{out.nbytes}-byte buffer")
        return tensors


class _StatelessEncoder(Encoder):
    def __init__(self, fmt: WeightFormat, layout: list[list[Any]]) -> None:
        self.fmt, self.layout, self.nbytes = fmt, layout, flat_nbytes(layout)

    def encode(self, flat: np.ndarray) -> np.ndarray:
        flat = _bytes(flat, "the flat buffer")
        if flat.nbytes != self.nbytes:
            raise FormatError(f"the flat buffer has {flat.nbytes} bytes; its layout needs {self.nbytes}")
        return self.fmt.encode(flat, self.layout)


class _Float32(WeightFormat):
    name, exact, rank, promise = "float32", True, 0, "bit-exact (the flat buffer itself)"

    def encode(self, flat: np.ndarray, layout: list[list[Any]]) -> np.ndarray:
        return flat  # no copy: the caller must not overwrite flat while it needs this encoding

    def encoded_nbytes(self, layout: list[list[Any]]) -> int:
        return flat_nbytes(layout)

    def decode(self, encoding: np.ndarray, layout: list[list[Any]], out: np.ndarray) -> None:
        encoding = _bytes(encoding, "the encoding")
        self._sizes(layout, encoding, out)
        _bytes(out, "out")[:] = encoding


class _Parts(WeightFormat):
    """A format whose encoding is one part per tensor: raw bytes for a tensor that is not float32."""

    def part_nbytes(self, e: Entry) -> int:
        """The bytes of a float32 tensor's part, before alignment."""
        raise NotImplementedError

    def encode_part(self, e: Entry, w: np.ndarray, part: np.ndarray) -> None:
        """Encode the float32 weights ``w`` into ``part`` (a zeroed uint8 array of :meth:`part_nbytes`)."""
        raise NotImplementedError

    def decode_part(self, e: Entry, part: np.ndarray, out: np.ndarray) -> None:
        """Decode ``part`` into the float32 array ``out`` (FormatError on a bad part)."""
        raise NotImplementedError

    def _places(self, layout: list[list[Any]]) -> tuple[list[tuple[Entry, int, int]], int]:
        places, at = [], 0
        for e in _entries(layout):
            size = self.part_nbytes(e) if e.lossy else e.nbytes
            places.append((e, at, size))
            at += _align(size, _PART_ALIGN)
        return places, at

    def encoded_nbytes(self, layout: list[list[Any]]) -> int:
        return self._places(layout)[1]

    def encode(self, flat: np.ndarray, layout: list[list[Any]]) -> np.ndarray:
        places, total = self._places(layout)
        encoding = np.zeros(total, np.uint8)
        for e, at, size in places:
            part = encoding[at:at + size]
            if e.lossy:
                self.encode_part(e, _tensor(flat, np.float32, e.size, e.offset), part)
            else:
                part[:] = flat[e.offset:e.offset + size]
        return encoding

    def decode(self, encoding: np.ndarray, layout: list[list[Any]], out: np.ndarray) -> None:
        encoding, out = _bytes(encoding, "the encoding"), _bytes(out, "out")
        self._sizes(layout, encoding, out)
        for e, at, size in self._places(layout)[0]:
            part = encoding[at:at + size]
            if e.lossy:
                self.decode_part(e, part, np.frombuffer(out, np.float32, e.size, e.offset) if e.size
                                 else np.empty(0, np.float32))
            else:
                out[e.offset:e.offset + size] = part


def _overflow(e: Entry, w: np.ndarray, coded: np.ndarray, fmt: str) -> None:
    """Raise FormatError when a finite weight became infinite in 16 bits."""
    bad = np.isinf(coded) & np.isfinite(w)
    if bad.any():
        i = int(np.argmax(bad))
        raise FormatError(f"tensor {e.name!r} holds {float(w[i])!r} (element {i}), beyond {fmt}'s range: send this "
                          "version in float32")


class _Parts16(_Parts):
    """A 16-bit format: two bytes per weight."""

    def part_nbytes(self, e: Entry) -> int:
        return 2 * e.size


class _Float16(_Parts16):
    name, rank = "float16", 1
    promise = "relative error <= 2**-11 for |w| >= 2**-14 (float16's normal range), absolute <= 2**-25 below"

    def encode_part(self, e: Entry, w: np.ndarray, part: np.ndarray) -> None:
        half = part.view(np.float16)
        with np.errstate(over="ignore"):
            half[:] = w  # round to nearest even
        _overflow(e, w, half, "float16")

    def decode_part(self, e: Entry, part: np.ndarray, out: np.ndarray) -> None:
        out[:] = part.view(np.float16)


class _BFloat16(_Parts16):
    name, rank = "bfloat16", 2
    promise = "relative error <= 2**-8 (absolute <= 2**-134 below float32's normal range, |w| < 2**-126)"

    def encode_part(self, e: Entry, w: np.ndarray, part: np.ndarray) -> None:
        bits = w.view(np.uint32)
        # round to nearest even on the top 16 bits: add 0x7FFF plus the lowest kept bit, then truncate
        top = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
        nan = np.isnan(w)
        if nan.any():  # rounding could carry a NaN's low payload into infinity: keep the top bits, quiet
            top[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)
        part.view(np.uint16)[:] = top
        _overflow(e, w, (top.astype(np.uint32) << 16).view(np.float32), "bfloat16")

    def decode_part(self, e: Entry, part: np.ndarray, out: np.ndarray) -> None:
        out.view(np.uint32)[:] = part.view(np.uint16).astype(np.uint32) << 16


class _Int8(_Parts):
    name, rank = "int8", 3
    promise = ("absolute error <= scale/2 per element (plus float32 rounding, under scale * 2**-16), with one scale "
               "per output channel, between max|w| / 127 and 2 * max|w| / 127 of its row")

    def part_nbytes(self, e: Entry) -> int:
        return _align(4 * e.rows, _PART_ALIGN) + e.size

    def encoder(self, layout: list[list[Any]]) -> Encoder:
        return _Int8Encoder(self, layout)

    def encode(self, flat: np.ndarray, layout: list[list[Any]]) -> np.ndarray:
        return _Int8Encoder(self, layout).encode(flat)  # fresh scales: no stability across calls

    def decode_part(self, e: Entry, part: np.ndarray, out: np.ndarray) -> None:
        at = _align(4 * e.rows, _PART_ALIGN)
        scales, codes = part[:4 * e.rows].view(np.float32), part[at:at + e.size].view(np.int8)
        if not (np.isfinite(scales).all() and (scales >= 0).all()):
            raise FormatError(f"tensor {e.name!r}: an int8 scale is negative or not finite")
        if e.size and int(codes.min()) < -127:
            raise FormatError(f"tensor {e.name!r}: an int8 code is -128, outside [-127, 127]")
        if e.size:
            np.multiply(codes.reshape(e.rows, -1), scales[:, None], out=out.reshape(e.rows, -1))


class _Int8Encoder(Encoder):
    """int8 with scales kept between versions.

    A row keeps its scale s while its max|w| stays within [127*s/2, 127*s]; only then is it set anew, to
    max|w| * 1.125 / 127 (headroom for growth). A weight that moved by less than s/2 thus mostly keeps its code, so
    consecutive versions' codes agree almost everywhere and their difference (the delta) is mostly zero bytes, which
    zstd compresses well; new scales every version would change nearly every code by a little."""

    def __init__(self, fmt: _Int8, layout: list[list[Any]]) -> None:
        self.fmt, self.layout, self.nbytes = fmt, layout, flat_nbytes(layout)
        self.places, self.total = fmt._places(layout)
        self.scales = {e.name: np.zeros(e.rows, np.float32) for e, _, _ in self.places if e.lossy}

    def encode(self, flat: np.ndarray) -> np.ndarray:
        flat = _bytes(flat, "the flat buffer")
        if flat.nbytes != self.nbytes:
            raise FormatError(f"the flat buffer has {flat.nbytes} bytes; its layout needs {self.nbytes}")
        encoding = np.zeros(self.total, np.uint8)
        for e, at, size in self.places:
            part = encoding[at:at + size]
            if not e.lossy:
                part[:] = flat[e.offset:e.offset + size]
            elif e.size:
                self._encode(e, _tensor(flat, np.float32, e.size, e.offset).reshape(e.rows, -1), part)
        return encoding

    def _encode(self, e: Entry, w: np.ndarray, part: np.ndarray) -> None:
        peak = np.abs(w).max(axis=1, initial=0.0)
        if not np.isfinite(peak).all():
            row = int(np.argmin(np.isfinite(peak)))
            raise FormatError(f"tensor {e.name!r} row {row} holds NaN or infinity, which int8 cannot carry: send "
                              "this version in float32")
        s = self.scales[e.name]
        keep = (s > 0) & (peak <= 127 * s) & (peak >= 63.5 * s)
        s[:] = np.where(keep, s, peak * np.float32(1.125 / 127))
        at = _align(4 * e.rows, _PART_ALIGN)
        part[:4 * e.rows].view(np.float32)[:] = s
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.rint(w / s[:, None])
        q[s == 0] = 0  # a row of zeros: scale 0, codes 0 (0/0 above)
        np.clip(q, -127, 127, out=q)
        part[at:at + e.size].view(np.int8)[:] = q.reshape(-1)


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
    """Byte 0 of every 4-byte word, then byte 1 of each, ...: a small change leaves the sign/exponent bytes of a
    float equal, so their difference makes long runs of zeros."""
    head = x.nbytes // 4 * 4
    out = np.empty_like(x)
    out[:head].reshape(4, -1)[:] = x[:head].reshape(-1, 4).T
    out[head:] = x[head:]
    return out


# A delta is the byte-wise difference modulo 256, not the XOR: just as exact, and where an int8 code moves by one
# step (most do, between two versions of a training actor) the difference is 1 or 255 whatever the code, while
# the XOR takes many values; zstd makes int8 deltas 17% smaller (2% for float32) on a 1M-parameter actor.
def _minus(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.subtract(a, b, out=out)  # uint8: wraps modulo 256


def _plus(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.add(a, b, out=out)


def delta_encode(base: np.ndarray, new: np.ndarray, level: int = 3) -> np.ndarray:
    """The compressed delta that turns encoding ``base`` into encoding ``new`` (of the same size and format)."""
    base, new = _bytes(base, "the base encoding"), _bytes(new, "the new encoding")
    if base.nbytes != new.nbytes:
        raise FormatError(f"a delta needs two encodings of one size: the base has {base.nbytes} bytes, the new "
                          f"version {new.nbytes}")
    diff = np.empty_like(new)
    _minus(new, base, diff)
    return np.frombuffer(_zstd_c(level).compress(_shuffle(diff).data), np.uint8)


def delta_apply(base: np.ndarray, payload: np.ndarray | bytes | memoryview, encoded: int,
                out: np.ndarray | None = None) -> np.ndarray:
    """The encoding ``payload`` (from :func:`delta_encode`) leads to from encoding ``base``, in ``out`` (which may
    be ``base`` itself) or a new array. ``encoded`` is the size the sender declares; a payload that declares or
    inflates to another size (a decompression bomb included) raises FormatError before using more memory."""
    base = _bytes(base, "the base encoding")
    if base.nbytes != encoded:
        raise FormatError(f"the delta is against a {encoded}-byte encoding, but the base held has {base.nbytes} "
                          "bytes (another format or layout?)")
    data = payload if isinstance(payload, (bytes, memoryview)) else _bytes(payload, "the delta").data
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise FormatError(f"the delta is not a zstd frame ({exc})") from None
    if declared != encoded:
        said = "no size" if declared == -1 else f"{declared} bytes"
        raise FormatError(f"the delta declares {said}, but the encoding it makes has {encoded} bytes")
    try:  # bounded: the output buffer is the declared size, and the data must fill it exactly
        shuffled = _zstd_d().decompress(data, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise FormatError(f"the delta does not decompress to {encoded} bytes ({exc})") from None
    if len(shuffled) != encoded:
        raise FormatError(f"the delta decompresses to {len(shuffled)} bytes, expected {encoded}")
    if out is None:
        out = np.empty(encoded, np.uint8)
    target = _bytes(out, "out")
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
    """zlib.crc32 of an encoding: the worker checks it after applying a delta or receiving a full version."""
    return zlib.crc32(_bytes(encoding, "the encoding").data)


_BUILTIN: dict[str, WeightFormat] = {f.name: f for f in (_Float32(), _Float16(), _BFloat16(), _Int8())}
_formats: dict[str, WeightFormat] = dict(_BUILTIN)
_lock = threading.Lock()


def register_format(fmt: WeightFormat, replace: bool = False) -> None:
    """Make ``fmt`` known under ``fmt.name`` in this process (trainer and workers; the server needs nothing)."""
    if not isinstance(fmt, WeightFormat):
        raise FormatError(f"register_format takes a WeightFormat instance, not {type(fmt).__name__}")
    name = fmt.name
    if not (isinstance(name, str) and FORMAT_NAME.fullmatch(name)):
        raise FormatError(f"the format name {name!r} is not a lower-case letter followed by up to 31 lower-case "
                          "letters, digits or _")
    if name in _SETTINGS:
        raise FormatError(f"{name!r} is a network.weight_format setting, not a format name: choose another name")
    if type(fmt.rank) is not int or fmt.rank < 0 or not isinstance(fmt.exact, bool):
        raise FormatError(f"format {name!r}: rank must be an int >= 0 (got {fmt.rank!r}) and exact a bool "
                          f"(got {fmt.exact!r})")
    with _lock:
        if name in _BUILTIN:
            raise FormatError(f"{name!r} is a built-in format, which cannot be replaced: choose another name")
        if name in _formats and not replace:
            raise FormatError(f"a format named {name!r} is registered already (pass replace=True to replace it)")
        _formats[name] = fmt


def get_format(name: str) -> WeightFormat:
    """The format registered as ``name`` (FormatError listing the known names otherwise)."""
    fmt = _formats.get(name)
    if fmt is None:
        raise FormatError(f"unknown weight format {str(name)[:40]!r}; known formats: {', '.join(format_names())} "
                          "(a custom one must be registered with register_format in this process)")
    return fmt


def format_names() -> list[str]:
    """Every format known in this process: the built-ins, then the registered ones."""
    return list(_formats)


def formats_for(setting: str) -> list[str]:
    """The formats the trainer encodes each version in for a ``network.weight_format`` setting."""
    if setting in _SETTINGS:
        return list(_SETTINGS[setting])
    if setting in _formats:
        return [setting]
    raise FormatError(f"network.weight_format is {str(setting)[:40]!r}; choose one of "
                      f"{', '.join([*_SETTINGS, *format_names()])}")


def sends_deltas(setting: str) -> bool:
    """Whether the trainer also sends each version as a delta against the one before, for this setting."""
    return setting in _SETTINGS or bool(get_format(formats_for(setting)[0]).deltas)
