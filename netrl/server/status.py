"""The server's account of itself: the snapshot that ``python -m netrl --status`` shows,
the status line it logs, and its last line, which says where every sample it took is.

:class:`ServerStatus` reads the server's parts (peers, weights cache, relay, counters) and changes
none of them but the count of rejected messages. The server's loop calls :meth:`ServerStatus.answer`
when a ``--status`` request waits, and :meth:`ServerStatus.tick` on every pass: once a second it
samples the sample rates, and every ``status_interval_s`` it logs one :func:`status_line`
while any peer is connected.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from netrl.errors import ProtocolError
from netrl.monitor.status import Rates
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import MAX_HEADER_BYTES, decode, encode
from netrl.server.counters import ServerCounters
from netrl.server.intake import SampleIntake
from netrl.server.peers import Peer, PeerTable
from netrl.server.sockets import ServerSockets
from netrl.server.weight_cache import WeightCache
from netrl.util import count_of, version_label

__all__ = ["ServerStatus", "answer_status", "status_line"]

log = logging.getLogger(__name__)


STATUS_LINE_WORKERS = 10  # workers the server's status line names


def status_line(s: dict[str, Any]) -> str:
    """The server's periodic one-line summary of a snapshot."""
    rates = s.get("rates", {})
    shown = s["workers"][:STATUS_LINE_WORKERS]  # a line, even with a thousand workers
    versions = " ".join(f"{w['name']}:{version_label(w['version'])}" for w in shown)
    if len(s["workers"]) > len(shown):
        versions += f" and {len(s['workers']) - len(shown):,} more (--status lists them)"
    return (f"status | {count_of(len(s['workers']), 'worker')} [{versions or '-'}] | trainer "
            f"{'connected' if s['trainer'] else 'absent'} | in {rates.get('samples_in', 0):.0f}/s "
            f"out {rates.get('samples_out', 0):.0f}/s | queued {s.get('queued_samples', 0)} | "
            f"spool {s.get('spool', {}).get('samples', 0)} | "
            f"held {s.get('held', {}).get('samples', 0)} | rejected {s['rejected']}")


def answer_status(sock: zmq.Socket, snapshot: Callable[[], dict[str, Any]]) -> bool:
    """Answer one STATUS request waiting on the server's REP socket; False if
    the request was malformed.

    A snapshot that cannot be built or encoded (a bug) is logged and answered
    with ``{"error": ...}``: a REP socket that leaves a request unanswered can
    never answer another one."""
    try:
        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return True
    request: Message | None = None
    try:
        request = decode(frames, 1 << 16)
    except ProtocolError as exc:
        log.warning("rejected a status request: %s", exc)
    try:
        body = {"snapshot": snapshot()} if request is not None and request.type is MsgType.STATUS else {}
        reply = encode(Message(MsgType.STATUS, "server", body=body))
        listed = body["snapshot"]["workers"] if body else []
        keep = len(listed)
        # thousands of workers: list as many as a header takes
        while len(reply[0]) > MAX_HEADER_BYTES and keep:
            keep //= 2
            body["snapshot"] = {**body["snapshot"], "workers": listed[:keep], "workers_omitted": len(listed) - keep}
            reply = encode(Message(MsgType.STATUS, "server", body=body))
    # (the status port is loopback-only and asked by hand: no flood to fear here)
    except Exception as exc:
        log.exception("could not answer a status request")
        reply = encode(Message(MsgType.STATUS, "server", body={"snapshot": {"error": repr(exc)[:300]}}))
    sock.send_multipart(reply)
    return request is not None


