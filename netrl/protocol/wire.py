"""The wire format: every message netrl sends, as ZeroMQ multipart frames. Nothing else knows this layout.

::

    frame 0   header, a msgpack map with exactly these keys:
                {"v": 2,                      protocol version (PROTOCOL_VERSION)
                 "type": "samples",           one of MsgType
                 "sender": "worker-a",        the sender's name
                 "seq": 41,                   per-sender sequence number (sample packets, bundles)
                 "policy_version": 17,        newest weight version the message relates to
                 "body": {...},               small type-specific fields, checked against BODY_SCHEMA
                 "arrays": [{"name": "obs/0", "dtype": "<f4", "shape": [50, 3],
                             "codec": "none", "nbytes": 600}, ...]}
    frame 1+  one buffer per entry of "arrays", in order: the raw C-contiguous bytes, or their zstd/lz4
              compression when "codec" says so ("nbytes" is always the raw size).

A SAMPLES message's arrays are its act/obs leaves (``act``, ``obs/0``...), the sample columns (``rew``, the flags,
``policy_version``, ``env``) and the actor's extra outputs (``extra/<name>``), all with one row per sample.

A server BUNDLE carries several worker SAMPLES messages unchanged: its header lists how many frames each part
has (``body.parts``) and the parts' frames follow, so the relay never copies or re-encodes sample data.

:func:`encode` and :func:`decode` are exact inverses. :func:`decode` checks, in this order, the frame count, the
header size and schema, the protocol version, the body schema of the message type, each array's dtype against
:data:`ALLOWED_DTYPES`, its shape against its buffer length (after decompressing it; the server's relay-only
decode leaves compressed integer arrays compressed, see :func:`decode`), and the size limits; anything else raises
:class:`~netrl.errors.ProtocolError`. Nothing is ever pickled.

What the message types are, the body fields of each (``BODY_SCHEMA``) and which role may send which live in
:mod:`netrl.protocol.messages`, which knows nothing of frames; this module re-exports them.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack
import numpy as np

from netrl.errors import MalformedMessage, VersionMismatch
from netrl.protocol.codecs import CODECS, Codec, check_declared_size, compress, decompress
from netrl.protocol.messages import (
    MAX_POLICY_VERSION,
    PEER_NAME,
    PEER_NAME_RULE,
    VERSION_TEXT,
    Message,
    MsgType,
    check_body,
)
from netrl.samples.columns import EXTRA_NAME, MAX_EXTRAS, Buffer, EpisodeStats, flatten, spec_leaves, unflatten

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

# 2: NOTICE, WEIGHTS' collect, WELCOME's and PROGRESS's batch_steps, PROGRESS's batch_version, the layout of NACK
# and of the server's HEARTBEAT to workers, extra/<name> sample arrays and the SCHEMA's extra leaves. A version-1
# peer refuses these as malformed, so peers of different versions are refused at HELLO instead.
# 3: several named models and compact weight formats: WEIGHTS' model, format, base, encoded, crc, rank and budget_s,
# ACK's model, format and need_full, HELLO's models and formats, WELCOME's models.
PROTOCOL_VERSION = 3
# What this netrl still reads from its own disk (the trainer's sample log, the server's spool), never from a peer:
# every field versions 2 and 3 added is optional, so an older stored message is a valid current one.
STORED_VERSIONS = frozenset({1, 2, PROTOCOL_VERSION})
MAX_HEADER_BYTES = 1 << 20
MAX_ARRAYS = 512
MAX_DIMS = 8
MAX_NAME = 256
MAX_MODELS = 8  # named models one trainer publishes (netrl.protocol.weight_formats)
MAX_ENCODED_BYTES = 1 << 40
# a weight format's name on the wire (netrl.protocol.weight_formats)
FORMAT_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
MAX_EPISODES_PER_PACKET = 10_000
MAX_ENVS = 1 << 16  # envs per worker: the per-row ``env`` column is uint16
# A sample packet reaches the trainer inside a BUNDLE, whose header (at most ~20 KiB) counts towards the trainer's
# max_message_bytes: a packet may use all of that limit but this room, or the trainer could never accept it.
BUNDLE_HEADER_ROOM = 32 << 10
MAX_LAYOUT_ENTRIES = 1 << 16  # tensors in one version (a large transformer has a few thousand)
MAX_LAYOUT_DIMS = 32  # dimensions of one tensor (numpy's limit is 64)
ALLOWED_DTYPES = frozenset({"|b1", "|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"})
_ITEMSIZE = {name: np.dtype(name).itemsize for name in ALLOWED_DTYPES}


def max_packet_bytes(max_message_bytes: int) -> int:
    """The largest sample packet (or run of packets in one bundle) a trainer with this limit can accept."""
    return max_message_bytes - BUNDLE_HEADER_ROOM


# The most one row's sample columns take: rew and policy_version may be 8-byte numbers, the four flags a byte each,
# env 2 bytes.
SAMPLE_COLUMN_ROW_BYTES = 22


def sample_row_bytes(leaves: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    """The most bytes one row of a packet takes with these act/obs leaves (name -> (dtype, row shape), as in a
    :class:`~netrl.protocol.schema.SampleSchema`), its sample columns included."""
    return SAMPLE_COLUMN_ROW_BYTES + sum(_ITEMSIZE.get(dtype, 8) * math.prod(shape) for dtype, shape in leaves.values())


class PacketLimits(NamedTuple):
    """How large a SAMPLES packet may be, checked by :func:`decode` before anything is inflated: its rows (the
    header's ``n``) and the bytes its arrays take once decompressed (their declared sizes). ``source`` says where
    each bound comes from, for the error message (e.g. "declared by the worker at HELLO")."""

    rows: int
    inflated_bytes: int
    source: str = ""


class PacketTooLarge(MalformedMessage):
    """A sample packet beyond its :class:`PacketLimits`: refused before it was inflated. ``seq`` is the packet's."""

    def __init__(self, message: str, seq: int) -> None:
        super().__init__(message)
        self.seq = seq



def encode(msg: Message, compression: Codec = "none") -> list[Any]:
    """Turn a message into frames: the msgpack header, then one buffer per array (zero-copy when raw)."""
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
    """The frames of a message an older netrl stored (one of :data:`STORED_VERSIONS`) as this version sends them:
    the header's ``"v"`` becomes :data:`PROTOCOL_VERSION`, all else stays as it was. The server's spool hands what
    it kept from before an upgrade on to the trainer this way, since the trainer takes only today's version. Frames
    of today's version, of a version not stored, or whose header does not read, come back unchanged (the trainer
    refuses the last two as it would anything else)."""
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
    """Frame 0 as msgpack, already known to be at most MAX_HEADER_BYTES: these caps bound every container in it."""
    try:
        return msgpack.unpackb(head, raw=False, strict_map_key=True, max_str_len=MAX_HEADER_BYTES, max_bin_len=0,
                               max_ext_len=0, max_array_len=MAX_EPISODES_PER_PACKET * 4, max_map_len=4096)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise MalformedMessage(f"header is not valid msgpack ({type(exc).__name__}: {exc})") from None


def _buf(frame: Any) -> memoryview:
    """A zero-copy view of a zmq.Frame, bytes or memoryview."""
    view = getattr(frame, "buffer", None)
    return view if view is not None else memoryview(frame)


def frames_nbytes(frames: Sequence[Any]) -> int:
    """Total payload bytes of a message's frames (zmq.Frame, bytes or memoryview)."""
    return sum(_buf(f).nbytes for f in frames)


def _check_header(header: Any, versions: frozenset[int]) -> None:
    if not isinstance(header, dict):
        raise MalformedMessage("header is not a map")
    if not all(type(k) is str for k in header):  # msgpack lets an empty bin through as a bytes key
        raise MalformedMessage("header keys must be strings")
    expected = {"v", "type", "sender", "seq", "policy_version", "body", "arrays"}
    if set(header) != expected:
        extra, missing = sorted(set(header) - expected), sorted(expected - set(header))
        raise MalformedMessage(f"header keys wrong (missing {missing}, unexpected {extra})")
    for key, types in (("v", int), ("type", str), ("sender", str), ("seq", int), ("policy_version", int)):
        value = header[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise MalformedMessage(f"header field {key!r} has the wrong type ({type(value).__name__})")
    if header["v"] not in versions:
        body = header["body"] if isinstance(header["body"], dict) else {}
        theirs = body.get("netrl_version")
        if theirs:  # quoted unless it is a plain version: it ends up in a log line
            theirs = theirs if isinstance(theirs, str) and VERSION_TEXT.fullmatch(theirs) else repr(str(theirs)[:64])
        raise VersionMismatch(header["v"], PROTOCOL_VERSION, f"peer runs netrl {theirs}" if theirs else "")
    if not 0 <= header["seq"] < 2**63:
        raise MalformedMessage(f"header seq {header['seq']} is out of range (0 to 2**63 - 1)")
    if not -1 <= header["policy_version"] <= MAX_POLICY_VERSION:
        raise MalformedMessage(f"header policy_version {header['policy_version']} is out of range "
                               f"(-1 to {MAX_POLICY_VERSION})")
    if len(header["sender"]) > MAX_NAME:
        raise MalformedMessage(f"sender name longer than {MAX_NAME} characters")
    if not isinstance(header["body"], dict) or not isinstance(header["arrays"], list):
        raise MalformedMessage("header body must be a map and arrays a list")


_ARRAY_KEYS = frozenset({"name", "dtype", "shape", "codec", "nbytes"})
_DTYPES = {name: np.dtype(name) for name in ALLOWED_DTYPES}  # built once: np.dtype() per array is measurable


def _array(spec: Any, frame: Any, budget: int, max_bytes: int, inflate: bool) -> tuple[str, np.ndarray]:
    # On the hot path of every relayed packet: plain type checks (`type(x) is int` also refuses bools).
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
        raise MalformedMessage(f"array {name!r} declares {nbytes!r} bytes but shape {shape} needs {expected}")
    if expected > budget:  # what the message's arrays take once inflated: a small message cannot claim gigabytes
        raise MalformedMessage(f"array {name!r} needs {expected} bytes: with the arrays before it, the message "
                               f"would take over the {max_bytes}-byte limit")
    data = _buf(frame)
    if codec != "none" and not inflate and dtype.kind in "iu":
        check_declared_size(name, codec, data, expected)
        return name, np.broadcast_to(np.zeros((), dtype), tuple(shape))  # read-only zeros: shape and dtype only
    if codec != "none":
        data = memoryview(decompress(name, codec, data, expected))
    if data.nbytes != expected:
        raise MalformedMessage(f"array {name!r}: shape {shape} needs {expected} bytes, frame has {data.nbytes}")
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    if dtype.kind == "b" and count and int(arr.view(np.uint8).max()) > 1:
        raise MalformedMessage(f"array {name!r} is boolean but holds bytes other than 0 and 1")
    return name, arr


def decode(frames: Sequence[Any], max_bytes: int = 256 * 2**20, inflate: bool = True,
           limits: PacketLimits | None = None, stored: bool = False) -> Message:
    """Parse and validate frames into a :class:`Message`.

    With ``inflate=False`` (the server, which reads sample packets but relays them as they came), integer arrays
    that arrive compressed are not decompressed: their declared size is checked where the codec records it, and
    they come back as read-only zeros of their shape and dtype. Boolean and float arrays are always inflated and
    checked, and the trainer decodes everything in full before anything reaches its memory.

    ``limits`` bounds a SAMPLES packet's rows and inflated bytes; both are checked from the header, before any
    array is decompressed (and decompression never yields more than an array declares: see
    :func:`~netrl.protocol.codecs.decompress`).

    ``stored=True`` is for frames this process reads back from its own disk (the trainer's sample log), which an
    older netrl may have written: a header of any of :data:`STORED_VERSIONS` is accepted. Never for a live peer,
    which must speak :data:`PROTOCOL_VERSION`, so that roles of different versions are refused at HELLO.

    Raises:
        PacketTooLarge: a SAMPLES packet beyond ``limits``.
        MalformedMessage: the frames do not follow the layout in this module's docstring.
        VersionMismatch: the header carries another protocol version.
    """
    if not frames:
        raise MalformedMessage("empty message")
    head = _buf(frames[0])
    if head.nbytes > MAX_HEADER_BYTES:
        raise MalformedMessage(f"header of {head.nbytes} bytes exceeds {MAX_HEADER_BYTES}")
    total = sum(_buf(f).nbytes for f in frames)
    if total > max_bytes:
        raise MalformedMessage(f"message of {total} bytes exceeds the {max_bytes}-byte limit")
    header = _unpack_header(head)
    _check_header(header, STORED_VERSIONS if stored else frozenset({PROTOCOL_VERSION}))
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
        raise MalformedMessage(f"header lists {len(specs)} arrays but {len(frames) - 1} data frames follow")
    budget = max_bytes
    if mtype is MsgType.SAMPLES and limits is not None:
        budget = min(budget, _check_limits(msg, specs, limits))
    for spec, frame in zip(specs, frames[1:], strict=True):
        name, arr = _array(spec, frame, budget, max_bytes, inflate)
        if name in msg.arrays:
            raise MalformedMessage(f"array {name!r} appears twice")
        msg.arrays[name] = arr
        budget -= arr.nbytes
    if mtype is MsgType.SAMPLES:
        _check_samples(msg)
    elif mtype is MsgType.WEIGHTS:
        _check_weights_part(msg)
    return msg


def _check_limits(msg: Message, specs: list[Any], limits: PacketLimits) -> int:
    """Raise :class:`PacketTooLarge` for a packet whose header declares more rows, or more inflated bytes, than
    ``limits``; the bytes its arrays may still take. (Each array's own entry is checked later, as it is read.)"""
    rows, declared = msg.body["n"], 0
    where = f" ({limits.source})" if limits.source else ""
    if rows > limits.rows:
        raise PacketTooLarge(f"samples packet {msg.seq} declares {rows} rows, over the bound of {limits.rows} rows per "
                             f"packet{where}", msg.seq)
    for spec in specs:  # a bad entry is refused by _array, in order; here only what the header claims counts
        nbytes = spec.get("nbytes") if type(spec) is dict else None
        declared += nbytes if type(nbytes) is int and nbytes > 0 else 0
    if declared > limits.inflated_bytes:
        raise PacketTooLarge(f"samples packet {msg.seq} declares arrays of {declared} bytes once inflated, over the "
                             f"bound of {limits.inflated_bytes} bytes per packet{where}", msg.seq)
    return limits.inflated_bytes


def _short(value: Any) -> str:
    """A hostile value, quoted for a log line but never at length."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_layout(layout: Any, nbytes: int) -> None:
    """Raise :class:`~netrl.errors.MalformedMessage`, naming the first problem, unless ``layout`` is
    ``[[name, dtype, shape, offset], ...]`` (see :func:`netrl.protocol.weights.flat_layout`) for a ``nbytes``-byte
    buffer: at most :data:`MAX_LAYOUT_ENTRIES` entries with distinct non-empty names, dtype strings from
    :data:`ALLOWED_DTYPES`, shapes of at most :data:`MAX_LAYOUT_DIMS` non-negative ints, and
    tensors that lie inside the buffer without overlapping. The server checks part 0 with it and each worker a version's
    layout before viewing the buffer."""
    if not isinstance(layout, list) or not layout:
        raise MalformedMessage(f"the layout must be a non-empty list of [name, dtype, shape, offset] (got "
                               f"{_short(layout)})")
    if len(layout) > MAX_LAYOUT_ENTRIES:
        raise MalformedMessage(f"the layout lists {len(layout)} tensors, over the limit of {MAX_LAYOUT_ENTRIES}")
    names: set[str] = set()
    spans: list[tuple[int, int, str]] = []  # (offset, size, name) of each tensor that takes any bytes
    for i, entry in enumerate(layout):
        if not (isinstance(entry, list) and len(entry) == 4):
            raise MalformedMessage(f"layout entry {i} is not [name, dtype, shape, offset] (got {_short(entry)})")
        name, dtype, shape, offset = entry
        if not isinstance(name, str) or not name:
            raise MalformedMessage(f"layout entry {i} has the name {_short(name)}, not a non-empty string")
        label = f"layout entry {i} ({_short(name)})"
        if name in names:
            raise MalformedMessage(f"{label} names a tensor listed before it")
        if not (isinstance(dtype, str) and dtype in ALLOWED_DTYPES):
            raise MalformedMessage(f"{label} has the dtype {_short(dtype)}, not one of {sorted(ALLOWED_DTYPES)}")
        if not (isinstance(shape, list) and len(shape) <= MAX_LAYOUT_DIMS
                and all(type(d) is int and d >= 0 for d in shape)):  # `type(d) is int`: no bools
            raise MalformedMessage(f"{label} has the shape {_short(shape)}, not a list of at most {MAX_LAYOUT_DIMS} "
                                   "non-negative integers")
        if type(offset) is not int or offset < 0:
            raise MalformedMessage(f"{label} has the offset {_short(offset)}, not a non-negative integer")
        size = math.prod(shape) * _ITEMSIZE[dtype]
        if offset + size > nbytes:
            raise MalformedMessage(f"tensor {_short(name)} at offset {offset} ({size} bytes) lies outside the "
                                   f"{nbytes}-byte buffer")
        names.add(name)
        if size:
            spans.append((offset, size, name))
    spans.sort()
    for (start, size, name), (after, _, other) in itertools.pairwise(spans):
        if start + size > after:  # sorted by offset: any overlap shows between neighbours
            raise MalformedMessage(f"tensors {_short(name)} and {_short(other)} overlap (bytes {after} to "
                                   f"{start + size - 1})")


def _check_weights_part(msg: Message) -> None:
    b = msg.body
    chunk = msg.arrays.get("chunk")
    if set(msg.arrays) != {"chunk"} or chunk is None or chunk.dtype != np.uint8 or chunk.ndim != 1:
        raise MalformedMessage("a weights part carries exactly one 1-D uint8 array named 'chunk'")
    if not (0 <= b["part"] < b["parts"] <= 1 << 20 and 0 <= b["offset"] and b["offset"] + chunk.size <= b["nbytes"]):
        raise MalformedMessage(f"weights part {b['part']} of {b['parts']} at offset {b['offset']} does not fit "
                               f"{b['nbytes']} bytes")
    if (b["part"] == 0) != bool(b["layout"]):
        raise MalformedMessage("the layout travels in part 0, and only there")
    if "model" in b and not PEER_NAME.fullmatch(b["model"]):
        raise MalformedMessage(f"weights name the model {b['model'][:40]!r}, not a valid name ({PEER_NAME_RULE})")
    if "format" in b and not FORMAT_NAME.fullmatch(b["format"]):
        raise MalformedMessage(f"weights name the format {b['format'][:40]!r}, not a valid format name (a lower-case "
                               "letter, then up to 31 lower-case letters, digits or _)")
    if "base" in b and not 0 <= b["base"] < msg.policy_version:
        raise MalformedMessage(f"weights v{msg.policy_version} are a delta against v{b['base']}, not an earlier "
                               "version")
    if "encoded" in b and not 0 <= b["encoded"] <= MAX_ENCODED_BYTES:
        raise MalformedMessage(f"weights declare a {b['encoded']}-byte encoding, not between 0 and "
                               f"{MAX_ENCODED_BYTES} bytes")
    if "base" not in b and b.get("encoded", b["nbytes"]) != b["nbytes"]:
        raise MalformedMessage(f"a full weights version of {b['nbytes']} bytes declares a {b['encoded']}-byte "
                               "encoding: only a delta's may differ")
    if "crc" in b and not 0 <= b["crc"] < 1 << 32:
        raise MalformedMessage(f"weights crc {b['crc']} is not a 32-bit crc")
    if "rank" in b and not 0 <= b["rank"] < 256:
        raise MalformedMessage(f"weights rank {b['rank']} is not between 0 and 255")
    if "budget_s" in b and not 0 < b["budget_s"] <= 3600:
        raise MalformedMessage(f"weights budget_s {b['budget_s']} is not between 0 and 3600 s")


def weight_parts(sender: str, session: str, version: int, trained_steps: int, flat: np.ndarray,
                 layout: list[Any], part_bytes: int, fields: dict[str, Any] | None = None) -> list[Message]:
    """A flat weights buffer (or a model's encoding of it, or a delta) as WEIGHTS parts of at most ``part_bytes``
    (views, no copies). ``fields``: the optional WEIGHTS fields (model, format, base, encoded, crc, rank, budget_s),
    the same in every part."""
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
        raise MalformedMessage(f"bundle lists {sum(counts)} part frames but {len(frames) - 1} follow")
    start = 1
    for count in counts:
        msg.parts.append(list(frames[start:start + count]))
        start += count


def split_bundle(msg: Message) -> list[list[Any]]:
    """The frames of each SAMPLES part of a decoded BUNDLE (decode each with :func:`decode`)."""
    return msg.parts


_SAMPLE_COLUMNS = {"rew": "f", "terminated": "b", "truncated": "b", "reset": "b", "context": "b",
                   "policy_version": "i"}


def _check_samples(msg: Message) -> None:
    body, arrays = msg.body, msg.arrays
    n = body["n"]
    if not 1 <= n <= 1 << 24:
        raise MalformedMessage(f"samples packet claims {n} rows")
    for name, kind in _SAMPLE_COLUMNS.items():
        arr = arrays.get(name)
        if arr is None or arr.shape != (n,) or arr.dtype.kind != kind:
            raise MalformedMessage(f"samples column {name!r} must have shape ({n},) and kind {kind!r}")
    leaves: list[str] = []
    for key in ("act", "obs"):
        try:
            names = spec_leaves(body[key])
        except ValueError as exc:
            raise MalformedMessage(f"samples {key} spec is invalid: {exc}") from None
        if not names or not all(x == key or x.startswith(key + "/") for x in names):
            raise MalformedMessage(f"samples {key} spec must name leaves {key} or {key}/...")
        leaves += names
    extras = [name for name in arrays if name.startswith("extra/")]
    bad = next((name for name in extras if not EXTRA_NAME.fullmatch(name[6:])), None)
    if bad is not None or len(extras) > MAX_EXTRAS:
        raise MalformedMessage(f"samples packet {msg.seq} from {_short(msg.sender)}: "
                               + (f"array {_short(bad)} names an extra output that is not a lowercase identifier "
                                  "of at most 32 characters" if bad is not None else
                                  f"{len(extras)} extra outputs, over {MAX_EXTRAS}"))
    if len(set(leaves)) != len(leaves) or set(leaves) | set(_SAMPLE_COLUMNS) != set(arrays) - {"env", *extras}:
        raise MalformedMessage("samples arrays do not match the act/obs specs and the sample columns")
    leaves += extras
    if "env" in arrays:
        _check_env_segments(msg, n)
    for name in leaves:
        if arrays[name].ndim < 1 or arrays[name].shape[0] != n:
            raise MalformedMessage(f"samples leaf {name!r} must have {n} rows (shape {arrays[name].shape})")
    newest = int(arrays["policy_version"].max())  # the upper bound only: below 0 counts as 0 (no weights yet)
    if newest > MAX_POLICY_VERSION:
        raise MalformedMessage(f"samples column 'policy_version' holds {newest}, over {MAX_POLICY_VERSION}")
    episodes = body["episodes"]
    if len(episodes) > MAX_EPISODES_PER_PACKET or not all(_episode_ok(e) for e in episodes):
        raise MalformedMessage("samples episodes must be [return, length, test, policy_version(, env)] lists, with "
                               "a finite return, a length >= 0, a policy_version from -1 to "
                               f"{MAX_POLICY_VERSION} and an env from 0 to {MAX_ENVS - 1}")


def _check_env_segments(msg: Message, n: int) -> None:
    """The ``env`` column: uint16, non-decreasing (env-major segments), and every segment starting with a context or
    reset row. A segment starting with a row that ends a transition would join it to the row before it: another
    env's, or another packet's."""
    env, fresh = msg.arrays["env"], ~(msg.arrays["reset"] | msg.arrays["context"])
    who = f"samples packet {msg.seq} from {_short(msg.sender)}"
    if env.shape != (n,) or env.dtype != np.uint16:
        raise MalformedMessage(f"{who}: column 'env' must have shape ({n},) and dtype uint16 (got {env.shape}, "
                               f"{env.dtype})")
    steps = np.diff(env.astype(np.int32))
    back = np.flatnonzero(steps < 0)
    if len(back):
        raise MalformedMessage(f"{who}: column 'env' goes from {int(env[back[0]])} back to {int(env[back[0] + 1])} "
                               f"at row {int(back[0]) + 1}: a packet holds each env's rows as one segment, in env "
                               "order")
    starts = np.concatenate([[0], np.flatnonzero(steps) + 1])
    joins = starts[fresh[starts]]
    if len(joins):
        raise MalformedMessage(f"{who}: row {int(joins[0])} starts env {int(env[joins[0]])}'s segment but is neither a "
                               "context nor a reset row, so its transition would join another env's or another "
                               "packet's rows")


def _episode_ok(e: Any) -> bool:
    return (isinstance(e, list) and len(e) in (4, 5) and isinstance(e[0], (int, float)) and math.isfinite(e[0])
            and type(e[1]) is int and 0 <= e[1] < 2**63 and isinstance(e[2], bool) and type(e[3]) is int
            and -1 <= e[3] <= MAX_POLICY_VERSION and (len(e) == 4 or (type(e[4]) is int and 0 <= e[4] < MAX_ENVS)))


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
        episodes=[EpisodeStats(float(e[0]), e[1], e[2], e[3], e[4] if len(e) > 4 else 0) for e in b["episodes"]],
    )
