"""Actor weights as numpy arrays, for the wire (files: :mod:`netrl.storage.weight_files`).

Weights received from the network are checked for a well-formed layout
(:func:`netrl.protocol.wire.check_layout`), against the receiving model's parameter names, shapes
and dtypes, and for finiteness before anything is loaded.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from netrl.errors import NetrlError
from netrl.protocol.checks import ALLOWED_DTYPES, check_layout

__all__ = ["MAX_SLOW_PARTS", "MIN_COMPACT_PART_BYTES", "MIN_PART_BYTES", "PARTS_PER_VERSION", "PART_BYTES",
           "SLOW_PART_BYTES", "KnownLayout",
           "WeightAssembler", "WeightSpecs",
           "all_finite", "check_weights", "copy_tensors", "flat_arrays", "flat_layout", "flat_views", "load_weights",
           "part_bytes", "snapshot_into", "state_arrays", "sum_is_finite", "tensor_views", "weight_specs"]


# str() of a dtype costs microseconds, and this runs per tensor of every received version
@functools.cache
def _dtype_name(dtype: Any) -> str:
    """The name ("float32", ...) of a numpy or torch dtype."""
    return str(dtype).removeprefix("torch.")


@functools.cache
def _np_dtype(dtype: torch.dtype) -> np.dtype[Any] | None:
    """The numpy dtype a tensor of ``dtype`` travels as; None for one the wire does not
    carry (bfloat16, complex)."""
    try:
        np_dtype = np.dtype(_dtype_name(dtype))
    except TypeError:  # no numpy twin: bfloat16, the float8 types
        return None
    return np_dtype if np_dtype.str in ALLOWED_DTYPES else None


def state_arrays(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """A snapshot of ``module.state_dict()`` as contiguous numpy arrays (copies:
    training goes on)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


WeightSpecs = dict[str, tuple[tuple[int, ...], str, bool]]  # name -> (shape, dtype, floating point)


def weight_specs(module: torch.nn.Module) -> WeightSpecs:
    """What :func:`check_weights` checks against, taken from ``module`` once (a receiver
    reuses it per version)."""
    return {name: (tuple(t.shape), _dtype_name(t.dtype), t.dtype.is_floating_point)
            for name, t in module.state_dict().items()}


def check_weights(module: torch.nn.Module | WeightSpecs, arrays: Mapping[str, Any]) -> list[str]:
    """Problems that stop ``arrays`` (numpy arrays or CPU tensors) from loading into ``module``:
    missing, unexpected, misshapen or non-finite."""
    expected = weight_specs(module) if isinstance(module, torch.nn.Module) else module
    problems = [f"missing parameter {k!r}" for k in expected if k not in arrays]
    problems += [f"unexpected parameter {k!r}" for k in arrays if k not in expected]
    # once, not per array: a sum may overflow (see all_finite)
    with np.errstate(over="ignore", invalid="ignore"):
        for name, (want_shape, want_dtype, floating) in expected.items():
            got = arrays.get(name)
            if got is None:
                continue
            shape, dtype = tuple(got.shape), _dtype_name(got.dtype)
            if shape != want_shape:
                problems.append(f"parameter {name!r} has shape {shape}, "
                                f"the model needs {want_shape}")
            elif dtype != want_dtype:
                problems.append(f"parameter {name!r} has dtype {dtype}, "
                                f"the model needs {want_dtype}")
            elif floating and not _finite(got if isinstance(got, torch.Tensor) else np.asarray(got)):
                problems.append(f"parameter {name!r} contains NaN or infinity")
    return problems


