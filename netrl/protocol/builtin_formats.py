"""The built-in weight formats: float32, float16, bfloat16 and int8.

Internal; numpy only. Each is a :class:`~netrl.protocol.weight_format_base.WeightFormat` that
:mod:`netrl.protocol.weight_formats` registers in every process. Byte layout of their encodings
(``n`` elements per tensor; each tensor's part starts at a multiple of 8 bytes of the encoding, zero
padding after it, so that :meth:`~netrl.protocol.weight_format_base.WeightFormat.decode` views it in
place)::

    float32    the flat buffer itself (rank 0, exact)
    float16    float32 tensor: n x <f2, IEEE half precision, rounded to nearest even
               other tensor: its raw bytes
               ("float32 tensor" here: one of at least EXACT_BELOW elements; a smaller one is an
               "other tensor")
    bfloat16   float32 tensor: n x <u2, the top 16 bits of each float32, rounded to nearest even
               (NaN stays NaN)
    int8       float32 tensor: r x <f4 scales, padding, then n x i1 codes in [-127, 127] (C order);
               r = shape[0] for a tensor of >= 2 dims (one scale per output channel), else 1;
               value = code * scale
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netrl.protocol.weight_format_base import (
    Encoder,
    Entry,
    FormatError,
    WeightFormat,
    align,
    byte_view,
    flat_bytes,
    flat_nbytes,
    layout_entries,
    tensor_view,
)

__all__ = ["BUILTIN_FORMATS"]

_PART_ALIGN = 8  # each tensor's part of an encoding: every dtype can be viewed in place


class _Float32(WeightFormat):
    name, exact, rank, promise = "float32", True, 0, "bit-exact (the flat buffer itself)"

    def encode(self, flat: np.ndarray, layout: list[list[Any]]) -> np.ndarray:
        return flat  # no copy: the caller must not overwrite flat while it needs this encoding

    def encoded_nbytes(self, layout: list[list[Any]]) -> int:
        return flat_nbytes(layout)

    def decode(self, encoding: np.ndarray, layout: list[list[Any]], out: np.ndarray) -> None:
        encoding = byte_view(encoding, "the encoding")
        self._sizes(layout, encoding, out)
        byte_view(out, "out")[:] = encoding


class _Parts(WeightFormat):
    """A format whose encoding is one part per tensor: raw bytes for a tensor that is not
    float32."""

    def part_nbytes(self, e: Entry) -> int:
        """The bytes of a float32 tensor's part, before alignment."""
        raise NotImplementedError

    def encode_part(self, e: Entry, w: np.ndarray, part: np.ndarray) -> None:
        """Encode the float32 weights ``w`` into ``part`` (a zeroed uint8 array of
        :meth:`part_nbytes`)."""
        raise NotImplementedError

    def decode_part(self, e: Entry, part: np.ndarray, out: np.ndarray) -> None:
        """Decode ``part`` into the float32 array ``out`` (FormatError on a bad part)."""
        raise NotImplementedError

    def _places(self, layout: list[list[Any]]) -> tuple[list[tuple[Entry, int, int]], int]:
        places, at = [], 0
        for e in layout_entries(layout):
            size = self.part_nbytes(e) if e.lossy else e.nbytes
            places.append((e, at, size))
            at += align(size, _PART_ALIGN)
        return places, at

    def encoded_nbytes(self, layout: list[list[Any]]) -> int:
        return self._places(layout)[1]

    def encode(self, flat: np.ndarray, layout: list[list[Any]]) -> np.ndarray:
        places, total = self._places(layout)
        encoding = np.zeros(total, np.uint8)
        for e, at, size in places:
            part = encoding[at:at + size]
            if e.lossy:
                self.encode_part(e, tensor_view(flat, np.float32, e.size, e.offset), part)
            else:
                part[:] = flat[e.offset:e.offset + size]
        return encoding

    def decode(self, encoding: np.ndarray, layout: list[list[Any]], out: np.ndarray) -> None:
        encoding, out = byte_view(encoding, "the encoding"), byte_view(out, "out")
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
        raise FormatError(f"tensor {e.name!r} holds {float(w[i])!r} (element {i}), beyond {fmt}'s "
                          "range: send this version in float32")


class _Parts16(_Parts):
    """A 16-bit format: two bytes per weight."""

    def part_nbytes(self, e: Entry) -> int:
        return 2 * e.size


class _Float16(_Parts16):
    name, rank = "float16", 1
    promise = ("relative error <= 2**-11 for |w| >= 2**-14 (float16's normal range), absolute "
               "<= 2**-25 below")

    def encode_part(self, e: Entry, w: np.ndarray, part: np.ndarray) -> None:
        half = part.view(np.float16)
        with np.errstate(over="ignore"):
            half[:] = w  # round to nearest even
        _overflow(e, w, half, "float16")

    def decode_part(self, e: Entry, part: np.ndarray, out: np.ndarray) -> None:
        out[:] = part.view(np.float16)


