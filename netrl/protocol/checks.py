"""What a decoded message must hold beyond its frames, and the limits every message keeps to.

:func:`netrl.protocol.wire.decode` reads the frames and calls these checks in turn: the
header (:func:`check_header`), a sample packet's declared size (:func:`check_packet_limits`, before
anything is inflated), then the body and arrays of a SAMPLES message (:func:`check_samples`) or of
a WEIGHTS part (:func:`check_weights_part`). :func:`check_layout` checks a weight version's tensor
layout; the server checks part 0 with it and each worker checks a version before viewing its
buffer.

Nothing here knows msgpack or the frame layout: the checks see decoded Python values and numpy
arrays. Each raises :class:`~netrl.errors.MalformedMessage` naming the first problem
(:class:`PacketTooLarge` and :class:`~netrl.errors.VersionMismatch` are kinds of it); network input
is checked here, never asserted.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any, NamedTuple

import numpy as np

from netrl.errors import MalformedMessage, VersionMismatch
from netrl.protocol.messages import (
    MAX_POLICY_VERSION,
    PEER_NAME,
    PEER_NAME_RULE,
    VERSION_TEXT,
    Message,
)
from netrl.samples.columns import EXTRA_NAME, MAX_EXTRAS, spec_leaves
from netrl.samples.info import MAX_INFO_KEYS

__all__ = [
    "ALLOWED_DTYPES",
    "BUNDLE_HEADER_ROOM",
    "FORMAT_NAME",
    "MAX_ENCODED_BYTES",
    "MAX_MODELS",
    "PacketLimits",
    "PacketTooLarge",
    "check_header",
    "check_layout",
    "check_packet_limits",
    "check_samples",
    "check_weights_part",
    "max_packet_bytes",
    "sample_row_bytes",
]

MAX_NAME = 256  # a sender's or an array's name
MAX_MODELS = 8  # named models one trainer publishes (netrl.protocol.weight_formats)
MAX_ENCODED_BYTES = 1 << 40
# a weight format's name on the wire (netrl.protocol.weight_formats)
FORMAT_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
MAX_EPISODES_PER_PACKET = 10_000
MAX_ENVS = 1 << 16  # envs per worker: the per-row ``env`` column is uint16
# A sample packet reaches the trainer inside a BUNDLE, whose header (at most ~20 KiB) counts towards
# the trainer's max_message_bytes: a packet may use all of that limit but this room, or the trainer
# could never accept it.
BUNDLE_HEADER_ROOM = 32 << 10
MAX_LAYOUT_ENTRIES = 1 << 16  # tensors in one version (a large transformer has a few thousand)
MAX_LAYOUT_DIMS = 32  # dimensions of one tensor (numpy's limit is 64)
ALLOWED_DTYPES = frozenset({"|b1", "|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2",
                            "<f4", "<f8"})
_ITEMSIZE = {name: np.dtype(name).itemsize for name in ALLOWED_DTYPES}


def max_packet_bytes(max_message_bytes: int) -> int:
    """The largest sample packet (or run of packets in one bundle) a trainer with this limit can
    accept."""
    return max_message_bytes - BUNDLE_HEADER_ROOM


# The most one row's sample columns take: rew and policy_version may be 8-byte numbers, the four
# flags a byte each, env 2 bytes.
SAMPLE_COLUMN_ROW_BYTES = 22


def sample_row_bytes(leaves: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    """The most bytes one row of a packet takes with these act/obs leaves (name -> (dtype, row
    shape), as in a :class:`~netrl.protocol.schema.SampleSchema`), its sample columns included."""
    return SAMPLE_COLUMN_ROW_BYTES + sum(_ITEMSIZE.get(dtype, 8) * math.prod(shape)
                                         for dtype, shape in leaves.values())


class PacketLimits(NamedTuple):
    """How large a SAMPLES packet may be, checked by :func:`~netrl.protocol.wire.decode` before
    anything is inflated: its rows (the header's ``n``) and the bytes its arrays take once
    decompressed (their declared sizes). ``source`` says where each bound comes from, for the error
    message (e.g. "declared by the worker at HELLO")."""

    rows: int
    inflated_bytes: int
    source: str = ""


class PacketTooLarge(MalformedMessage):
    """A sample packet beyond its :class:`PacketLimits`: refused before it was inflated. ``seq`` is
    the packet's."""

    def __init__(self, message: str, seq: int) -> None:
        super().__init__(message)
        self.seq = seq


def check_header(header: Any, current: int, accepted: frozenset[int]) -> None:
    """Frame 0, decoded: exactly the header keys, of their types, and a protocol version of
    ``accepted`` (VersionMismatch, saying this process speaks ``current``, otherwise)."""
    if not isinstance(header, dict):
        raise MalformedMessage("header is not a map")
    if not all(type(k) is str for k in header):  # msgpack lets an empty bin through as a bytes key
        raise MalformedMessage("header keys must be strings")
    expected = {"v", "type", "sender", "seq", "policy_version", "body", "arrays"}
    if set(header) != expected:
        extra, missing = sorted(set(header) - expected), sorted(expected - set(header))
        raise MalformedMessage(f"header keys wrong (missing {missing}, unexpected {extra})")
    for key, types in (("v", int), ("type", str), ("sender", str), ("seq", int),
                       ("policy_version", int)):
        value = header[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise MalformedMessage(f"header field {key!r} has the wrong type "
                                   f"({type(value).__name__})")
    if header["v"] not in accepted:
        body = header["body"] if isinstance(header["body"], dict) else {}
        theirs = body.get("netrl_version")
        if theirs:  # quoted unless it is a plain version: it ends up in a log line
            plain = isinstance(theirs, str) and VERSION_TEXT.fullmatch(theirs)
            theirs = theirs if plain else repr(str(theirs)[:64])
        raise VersionMismatch(header["v"], current,
                              f"peer runs netrl {theirs}" if theirs else "")
    if not 0 <= header["seq"] < 2**63:
        raise MalformedMessage(f"header seq {header['seq']} is out of range (0 to 2**63 - 1)")
    if not -1 <= header["policy_version"] <= MAX_POLICY_VERSION:
        raise MalformedMessage(f"header policy_version {header['policy_version']} is out of range "
                               f"(-1 to {MAX_POLICY_VERSION})")
    if len(header["sender"]) > MAX_NAME:
        raise MalformedMessage(f"sender name longer than {MAX_NAME} characters")
    if not isinstance(header["body"], dict) or not isinstance(header["arrays"], list):
        raise MalformedMessage("header body must be a map and arrays a list")


def check_packet_limits(msg: Message, specs: list[Any], limits: PacketLimits) -> int:
    """Raise :class:`PacketTooLarge` for a packet whose header declares more rows, or more inflated
    bytes, than ``limits``; the bytes its arrays may still take. (Each array's own entry is checked
    later, as it is read.)"""
    rows, declared = msg.body["n"], 0
    where = f" ({limits.source})" if limits.source else ""
    if rows > limits.rows:
        raise PacketTooLarge(f"samples packet {msg.seq} declares {rows} rows, over the bound of "
                             f"{limits.rows} rows per packet{where}", msg.seq)
    for spec in specs:  # a bad entry is refused as it is read, in order; here only what is claimed
        nbytes = spec.get("nbytes") if type(spec) is dict else None
        declared += nbytes if type(nbytes) is int and nbytes > 0 else 0
    if declared > limits.inflated_bytes:
        raise PacketTooLarge(f"samples packet {msg.seq} declares arrays of {declared} bytes once "
                             f"inflated, over the bound of {limits.inflated_bytes} bytes per "
                             f"packet{where}", msg.seq)
    return limits.inflated_bytes


def _short(value: Any) -> str:
    """A hostile value, quoted for a log line but never at length."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_layout(layout: Any, nbytes: int) -> None:
    """Raise :class:`~netrl.errors.MalformedMessage`, naming the first problem, unless ``layout`` is
    ``[[name, dtype, shape, offset], ...]`` (see :func:`netrl.protocol.weights.flat_layout`) for a
    ``nbytes``-byte buffer: at most :data:`MAX_LAYOUT_ENTRIES` entries with distinct non-empty
    names, dtype strings from :data:`ALLOWED_DTYPES`, shapes of at most :data:`MAX_LAYOUT_DIMS`
    non-negative ints, and tensors that lie inside the buffer without overlapping. The server checks
    part 0 with it and each worker a version's layout before viewing the buffer."""
    if not isinstance(layout, list) or not layout:
        raise MalformedMessage("the layout must be a non-empty list of [name, dtype, shape, "
                               f"offset] (got {_short(layout)})")
    if len(layout) > MAX_LAYOUT_ENTRIES:
        raise MalformedMessage(f"the layout lists {len(layout)} tensors, over the limit of "
                               f"{MAX_LAYOUT_ENTRIES}")
    names: set[str] = set()
    spans: list[tuple[int, int, str]] = []  # (offset, size, name) of each tensor that takes bytes
    for i, entry in enumerate(layout):
        if not (isinstance(entry, list) and len(entry) == 4):
            raise MalformedMessage(f"layout entry {i} is not [name, dtype, shape, offset] "
                                   f"(got {_short(entry)})")
        name, dtype, shape, offset = entry
        if not isinstance(name, str) or not name:
            raise MalformedMessage(f"layout entry {i} has the name {_short(name)}, not a non-empty "
                                   "string")
        label = f"layout entry {i} ({_short(name)})"
        if name in names:
            raise MalformedMessage(f"{label} names a tensor listed before it")
        if not (isinstance(dtype, str) and dtype in ALLOWED_DTYPES):
            raise MalformedMessage(f"{label} has the dtype {_short(dtype)}, not one of "
                                   f"{sorted(ALLOWED_DTYPES)}")
        if not (isinstance(shape, list) and len(shape) <= MAX_LAYOUT_DIMS
                and all(type(d) is int and d >= 0 for d in shape)):  # `type(d) is int`: no bools
            raise MalformedMessage(f"{label} has the shape {_short(shape)}, not a list of at most "
                                   f"{MAX_LAYOUT_DIMS} non-negative integers")
        if type(offset) is not int or offset < 0:
            raise MalformedMessage(f"{label} has the offset {_short(offset)}, not a non-negative "
                                   "integer")
        size = math.prod(shape) * _ITEMSIZE[dtype]
        if offset + size > nbytes:
            raise MalformedMessage(f"tensor {_short(name)} at offset {offset} ({size} bytes) lies "
                                   f"outside the {nbytes}-byte buffer")
        names.add(name)
        if size:
            spans.append((offset, size, name))
    spans.sort()
    for (start, size, name), (after, _, other) in itertools.pairwise(spans):
        if start + size > after:  # sorted by offset: any overlap shows between neighbours
            raise MalformedMessage(f"tensors {_short(name)} and {_short(other)} overlap (bytes "
                                   f"{after} to {start + size - 1})")


def check_weights_part(msg: Message) -> None:
    """A WEIGHTS part: one ``chunk`` array that fits the version's size, and body fields in
    range."""
    b = msg.body
    chunk = msg.arrays.get("chunk")
    if set(msg.arrays) != {"chunk"} or chunk is None or chunk.dtype != np.uint8 or chunk.ndim != 1:
        raise MalformedMessage("a weights part carries exactly one 1-D uint8 array named 'chunk'")
    if not (0 <= b["part"] < b["parts"] <= 1 << 20 and 0 <= b["offset"]
            and b["offset"] + chunk.size <= b["nbytes"]):
        raise MalformedMessage(f"weights part {b['part']} of {b['parts']} at offset {b['offset']} "
                               f"does not fit {b['nbytes']} bytes")
    if (b["part"] == 0) != bool(b["layout"]):
        raise MalformedMessage("the layout travels in part 0, and only there")
    if "model" in b and not PEER_NAME.fullmatch(b["model"]):
        raise MalformedMessage(f"weights name the model {b['model'][:40]!r}, not a valid name "
                               f"({PEER_NAME_RULE})")
    if "format" in b and not FORMAT_NAME.fullmatch(b["format"]):
        raise MalformedMessage(f"weights name the format {b['format'][:40]!r}, not a valid format "
                               "name (a lower-case letter, then up to 31 lower-case letters, "
                               "digits or _)")
    if "base" in b and not 0 <= b["base"] < msg.policy_version:
        raise MalformedMessage(f"weights v{msg.policy_version} are a delta against v{b['base']}, "
                               "not an earlier version")
    if "encoded" in b and not 0 <= b["encoded"] <= MAX_ENCODED_BYTES:
        raise MalformedMessage(f"weights declare a {b['encoded']}-byte encoding, not between 0 and "
                               f"{MAX_ENCODED_BYTES} bytes")
    if "base" not in b and b.get("encoded", b["nbytes"]) != b["nbytes"]:
        raise MalformedMessage(f"a full weights version of {b['nbytes']} bytes declares a "
                               f"{b['encoded']}-byte encoding: only a delta's may differ")
    if "crc" in b and not 0 <= b["crc"] < 1 << 32:
        raise MalformedMessage(f"weights crc {b['crc']} is not a 32-bit crc")
    if "rank" in b and not 0 <= b["rank"] < 256:
        raise MalformedMessage(f"weights rank {b['rank']} is not between 0 and 255")
    if "budget_s" in b and not 0 < b["budget_s"] <= 3600:
        raise MalformedMessage(f"weights budget_s {b['budget_s']} is not between 0 and 3600 s")


_SAMPLE_COLUMNS = {"rew": "f", "terminated": "b", "truncated": "b", "reset": "b", "context": "b",
                   "policy_version": "i"}


def check_samples(msg: Message) -> None:
    """A SAMPLES message: its columns, its act/obs leaves, extra outputs and info entries, all
    with one row per sample, the env column's segments, and its episodes."""
    body, arrays = msg.body, msg.arrays
    n = body["n"]
    if not 1 <= n <= 1 << 24:
        raise MalformedMessage(f"samples packet claims {n} rows")
    for name, kind in _SAMPLE_COLUMNS.items():
        arr = arrays.get(name)
        if arr is None or arr.shape != (n,) or arr.dtype.kind != kind:
            raise MalformedMessage(f"samples column {name!r} must have shape ({n},) and kind "
                                   f"{kind!r}")
    leaves: list[str] = []
    for key in ("act", "obs"):
        try:
            names = spec_leaves(body[key])
        except ValueError as exc:
            raise MalformedMessage(f"samples {key} spec is invalid: {exc}") from None
        if not names or not all(x == key or x.startswith(key + "/") for x in names):
            raise MalformedMessage(f"samples {key} spec must name leaves {key} or {key}/...")
        leaves += names
    extras: list[str] = []  # the extra outputs' and info keys' columns
    for prefix, one, many, most in (("extra/", "an extra output", "extra outputs", MAX_EXTRAS),
                                    ("info/", "an info key", "info keys", MAX_INFO_KEYS)):
        named = [name for name in arrays if name.startswith(prefix)]
        bad = next((name for name in named if not EXTRA_NAME.fullmatch(name[len(prefix):])), None)
        if bad is not None or len(named) > most:
            raise MalformedMessage(f"samples packet {msg.seq} from {_short(msg.sender)}: "
                                   + (f"array {_short(bad)} names {one} that is not a "
                                      "lowercase identifier of at most 32 characters"
                                      if bad is not None else f"{len(named)} {many}, over {most}"))
        extras += named
    columns = set(arrays) - {"env", *extras}
    if len(set(leaves)) != len(leaves) or set(leaves) | set(_SAMPLE_COLUMNS) != columns:
        raise MalformedMessage("samples arrays do not match the act/obs specs and the sample "
                               "columns")
    leaves += extras
    if "env" in arrays:
        _check_env_segments(msg, n)
    for name in leaves:
        if arrays[name].ndim < 1 or arrays[name].shape[0] != n:
            raise MalformedMessage(f"samples leaf {name!r} must have {n} rows (shape "
                                   f"{arrays[name].shape})")
    # the upper bound only: below 0 counts as 0 (no weights yet)
    newest = int(arrays["policy_version"].max())
    if newest > MAX_POLICY_VERSION:
        raise MalformedMessage(f"samples column 'policy_version' holds {newest}, over "
                               f"{MAX_POLICY_VERSION}")
    episodes = body["episodes"]
    if len(episodes) > MAX_EPISODES_PER_PACKET or not all(_episode_ok(e) for e in episodes):
        raise MalformedMessage("samples episodes must be [return, length, test, "
                               "policy_version(, env)] lists, with a finite return, a length >= 0, "
                               f"a policy_version from -1 to {MAX_POLICY_VERSION} and an env from "
                               f"0 to {MAX_ENVS - 1}")


def _check_env_segments(msg: Message, n: int) -> None:
    """The ``env`` column: uint16, non-decreasing (env-major segments), and every segment starting
    with a context or reset row. A segment starting with a row that ends a transition would join it
    to the row before it: another env's, or another packet's."""
    env, fresh = msg.arrays["env"], ~(msg.arrays["reset"] | msg.arrays["context"])
    who = f"samples packet {msg.seq} from {_short(msg.sender)}"
    if env.shape != (n,) or env.dtype != np.uint16:
        raise MalformedMessage(f"{who}: column 'env' must have shape ({n},) and dtype uint16 (got "
                               f"{env.shape}, {env.dtype})")
    steps = np.diff(env.astype(np.int32))
    back = np.flatnonzero(steps < 0)
    if len(back):
        raise MalformedMessage(f"{who}: column 'env' goes from {int(env[back[0]])} back to "
                               f"{int(env[back[0] + 1])} at row {int(back[0]) + 1}: a packet holds "
                               "each env's rows as one segment, in env order")
    starts = np.concatenate([[0], np.flatnonzero(steps) + 1])
    joins = starts[fresh[starts]]
    if len(joins):
        raise MalformedMessage(f"{who}: row {int(joins[0])} starts env {int(env[joins[0]])}'s "
                               "segment but is neither a context nor a reset row, so its "
                               "transition would join another env's or another packet's rows")


def _episode_ok(e: Any) -> bool:
    return (isinstance(e, list) and len(e) in (4, 5) and isinstance(e[0], (int, float))
            and math.isfinite(e[0]) and type(e[1]) is int and 0 <= e[1] < 2**63
            and isinstance(e[2], bool) and type(e[3]) is int
            and -1 <= e[3] <= MAX_POLICY_VERSION
            and (len(e) == 4 or (type(e[4]) is int and 0 <= e[4] < MAX_ENVS)))
