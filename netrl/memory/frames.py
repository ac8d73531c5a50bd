"""Frame stacks sent one frame at a time: the worker-side compressor and the memory
that rebuilds the stacks.

An image env observes a stack of the last ``S`` grayscale frames, ``(S, H, W)`` uint8, newest
last; at an episode's first observation the stack holds ``S`` copies of the first frame (Gymnasium's
FrameStackObservation with ``padding_type="reset"`` does the same). Consecutive stacks share
``S - 1`` frames, so the worker sends only the newest frame of each row (the compressor raises
ValueError at the first stack that breaks this)::

    worker:  obs (S, H, W) --FrameStackCompressor--> newest frame (H, W), or its PNG/JPEG bytes
    wire:    one frame per row, plus ``S`` context rows per packet (pipeline ``overlap = S``)
    trainer: FrameStackMemory stores each frame once (uint8) and rebuilds the stacks of a batch
             with one gather

FrameStackMemory is a declaration on :class:`~netrl.memory.history.HistoryMemory`: each row stores
its newest frame, and one view (:mod:`netrl.memory.views`) makes the observation the last ``S``
frames. The stack of row ``k`` is the frames of rows ``k - min(S - 1 - j, since_reset[k])`` for
``j = 0 .. S - 1``: the index arithmetic clamps at the episode's first row, so stacks never mix
episodes (nor envs, nor packets). A transition ending at row ``k`` reads ``S + 1`` frames; its
observation is the first ``S`` of them and its next observation the last ``S`` (two overlapping
views of one gathered window).

Frame codecs run in the compressor, per frame, with OpenCV: ``"png"`` (lossless) or ``"jpeg"``
(lossy, with a ``quality``). A row's observation must have a fixed shape, so an encoded frame
travels as a fixed-size uint8 array (the bytes, then zeros) plus its length; the wire's packet
compression (zstd by default) removes the zeros, so use the codecs with ``compression="zstd"`` or
``"lz4"``, never ``"none"``.
"""

from __future__ import annotations

import logging
import struct
from typing import Any, Literal

import cv2
import numpy as np

from netrl.memory.history import HistoryMemory
from netrl.memory.views import View
from netrl.samples.columns import Buffer, Spec

__all__ = ["FrameCodec", "FrameStackCompressor", "FrameStackMemory", "PngStrategy", "decode_frame", "encode_frame",
           "frame_header"]

log = logging.getLogger(__name__)

FrameCodec = Literal["raw", "png", "jpeg"]
_CODECS = ("raw", "png", "jpeg")
PngStrategy = Literal["rle", "default", "huffman", "filtered"]
# zlib strategies: on noisy camera frames, LZ matches find nothing and RLE/Huffman-only is ~10%
# smaller and faster; on clean synthetic frames the default (LZ77) strategy wins.
_PNG_STRATEGIES = {"rle": cv2.IMWRITE_PNG_STRATEGY_RLE, "default": cv2.IMWRITE_PNG_STRATEGY_DEFAULT,
                   "huffman": cv2.IMWRITE_PNG_STRATEGY_HUFFMAN_ONLY, "filtered": cv2.IMWRITE_PNG_STRATEGY_FILTERED}