class ServerStatus:
    """Connected peers, rates, queues and counters of one server session. ``intake`` supplies the
    trainer's progress and the relay."""

    def __init__(self, session: str, peers: PeerTable, weights: WeightCache, intake: SampleIntake,
                 sockets: ServerSockets, stats: ServerCounters, interval_s: float) -> None:
        self.session, self.peers, self.weights, self.intake = session, peers, weights, intake
        self.sockets, self.stats = sockets, stats
        self.interval = interval_s
        self.rates = Rates()
        self.started = time.time()
        self._next_tick = self._next_status_line = 0.0
        # samples dropped by workers that left, by session (its last report), so
        # that the total never falls
        self._departed: dict[str, int] = {}
        self._departed_folded = 0  # those of the sessions forgotten beyond MAX_DEPARTED
        # more of the snapshot, from parts made after this one (revocations, the trainer's report)
        self.extra: list[Callable[[], dict[str, Any]]] = []

    MAX_DEPARTED = 10_000

    def worker_left(self, peer: Peer) -> None:
        dropped = int(peer.reported.get("dropped_samples", 0))
        if dropped:
            self._departed[peer.session] = dropped
            if len(self._departed) > self.MAX_DEPARTED:
                self._departed_folded += self._departed.pop(next(iter(self._departed)))

    def worker_joined(self, peer: Peer) -> None:
        """A worker (re)connected: its own reports count its session's drops again."""
        self._departed.pop(peer.session, None)

    def snapshot(self) -> dict[str, Any]:
        """Connected peers, rates, queues and counters (what ``--status`` shows)."""
        workers = [p.describe() for p in self.peers.workers()]
        relay = self.intake.relay
        for w in workers:  # its packets in the spool, against its share (netrl.server.relay)
            w["spooled_bytes"] = relay.spool.by_worker.get(w["name"], 0)
        by_workers = sum(int(w["reported"].get("dropped_samples", 0)) for w in workers)
        by_workers += sum(self._departed.values()) + self._departed_folded  # those gone count too
        return {
            "session": self.session, "uptime_s": time.time() - self.started, "ports": dict(self.sockets.ports),
            "workers": workers,
            "trainer": self.peers.trainer.describe() if self.peers.trainer else None,
            "progress": self.intake.progress,
            "weights_version": self.weights.complete_version,
            # per model: its newest version, formats and deltas cached
            "models": self.weights.describe(),
            "rates": self.rates.rates(),
            **relay.snapshot(),
            "rejected": self.stats.rejected, "refused": self.stats.samples_refused,
            "unknown_keys": dict(auth.ring.refused) if (auth := self.sockets.auth) else {},
            "failed_handshakes": {"trainer": self.stats.failed_handshakes_trainer,
                                  "worker": self.stats.failed_handshakes_worker},
            "dropped": by_workers,  # refused samples are not lost: their workers resend them
            "stats": self.stats.as_dict(),  # every counter, at 0 until it counts: no key a script
                                            # reads goes missing
            **{k: v for part in self.extra for k, v in part().items()},
        }

    def stop_line(self) -> str:
        """The server's last line: where each sample it took is (delivered, spooled, held for
        another layout, still in memory, or lost, and why)."""
        relay, stats = self.intake.relay, self.stats
        spool, held = relay.spool, relay.hold
        memory = relay.queued_steps + relay.inflight_steps - relay.inflight_spooled
        layouts = count_of(len(held.stores), "layout")
        return (f"server stopped: {stats.samples_out} samples delivered to the trainer; "
                f"{spool.steps} spooled for it ({spool.packets} packets); {held.steps} held for "
                f"another sample layout ({held.packets} packets in {layouts}, in {held.dir}: sent "
                f"when a trainer with theirs connects); {memory} in memory (their workers still "
                f"have them); {stats.samples_trainer_rejected} refused by the trainer's checks (its "
                f"log says why); lost: {stats.samples_held_lost} refused for their layout that the "
                f"held folder could not keep, {stats.samples_dropped} spooled over the trainer's "
                f"message limit (the log says which); {stats.samples_spooled} samples spooled in "
                f"all, {stats.rejected} messages rejected, {stats.samples_refused} sample refusals "
                f"while the spool was full or failing (workers keep refused samples and resend "
                f"them, so one can be refused again)")

    def answer(self, sock: zmq.Socket) -> None:
        """Answer one ``--status`` request waiting on ``sock`` (a malformed one is
        counted as rejected)."""
        if not answer_status(sock, self.snapshot):
            self.stats.rejected += 1

    def tick(self, now: float) -> None:
        """Once a second: sample the rates; every ``status_interval_s``: one status line."""
        if now < self._next_tick:
            return
        self._next_tick = now + 1.0
        self.rates.record({"samples_in": self.stats.samples_in, "samples_out": self.stats.samples_out}, now)
        if self.interval and now >= self._next_status_line:
            self._next_status_line = now + self.interval
            if self._next_status_line - self.interval > 0 and self.peers:
                log.info("%s", status_line(self.snapshot()))
