"""The wire format: every message netrl sends, as ZeroMQ multipart frames.
Nothing else knows this layout.

::

    frame 0   header, a msgpack map with exactly these keys:
                {"v": 2,                      protocol version (PROTOCOL_VERSION)
                 "type": "samples",           one of MsgType
                 "sender": "worker-a",        the sender's name
                 "seq": 41,                   per-sender sequence number (sample packets, bundles)
                 "policy_version": 17,        newest weight version the message relates to
                 "body": {...},               small type-specific fields, checked against
                                              BODY_SCHEMA
                 "arrays": [{"name": "obs/0", "dtype": "<f4", "shape": [50, 3],
                             "codec": "none", "nbytes": 600}, ...]}
    frame 1+  one buffer per entry of "arrays", in order: the raw C-contiguous bytes, or their
              zstd/lz4 compression when "codec" says so ("nbytes" is always the raw size).

A SAMPLES message's arrays are its act/obs leaves (``act``, ``obs/0``...), the sample columns
(``rew``, the flags, ``policy_version``, ``env``), the actor's extra outputs (``extra/<name>``) and
the env info entries the pipeline declares (``info/<name>``), all with one row per sample.

A server BUNDLE carries several worker SAMPLES messages unchanged: its header lists how
many frames each part has (``body.parts``) and the parts' frames follow, so the relay never
copies or re-encodes sample data.

:func:`encode` and :func:`decode` are exact inverses. :func:`decode` checks, in this order, the
frame count, the header size and schema, the protocol version, the body schema of the message type,
each array's dtype against :data:`ALLOWED_DTYPES`, its shape against its buffer length (after
decompressing it; the server's relay-only decode leaves compressed integer arrays compressed, see
:func:`decode`), and the size limits; anything else raises :class:`~netrl.errors.ProtocolError`.
Nothing is ever pickled.

This module owns the frames and msgpack. What a decoded header, sample packet or weights part must
hold, and the limits, are checked by :mod:`netrl.protocol.checks`, which sees plain values only;
what the message types are, the body fields of each (``BODY_SCHEMA``) and which role may send which
live in :mod:`netrl.protocol.messages`. This module re-exports the names its callers need of both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from netrl.errors import MalformedMessage
from netrl.protocol.checks import (
    ALLOWED_DTYPES,
    BUNDLE_HEADER_ROOM,
    FORMAT_NAME,
    MAX_ENCODED_BYTES,
    MAX_EPISODES_PER_PACKET,
    MAX_MODELS,
    MAX_NAME,
    PacketLimits,
    PacketTooLarge,
    check_header,
    check_layout,
    check_packet_limits,
    check_samples,
    check_weights_part,
    max_packet_bytes,
    sample_row_bytes,
)
from netrl.protocol.codecs import CODECS, Codec, check_declared_size, compress, decompress
from netrl.protocol.messages import PROTOCOL_VERSION, STORED_VERSIONS, Message, MsgType, check_body
from netrl.samples.columns import Buffer, EpisodeStats, flatten, unflatten

# The wire's public face: what it defines, and the limits and checks of netrl.protocol.checks that
# callers of encode() and decode() need (PacketLimits, the bounds a packet must keep to).
__all__ = [
    "ALLOWED_DTYPES",
    "BUNDLE_HEADER_ROOM",
    "FORMAT_NAME",
    "MAX_ENCODED_BYTES",
    "MAX_MODELS",
    "PROTOCOL_VERSION",
    "STORED_VERSIONS",
    "Codec",
    "PacketLimits",
    "PacketTooLarge",
    "buffer_from_message",
    "check_layout",
    "decode",
    "encode",
    "encode_bundle",
    "frames_nbytes",
    "max_packet_bytes",
    "restamp",
    "sample_row_bytes",
    "samples_message",
    "split_bundle",
    "weight_parts",
]

MAX_HEADER_BYTES = 1 << 20
MAX_ARRAYS = 512
MAX_DIMS = 8


def encode(msg: Message, compression: Codec = "none") -> list[Any]:
    """Turn a message into frames: the msgpack header, then one buffer per array
    (zero-copy when raw)."""
    specs = []
    frames: list[Any] = [b""]
    for name, arr in msg.arrays.items():
        arr = np.asarray(arr)
        codec, payload = compress(arr, compression)
        specs.append({"name": name, "dtype": arr.dtype.str, "shape": list(arr.shape), "codec": codec,
                      "nbytes": int(arr.nbytes)})
        frames.append(payload)
    header = {"v": PROTOCOL_VERSION, "type": msg.type.value, "sender": msg.sender, "seq": int(msg.seq),
              "policy_version": int(msg.policy_version), "body": msg.body, "arrays": specs}
    frames[0] = msgpack.packb(header, use_bin_type=True)
    return frames


def encode_bundle(sender: str, seq: int, parts: Sequence[Sequence[Any]]) -> list[Any]:
    """A BUNDLE header followed by the unchanged frames of each SAMPLES part."""
    header = {"v": PROTOCOL_VERSION, "type": MsgType.BUNDLE.value, "sender": sender, "seq": seq,
              "policy_version": 0, "body": {"parts": [len(p) for p in parts]}, "arrays": []}
    frames: list[Any] = [msgpack.packb(header, use_bin_type=True)]
    for part in parts:
        frames.extend(part)
    return frames


def restamp(frames: Sequence[Any]) -> list[Any]:
    """The frames of a message an older netrl stored (one of :data:`STORED_VERSIONS`) as this
    version sends them: the header's ``"v"`` becomes :data:`PROTOCOL_VERSION`, all else stays as it
    was. The server's spool hands what it kept from before an upgrade on to the trainer this
    way, since the trainer takes only today's version. Frames of today's version, of a version
    not stored, or whose header does not read, come back unchanged (the trainer refuses the last
    two as it would anything else)."""
    out = list(frames)
    head = bytes(_buf(out[0])) if out else b""
    if head[1:len(_STAMP) + 1] == _STAMP:  # how encode() starts every header of today's version
        return out
    try:
        header = _unpack_header(head)
    except MalformedMessage:
        return out
    version = header.get("v") if isinstance(header, dict) else None
    if type(version) is int and version != PROTOCOL_VERSION and version in STORED_VERSIONS:
        header["v"] = PROTOCOL_VERSION
        out[0] = msgpack.packb(header, use_bin_type=True)
    return out


# A header map's first key and value, as encode() writes them (after the map's one-byte length).
_STAMP = msgpack.packb("v") + msgpack.packb(PROTOCOL_VERSION)


def _unpack_header(head: Any) -> Any:
    """Frame 0 as msgpack, already known to be at most MAX_HEADER_BYTES: these caps
    bound every container in it."""
    try:
        return msgpack.unpackb(head, raw=False, strict_map_key=True, max_str_len=MAX_HEADER_BYTES, max_bin_len=0,
                               max_ext_len=0, max_array_len=MAX_EPISODES_PER_PACKET * 4, max_map_len=4096)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise MalformedMessage(f"header is not valid msgpack "
                               f"({type(exc).__name__}: {exc})") from None


def _buf(frame: Any) -> memoryview:
    """A zero-copy view of a zmq.Frame, bytes or memoryview."""
    view = getattr(frame, "buffer", None)
    return view if view is not None else memoryview(frame)


def frames_nbytes(frames: Sequence[Any]) -> int:
    """Total payload bytes of a message's frames (zmq.Frame, bytes or memoryview)."""
    return sum(_buf(f).nbytes for f in frames)