def all_finite(arr: np.ndarray | torch.Tensor) -> bool:
    """True if no element of a floating-point array or CPU tensor is NaN or infinite,
    with no temporary array.

    A sum is NaN or infinite whenever an element is, so a finite sum proves every element finite.
    The sum runs in the array's own dtype, and for a tensor in torch's vectorised reduction (3x
    numpy's float32 sum: 60 against 190 us per million parameters here). Only a non-finite sum (a
    bad element, or large finite values that overflow it) takes the exact element-wise check."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _finite(arr)


def _finite(arr: np.ndarray | torch.Tensor) -> bool:
    """:func:`all_finite` without its errstate (the caller silences overflow warnings)."""
    if isinstance(arr, torch.Tensor):
        if math.isfinite(float(arr.sum())):
            return True
        arr = arr.numpy()  # numpy's element check: torch.isfinite(...).all() is far slower on CPU
    return math.isfinite(float(arr.sum())) or bool(np.isfinite(arr).all())


def tensor_views(arrays: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """CPU tensors viewing each array's memory (no copies). Received frames are read-only buffers;
    torch's warning about that is silenced, since neither checks nor inference write to weights."""
    if all(isinstance(v, torch.Tensor) for v in arrays.values()):
        return dict(arrays)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {k: v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v)) for k, v in arrays.items()}


def load_weights(module: torch.nn.Module, arrays: Mapping[str, Any], assign: bool = False,
                 own: Mapping[str, torch.Tensor] | None = None) -> None:
    """Load checked arrays into ``module`` (call :func:`check_weights` first).

    With ``assign`` (CPU modules only), the module's tensors become views of ``arrays`` instead of
    copies: the worker loads received weights that way, with no copy, since nothing writes to an
    inference actor. ``own`` is ``module.state_dict(keep_vars=True)`` if the caller kept it
    (assigning keeps it valid; taking it costs more than the assignment).
    """
    state = tensor_views(arrays)
    tensors = module.state_dict(keep_vars=True) if own is None else own
    if assign and all(t.device.type == "cpu" for t in tensors.values()):
        # Repoint each tensor at its view: what load_state_dict(assign=True) does, without its
        # per-module machinery (0.9 ms of a 1.2 ms receive for a 0.1M-parameter actor).
        for name, value in state.items():
            tensors[name].data = value
    else:
        module.load_state_dict(state, assign=False)


# -- weights on the wire: one flat buffer, sent in parts -------------------------------------------
# The trainer copies the actor's tensors into one flat, aligned, reusable buffer and sends it in
# parts of at most PART_BYTES (smaller for a smaller version: part_bytes), so the server can
# forward part i while part i+1 is still arriving (a relay that overlaps its two hops). Part 0
# carries the layout: [[name, dtype, shape, offset], ...]. A worker copies each part into place
# and, when all parts are in, loads views of the buffer into a spare actor. The layout checks
# (check_layout) live in the wire module, which imports no torch, because the server's cache
# applies them too.

PART_BYTES = 1 << 20
# A version is cut into about PARTS_PER_VERSION parts of MIN_PART_BYTES to PART_BYTES: each part
# that arrives is the server talking (net.liveness), so a small version over a slow lossy link
# renews the worker's liveness window every part instead of only once it is whole (a 270 KB
# float32 version in one part took longer than the window over reno at 200 ms each way, 5% loss:
# 6 reconnects in 1.5 minutes, no version through; in 4 parts, none and versions through). Few
# parts, since each costs every hop a message (16 parts of a 0.1M-parameter actor took its LAN
# broadcast from 4 to 8 ms); from 4 MiB up, 1 MiB parts as before (the server's per-part
# bookkeeping stays within its room: weight_encodings.OVERHEAD_ROOM_BYTES).
MIN_PART_BYTES = 64 << 10
# The compact encodings (float16, int8, deltas) go to the workers whose link is slow, where one part
# of 64 KiB took longer than the liveness window: an int8 version of the Pendulum actor (69 KB, a
# 64 KiB part first) at 20 KB/s behind reno, 100 ms each way and 5% loss, and the worker dropped a
# healthy connection (docs/benchmarks/links.md). They go in parts of at least 16 KiB.
MIN_COMPACT_PART_BYTES = 16 << 10
# While the server counts a worker whose link is slow, every encoding (float32 too) goes in parts of
# SLOW_PART_BYTES, so that each takes a fraction of the liveness window there: a float32 version of
# a 1M-parameter actor in 1 MiB parts never arrived behind reno at 100 ms each way, 1% loss (a part
# took longer than the window: 10 reconnects in 10 s). At most MAX_SLOW_PARTS parts (the server's
# bookkeeping per part); fast links keep the parts above while no worker is slow.
SLOW_PART_BYTES = 16 << 10
MAX_SLOW_PARTS = 1024
PARTS_PER_VERSION = 4
_PART_STEP = 4096  # part sizes are multiples of this (and so of _ALIGN)
_ALIGN = 64
# a received frame viewed in place must align every dtype (offsets in it are multiples of _ALIGN)
_FRAME_ALIGN = 16


