"""What a weight format is: the class a format subclasses, and the layout every format works on.

Internal; numpy only. A model's *flat buffer* is the one :func:`netrl.protocol.weights.flat_layout`
describes: its tensors in ``layout = [[name, dtype, shape, offset], ...]`` order, each at a multiple
of 64 bytes, zero padding between. A format encodes the float32 tensors of that buffer of at least
:data:`EXACT_BELOW` (64) elements; a smaller one (an action scale, a temperature) and a tensor of
any other dtype travel raw, bit-exact, in every format. The structure of an encoding follows from
the layout alone (:meth:`WeightFormat.encoded_nbytes`).

:class:`WeightFormat` is the interface, :class:`Encoder` the state one model's successive versions
share; :mod:`netrl.protocol.builtin_formats` holds float32, float16, bfloat16 and int8, and
:mod:`netrl.protocol.weight_formats` the registry of the formats known in this process.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from netrl.errors import MalformedMessage, ProtocolError
from netrl.protocol.checks import check_layout

__all__ = ["EXACT_BELOW", "Encoder", "Entry", "FormatError", "WeightFormat", "align", "byte_view",
           "flat_bytes", "flat_nbytes", "layout_entries", "layout_plan", "tensor_view"]

_FLOAT32 = "<f4"
_FLAT_ALIGN = 64  # as netrl.protocol.weights.flat_layout places tensors


class FormatError(ProtocolError):
    """An encoding, a delta or a format name is not what it must be; the message names what was
    wrong."""


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


# Smaller float32 tensors travel raw, exact, in every format: an actor's action scale and offset, a
# temperature, a one-unit head's bias. Quantising them moves every action (2.0 in int8 is 2.0020,
# outside a [-2, 2] action space, and the server refuses such actions), and they cost nothing.
EXACT_BELOW = 64


def align(n: int, to: int) -> int:
    """``n`` rounded up to a multiple of ``to``."""
    return -(-n // to) * to


def layout_plan(layout: Any) -> tuple[tuple[Entry, ...], int]:
    """The entries of a layout and the size of its flat buffer (FormatError when the layout is
    malformed: see :func:`netrl.protocol.checks.check_layout`). Worked out once per layout: a decode
    per version reuses it."""
    try:
        key: tuple[Any, ...] | None = tuple((name, dtype, tuple(shape), offset)
                                            for name, dtype, shape, offset in layout)
        hash(key)
    except (TypeError, ValueError):  # not [[name, dtype, shape, offset], ...] of plain values
        key = None
    try:
        if key is None:
            check_layout(layout, 1 << 62)  # names the problem
            raise FormatError(f"the layout must be a list of [name, dtype, shape, offset] (got "
                              f"{str(layout)[:60]})")
        return _checked_plan(key)
    except MalformedMessage as exc:
        raise FormatError(str(exc)) from None


@functools.lru_cache(maxsize=64)
def _checked_plan(key: tuple[Any, ...]) -> tuple[tuple[Entry, ...], int]:
    layout = [[name, dtype, list(shape), offset] for name, dtype, shape, offset in key]
    check_layout(layout, 1 << 62)  # the structure first: then the sizes below are well defined
    nbytes = max(align(offset + math.prod(shape) * np.dtype(dtype).itemsize, _FLAT_ALIGN)
                 for _, dtype, shape, offset in key)
    tensors = tuple(Entry(name, np.dtype(dtype), tuple(shape), offset, math.prod(shape))
                    for name, dtype, shape, offset in key)
    return tensors, nbytes


def layout_entries(layout: list[list[Any]]) -> tuple[Entry, ...]:
    """The entries of a layout (see :func:`layout_plan`)."""
    return layout_plan(layout)[0]


def flat_nbytes(layout: list[list[Any]]) -> int:
    """The size of the flat buffer ``layout`` describes (as
    :func:`netrl.protocol.weights.flat_layout` makes it)."""
    return layout_plan(layout)[1]


def byte_view(arr: np.ndarray, what: str) -> np.ndarray:
    """A 1-D uint8 view of a C-contiguous array (FormatError otherwise: copying would hide a wrong
    argument)."""
    if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
        raise FormatError(f"{what} must be a C-contiguous numpy array (got {type(arr).__name__})")
    return arr.reshape(-1).view(np.uint8)


def flat_bytes(flat: np.ndarray, nbytes: int) -> np.ndarray:
    """A flat buffer handed to an encoder, as bytes (FormatError unless it has its layout's
    ``nbytes``)."""
    flat = byte_view(flat, "the flat buffer")
    if flat.nbytes != nbytes:
        raise FormatError(f"the flat buffer has {flat.nbytes} bytes; its layout needs {nbytes}")
    return flat


def tensor_view(buf: np.ndarray, dtype: Any, count: int, offset: int) -> np.ndarray:
    """``count`` elements of ``dtype`` at byte ``offset`` of ``buf``, without a copy."""
    if not count:
        return np.empty(0, dtype)
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset)


class Encoder:
    """Encodes successive versions of one model in one format; may keep state between them (int8's
    scales).

    :meth:`encode` returns a new array per version, which the encoder never writes again (the
    trainer keeps it as the base of the next delta); float32's is the flat buffer passed in
    itself."""

    def encode(self, flat: np.ndarray) -> np.ndarray:
        """The uint8 encoding of one version, given its flat buffer (uint8, in the encoder's
        layout)."""
        raise NotImplementedError


class WeightFormat:
    """A way to encode a model's flat buffer. Subclass it, set the attributes, implement
    :meth:`decode` and either :meth:`encode` (stateless) or :meth:`encoder`, then
    :func:`~netrl.protocol.weight_formats.register_format` it on the trainer and the workers.

    ``rank`` orders formats by fidelity (0: exact) for ``auto``; ``deltas = True`` makes the trainer
    send deltas between versions too when ``network.weight_format`` names this format."""

    name: str = ""
    exact: bool = False
    rank: int = 1
    promise: str = ""
    deltas: bool = False

    def encoder(self, layout: list[list[Any]]) -> Encoder:
        """An encoder for successive versions of a model with this layout (FormatError for a
        malformed layout)."""
        return _StatelessEncoder(self, layout)

    def encode(self, flat: np.ndarray, layout: list[list[Any]]) -> np.ndarray:
        """The encoding of one version (for a format that keeps no state between versions)."""
        raise NotImplementedError(f"format {self.name!r} defines neither encode() nor encoder()")

    def encoded_nbytes(self, layout: list[list[Any]]) -> int | None:
        """The size of every encoding of a model with this layout; None: it varies."""
        return None

    def decode(self, encoding: np.ndarray, layout: list[list[Any]], out: np.ndarray) -> None:
        """Write the flat buffer an encoding stands for into ``out`` (a zeroed uint8 flat buffer of
        the layout, whose padding stays zero). Raises FormatError on an encoding that does not fit
        the layout."""
        raise NotImplementedError

    def max_error(self, original: np.ndarray, decoded: np.ndarray,
                  layout: list[list[Any]]) -> float:
        """The largest absolute difference over the float32 weights between two flat buffers (NaN
        where both are NaN counts as equal); inf when a tensor of another dtype differs at all."""
        worst = 0.0
        for e in layout_entries(layout):
            a, b = (tensor_view(buf, e.dtype, e.size, e.offset) for buf in (original, decoded))
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

    def _sizes(self, layout: list[list[Any]], encoded: np.ndarray,
               out: np.ndarray) -> tuple[Entry, ...]:
        """The layout's entries, after checking the sizes of an encoding and of the buffer it
        decodes into."""
        tensors, nbytes = layout_plan(layout)
        want = self.encoded_nbytes(layout)
        if want is not None and encoded.nbytes != want:
            raise FormatError(f"a {self.name} encoding of this layout has {want} bytes, not "
                              f"{encoded.nbytes}")
        if out.nbytes != nbytes or not out.flags.writeable:
            raise FormatError(f"the layout's flat buffer has {nbytes} bytes; cannot decode into a "
                              f"{'read-only ' if not out.flags.writeable else ''}{out.nbytes}-byte "
                              "buffer")
        return tensors


class _StatelessEncoder(Encoder):
    def __init__(self, fmt: WeightFormat, layout: list[list[Any]]) -> None:
        self.fmt, self.layout, self.nbytes = fmt, layout, flat_nbytes(layout)

    def encode(self, flat: np.ndarray) -> np.ndarray:
        return self.fmt.encode(flat_bytes(flat, self.nbytes), self.layout)