_ARRAY_KEYS = frozenset({"name", "dtype", "shape", "codec", "nbytes"})
# built once: np.dtype() per array is measurable
_DTYPES = {name: np.dtype(name) for name in ALLOWED_DTYPES}


def _array(spec: Any, frame: memoryview, budget: int, max_bytes: int,
           inflate: bool) -> tuple[str, np.ndarray]:
    # On the hot path of every relayed packet: plain type checks (`type(x) is
    # int` also refuses bools).
    if type(spec) is not dict or spec.keys() != _ARRAY_KEYS:
        raise MalformedMessage("array entry must have exactly name, dtype, shape, codec, nbytes")
    name, shape, codec, nbytes = spec["name"], spec["shape"], spec["codec"], spec["nbytes"]
    if type(name) is not str or not 0 < len(name) <= MAX_NAME:
        raise MalformedMessage("array name must be a non-empty string")
    dtype = _DTYPES.get(spec["dtype"]) if type(spec["dtype"]) is str else None
    if dtype is None:
        raise MalformedMessage(f"array {name!r} has dtype {spec['dtype']!r}, which is not allowed")
    if type(shape) is not list or len(shape) > MAX_DIMS:
        raise MalformedMessage(f"array {name!r} has an invalid shape {shape!r}")
    count = 1
    for d in shape:
        if type(d) is not int or not 0 <= d < 2**40:
            raise MalformedMessage(f"array {name!r} has an invalid shape {shape!r}")
        count *= d
    if codec not in CODECS:
        raise MalformedMessage(f"array {name!r} has unknown codec {codec!r}")
    expected = count * dtype.itemsize
    if nbytes != expected:
        raise MalformedMessage(f"array {name!r} declares {nbytes!r} bytes "
                               f"but shape {shape} needs {expected}")
    # what the message's arrays take once inflated: a small message cannot claim gigabytes
    if expected > budget:
        raise MalformedMessage(f"array {name!r} needs {expected} bytes: with the arrays before "
                               f"it, the message would take over the {max_bytes}-byte limit")
    data = frame  # decode() made the view
    if codec != "none" and not inflate and dtype.kind in "iu":
        check_declared_size(name, codec, data, expected)
        # read-only zeros: shape and dtype only
        return name, np.broadcast_to(np.zeros((), dtype), tuple(shape))
    if codec != "none":
        data = memoryview(decompress(name, codec, data, expected))
    if data.nbytes != expected:
        raise MalformedMessage(f"array {name!r}: shape {shape} needs "
                               f"{expected} bytes, frame has {data.nbytes}")
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    if dtype.kind == "b" and count and int(arr.view(np.uint8).max()) > 1:
        raise MalformedMessage(f"array {name!r} is boolean but holds bytes other than 0 and 1")
    return name, arr