def part_bytes(nbytes: int, smallest: int = MIN_PART_BYTES, slow: bool = False) -> int:
    """The size of each part (the last may be shorter) a ``nbytes``-byte version or encoding is
    sent in: about :data:`PARTS_PER_VERSION` parts, each of ``smallest`` (:data:`MIN_PART_BYTES`,
    or :data:`MIN_COMPACT_PART_BYTES` for a compact encoding) to :data:`PART_BYTES`; ``slow`` (a
    worker's link is): at most :data:`SLOW_PART_BYTES`, unless that makes over
    :data:`MAX_SLOW_PARTS` parts."""
    share = -(-nbytes // PARTS_PER_VERSION)
    size = min(PART_BYTES, max(smallest, -(-share // _PART_STEP) * _PART_STEP))
    if slow:
        fewest = -(-nbytes // MAX_SLOW_PARTS)
        size = min(size, max(SLOW_PART_BYTES, -(-fewest // _PART_STEP) * _PART_STEP))
    return size


def flat_layout(module: torch.nn.Module | Mapping[str, torch.Tensor]) -> tuple[list[list[Any]], int]:
    """``[[name, dtype, shape, offset], ...]`` and the total size of a module's state_dict (or of a
    state_dict already taken) as one buffer."""
    state = module.state_dict() if isinstance(module, torch.nn.Module) else module
    layout, offset = [], 0
    for name, t in state.items():
        dtype = _np_dtype(t.dtype)
        if dtype is None:
            raise NetrlError(f"the actor's tensor {name!r} is {t.dtype}, which netrl's "
                             f"weights do not carry (they carry bool, integers, float16, "
                             f"float32 and float64): convert the actor, e.g. with .float(), "
                             f"and train it in bfloat16 with torch.autocast instead")
        layout.append([name, dtype.str, list(t.shape), offset])
        offset += -(-t.numel() * dtype.itemsize // _ALIGN) * _ALIGN
    return layout, offset


def flat_views(flat: np.ndarray, layout: list[list[Any]]) -> list[torch.Tensor]:
    """CPU tensors viewing the place of each tensor of ``layout`` in ``flat``, in layout order
    (writable when ``flat`` is)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return [torch.from_numpy(np.frombuffer(flat, dtype=dtype, count=math.prod(shape), offset=offset)
                                 .reshape(shape)) for _, dtype, shape, offset in layout]


def copy_tensors(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for every pair, whose shapes the caller has
    matched (a copy broadcasts).

    One call to torch's foreach copy where it applies: in a process that sat idle between
    two weight versions, that takes about half the time of one ``copy_`` per tensor for a
    small actor (260 against 490 us for 0.1M parameters here), since the copy code runs once
    instead of once per tensor."""
    if len(dst) != len(src):
        raise ValueError(f"copying {len(src)} tensors into {len(dst)} places")
    with torch.no_grad():
        try:
            torch._foreach_copy_(dst, src)
        # an older torch, or a mix it does not take in one call
        except (AttributeError, RuntimeError, TypeError):
            for d, s in zip(dst, src, strict=True):
                d.copy_(s)


def snapshot_into(module: torch.nn.Module | Mapping[str, torch.Tensor], layout: list[list[Any]],
                  flat: np.ndarray) -> None:
    """Copy a module's current tensors (or those of a state_dict) into ``flat`` at
    the offsets of ``layout``."""
    state = module.state_dict() if isinstance(module, torch.nn.Module) else module
    copy_tensors(flat_views(flat, layout), [t.detach() for t in state.values()])


def flat_arrays(flat: np.ndarray, layout: list[list[Any]]) -> dict[str, np.ndarray]:
    """Views of each tensor in a flat buffer. Raises :class:`~netrl.errors.MalformedMessage`
    when the layout is malformed or does not fit the buffer
    (see :func:`~netrl.protocol.wire.check_layout`)."""
    check_layout(layout, flat.nbytes)
    return {name: np.frombuffer(flat, dtype=np.dtype(dtype), count=math.prod(shape), offset=offset).reshape(shape)
            for name, dtype, shape, offset in layout}


class KnownLayout:
    """The receiving actor's own flat layout, worked out once: the fast path for the usual version,
    sent by a trainer whose actor has the same tensors.

    A version in exactly this layout is viewed without checking each layout entry again, and
    when every tensor has the same floating dtype, as strided views of one tensor over the whole
    buffer, which one sum proves finite (a tenth of the per-tensor checks' cost for a small
    actor). The trainer zeroes the padding between tensors, so that sum sees weights and zeros
    only. Any other outcome (a bad weight, a finite sum that overflows, padding that is not
    zero) falls back to :func:`check_weights`, which is exact, so the fast path never rejects
    what the exact check accepts.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.layout, self.nbytes = flat_layout(module)
        self._views = [(name, np.dtype(dtype), offset, math.prod(shape), tuple(shape))
                       for name, dtype, shape, offset in self.layout]
        dtypes = {dtype for _, dtype, *_ in self._views}
        only = dtypes.pop() if len(dtypes) == 1 else None
        self._dtype = only if only is not None and only.kind == "f" and self.nbytes % only.itemsize == 0 else None
        # (name, shape, strides, offset) in elements of that dtype: offsets are multiples of _ALIGN
        self._strided = [(name, shape, torch.empty(shape, device="meta").stride(), offset // dtype.itemsize)
                         for name, dtype, offset, _, shape in self._views]

    def matches(self, flat: np.ndarray, layout: list[Any]) -> bool:
        return flat.nbytes == self.nbytes and layout == self.layout

    def arrays(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Views of each tensor in a buffer that :meth:`matches`."""
        return {name: np.frombuffer(flat, dtype=dtype, count=count, offset=offset).reshape(shape)
                for name, dtype, offset, count, shape in self._views}

    def views(self, flat: np.ndarray) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """CPU tensors viewing each tensor of a buffer that :meth:`matches`, and the one
        tensor over the whole buffer that :func:`sum_is_finite` checks (None when the tensors
        have different dtypes)."""
        if self._dtype is None:
            return tensor_views(self.arrays(flat)), None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            whole = torch.from_numpy(flat.view(self._dtype))
        return {name: whole.as_strided(shape, strides, offset) for name, shape, strides, offset in self._strided}, whole

    def tensors(self, flat: np.ndarray) -> tuple[dict[str, torch.Tensor], bool]:
        """CPU tensors viewing each tensor of a buffer that :meth:`matches`, and True when one sum
        proved them all finite (False: check them with :func:`check_weights`)."""
        views, whole = self.views(flat)
        return views, sum_is_finite(whole)


def sum_is_finite(whole: torch.Tensor | None) -> bool:
    """True when the sum of ``whole`` (:meth:`KnownLayout.views`) is finite, which proves
    every weight finite; False means only that the exact check must decide. Uses torch's
    sum: see :func:`all_finite`."""
    return whole is not None and math.isfinite(float(whole.sum()))


class WeightAssembler:
    """Worker side: collects the parts of one weight version into a flat buffer from a small pool.

    A buffer handed out by :meth:`take` backs a loaded actor; :meth:`release` returns one that no
    actor views any more, so buffers are reused (fresh pages are slow) and never overwritten
    while an actor reads them. A version that came in one part is not copied at all: a read-only
    view of its received chunk becomes the buffer (so it never joins the pool; the caller must
    not write to that chunk afterwards). A caller that has a place of its own for a version (a
    spare actor's buffer) passes it as ``into`` with part 0: the parts are copied there, and
    the assembler never pools it.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._free: list[np.ndarray] = []
        self._flat: np.ndarray | None = None
        # whether _flat is the assembler's to pool once dropped (not a caller's `into`)
        self._owned = False
        self._key: tuple[str, int] | None = None
        self._next = 0
        self._parts = 0
        self._filled = 0  # bytes written so far, from offset 0: parts must continue each other
        self._part_bytes = 0  # the size of part 0, and of every part but the last
        self._layout: list[list[Any]] = []

    def add(self, session: str, version: int, part: int, parts: int, offset: int, nbytes: int,
            layout: list[Any], chunk: np.ndarray, into: np.ndarray | None = None) -> None:
        """Take one part (with part 0, optionally the writable ``nbytes``-byte buffer to assemble
        the version in). Raises ValueError (and forgets the version) when it does not fit: parts
        must be those :func:`~netrl.protocol.wire.weight_parts` makes, each as large as part 0 but
        the last, which ends the buffer."""
        if part == 0:
            if not 0 < nbytes <= self.max_bytes:
                raise ValueError(f"weights v{version} declare {nbytes} bytes; this "
                                 f"worker's actor takes {self.max_bytes} (do the "
                                 f"trainer and the workers build the same actor?)")
            if not chunk.nbytes or parts != -(-nbytes // chunk.nbytes):
                raise ValueError(f"weights v{version} declare {nbytes} bytes in "
                                 f"{parts} parts, but part 0 has {chunk.nbytes} bytes")
            self._drop()
            self._owned = into is None
            if into is not None:
                if into.nbytes != nbytes or not into.flags.writeable:
                    raise ValueError(f"a {into.nbytes}-byte buffer cannot hold "
                                     f"weights v{version} of {nbytes} bytes")
                self._flat = into
            elif (parts == 1 and offset == 0 and chunk.nbytes == nbytes and chunk.dtype == np.uint8 and chunk.ndim == 1
                    and chunk.ctypes.data % _FRAME_ALIGN == 0):
                self._flat = chunk.view()  # the whole version: viewed in place, no copy
                self._flat.flags.writeable = False
            else:
                self._flat = self._buffer(nbytes)
            self._key, self._next, self._parts, self._layout = (session, version), 0, parts, layout
            self._filled, self._part_bytes = 0, chunk.nbytes
        elif self._key != (session, version) or part != self._next or parts != self._parts:
            self._drop()
            raise ValueError(f"weights v{version} part {part} of {parts} arrived "
                             f"out of order; waiting for the next version")
        assert self._flat is not None
        size = self._flat.nbytes
        if offset != self._filled or offset + chunk.nbytes > size:
            self._drop()
            raise ValueError(f"weights v{version} part {part} ({chunk.nbytes} bytes at "
                             f"offset {offset}) does not continue the "
                             f"{self._filled} bytes before it in its {size}-byte buffer")
        if part < parts - 1 and chunk.nbytes != self._part_bytes:
            self._drop()
            raise ValueError(f"weights v{version} part {part} has {chunk.nbytes} bytes; every "
                             f"part but the last has the {self._part_bytes} bytes of part 0")
        if self._flat.flags.writeable:
            self._flat[offset:offset + chunk.nbytes] = chunk
        self._next += 1
        self._filled = offset + chunk.nbytes
        if self._next == self._parts and self._filled != size:
            self._drop()
            raise ValueError(f"weights v{version} end at byte {self._filled} of {size}")

    @property
    def done(self) -> bool:
        return self._flat is not None and self._next == self._parts

    def take(self) -> tuple[np.ndarray, list[Any]]:
        """The finished buffer and its layout, as sent (unchecked:
        :func:`flat_arrays` checks it)."""
        assert self._flat is not None and self.done
        flat, layout = self._flat, self._layout
        self._flat, self._key = None, None
        return flat, layout

    def release(self, flat: np.ndarray | None) -> None:
        if flat is not None and flat.flags.writeable and len(self._free) < 3:
            self._free.append(flat)

    def _buffer(self, nbytes: int) -> np.ndarray:
        for i, buf in enumerate(self._free):
            if buf.nbytes == nbytes:
                return self._free.pop(i)
        return np.empty(nbytes, np.uint8)

    def _drop(self) -> None:
        if self._flat is not None and self._owned:
            self.release(self._flat)
        self._flat, self._key = None, None
