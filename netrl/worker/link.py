"""The worker's network thread: sample packets out (kept until acknowledged), weights and pacing in.

It never touches the env or the policy: the control path hands it encoded packets through an inproc
pipe (:meth:`~netrl.worker.backlog.BacklogThread.hand_over`, as PACKET commands), and weights are
passed to a callback that loads them off the control path. It needs no torch, so benchmarks and
tools can drive the real delivery path with synthetic packets. The packets' side, the backlog, is
:mod:`netrl.worker.backlog`'s; this module adds what comes in beside the acks (weights, the
collection they announce, the trainer's pace), the heartbeats' counters and the status line.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from netrl.config.sections import NetworkConfig
from netrl.monitor.status import StatusClock
from netrl.net.keys import ClientKeys
from netrl.protocol.messages import Message, MsgType, printable
from netrl.protocol.wire import encode
from netrl.util import version_label, worth_logging
from netrl.worker.announcement import check_announcement
from netrl.worker.backlog import BacklogThread

__all__ = ["WorkerLink"]

log = logging.getLogger(__name__)

# Replay-share NOTICEs this far apart are two spells of refusals, each logged once: the trainer
# reports once a second, so a worker refused steadily gets one line, not one a second.
SHARE_SPELL_GAP_S = 30.0


class WorkerLink(BacklogThread):
    """The worker's network thread: packets out, weights and pace in.

    Packets follow the backlog's rules (:class:`~netrl.worker.backlog.BacklogThread`: kept until
    acknowledged, sent within a window, held, resent or dropped as the server answers). Each weight
    part goes to ``on_weights`` on this thread, and each whole version is acknowledged, in order; a
    PACE raises the allowance :meth:`wait_for_pace` holds the control path to. Heartbeats carry
    the counters, and the status line logs them every ``status_interval_s``.
    """

    def __init__(self, network: NetworkConfig, worker_id: str, session: str, port: int,
                 keys: ClientKeys | None, max_backlog_bytes: int, send_window_bytes: int,
                 produced: Callable[[], int] | None = None,
                 on_weights: Callable[[Message], dict[str, Any]] | None = None,
                 status_interval_s: float = 0.0,
                 last_return: Callable[[], float | None] | None = None,
                 weight_ack: Callable[[Message], dict[str, Any] | None] | None = None) -> None:
        super().__init__(network, worker_id, session, port, keys, max_backlog_bytes,
                         send_window_bytes)
        self.produced = produced or (lambda: 0)
        self.on_weights = on_weights  # called on this thread; returns counters to
                                      # report in heartbeats
        self.weight_ack = weight_ack  # the ACK body of a version whose last part arrived
                                      # (None: no ACK)
        self.last_return = last_return or (lambda: None)
        self.num_envs = 1  # the worker's envs: the status line's steps/s are their sum
        self._status = StatusClock(status_interval_s, {"produced": 0})
        # ACK bodies of the versions received that the link has not taken yet, in order: the server
        # pipelines deltas and expects an ACK of each, in the order it sent them (at most a few per
        # model: it sends no more without them)
        self.weights_acks: collections.deque[dict[str, Any]] = collections.deque()
        self._told_flushing = False  # the server knows, on this connection, that this
                                     # worker is stopping
        self.weight_stats: dict[str, Any] = {}
        # the trainer's collection announcement, from the newest weights
        # (netrl.worker.runners.sync); None: none heard
        self.collect: dict[str, Any] | None = None
        self.sync_stats: dict[str, Any] = {}  # the control path's waits for weights in sync mode
        self.allowance = 0
        self.pace_cond = threading.Condition()
        self.paced = False  # True once the server sent a PACE
        self.trainer_samples: int | None = None  # what the trainer held at the newest PACE (see
                                                 # also server_stats)
        self.waiting_for_pace = False  # set by the control path while it waits for a
                                       # larger allowance
        self.link.heartbeat_body = self._heartbeat_stats
        self._share_notice_at = -SHARE_SPELL_GAP_S  # the last replay-share NOTICE (monotonic)

    def wait_for_pace(self, produced: Callable[[], int], stop: threading.Event,
                      send: Callable[[], None], check: Callable[[], None], rows: int = 1) -> None:
        """Block the control path until the trainer's PACE allows the ``rows`` samples of the next
        step beyond those ``produced``: ``send`` first (the trainer may be waiting for exactly
        these rows), then ``check`` the network as it waits. A step is never taken in part, so a
        vector step waits for room for every env's row: the server holds back any sample beyond
        the allowance, and such a backlog reaches the trainer stale."""
        if produced() + rows <= self.allowance:
            return
        send()
        waited = time.monotonic()
        self.waiting_for_pace = True  # the status line says why the worker makes no steps
        try:
            with self.pace_cond:
                while produced() + rows > self.allowance and not stop.is_set():
                    self.pace_cond.wait(0.05)
                    if time.monotonic() - waited > 10 and not self.paced:
                        log.info("worker %s is waiting for the trainer to "
                                 "ask for samples (worker.throttle is on)",
                                 self.worker_id)
                        waited = time.monotonic()
                    check()
        finally:
            self.waiting_for_pace = False

    def _heartbeat_stats(self) -> dict[str, Any]:
        return {"stats": {"produced": self.produced(), "backlog_packets": len(self.backlog),
                          "backlog_bytes": self.backlog_bytes, "held_packets": len(self.held),
                          **self.weight_stats, **self.sync_stats, **self.dropped()}}

    def on_ready(self) -> None:
        """(Re)connected: the backlog goes again, and no weights ACK is owed any more."""
        self._told_flushing = False
        self.weights_acks.clear()  # the server's new session for this worker waits for no ACK
        super().on_ready()

    def _ack_weights(self) -> None:
        """Acknowledge each version received, in order. The server sends this worker few more
        versions of a model until it has the ACKs, so those the link refuses (its queue full of
        packets) are kept and sent again at every tick."""
        while self.weights_acks:
            ack = Message(MsgType.ACK, self.worker_id, body=self.weights_acks[0])
            if not self.link.send(encode(ack)):
                return
            self.weights_acks.popleft()

    def on_tick(self) -> None:
        self._ack_weights()
        self._status_line()
        if self.flushing.is_set() and self.link.ready and not self._told_flushing:
            # the server then spools this worker's packets at once and says so, rather than
            # hold them for the trainer
            body = {**self._heartbeat_stats(), "flushing": True}
            self._told_flushing = self.link.send(
                encode(Message(MsgType.HEARTBEAT, self.worker_id, body=body)))
        super().on_tick()

    def _status_line(self) -> None:
        if not self._status.due():
            return
        rates = self._status.rates({"produced": self.produced()})
        assert rates is not None  # the clock started with the link
        ret = self.last_return()
        log.info("status | worker %s | %.0f steps/s%s | weights %s | server %s | "
                 "backlog %d packets (%.1f MiB) | acked %d, dropped %d samples | last return %s%s",
                 self.worker_id, rates["produced"],
                 f" over {self.num_envs} envs" if self.num_envs > 1 else "",
                 version_label(self.weight_stats.get("version")), self.link.state(),
                 len(self.backlog), self.backlog_bytes / 2**20, self.counts["acked_samples"],
                 self.dropped()["dropped_samples"], "-" if ret is None else f"{ret:.1f}",
                 self._waiting() if self.waiting_for_pace else self._sync_line())
        if self.held:
            log.warning("status | worker %s | %d packets (%d samples) held: the server "
                        "refuses them for the trainer's sample layout (%s); they "
                        "are sent again once a trainer with their layout connects",
                        self.worker_id, len(self.held),
                        sum(self.backlog[s].steps for s in self.held), self.last_held_reason)
        if self.counts["share_refused_packets"]:
            log.warning("status | worker %s | %d packets (%d rows) refused by the trainer over "
                        "this worker's share of its replay memory, in %d spell(s)",
                        self.worker_id, self.counts["share_refused_packets"],
                        self.counts["share_refused_rows"], self.counts["share_refusal_spells"])
        # e.g. a packet beyond the spaces' bounds: refused for good
        if self.counts["rejected_samples"]:
            log.warning("status | worker %s | %d samples REJECTED in all, the newest because: %s",
                        self.worker_id,
                        self.counts["rejected_samples"], self.last_rejection)

    def _sync_line(self) -> str:
        if not self.sync_stats:
            return ""
        return (f" | sync: {self.sync_stats['fragments']} fragments, "
                f"{self.sync_stats['worker_wait_s']:.1f} s waiting for "
                f"weights (last wait {self.sync_stats['last_wait_s']:.2f} s)")

    def _waiting(self) -> str:
        """Why a throttled worker makes no steps, as far as the server's heartbeats tell."""
        if self.link.ready and self.link.server_stats.get("trainer_connected") == 0:
            return (" | waiting for the trainer to ask for samples (worker.throttle): no "
                    "trainer is connected to the server (it finished, or has not started)")
        return " | waiting for the trainer to ask for samples (worker.throttle)"

    # -- messages in besides ACK and NACK ----------------------------------------------------------
    def on_other_message(self, msg: Message) -> None:
        if msg.type is MsgType.WEIGHTS:
            self._collect(msg)
            if self.on_weights is not None:
                self.weight_stats = self.on_weights(msg)
            # the whole version arrived: the server may send the next
            if msg.body["part"] == msg.body["parts"] - 1:
                model = msg.body.get("model", "policy")
                ack = (self.weight_ack(msg) if self.weight_ack is not None else
                       {"seqs": [msg.policy_version], "model": model,
                        "format": msg.body.get("format", "float32")})
                if ack is not None:
                    self.weights_acks.append(ack)
                self._ack_weights()
        elif msg.type is MsgType.PACE:
            with self.pace_cond:
                self.allowance = max(self.allowance, msg.body["allowance"])
                self.trainer_samples = msg.body.get("trainer_samples", self.trainer_samples)
                self.paced = True
                self.pace_cond.notify_all()
        elif msg.type is MsgType.NOTICE and msg.body["cause"] == "replay_share":
            self._share_refused(msg.body)
        elif msg.type is MsgType.NOTICE:  # the server refused one of its messages: why
            self.counts["refused_notices"] += 1
            if worth_logging(self.counts["refused_notices"]):
                log.warning("worker %s: the server refused a message of this worker: %s (%d so "
                            "far)", self.worker_id, printable(msg.body["reason"]),
                            self.counts["refused_notices"])
        else:
            super().on_other_message(msg)

    def _share_refused(self, body: dict[str, Any]) -> None:
        """The trainer refused packets of this worker over its share of the replay memory (the
        server tells it at most once a trainer report): counted, and logged once per spell, a
        first notice or one after :data:`SHARE_SPELL_GAP_S` without any, not per packet."""
        now = time.monotonic()
        self.counts["share_refused_packets"] += body.get("packets", 0)
        self.counts["share_refused_rows"] += body.get("rows", 0)
        if now - self._share_notice_at > SHARE_SPELL_GAP_S:
            self.counts["share_refusal_spells"] += 1
            log.warning("worker %s: %s (logged once per spell of such refusals; the status line "
                        "counts them)", self.worker_id, printable(body["reason"]))
        self._share_notice_at = now

    def _collect(self, msg: Message) -> None:
        """Take the collection mode a version announces (``collect`` in its WEIGHTS body)."""
        if "collect" not in msg.body:
            return
        collect = msg.body["collect"]
        problem = check_announcement(collect)
        if problem is not None:
            self.counts["bad_announcements"] += 1
            if worth_logging(self.counts["bad_announcements"]):
                log.error("weights v%d announce a collection this worker cannot follow "
                          "(%s); it keeps collecting as before. Run the same netrl "
                          "version on the trainer and the workers", msg.policy_version,
                          problem)
            return
        if collect != self.collect:
            log.info("worker %s: the trainer collects %s", self.worker_id,
                     "asynchronously" if collect["mode"] == "async" else
                     f"synchronously: {collect['fragment']} steps per env under each weight "
                     f"version ({collect['batch_mode']}), then a wait for the next version")
            self.collect = dict(collect)