def decode(frames: Sequence[Any], max_bytes: int = 256 * 2**20, inflate: bool = True,
           limits: PacketLimits | None = None, stored: bool = False) -> Message:
    """Parse and validate frames into a :class:`Message`.

    With ``inflate=False`` (the server, which reads sample packets but relays them as they came),
    integer arrays that arrive compressed are not decompressed: their declared size is checked where
    the codec records it, and they come back as read-only zeros of their shape and dtype. Boolean
    and float arrays are always inflated and checked, and the trainer decodes everything in full
    before anything reaches its memory.

    ``limits`` bounds a SAMPLES packet's rows and inflated bytes; both are checked from the header,
    before any array is decompressed (and decompression never yields more than an array declares:
    see :func:`~netrl.protocol.codecs.decompress`).

    ``stored=True`` is for frames this process reads back from its own disk (the trainer's sample
    log), which an older netrl may have written: a header of any of :data:`STORED_VERSIONS` is
    accepted. Never for a live peer, which must speak :data:`PROTOCOL_VERSION`, so that roles of
    different versions are refused at HELLO.

    Raises:
        PacketTooLarge: a SAMPLES packet beyond ``limits``.
        MalformedMessage: the frames do not follow the layout in this module's docstring.
        VersionMismatch: the header carries another protocol version.
    """
    if not frames:
        raise MalformedMessage("empty message")
    views = [_buf(f) for f in frames]  # once per frame: the packet's arrays view them
    head = views[0]
    if head.nbytes > MAX_HEADER_BYTES:
        raise MalformedMessage(f"header of {head.nbytes} bytes exceeds {MAX_HEADER_BYTES}")
    total = sum(v.nbytes for v in views)
    if total > max_bytes:
        raise MalformedMessage(f"message of {total} bytes exceeds the {max_bytes}-byte limit")
    header = _unpack_header(head)
    accepted = STORED_VERSIONS if stored else frozenset({PROTOCOL_VERSION})
    check_header(header, PROTOCOL_VERSION, accepted)
    try:
        mtype = MsgType(header["type"])
    except ValueError:
        raise MalformedMessage(f"unknown message type {header['type']!r}") from None
    body = header["body"]
    check_body(mtype, body)
    msg = Message(mtype, header["sender"], header["seq"], header["policy_version"], body)
    if mtype is MsgType.BUNDLE:
        _split_parts(msg, frames)
        return msg
    specs = header["arrays"]
    if len(specs) > MAX_ARRAYS:
        raise MalformedMessage(f"{len(specs)} arrays exceed the limit of {MAX_ARRAYS}")
    if len(frames) != 1 + len(specs):
        raise MalformedMessage(f"header lists {len(specs)} arrays but "
                               f"{len(frames) - 1} data frames follow")
    budget = max_bytes
    if mtype is MsgType.SAMPLES and limits is not None:
        budget = min(budget, check_packet_limits(msg, specs, limits))
    for spec, frame in zip(specs, views[1:], strict=True):
        name, arr = _array(spec, frame, budget, max_bytes, inflate)
        if name in msg.arrays:
            raise MalformedMessage(f"array {name!r} appears twice")
        msg.arrays[name] = arr
        budget -= arr.nbytes
    if mtype is MsgType.SAMPLES:
        check_samples(msg)
    elif mtype is MsgType.WEIGHTS:
        check_weights_part(msg)
    return msg