def encoded_capacity(height: int, width: int, codec: Literal["png", "jpeg"] = "jpeg") -> int:
    """Bytes reserved per encoded frame of ``height x width`` pixels with ``codec``. JPEG's, the
    default, is the larger, so it also holds a PNG.

    PNG: a true bound. ``height`` rows of a filter byte and ``width`` pixels, deflated: deflate
    expands such data by at most 1/8 + 1/64 + 11 bytes (zlib's ``deflateBound`` for any settings,
    with its wrapper), the IDAT chunks that carry it cost 12 bytes each (libpng writes 8 KiB
    chunks; we allow 1 KiB), and the signature, IHDR and IEND 45.

    JPEG: 2 bytes per pixel of the frame padded to whole 8x8 blocks, plus 1 KiB of markers and
    tables. The worst frames measured (noise, salt and pepper, at quality 100) take 1.9; a thin
    frame is mostly padding, so the padded size is what counts. A true bound (about 6.5 bytes
    per pixel, 0xFF stuffing included) would triple every row, so :class:`FrameStackCompressor`
    re-encodes the rare frame beyond this one at a lower quality instead.
    """
    if codec == "png":
        data = height * (width + 1)
        deflated = data + (data + 7) // 8 + (data + 63) // 64 + 11
        return deflated + 12 * (deflated // 1024 + 1) + 45
    return 2 * (-(-height // 8) * 8) * (-(-width // 8) * 8) + 1024


def encode_frame(frame: np.ndarray, codec: FrameCodec, quality: int = 95, png_level: int = 1,
                 png_strategy: PngStrategy = "rle") -> bytes:
    """One grayscale frame as PNG or JPEG bytes (OpenCV)."""
    if codec == "png":
        ok, data = cv2.imencode(".png", frame, [cv2.IMWRITE_PNG_COMPRESSION, png_level, cv2.IMWRITE_PNG_STRATEGY,
                                                _PNG_STRATEGIES[png_strategy]])
    elif codec == "jpeg":
        ok, data = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
    else:
        raise ValueError(f"frame codec must be 'png' or 'jpeg' to encode (got {codec!r})")
    if not ok:
        raise ValueError(f"OpenCV could not encode a {frame.shape} {frame.dtype} frame as {codec}")
    return bytes(data)


def decode_frame(payload: np.ndarray, nbytes: int) -> np.ndarray:
    """Inverse of :func:`encode_frame` for the first ``nbytes`` of ``payload``: a
    2-D uint8 frame."""
    if not 0 < nbytes <= payload.shape[0]:
        raise ValueError(f"encoded frame length {nbytes} is outside 1..{payload.shape[0]}")
    # Ignoring EXIF orientation keeps the decoded size the one the header
    # declares (see frame_header).
    frame = cv2.imdecode(payload[:nbytes], cv2.IMREAD_GRAYSCALE | cv2.IMREAD_IGNORE_ORIENTATION)
    if frame is None:
        raise ValueError(f"{nbytes} bytes of an encoded frame are neither valid PNG nor JPEG")
    return frame


_PNG_HEAD = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR"  # the signature, then the IHDR chunk's length
                                                      # (13) and type
# SOF0..SOF15 (C4, C8, CC are DHT, JPG, DAC)
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def frame_header(data: bytes) -> tuple[Literal["png", "jpeg"], int, int] | None:
    """``(codec, height, width)`` that an encoded frame's header declares, read without
    decoding any pixel, or None if the header cannot be read the way libpng and libjpeg
    read it, or declares no pixels.

    PNG: the IHDR chunk must come right after the signature. JPEG: the first SOF marker, reached by
    following the segment lengths from SOI; anything libjpeg would skip as garbage, or a scan
    before the SOF, refuses the frame.
    """
    if data.startswith(_PNG_HEAD):
        if len(data) < 33:  # IHDR's 13 bytes and its CRC
            return None
        width, height = struct.unpack_from(">II", data, 16)
        return ("png", height, width) if height and width else None
    if not data.startswith(b"\xff\xd8"):
        return None
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # a fill byte before a marker
            i += 1
        elif 0xD0 <= marker <= 0xD7 or marker == 0x01:  # RSTn, TEM: no length
            i += 2
        elif marker in _JPEG_SOF:
            if i + 9 > len(data):
                return None
            # after the length and the sample precision
            height, width = struct.unpack_from(">HH", data, i + 5)
            # height 0: set by a later DNL marker
            return ("jpeg", height, width) if height and width else None
        elif marker in (0x00, 0xD8, 0xD9, 0xDA):  # not a marker, a second SOI, EOI or a scan
                                                  # before the SOF
            return None
        else:
            length = (data[i + 2] << 8) | data[i + 3]  # counts itself, not the marker
            if length < 2:
                return None
            i += 2 + length
    return None


class FrameStackCompressor:
    """``sample_compressor`` for stacked frames: keep only the newest frame,
    optionally PNG or JPEG encoded.

    Stateful: it checks every stack against the previous one and raises ValueError at the first
    that breaks the convention FrameStackMemory rebuilds (module docstring), e.g. Gymnasium's
    ``padding_type="zero"``. Unlike ActionBufferCompressor's seams, which mark gaps that occur in
    normal runs, such a stack means a misconfigured env whose every episode would be rebuilt
    wrong, so it stops the worker. Use one instance per worker.

    Args:
        codec: ``"raw"`` (the frame as is), ``"png"`` (lossless) or ``"jpeg"`` (lossy).
        quality: JPEG quality, 1..100.
        png_level: PNG (zlib) compression level, 0..9.
        png_strategy: zlib strategy for PNG: ``"rle"`` (best for noisy camera frames) or
            ``"default"`` (LZ77, best for clean synthetic frames), ``"huffman"``, ``"filtered"``.
    """

    def __init__(self, codec: FrameCodec = "raw", quality: int = 95, png_level: int = 1,
                 png_strategy: PngStrategy = "rle") -> None:
        if codec not in _CODECS:
            raise ValueError(f"codec must be one of {_CODECS} (got {codec!r})")
        if not 1 <= quality <= 100:
            raise ValueError(f"JPEG quality must be between 1 and 100 (got {quality})")
        if not 0 <= png_level <= 9:
            raise ValueError(f"png_level must be between 0 and 9 (got {png_level})")
        if png_strategy not in _PNG_STRATEGIES:
            raise ValueError(f"png_strategy must be one of "
                             f"{sorted(_PNG_STRATEGIES)} (got {png_strategy!r})")
        self.codec, self.quality, self.png_level, self.png_strategy = codec, quality, png_level, png_strategy
        self.reencoded = 0  # JPEG frames over encoded_capacity, sent at a lower quality
        self._tail: bytes | None = None  # the previous stack's last S - 1 frames: this one
                                         # must start with them
        self._next_is_first = True  # the worker records an episode's first row first,
                                    # and after every end
        self._unsure = False  # the previous row began an episode without S equal frames,
                              # unless it was a probe

    def __call__(self, act: Any, obs: Any, rew: float, terminated: bool, truncated: bool,
                 info: dict[str, Any]) -> tuple[Any, Any, float, bool, bool, dict[str, Any]]:
        frames = np.asarray(obs)
        if frames.ndim != 3 or frames.dtype != np.uint8:
            raise ValueError(f"FrameStackCompressor expects a (stack, height, width) "
                             f"uint8 observation (got {frames.dtype} {frames.shape})")
        if not info.get("probe"):  # SampleSchema's random row, which continues nothing
            self._check_stack(frames, terminated or truncated)
        newest = frames[-1]
        if self.codec == "raw":
            return act, newest, rew, terminated, truncated, info
        frame = np.ascontiguousarray(newest)
        data = encode_frame(frame, self.codec, self.quality, self.png_level, self.png_strategy)
        height, width = newest.shape
        payload = np.zeros(encoded_capacity(height, width, self.codec), np.uint8)
        quality = self.quality
        while len(data) > payload.shape[0] and self.codec == "jpeg" and quality > 10:
            # a frame beyond the measured worst case: lose detail, not the run
            quality = max(10, quality - 10)
            data = encode_frame(frame, "jpeg", quality)
        if quality != self.quality:
            self.reencoded += 1
            if self.reencoded == 1 or self.reencoded % 1000 == 0:
                log.warning("a %dx%d frame took more than the %d bytes reserved at JPEG "
                            "quality %d: sent at quality %d (%d frames so far); frames "
                            "like it (noise) do better with a lower quality or png",
                            height, width, payload.shape[0], self.quality, quality, self.reencoded)
        if len(data) > payload.shape[0]:
            raise ValueError(f"a {newest.shape} frame encoded to {len(data)} bytes with "
                             f"{self.codec}, more than the {payload.shape[0]} that "
                             f"encoded_capacity reserves: please report this, "
                             f"with your OpenCV version ({cv2.__version__})")
        payload[:len(data)] = np.frombuffer(data, np.uint8)
        return act, (payload, np.int32(len(data))), rew, terminated, truncated, info

    def _check_stack(self, frames: np.ndarray, episode_ends: bool) -> None:
        """Raise ValueError unless ``frames`` continues the previous stack, or holds S
        equal frames (a first row).

        A first row that does not repeat one frame raises only once the next row continues it: the
        first call may be a probe with a random stack by code that does not mark it (SampleSchema
        marks its own, info["probe"], which __call__ skips). S equal frames pass where a
        continuation was expected: an episode stopped early.
        """
        head, tail = frames[:-1].tobytes(), frames[1:].tobytes()
        follows, repeats = head == self._tail, head == tail
        first, unsure, probe = self._next_is_first, self._unsure, self._tail is None
        self._tail, self._next_is_first, self._unsure = tail, episode_ends, probe and not repeats
        if repeats or probe or (follows and not first and not unsure):
            return
        s = len(frames)
        problem = (f"an episode's first observation is not "
                   f"{s} copies of one frame" if first or unsure else
                   f"an observation does not continue the previous one (its first "
                   f"{s - 1} frames are not the previous observation's last {s - 1})")
        raise ValueError(f"FrameStackCompressor: {problem}. FrameStackMemory rebuilds each stack "
                         f"from the newest frames of earlier rows, so a stack must hold the last "
                         f"{s} frames, newest last, and an episode's first stack {s} copies of "
                         f"its first frame: with Gymnasium's FrameStackObservation, use "
                         f"padding_type='reset' (its default), not 'zero' or a custom padding")


class FrameStackMemory(HistoryMemory):
    """Replay memory for ``(S, H, W)`` uint8 frame stacks that stores each frame once
    (see the module docstring).

    Accepts packets whose observations are a frame per row
    (``FrameStackCompressor(codec="raw")``), or a ``(payload, nbytes)`` pair of encoded frames
    (``"png"``/``"jpeg"``), which are decoded on arrival once their headers declare the size of the
    frames stored. A packet that fails a check raises ValueError and is not stored. The pipeline
    must set ``overlap >= stack`` so that every packet carries the frames its first stacks read.

    Args:
        stack: frames per observation (``S``).
        frame_shape: ``(H, W)`` of every frame, if known (the image pipeline knows it): encoded
            frames of another size are refused from the first packet on. Without it, the first
            packet's frames set the size.
        *args, **kwargs: :class:`~netrl.memory.base.MemoryDataloading`'s arguments.
    """

    def __init__(self, *args: Any, stack: int = 4, frame_shape: tuple[int, int] | None = None, **kwargs: Any) -> None:
        if not 1 <= stack <= 64:
            raise ValueError(f"stack must be between 1 and 64 frames (got {stack})")
        if frame_shape is not None and not (len(frame_shape) == 2 and min(frame_shape) > 0):
            raise ValueError(f"frame_shape must be (height, width) in pixels (got {frame_shape})")
        self.stack = stack
        self.frame_shape = tuple(frame_shape) if frame_shape is not None else None
        # Each row stores its newest frame; the observation leaf "obs" is the stack of the last S.
        super().__init__(*args, views=[View("obs", "frame", stack, into="obs")], **kwargs)

    def _reach_label(self, view: View) -> str:
        return f"stack ({self.stack})"

    def _frames(self, buffer: Buffer) -> np.ndarray:
        obs = buffer.obs
        if isinstance(obs, np.ndarray) and obs.ndim == 3 and obs.dtype == np.uint8:
            return obs
        if (isinstance(obs, tuple) and len(obs) == 2 and isinstance(obs[0], np.ndarray) and obs[0].ndim == 2
                and obs[0].dtype == np.uint8 and np.asarray(obs[1]).shape == (len(buffer),)):
            return self._decode(obs[0], np.asarray(obs[1]))
        raise ValueError("FrameStackMemory expects one uint8 frame per row, or "
                         "(payload, nbytes) of encoded frames, as FrameStackCompressor "
                         "sends them: is the worker's sample_compressor one?")

    def _decode(self, payload: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Decode the rows' frames once every row's header declares the expected size: that of the
        frames stored or, in a first packet, row 0's, which must fit the packet's rows (so decoding
        takes no more memory than the packet). A PNG of 3000x3000 zeros takes 9 KB: a packet of
        them is refused before any pixel is decoded."""
        n, cap = payload.shape
        stored = self._cols.get("frame")
        want = tuple(stored.shape[1:]) if stored is not None else self.frame_shape
        whose = ("the memory stores" if stored is not None else "the memory takes (frame_shape)" if want is not None
                 else "row 0 holds")
        for i in range(n):
            size = int(nbytes[i])
            head = frame_header(payload[i, :size].tobytes()) if 0 < size <= cap else None
            if head is None:
                raise ValueError(f"row {i}: {size} bytes of an encoded frame are neither valid PNG "
                                 f"nor JPEG (no readable header, or outside the {cap}-byte row)")
            codec, height, width = head
            # capacity >= pixels, so the frames take no more memory than the packet
            if want is None:
                if encoded_capacity(height, width, codec) > cap:
                    raise ValueError(f"row {i}: a {height}x{width} {codec} frame does not fit "
                                     f"this packet's {cap}-byte rows: the packet is malformed")
                want = (height, width)
            elif (height, width) != want:
                raise ValueError(f"row {i}: an encoded frame declares {height}x{width} pixels, "
                                 f"but {whose} {want[0]}x{want[1]} frames: "
                                 f"every worker must send frames of one size")
        frames = np.empty((n, *(want or (0, 0))), np.uint8)
        for i in range(n):
            try:
                frame = decode_frame(payload[i], int(nbytes[i]))
            except ValueError as exc:
                raise ValueError(f"row {i}: {exc}") from None
            if frame.shape != want:  # not the size its header declares
                raise ValueError(f"row {i}: an encoded frame decodes to {frame.shape}, not "
                                 f"the {want} its header declares: the packet is malformed")
            frames[i] = frame
        return frames

    def _obs_columns(self, buffer: Buffer) -> tuple[Spec, dict[str, np.ndarray]]:
        return "obs", {"frame": self._frames(buffer)}
