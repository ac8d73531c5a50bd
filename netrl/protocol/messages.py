"""The message vocabulary: the types of message, :class:`Message` (one message, decoded or to be
encoded), the body fields each type carries and the protocol version that added them, which role may
send which type, and the names and versions a peer may announce. It knows nothing of msgpack or
frames: :mod:`netrl.protocol.wire` encodes and decodes, and checks every decoded body with
:func:`check_body` (the server then checks the sender with :func:`check_role`).
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from netrl.errors import MalformedMessage, RoleViolation

__all__ = ["ALLOWED_FROM", "BODY_SCHEMA", "MAX_POLICY_VERSION", "MIN_MESSAGE_BYTES", "PEER_NAME",
           "PEER_NAME_RULE", "PROTOCOL_VERSION", "STORED_VERSIONS", "VERSION_TEXT", "Message", "MsgType",
           "check_body", "check_role", "printable"]

# The names a server prints in its logs and status tables (a worker_id in HELLO, a key name):
# nothing that could forge a log line or a terminal escape.
PEER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PEER_NAME_RULE = "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
# a PEP 440 version, as a HELLO's netrl_version
VERSION_TEXT = re.compile(r"[0-9A-Za-z.+!_-]{1,64}")

# The largest weight version any message may name: 70 years of 1,000 publications a second, and far
# enough from int64's limit that no arithmetic on versions overflows (a trainer takes a version it
# never published as taken only up to half of it: see netrl.trainer.link).
MAX_POLICY_VERSION = 2**41
# 2: NOTICE, WEIGHTS' collect, WELCOME's and PROGRESS's batch_steps, PROGRESS's batch_version,
# the layout of NACK and of the server's HEARTBEAT to workers, extra/<name> sample arrays and the
# SCHEMA's extra leaves. A version-1 peer refuses these as malformed, so peers of different versions
# are refused at HELLO instead. 3: several named models and compact weight formats: WEIGHTS' model,
# format, base, encoded, crc, rank and budget_s, ACK's model, format and need_full, HELLO's models
# and formats, WELCOME's models. 4: the trainer's ACK names the parts of its bundle it refused
# (layout_refused, rejected), so that the server keeps the first for a trainer of their layout.
# 5: info/<name> sample arrays and the SCHEMA's info leaves (env info to the trainer). 6: LIFT,
# REVOKE's undo, PROGRESS's workers and quarantined, NOTICE's packets and rows (what an operator
# sees of quarantine, revocation and the replay share, and share refusals told to the worker).
PROTOCOL_VERSION = 6
# What this netrl still reads from its own disk (the trainer's sample log, the server's spool),
# never from a peer: every field versions 2 to 6 added is optional, so an older stored
# message is a valid current one.
STORED_VERSIONS = frozenset({1, 2, 3, 4, 5, PROTOCOL_VERSION})
# the smallest network.max_message_bytes (netrl.config.sections checks the same bound)
MIN_MESSAGE_BYTES = 1 << 16
# the longest network interval or delay (netrl.config.sections too): ZeroMQ takes int32 milliseconds
MAX_SECONDS = 86_400.0


class MsgType(str, enum.Enum):
    HELLO = "hello"  # client -> server: first message on every connection
    WELCOME = "welcome"  # server -> client: HELLO accepted
    REJECT = "reject"  # server -> client: refused, with a reason
    HEARTBEAT = "heartbeat"  # both ways, when nothing else was sent for a heartbeat interval
    BYE = "bye"  # either side: clean goodbye
    SAMPLES = "samples"  # worker -> server: a packet of sample rows
    BUNDLE = "bundle"  # server -> trainer: several SAMPLES messages, frames unchanged
    ACK = "ack"  # receipt: server -> worker (sample seqs), trainer -> server (bundle seqs),
                 # worker -> server (weights)
    NACK = "nack"  # server -> worker: packets refused for now (spool full, over PACE);
                   # resend them after retry_s
    # (or, with a layout, once the server names another sample layout)
    CREDIT = "credit"  # trainer -> server: how many more bundles it can take
    WEIGHTS = "weights"  # trainer -> server -> workers: actor state_dict, versioned
    PROGRESS = "progress"  # trainer -> server: training steps and samples, for pacing
    PACE = "pace"  # server -> worker: how many samples it may have produced in total
    SCHEMA = "schema"  # trainer -> server: the sample layout it expects (checked at
                       # the server's edge)
    STATUS = "status"  # status tool <-> server (loopback status port): request, and
                       # the snapshot in reply
    NOTICE = "notice"  # server -> trainer: why workers' packets are refused that the trainer
                       # can fix (its layout); server -> a peer: why its message was refused
    REVOKE = "revoke"  # trainer or --revoke -> server: revoke a worker key; server -> the revoker:
                       # done (links dropped); server -> trainer: a worker revoked, drop its rows
                       # (undo: the revocation lifted, both ways: --unrevoke)
    LIFT = "lift"  # --lift -> server -> trainer: end a worker's quarantine; the trainer's answer
                   # (what was released) -> server -> the operator


@dataclass
class Message:
    """A decoded (or to-be-encoded) message. ``arrays`` keeps its order on the wire."""

    type: MsgType
    sender: str = ""
    seq: int = 0
    policy_version: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    # BUNDLE only: the frames of each SAMPLES part
    parts: list[list[Any]] = field(default_factory=list)


# Body fields per message type: name -> (python types, required). Anything
# else in a body is malformed.
_INT = (int,)
_STR = (str,)
_BOOL = (bool,)
BODY_SCHEMA: dict[MsgType, dict[str, tuple[tuple[type, ...], bool]]] = {
    # a worker's HELLO also declares the largest packet it makes (rows, bytes inflated), whether it
    # keeps to PACE and how many envs it runs (its packets' env column stays below it)
    MsgType.HELLO: {"role": (_STR, True), "netrl_version": (_STR, True), "worker_id": (_STR, True),
                    "session": (_STR, True), "max_rows": (_INT, False), "max_bytes": (_INT, False),
                    "paced": (_BOOL, False), "num_envs": (_INT, False),
                    # a worker's model targets and the weight formats it
                    # decodes (netrl.protocol.weight_formats)
                    "models": ((list,), False), "formats": ((list,), False)},
    MsgType.WELCOME: {"server_session": (_STR, True), "heartbeat_interval_s": ((float, int), True),
                      "window": (_INT, False), "weights_version": (_INT, False),
                      "max_message_bytes": (_INT, False), "batch_steps": (_INT, False),
                      # model name -> newest complete version the server holds
                      "models": ((dict,), False)},
    # retry_s: try again, not fatal; netrl_version: the server's, which a peer of another
    # protocol version can read
    MsgType.REJECT: {"reason": (_STR, True), "retry_s": ((float, int), False), "netrl_version": (_STR, False)},
    # flushing: a worker stopping; t: the sender's clock; echo, held: the newest t it got from the
    # peer, and how long ago (round-trip time)
    MsgType.HEARTBEAT: {"stats": ((dict,), False), "flushing": (_BOOL, False), "t": ((float,), False),
                        "echo": ((float,), False), "held": ((float, int), False)},
    MsgType.BYE: {"reason": (_STR, False)},
    MsgType.SAMPLES: {"n": (_INT, True), "act": ((str, list, dict), True), "obs": ((str, list, dict), True),
                      "episodes": ((list,), True), "produced": (_INT, True), "session": (_STR, True)},
    MsgType.BUNDLE: {"parts": ((list,), True)},
    # spooled: the server has the packets on disk, and the trainer not yet a worker's ACK of weights
    # names the model and format it took; need_full: it could not apply a delta (or a version failed
    # its checks) and wants a full version next. The trainer's ACK of one bundle: layout_refused,
    # rejected: the indices of its parts refused for their sample layout, and for anything else
    MsgType.ACK: {"seqs": ((list,), True), "window": (_INT, False), "spooled": (_BOOL, False),
                  "model": (_STR, False), "format": (_STR, False), "need_full": (_BOOL, False),
                  "layout_refused": ((list,), False), "rejected": ((list,), False)},
    # layout: the tag of the sample layout that refused the packets
    # (netrl.protocol.schema.SampleSchema.tag): the worker keeps them and sends them again once the
    # server's heartbeats name another layout
    MsgType.NACK: {"seqs": ((list,), True), "reason": (_STR, True), "retry_s": ((float, int), True),
                   "layout": (_INT, False)},
    MsgType.CREDIT: {"bundles": (_INT, True)},
    MsgType.WEIGHTS: {"trained_steps": (_INT, True), "session": (_STR, True), "part": (_INT, True),
                      "parts": (_INT, True), "offset": (_INT, True), "nbytes": (_INT, True), "layout": ((list,), True),
                      "collect": ((dict,), False),
                      # model: which named model (absent: "policy"); format: its encoding (absent:
                      # "float32"); base: a delta against that version of the same model and format
                      # (absent: a full version); encoded: the bytes of the format's full encoding;
                      # crc: zlib.crc32 of it; rank: the format's fidelity order among those the
                      # trainer sends (0: exact); budget_s: auto's time per version to a worker
                      "model": (_STR, False), "format": (_STR, False), "base": (_INT, False),
                      "encoded": (_INT, False), "crc": (_INT, False), "rank": (_INT, False),
                      "budget_s": ((float, int), False)},
    # batch_version, batch_steps: sync collection's batch under way (netrl.training.sync); a
    # WELCOME's batch_steps are those of the batch of its weights_version, so that a worker joining
    # mid-batch waits for the next version
    # workers: name -> [rows in replay, its share's cap, packets and rows refused over it];
    # quarantined: name -> [rows kept aside, why] (at most once a second, for --status)
    MsgType.PROGRESS: {"trained_steps": (_INT, True), "samples": (_INT, True), "wanted": (_INT, True),
                       "batch_version": (_INT, False), "batch_steps": (_INT, False),
                       "workers": ((dict,), False), "quarantined": ((dict,), False)},
    # trainer_samples: what the trainer holds as the allowance rises (a worker acts at
    # random until it holds enough)
    MsgType.PACE: {"allowance": (_INT, True), "trainer_samples": (_INT, False)},
    MsgType.SCHEMA: {"act": ((str, list, dict), True), "obs": ((str, list, dict), True), "leaves": ((list,), True),
                     "limits": ((dict,), False)},
    MsgType.STATUS: {"snapshot": ((dict,), False)},
    # refused: the peer's own message was refused (the reason names the field), not workers'
    # packets for the trainer's layout
    # packets, rows: those refused since the last such NOTICE (cause "replay_share")
    MsgType.NOTICE: {"cause": (_STR, True), "reason": (_STR, True), "refused": (_BOOL, False),
                     "packets": (_INT, False), "rows": (_INT, False)},
    # worker: a worker key (CURVE) or name; links: the connections the server dropped; refused:
    # the request was refused (the reason says why)
    MsgType.REVOKE: {"worker": (_STR, True), "reason": (_STR, False), "links": (_INT, False),
                     "refused": (_BOOL, False), "undo": (_BOOL, False), "was": (_BOOL, False)},
    # ask: the server's number for the operator's request, echoed by the trainer's answer; was:
    # the worker was quarantined; packets, rows: those kept aside, now ingested; hidden: its rows
    # in replay sampled again; gone: rows it sent while quarantined dropped beyond the hold
    MsgType.LIFT: {"worker": (_STR, True), "reason": (_STR, False), "ask": (_INT, False),
                   "refused": (_BOOL, False), "was": (_BOOL, False), "packets": (_INT, False),
                   "rows": (_INT, False), "hidden": (_INT, False), "gone": (_INT, False)},
}

# Which message types each role may send. The server drops anything else and logs a RoleViolation.
ALLOWED_FROM: dict[str, frozenset[MsgType]] = {
    "worker": frozenset({MsgType.HELLO, MsgType.SAMPLES, MsgType.HEARTBEAT, MsgType.BYE, MsgType.ACK}),
    "trainer": frozenset({MsgType.HELLO, MsgType.WEIGHTS, MsgType.ACK, MsgType.CREDIT, MsgType.PROGRESS,
                          MsgType.SCHEMA, MsgType.HEARTBEAT, MsgType.BYE, MsgType.REVOKE,
                          MsgType.LIFT}),
}


def check_body(mtype: MsgType, body: dict[str, Any]) -> None:
    """Raise :class:`MalformedMessage` unless ``body`` holds exactly the fields :data:`BODY_SCHEMA`
    allows for ``mtype``, of their types, with every required one present (a HELLO's names
    and version are checked too)."""
    schema = BODY_SCHEMA[mtype]
    for key, value in body.items():
        if key not in schema:
            raise MalformedMessage(f"{mtype.value} body has unexpected field {key!r}")
        types, _ = schema[key]
        # (short: a REJECT quoting it never outgrows the message it answers)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise MalformedMessage(f"{mtype.value} {key!r} is a {type(value).__name__}, not a "
                                   f"{' or '.join(t.__name__ for t in types)}")
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            raise MalformedMessage(f"{mtype.value} {key!r} is out of range")
        if isinstance(value, float) and not math.isfinite(value):  # a NaN delay would never end
            raise MalformedMessage(f"{mtype.value} body field {key!r} is "
                                   f"{value}, not a finite number")
    missing = [k for k, (_, required) in schema.items() if required and k not in body]
    if missing:
        raise MalformedMessage(f"{mtype.value} body lacks required field(s) {missing}")
    if mtype is MsgType.HELLO:
        _check_hello(body)
    elif mtype in (MsgType.WELCOME, MsgType.REJECT):
        _check_from_server(mtype, body)
    elif mtype in (MsgType.SAMPLES, MsgType.WEIGHTS) and not PEER_NAME.fullmatch(body["session"]):
        # logged, shown by --status, saved next to a worker's weights and kept per
        # packet in the trainer's log
        raise MalformedMessage(f"{mtype.value} session {body['session'][:40]!r} is "
                               f"not a valid id ({PEER_NAME_RULE})")


def _check_hello(body: dict[str, Any]) -> None:
    if body["role"] not in ALLOWED_FROM:
        raise MalformedMessage(f"HELLO role {body['role'][:40]!r} is "
                               f"neither 'worker' nor 'trainer'")
    if not PEER_NAME.fullmatch(body["worker_id"]):
        raise MalformedMessage(f"HELLO worker_id {body['worker_id'][:40]!r} is "
                               f"not a valid name ({PEER_NAME_RULE})")
    if not PEER_NAME.fullmatch(body["session"]):  # logged and shown by --status, like the name
        raise MalformedMessage(f"HELLO session {body['session'][:40]!r} is "
                               f"not a valid id ({PEER_NAME_RULE})")
    if not VERSION_TEXT.fullmatch(body["netrl_version"]):
        raise MalformedMessage(f"HELLO netrl_version {body['netrl_version'][:40]!r} is "
                               f"not a version number")
    for key in ("max_rows", "max_bytes"):
        if key in body and body[key] < 1:
            raise MalformedMessage(f"hello {key!r} is {body[key]}, not >= 1")


def _check_from_server(mtype: MsgType, body: dict[str, Any]) -> None:
    """The numbers a client acts on: intervals and delays it waits, and the
    server's message limit."""
    for key in ("heartbeat_interval_s", "retry_s"):
        if key in body and not 0 < body[key] <= MAX_SECONDS:
            raise MalformedMessage(f"{mtype.value} {key} {body[key]} is "
                                   f"not between 0 and {MAX_SECONDS:g} s")
    if not MIN_MESSAGE_BYTES <= body.get("max_message_bytes", MIN_MESSAGE_BYTES):
        # network.max_message_bytes has this minimum: below it, a worker would drop
        # every packet as too large
        raise MalformedMessage(f"welcome max_message_bytes {body['max_message_bytes']} is under "
                               f"{MIN_MESSAGE_BYTES}, the smallest network.max_message_bytes")


def printable(text: str, limit: int = 500) -> str:
    """``text`` from a peer (a REJECT's reason, say), fit for one log line: control characters and
    terminal escapes shown escaped, at most ``limit`` characters."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown if len(text) <= limit else f"{shown}... ({len(text) - limit} more characters)"


def check_role(role: str, msg: Message) -> None:
    """Raise :class:`RoleViolation` when ``role`` may not send ``msg.type``."""
    if msg.type not in ALLOWED_FROM.get(role, frozenset()):
        raise RoleViolation(f"a {role} may not send {msg.type.value} messages")
