"""Server: relays sample packets from workers to the trainer and weights from
the trainer to every worker.

One thread, one poll loop over two ROUTER sockets (``trainer_port``, ``worker_port``) and a
loopback-only status socket (opened and secured by :class:`~netrl.server.sockets.ServerSockets`)::

    worker --SAMPLES--> [checks] --> SampleRelay (memory queue / disk spool) --BUNDLE--> trainer
    worker <--ACK------------------- SampleRelay <--ACK-------------------------------- trainer
    worker <--WEIGHTS parts--------- newest-weights cache <--WEIGHTS parts------------- trainer

The server authenticates peers (CURVE keys per port), checks every message against its
sender's role and every sample packet against the trainer's schema (compressed images are
relayed without decompressing them: the trainer checks their contents), and hands packets to
:class:`~netrl.server.relay.SampleRelay`, which decides where each waits and when its worker is
acknowledged. The newest weights are cached (:class:`~netrl.server.weight_cache.WeightCache`)
and streamed to a worker the moment it says HELLO, part by part as they arrive. The trainer's
PROGRESS becomes a PACE allowance per worker. :class:`~netrl.server.admission.Admission`
checks each HELLO, and counts (``stats.rejected``), logs and drops bad messages.
:class:`~netrl.server.intake.SampleIntake` checks sample packets and sets each worker's window and
PACE; :class:`~netrl.server.status.ServerStatus` answers ``--status`` and logs the status line.
Every part counts what it does in the server's one :class:`~netrl.server.counters.ServerCounters`,
which declares each counter.

Peers come and go through :class:`~netrl.server.membership.Membership`: the WELCOME, the heartbeats,
and the peers forgotten after a BYE, a silence or a failed send. This module keeps the loop, what
each message type is handed to, and the messages the server handles itself (acknowledgements,
credit, weight parts).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import zmq

from netrl.config.sections import Config, NetworkConfig
from netrl.errors import NetrlError, ProtocolError, VersionMismatch
from netrl.lifecycle.runs import Runs, ctrl_c_stops
from netrl.lifecycle.tmrl_args import SERVER_ONLY, is_count, tmrl_arguments
from netrl.net.keys import ServerKeys, server_keys
from netrl.net.transport import new_session
from netrl.protocol.messages import Message, MsgType, check_role
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import PacketTooLarge, decode, frames_nbytes
from netrl.server.admission import Admission
from netrl.server.counters import ServerCounters
from netrl.server.intake import SampleIntake
from netrl.server.membership import Membership
from netrl.server.outbound import Outbound
from netrl.server.peers import Peer, PeerTable
from netrl.server.relay import MAX_BUNDLES_PER_PASS, SampleRelay
from netrl.server.revocation import Revocations
from netrl.server.sockets import ServerSockets
from netrl.server.spool import Spool
from netrl.server.standing import Standing
from netrl.server.status import ServerStatus
from netrl.server.weight_cache import LoggedProblem, WeightCache
from netrl.storage.folderlock import FolderLock

__all__ = ["Server"]

log = logging.getLogger(__name__)


class Server:
    """The central relay. Construct (no I/O), then ``run(stop)``; ``close()`` is idempotent.

    Args:
        min_samples_per_server_packet: samples bundled before sending to the trainer (tmrl's name).
        bind_ip: interface to bind; 127.0.0.1 by default.
        trainer_port, worker_port: the two ports (tmrl's defaults 55555 and 55556).
        network: heartbeat, size and reconnect settings.
        max_bundle_bytes: beyond ``min_samples_per_server_packet``, a bundle takes the packets
            already waiting up to this size.
        max_packet_delay_s: a bundle is sent after this long even if it has fewer samples.
        max_queue_bytes: sample data held in memory (queued or in flight to the
            trainer) before spooling.
        spool_after_s: a queued packet the trainer has not taken after this
            long is moved to the spool.
        spool_dir, spool_max_bytes, fsync: the disk spool.
        keys: the server's CURVE keypair and allow-lists; None runs
            unencrypted (``"security": "none"``).
        status_port: loopback port answering ``python -m netrl --status`` (None: no status port).
        status_interval_s: seconds between status log lines (0: none).
        max_weights_bytes: the largest weight version cached and relayed.
        max_workers: workers connected at once; a new one beyond it is refused.
        max_rows_per_packet: rows a sample packet may hold, whatever its worker declares.
        unpaced_workers: the worker keys (without CURVE, names) exempt from PACE: real-time
            workers whose env cannot wait; a HELLO saying ``paced`` false is honoured for these
            alone.
    """

    @tmrl_arguments("Server", ("port", "password"), SERVER_ONLY,
                    "tmrl's Server takes its port and password there; netrl takes "
                    "trainer_port=... and worker_port=..., and CURVE keys as keys=...", {
                        "min_samples_per_server_packet": (is_count, "an integer")})
    def __init__(self, min_samples_per_server_packet: int = 200, *, bind_ip: str = "127.0.0.1",
                 trainer_port: int = 55555, worker_port: int = 55556, network: NetworkConfig | None = None,
                 max_bundle_bytes: int = 4 << 20, max_packet_delay_s: float = 0.05, max_queue_bytes: int = 64 << 20,
                 spool_after_s: float = 2.0, spool_dir: str | Path = "weights/server-spool",
                 spool_max_bytes: int = 1 << 30, fsync: bool = False, keys: ServerKeys | None = None,
                 status_port: int | None = None, status_interval_s: float = 10.0,
                 max_weights_bytes: int = 1 << 30, max_workers: int = 1000,
                 max_rows_per_packet: int = 65_536, unpaced_workers: Collection[str] = ()) -> None:
        self.bind_ip = bind_ip
        self.trainer_port = trainer_port
        self.worker_port = worker_port
        self.net = network or NetworkConfig()
        self.spool_dir = spool_dir
        self._next_internal_error_log = 0.0
        self.sockets = ServerSockets(self.net, bind_ip, trainer_port, worker_port, keys, status_port)
        self.session = new_session()
        self.peers = PeerTable()
        self.weights = WeightCache(max_weights_bytes)
        self.stats = ServerCounters()
        self._opened = self._listening = False
        self._runs = Runs(lambda: NetrlError(f"this Server (worker port {self.worker_port}) is "
                                             f"closed: its ports and spool folder are "
                                             f"released; create a new Server to serve again"),
                          lambda runner: NetrlError(f"this Server is already running (run() "
                                                    f"was called in {runner.name}): call "
                                                    f"run() once; a second server needs "
                                                    f"other ports and another spool folder"))
        self._lock = FolderLock(spool_dir, "spool folder",
                                "two servers would interleave its packets; stop "
                                "that one first, or give this server another "
                                "spool folder (config.json: server.spool_dir)")
        # (the two callbacks reach self.members, made below from these parts among others)
        self.admission = Admission(self.net, self.sockets, self.peers, self.stats,
                                   lambda peer: self.members.forget(peer), max_workers, max_rows_per_packet,
                                   unpaced_workers)
        self.out = Outbound(self.sockets, self.stats, self.weights,
                            lambda peer, why: self.members.lost_on_send(peer, why))
        self.spool = Spool(spool_dir, spool_max_bytes, fsync)
        self.relay = SampleRelay(self.spool, min_samples_per_server_packet, max_bundle_bytes,
                                 self.net.max_message_bytes, max_packet_delay_s, max_queue_bytes, spool_after_s,
                                 self.stats, self._send_to_trainer, self._tell_worker,
                                 lambda: [w.name for w in self.peers.workers()])
        self.intake = SampleIntake(self.net, max_queue_bytes, Path(spool_dir) / "schema.json", self.peers,
                                   self.admission, self.relay, self.stats, self.out.must_send, max_rows_per_packet)
        self.status = ServerStatus(self.session, self.peers, self.weights, self.intake, self.sockets, self.stats,
                                   status_interval_s)
        self.members = Membership(self.net, self.session, self.sockets, self.peers, self.stats, self.admission,
                                  self.out, self.weights, self.intake, self.relay, self.status)
        self.revocations = Revocations(spool_dir, self.peers, self.stats, self.admission,
                                       lambda peer: self.members.forget(peer), self._tell_trainer)
        self.admission.revoked = self.revocations.refusal
        self.standing = Standing(self.peers, self.stats,
                                 lambda rid, msg: self.admission.send("trainer", rid, msg),
                                 self.out.must_send)  # the trainer's report, --lift
        self.status.extra += [lambda: {"revoked": self.revocations.describe()},
                              self.standing.describe]
        # what the server does with each message a peer may send it after HELLO
        # (check_role has let it through)
        self.handlers: dict[MsgType, Callable[[Peer, Message, list[Any]], None]] = {
            MsgType.SAMPLES: self.intake.on_samples, MsgType.HEARTBEAT: self._heartbeat,
            MsgType.SCHEMA: self.intake.on_schema, MsgType.PROGRESS: self._progress,
            MsgType.ACK: self._take_acks, MsgType.CREDIT: self._add_credit, MsgType.WEIGHTS: self._cache_weights,
            MsgType.BYE: self.members.on_bye, MsgType.REVOKE: self.revocations.on_trainer,
            MsgType.LIFT: self.standing.on_trainer}

    @classmethod
    def from_config(cls, cfg: Config) -> Server:
        s = cfg.server
        spool_dir = cfg.server_spool_dir
        keys = server_keys(cfg.keys_dir) if cfg.security == "curve" else None
        return cls(s.min_samples_per_server_packet, bind_ip=s.bind_ip, trainer_port=cfg.network.trainer_port,
                   worker_port=cfg.network.worker_port, network=cfg.network, max_bundle_bytes=s.max_bundle_bytes,
                   max_packet_delay_s=s.max_packet_delay_s, max_queue_bytes=s.max_queue_bytes,
                   spool_after_s=s.spool_after_s, spool_dir=spool_dir, spool_max_bytes=s.spool_max_bytes,
                   fsync=s.fsync, keys=keys, status_port=s.status_port, status_interval_s=cfg.status_interval_s,
                   max_weights_bytes=s.max_weights_bytes, max_workers=s.max_workers,
                   max_rows_per_packet=s.max_rows_per_packet, unpaced_workers=s.unpaced_workers)

    # -- lifecycle ---------------------------------------------------------------------------------
    def open(self) -> None:
        """Open the spool and bind both ports (TransportError names the config key to change). Does
        nothing on an open server; raises NetrlError on a closed one."""
        self._runs.check_open()
        if self._opened:
            return
        self._lock.acquire()
        try:
            self.spool.open()
            self.relay.hold.open()
        except BaseException:
            self._lock.release()
            raise
        self.intake.open()
        self.revocations.open()
        self._opened = True
        self.sockets.open(connections=self.admission.max_workers + 1)  # and the trainer
        self._listening = True
        keys = self.sockets.keys
        log.info("server listening on %s (trainer port %d, "
                 "worker port %d), %s, session %s, spool %s",
                 self.bind_ip, self.trainer_port, self.worker_port,
                 f"CURVE keys from {keys.allow_dir}" if keys else "UNENCRYPTED", self.session[:8], self.spool_dir)

    def run(self, stop: threading.Event) -> None:
        """Relay until ``stop`` is set, then close: a server runs once (a closed
        one raises NetrlError)."""
        run_stop = self._runs.enter(stop)
        try:
            with ctrl_c_stops(run_stop, "server"):  # the spool flushed on the way out too (close)
                try:
                    self._serve(run_stop)
                finally:
                    self.close()
        finally:
            self._runs.leave()

    def _serve(self, stop: threading.Event) -> None:
        """run()'s poll loop: only its thread uses the sockets until it closes them."""
        self.open()
        poller = zmq.Poller()
        socks, status, monitors = self.sockets.by_role, self.sockets.status, self.sockets.monitors
        for sock in [*socks.values(), *monitors.values()]:
            poller.register(sock, zmq.POLLIN)
        if status is not None:
            poller.register(status, zmq.POLLIN)
        while not stop.is_set():
            events = dict(poller.poll(self._poll_timeout_ms()))
            for role, sock in socks.items():
                if sock in events:
                    self._drain(role, sock)
                if monitors[role] in events:
                    self.admission.failed_handshakes(role)
            now = time.monotonic()
            if status is not None and status in events:
                # --status must never stop the relay
                self._guarded(lambda: self.status.answer(status), now)
            self._housekeeping(now)
            if self.members.gone:
                self._forget_gone()

    def _housekeeping(self, now: float) -> None:
        """Bundles out, stale packets to disk, heartbeats and the status tick, once
        per pass of the loop."""
        relay, trainer = self.relay, self.peers.trainer is not None
        steps: list[Callable[[], None]] = [self.out.retry, lambda: relay.flush(now, trainer, MAX_BUNDLES_PER_PASS),
                                           lambda: relay.spool_stale(now, trainer), self.intake.after_joins,
                                           lambda: self.members.heartbeats(now), lambda: self.status.tick(now),
                                           lambda: self.standing.expire(now)]
        for step in steps:
            self._guarded(step, now)

    def _forget_gone(self) -> None:
        """The loop's last step: the peers a send found gone are forgotten, after their port is read
        once more (a BYE waiting there is a clean stop)."""
        self.members.forget_gone(lambda role: self._drain(role, self.sockets.by_role[role]))

    def _guarded(self, step: Callable[[], None], now: float) -> None:
        try:
            step()
        # as in _drain: a bug must not take the relay down, nor flood the log every pass
        except Exception:
            self.stats.internal_errors += 1
            if now >= self._next_internal_error_log:
                self._next_internal_error_log = now + 60.0
                log.exception("internal error in the server's loop (%d so far; the next one is "
                              "logged a minute later at the earliest)", self.stats.internal_errors)

    def close(self) -> None:
        """Say BYE to every peer, close the spool and release the sockets. Idempotent. Called from
        another thread while :meth:`run` runs, it stops the loop as ``stop`` would and waits for
        run() to close (ZeroMQ sockets must not be closed under the thread that polls them)."""
        if self._runs.close() or not self._runs.shut_once():
            return
        for peer in self.peers.values():
            self.out.send(peer, Message(MsgType.BYE, "server", body={"reason": "server shutting down"}))
        self.sockets.close()
        try:
            self.spool.close()
            self.relay.hold.close()
        # the packets on disk stay; at worst some are sent again after a restart
        except OSError as exc:
            log.error("could not close the spool in %s cleanly: %s", self.spool_dir, exc)
        self._lock.release()
        # it never served (a port in use, a spool folder in use): the error says it all
        if not self._listening:
            return
        log.info("%s", self.status.stop_line())

    # -- receiving ---------------------------------------------------------------------------------
    # The stop event is seen only between polls (a SIGINT does not end one): waiting
    # heartbeat_interval_s / 2 alone would make an idle server with 60 s heartbeats
    # take up to 30 s to obey Ctrl+C. 0.25 s is the default interval's.
    MAX_POLL_S = 0.25

    def _poll_timeout_ms(self) -> int:
        timeout = min(self.net.heartbeat_interval_s / 2, self.MAX_POLL_S)
        deadline = self.relay.next_deadline(self.peers.trainer is not None)
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - time.monotonic()))
        if self.relay.cut_short:  # bundles left to build, one per pass
            return 0
        if self.out.waiting():  # a peer's queue was full: try again soon
            timeout = min(timeout, 0.01)
        return max(1, int(timeout * 1000))

    def _drain(self, role: str, sock: zmq.Socket, budget: int = 32) -> None:
        # A few messages per pass, so that a burst from many workers never holds up bundles to
        # the trainer: with a budget of 1,000, 16 workers filling their windows keep the server
        # accepting for seconds while it sends the trainer 8 bundles per pass (measured: 3,000
        # samples/s instead of 700,000).
        for _ in range(budget):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                self._receive(role, frames)
            # a bug must not take the relay down: log it loudly, count it, carry on
            except Exception:
                self.stats.internal_errors += 1
                log.exception("internal error while handling a message on the %s port", role)

    def _receive(self, role: str, frames: list[Any]) -> None:
        rid = frames[0].bytes
        peer = self.peers.get(role, rid)
        if peer is not None:
            # any data proves the peer is alive, even a message we then reject
            peer.liveness.heard()
        try:
            # compressed images stay compressed: the server checks their layout,
            # the trainer their contents
            msg = decode(frames[1:], self.net.max_message_bytes, inflate=False, limits=self.intake.packet_limits(peer))
            if msg.type is MsgType.HELLO:
                self.members.hello(role, rid, msg, frames[0], frames_nbytes(frames[1:]))
                if role == "trainer" and (trainer := self.peers.get(role, rid)) is not None:
                    self.revocations.trainer_joined(trainer)  # the rows it must not train on
                    self.standing.trainer_joined()
                return
            # --revoke, --unrevoke, --lift: on the trainer port (its keys' authority), no HELLO
            if peer is None and role == "trainer" and msg.type in (MsgType.REVOKE, MsgType.LIFT):
                (self.revocations.on_operator if msg.type is MsgType.REVOKE
                 else self.standing.on_operator)(rid, msg)
                return
            # from a peer already forgotten: it is leaving anyway
            if peer is None and msg.type is MsgType.BYE:
                log.debug("a BYE from a %s this server does not know (already forgotten)", role)
                return
            # e.g. a client of a server that restarted: it says HELLO again when told
            if peer is None:
                self.stats.unknown_peer += 1
                self.admission.log_rejection(role, rid, None,
                                             f"a {msg.type.value} message before HELLO "
                                             f"(after a server restart, every client "
                                             f"sends one); asked it to say HELLO", first=1)
                self.admission.reply(role, rid, "unknown peer: say HELLO",
                                     received=frames_nbytes(frames[1:]))
                return
            check_role(peer.role, msg)
        except PacketTooLarge as exc:  # checked before inflating
            if peer is not None and peer.role == "worker":
                self.intake.on_oversized(peer, exc)
            else:
                self.admission.reject(role, rid, peer, str(exc), frames_nbytes(frames[1:]))
            return
        except VersionMismatch as exc:
            self.admission.refuse(role, rid, peer,
                                  f"{exc}; install the same netrl version on "
                                  f"the server and the {role}", str(exc),
                                  received=frames_nbytes(frames[1:]))
            return
        except ProtocolError as exc:  # malformed, or outside its sender's role: told why
            self.admission.reject(role, rid, peer, str(exc), frames_nbytes(frames[1:]))
            return
        peer.last_seen = time.time()
        handler = self.handlers.get(msg.type)
        if handler is None:
            self.admission.reject(role, rid, peer, f"{msg.type.value} is not handled by the server",
                                  frames_nbytes(frames[1:]))
            return
        handler(peer, msg, frames[1:])

    # -- the server's own handlers (self.handlers) -------------------------------------------------
    def _take_acks(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        seqs = [s for s in msg.body["seqs"] if isinstance(s, int) and not isinstance(s, bool)]
        if peer.role == "worker":  # a worker acknowledges the weight version it received completely
            b = msg.body
            problem = peer.weights_acked(seqs, b.get("model", "policy"), b.get("format", "float32"),
                                         b.get("need_full", False))
            if problem:
                self.admission.reject("worker", peer.rid, peer, problem, frames_nbytes(frames))
                return
            self.out.stream_weights(peer)
            return
        # the trainer acknowledges bundles, naming the parts it refused
        self.relay.trainer_acked(seqs, {k: v for k, v in msg.body.items()
                                        if k in ("layout_refused", "rejected")})

    def _progress(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        self.standing.on_progress(msg.body)  # its report of the workers, off the pacing's counts
        self.intake.on_progress(peer, msg, frames)

    def _heartbeat(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        peer.liveness.on_heartbeat(msg.body)  # the round trip, for the window that declares it lost
        self.intake.on_heartbeat(peer, msg, frames)

    def _add_credit(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        self.relay.add_credit(msg.body["bundles"])

    def _cache_weights(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        b = msg.body
        completed = self.weights.completed
        problem = self.weights.add(msg.policy_version, b["part"], b["parts"], b["offset"], b["nbytes"],
                                   msg.arrays["chunk"].nbytes, frames, b["layout"], b)
        # logged once by the cache: a trainer sends many such parts
        if isinstance(problem, LoggedProblem):
            self.stats.rejected += 1
        elif problem:
            self.admission.reject("trainer", peer.rid, peer, problem, frames_nbytes(frames))
        elif self.weights.completed > completed:
            log.debug("weights %s v%d%s from the trainer (%d parts)",
                      b.get("model", "policy"), msg.policy_version,
                      f" ({b.get('format', 'float32')}{' delta' if 'base' in b else ''})",
                      b["parts"])
            self.stats.weights_in += 1
        # after a bad part too: it may have abandoned a version for the previous one
        self.out.stream_weights_to(self.peers.workers())

    # -- sending (netrl.server.outbound) -----------------------------------------------------------
    def _send_to_trainer(self, frames: list[Any]) -> bool:
        trainer = self.peers.trainer
        return trainer is not None and self.out.send_frames(trainer, frames) is True

    def _tell_trainer(self, msg: Message) -> None:
        if self.peers.trainer is not None:
            self.out.must_send(self.peers.trainer, msg)

    def _tell_worker(self, session: str, kind: MsgType, body: dict[str, Any]) -> None:
        # (the intake is built after the relay, which it takes)
        self.intake.tell_worker(session, kind, body)

    @property
    def schema(self) -> SampleSchema | None:
        """The layout sample packets are checked against: the trainer's (None until it is known)."""
        return self.intake.schema

    def snapshot(self) -> dict[str, Any]:
        """Connected peers, rates, queues and counters (what ``--status`` shows)."""
        return self.status.snapshot()

