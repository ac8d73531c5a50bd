"""What the trainer tells the server of each worker, shown by ``--status``; share refusals told to
their workers; the operator's ``--lift``, relayed to the trainer.

The trainer's PROGRESS carries, at most once a second, each worker's rows in its replay memory
against its share's cap, the packets and rows it refused over that share, and the workers it
quarantined (rows kept aside, and why). :class:`Standing` keeps the latest report for ``--status``.
A worker whose refusals rose since the last report is sent a NOTICE (cause ``replay_share``) naming
the cap and the key that sets it, with the packets and rows refused: one a report at most, however
many packets the worker sends (no amplification); the worker logs one line per spell of them.

``--lift NAME`` is a LIFT on the trainer port from a connection that said no HELLO (the authority
of ``--revoke``: :mod:`netrl.server.revocation`). Quarantine lives in the trainer, so the server
numbers the request (``ask``), hands it on, and passes the trainer's answer back to the operator;
without a trainer, or without its answer within :data:`LIFT_TIMEOUT_S`, the operator is told so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from netrl.protocol.messages import PEER_NAME, PEER_NAME_RULE, Message, MsgType, printable
from netrl.server.counters import ServerCounters
from netrl.server.peers import Peer, PeerTable
from netrl.util import worth_logging

__all__ = ["LIFT_TIMEOUT_S", "Standing"]

log = logging.getLogger(__name__)

LIFT_TIMEOUT_S = 10.0  # a trainer busy in a long training step answers between two of them
MAX_ASKS = 64  # lifts waiting for the trainer's answer at once
MAX_REPORTED = 1000  # workers kept from one report (the trainer sends at most as many)
_COUNT = 2**53


def _counts(value: Any, n: int) -> list[int] | None:
    """``value`` as ``n`` counts in [0, 2**53), or None."""
    if (not isinstance(value, list) or len(value) != n
            or not all(type(v) is int and 0 <= v < _COUNT for v in value)):
        return None
    return value


class Standing:
    """The trainer's latest report of its workers, and the lifts under way (module docstring).
    ``send(rid, msg)`` answers an operator's connection; ``tell(peer, msg)`` a connected peer."""

    def __init__(self, peers: PeerTable, stats: ServerCounters,
                 send: Callable[[bytes, Message], None],
                 tell: Callable[[Peer, Message], None]) -> None:
        self.peers, self.stats, self.send, self.tell = peers, stats, send, tell
        self.workers: dict[str, list[int]] = {}  # name -> [rows, cap, refused packets, rows]
        self.quarantined: dict[str, dict[str, Any]] = {}  # name -> {"rows", "reason"}
        self.reported_at: float | None = None
        self._seen: dict[str, list[int]] | None = None  # refusals already told (None: a new
                                                        # trainer's first report sets them)
        self._asks: dict[int, tuple[bytes, float, str]] = {}  # ask -> (operator, deadline, name)
        self._next_ask = 1
        self._bad_reports = 0

    # -- the trainer's report ----------------------------------------------------------------------
    def trainer_joined(self) -> None:
        """A trainer (re)connected: its counts restart from its checkpoint's, so its first report
        is taken as they stand, and refusals are told from the next one on."""
        self._seen = None

    def on_progress(self, body: dict[str, Any]) -> None:
        """Take the report fields off a PROGRESS ``body`` (the pacing reads its counts alone)."""
        workers, quarantined = body.pop("workers", None), body.pop("quarantined", None)
        if workers is None and quarantined is None:
            return
        bad = 0
        table: dict[str, list[int]] = {}
        for name, value in list((workers or {}).items())[:MAX_REPORTED]:
            counts = _counts(value, 4)
            if not (isinstance(name, str) and PEER_NAME.fullmatch(name)) or counts is None:
                bad += 1
                continue
            table[name] = counts
        held: dict[str, dict[str, Any]] = {}
        for name, value in list((quarantined or {}).items())[:MAX_REPORTED]:
            ok = (isinstance(value, list) and len(value) == 2 and _counts(value[:1], 1)
                  and isinstance(value[1], str))
            if not (isinstance(name, str) and PEER_NAME.fullmatch(name)) or not ok:
                bad += 1
                continue
            held[name] = {"rows": value[0], "reason": printable(value[1], 300)}
        if bad:
            self._bad_reports += 1
            self.stats.rejected += 1
            if worth_logging(self._bad_reports):
                log.warning("the trainer's report of its workers had %d malformed entries, "
                            "left out of --status (%d such reports)", bad, self._bad_reports)
        self.workers, self.quarantined, self.reported_at = table, held, time.time()
        self._tell_refusals(table)

    def _tell_refusals(self, table: dict[str, list[int]]) -> None:
        seen, self._seen = self._seen, {name: c[2:] for name, c in table.items()}
        if seen is None:
            return
        for name, (rows, cap, packets, refused) in table.items():
            before = seen.get(name, [0, 0])
            more_packets, more_rows = packets - before[0], refused - before[1]
            if more_packets <= 0:
                continue
            reason = (f"the trainer refused {more_packets} packet(s) ({more_rows} rows) of "
                      f"worker {name} since its last report, {packets} ({refused} rows) in all: "
                      f"they would take it over its share of the replay memory, {cap:,} rows "
                      f"(it holds {rows:,}). The trainer's memory.max_worker_share sets the "
                      f"share (0: an equal share of the workers storing lately, at least "
                      f"memory.min_worker_share): raise it there, or send fewer rows")
            notice = Message(MsgType.NOTICE, "server", body={
                "cause": "replay_share", "reason": reason, "packets": more_packets,
                "rows": max(0, more_rows)})
            for worker in self.peers.workers():
                if name in (worker.name, worker.key):
                    self.stats.share_notices += 1
                    self.tell(worker, notice)

    def describe(self) -> dict[str, Any]:
        """For ``--status``: each worker's rows in replay against its share, its refusals, and the
        workers quarantined (as of the trainer's latest report)."""
        return {"replay": {name: {"rows": c[0], "cap": c[1], "refused_packets": c[2],
                                  "refused_rows": c[3]} for name, c in self.workers.items()},
                "quarantined": dict(self.quarantined), "reported_at": self.reported_at}

    # -- --lift ------------------------------------------------------------------------------------
    def on_operator(self, rid: bytes, msg: Message) -> None:
        """A LIFT on the trainer port from a connection that said no HELLO: ``--lift``."""
        name = msg.body.get("worker", "")
        problem = None
        if not PEER_NAME.fullmatch(name):
            problem = f"lift 'worker' {name[:64]!r} is not a worker key or name ({PEER_NAME_RULE})"
        elif self.peers.trainer is None:
            problem = ("no trainer is connected: quarantine is kept by the trainer, so lift it "
                       "once the trainer runs (its checkpoint keeps who is quarantined)")
        elif len(self._asks) >= MAX_ASKS:
            problem = f"{MAX_ASKS} lifts already wait for the trainer's answer: try again later"
        if problem is not None:
            self.stats.rejected += 1
            log.warning("refused a LIFT from the operator: %s", problem)
            self.send(rid, Message(MsgType.LIFT, "server", body={
                "worker": name[:64], "reason": problem, "refused": True}))
            return
        ask, self._next_ask = self._next_ask, self._next_ask + 1
        self._asks[ask] = (rid, time.monotonic() + LIFT_TIMEOUT_S, name)
        self.stats.lifts += 1
        body: dict[str, Any] = {"worker": name, "ask": ask}
        if msg.body.get("reason"):
            body["reason"] = printable(msg.body["reason"], 300)
        log.info("the operator asks the trainer to lift worker %s's quarantine", name)
        assert self.peers.trainer is not None
        self.tell(self.peers.trainer, Message(MsgType.LIFT, "server", body=body))

    def on_trainer(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """The trainer's answer to a LIFT: to the operator who asked."""
        asked = self._asks.pop(msg.body.get("ask", -1), None)
        if asked is None:  # the operator was told it timed out
            log.info("the trainer answered a lift of %s too late: %s", msg.body.get("worker"),
                     printable(msg.body.get("reason", ""), 300))
            return
        body = {k: v for k, v in msg.body.items() if k != "ask"}
        log.warning("lift of worker %s: %s", asked[2], printable(body.get("reason", ""), 300))
        self.send(asked[0], Message(MsgType.LIFT, "server", body=body))

    def expire(self, now: float) -> None:
        """Tell the operators whose lift the trainer has not answered in time."""
        for ask in [a for a, (_, deadline, _) in self._asks.items() if now >= deadline]:
            rid, _, name = self._asks.pop(ask)
            self.send(rid, Message(MsgType.LIFT, "server", body={
                "worker": name, "refused": True,
                "reason": f"the trainer did not answer within {LIFT_TIMEOUT_S:.0f} s (it may "
                          f"have left, or be stuck in a long step): ask again"}))