def weight_parts(sender: str, session: str, version: int, trained_steps: int, flat: np.ndarray,
                 layout: list[Any], part_bytes: int, fields: dict[str, Any] | None = None) -> list[Message]:
    """A flat weights buffer (or a model's encoding of it, or a delta) as WEIGHTS parts of at most
    ``part_bytes`` (views, no copies). ``fields``: the optional WEIGHTS fields (model, format, base,
    encoded, crc, rank, budget_s), the same in every part."""
    starts = list(range(0, flat.nbytes, part_bytes)) or [0]
    return [Message(MsgType.WEIGHTS, sender, policy_version=version, arrays={"chunk": flat[s:s + part_bytes]},
                    body={"trained_steps": trained_steps, "session": session, "part": i, "parts": len(starts),
                          "offset": s, "nbytes": flat.nbytes, "layout": layout if i == 0 else [], **(fields or {})})
            for i, s in enumerate(starts)]


def _split_parts(msg: Message, frames: Sequence[Any]) -> None:
    counts = msg.body["parts"]
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in counts):
        raise MalformedMessage("bundle part sizes must be positive integers")
    if 1 + sum(counts) != len(frames):
        raise MalformedMessage(f"bundle lists {sum(counts)} part "
                               f"frames but {len(frames) - 1} follow")
    start = 1
    for count in counts:
        msg.parts.append(list(frames[start:start + count]))
        start += count


def split_bundle(msg: Message) -> list[list[Any]]:
    """The frames of each SAMPLES part of a decoded BUNDLE (decode each with :func:`decode`)."""
    return msg.parts


def samples_message(buf: Buffer, sender: str, session: str, seq: int, produced: int) -> Message:
    """Pack a :class:`Buffer` into a SAMPLES message."""
    act_spec, act_leaves = flatten(buf.act, "act")
    obs_spec, obs_leaves = flatten(buf.obs, "obs")
    arrays = dict(act_leaves + obs_leaves)
    arrays.update(rew=buf.rew, terminated=buf.terminated, truncated=buf.truncated, reset=buf.reset,
                  context=buf.context, policy_version=buf.policy_version)
    if buf.env is not None:
        arrays["env"] = buf.env
    if buf.extra:
        arrays.update((f"extra/{name}", col) for name, col in buf.extra.items())
    if buf.info:
        arrays.update((f"info/{name}", col) for name, col in buf.info.items())
    body = {"n": len(buf), "act": act_spec, "obs": obs_spec, "produced": produced, "session": session,
            "episodes": [[float(e.ret), int(e.length), bool(e.test), int(e.policy_version), int(e.env)]
                         for e in buf.episodes]}
    version = int(buf.policy_version.max()) if len(buf) else 0
    return Message(MsgType.SAMPLES, sender, seq, version, body, arrays)


def buffer_from_message(msg: Message) -> Buffer:
    """Rebuild the :class:`Buffer` a worker sent (arrays are zero-copy views of the frames)."""
    a, b = msg.arrays, msg.body
    return Buffer(
        act=unflatten(b["act"], a), obs=unflatten(b["obs"], a), rew=a["rew"], terminated=a["terminated"],
        truncated=a["truncated"], reset=a["reset"], context=a["context"], policy_version=a["policy_version"],
        worker=f"{msg.sender}/{b['session']}", seq=msg.seq, env=a.get("env"),
        extra={name[6:]: arr for name, arr in a.items() if name.startswith("extra/")} or None,
        info={name[5:]: arr for name, arr in a.items() if name.startswith("info/")} or None,
        episodes=[EpisodeStats(float(e[0]), e[1], e[2], e[3], e[4] if len(e) > 4 else 0) for e in b["episodes"]],
    )