class _BFloat16(_Parts16):
    name, rank = "bfloat16", 2
    promise = ("relative error <= 2**-8 (absolute <= 2**-134 below float32's normal range, "
               "|w| < 2**-126)")

    def encode_part(self, e: Entry, w: np.ndarray, part: np.ndarray) -> None:
        bits = w.view(np.uint32)
        # round to nearest even on the top 16 bits: add 0x7FFF plus the lowest kept bit, then
        # truncate
        top = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
        nan = np.isnan(w)
        # rounding could carry a NaN's low payload into infinity: keep the top bits, quiet
        if nan.any():
            top[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)
        part.view(np.uint16)[:] = top
        _overflow(e, w, (top.astype(np.uint32) << 16).view(np.float32), "bfloat16")

    def decode_part(self, e: Entry, part: np.ndarray, out: np.ndarray) -> None:
        out.view(np.uint32)[:] = part.view(np.uint16).astype(np.uint32) << 16


class _Int8(_Parts):
    name, rank = "int8", 3
    promise = ("absolute error <= scale/2 per element (plus float32 rounding, under scale * "
               "2**-16), with one scale per output channel, between max|w| / 127 and 2 * max|w| / "
               "127 of its row")

    def part_nbytes(self, e: Entry) -> int:
        return align(4 * e.rows, _PART_ALIGN) + e.size

    def encoder(self, layout: list[list[Any]]) -> Encoder:
        return _Int8Encoder(self, layout)

    def encode(self, flat: np.ndarray, layout: list[list[Any]]) -> np.ndarray:
        return _Int8Encoder(self, layout).encode(flat)  # fresh scales: no stability across calls

    def decode_part(self, e: Entry, part: np.ndarray, out: np.ndarray) -> None:
        at = align(4 * e.rows, _PART_ALIGN)
        scales, codes = part[:4 * e.rows].view(np.float32), part[at:at + e.size].view(np.int8)
        if not (np.isfinite(scales).all() and (scales >= 0).all()):
            raise FormatError(f"tensor {e.name!r}: an int8 scale is negative or not finite")
        if e.size and int(codes.min()) < -127:
            raise FormatError(f"tensor {e.name!r}: an int8 code is -128, outside [-127, 127]")
        if e.size:
            np.multiply(codes.reshape(e.rows, -1), scales[:, None], out=out.reshape(e.rows, -1))


class _Int8Encoder(Encoder):
    """int8 with scales kept between versions.

    A row keeps its scale s while its max|w| stays within [127*s/2, 127*s]; only then is it set
    anew, to max|w| * 1.125 / 127 (headroom for growth). A weight that moved by less than s/2 thus
    mostly keeps its code, so consecutive versions' codes agree almost everywhere and their
    difference (the delta) is mostly zero bytes, which zstd compresses well; new scales every
    version would change nearly every code by a little."""

    def __init__(self, fmt: _Int8, layout: list[list[Any]]) -> None:
        self.fmt, self.layout, self.nbytes = fmt, layout, flat_nbytes(layout)
        self.places, self.total = fmt._places(layout)
        self.scales = {e.name: np.zeros(e.rows, np.float32) for e, _, _ in self.places if e.lossy}

    def encode(self, flat: np.ndarray) -> np.ndarray:
        flat = flat_bytes(flat, self.nbytes)
        encoding = np.zeros(self.total, np.uint8)
        for e, at, size in self.places:
            part = encoding[at:at + size]
            if not e.lossy:
                part[:] = flat[e.offset:e.offset + size]
            elif e.size:
                w = tensor_view(flat, np.float32, e.size, e.offset).reshape(e.rows, -1)
                self._encode(e, w, part)
        return encoding

    def _encode(self, e: Entry, w: np.ndarray, part: np.ndarray) -> None:
        peak = np.abs(w).max(axis=1, initial=0.0)
        if not np.isfinite(peak).all():
            row = int(np.argmin(np.isfinite(peak)))
            raise FormatError(f"tensor {e.name!r} row {row} holds NaN or infinity, which int8 "
                              "cannot carry: send this version in float32")
        s = self.scales[e.name]
        keep = (s > 0) & (peak <= 127 * s) & (peak >= 63.5 * s)
        s[:] = np.where(keep, s, peak * np.float32(1.125 / 127))
        at = align(4 * e.rows, _PART_ALIGN)
        part[:4 * e.rows].view(np.float32)[:] = s
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.rint(w / s[:, None])
        q[s == 0] = 0  # a row of zeros: scale 0, codes 0 (0/0 above)
        np.clip(q, -127, 127, out=q)
        part[at:at + e.size].view(np.int8)[:] = q.reshape(-1)


# In the order format_names() lists them
BUILTIN_FORMATS: tuple[WeightFormat, ...] = (_Float32(), _Float16(), _BFloat16(), _Int8())
