"""Server: relays sample packets from workers to the trainer and weights from the trainer to every worker.

One thread, one poll loop over two ROUTER sockets (``trainer_port``, ``worker_port``)::

    workers --SAMPLES--> [worker ROUTER] --queue--> BUNDLE (>= min_samples_per_server_packet) --> [trainer ROUTER]
    workers <--WEIGHTS-- [worker ROUTER] <-- newest-weights cache <--WEIGHTS-- [trainer ROUTER]

* Sample packets are validated, then forwarded unchanged inside bundles, only while the trainer has credit.
* The newest weights are cached and sent to a worker the moment it says HELLO. Each worker has at most one
  weight message in flight; a newer version replaces one that has not been sent yet.
* The trainer's PROGRESS (training steps, samples wanted) becomes a PACE allowance per worker, which throttles
  simulated envs to the trainer's update-to-data ratio.
* Any bad message is logged with its peer, counted in ``stats["rejected"]``, and dropped.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from netrl.config import Config, NetworkConfig
from netrl.errors import ProtocolError, VersionMismatch
from netrl.transport import Liveness, bind, new_session, new_socket
from netrl.wire import Message, MsgType, check_role, decode, encode, encode_bundle

__all__ = ["Server"]

log = logging.getLogger(__name__)


@dataclass
class Peer:
    """A connected worker or trainer, keyed by its ZeroMQ routing id."""

    rid: bytes
    role: str
    name: str
    session: str
    address: str
    liveness: Liveness
    connected_at: float = field(default_factory=time.time)
    version: int = -1  # newest weight version the worker acknowledged
    inflight_version: int | None = None  # weight version sent but not yet acknowledged
    samples: int = 0
    packets: int = 0
    produced: int = 0  # env steps the worker has produced, as of its latest packet
    allowance: int = 0  # PACE last sent

    @property
    def label(self) -> str:
        return f"{self.role} {self.name!r} ({self.address}, session {self.session[:8]})"


@dataclass
class _Packet:
    worker: str
    seq: int
    steps: int
    frames: list[Any]
    received: float


class Server:
    """The central relay. Construct (no I/O), then ``run(stop)``; ``close()`` is idempotent.

    Args:
        min_samples_per_server_packet: samples bundled before sending to the trainer (tmrl's name).
        bind_ip: interface to bind; 127.0.0.1 by default.
        trainer_port, worker_port: the two ports (tmrl's defaults 55555 and 55556).
        network: heartbeat, size and reconnect settings.
        max_packet_delay_s: a bundle is sent after this long even if it has fewer samples.
    """

    def __init__(self, min_samples_per_server_packet: int = 200, *, bind_ip: str = "127.0.0.1",
                 trainer_port: int = 55555, worker_port: int = 55556, network: NetworkConfig | None = None,
                 max_packet_delay_s: float = 0.05) -> None:
        self.min_samples = min_samples_per_server_packet
        self.bind_ip = bind_ip
        self.trainer_port = trainer_port
        self.worker_port = worker_port
        self.net = network or NetworkConfig()
        self.max_delay = max_packet_delay_s
        self.session = new_session()
        self.peers: dict[bytes, Peer] = {}
        self.trainer: Peer | None = None
        self.weights: list[Any] | None = None  # frames of the newest WEIGHTS message
        self.weights_version = -1
        self.trainer_session = ""
        self.queue: collections.deque[_Packet] = collections.deque()
        self.queued_steps = 0
        self.credit = 0
        self.bundle_seq = 0
        self.inflight_steps = 0  # steps in bundles sent to the trainer but not acknowledged
        self.inflight: dict[int, int] = {}
        self.progress: dict[str, int] | None = None
        self.stats: collections.Counter[str] = collections.Counter()
        self._ctx: zmq.Context | None = None
        self._socks: dict[str, zmq.Socket] = {}
        self._closed = False
        self._rejections_logged: collections.Counter[bytes] = collections.Counter()

    @classmethod
    def from_config(cls, cfg: Config) -> Server:
        return cls(cfg.server.min_samples_per_server_packet, bind_ip=cfg.server.bind_ip,
                   trainer_port=cfg.network.trainer_port, worker_port=cfg.network.worker_port,
                   network=cfg.network, max_packet_delay_s=cfg.server.max_packet_delay_s)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Bind both ports. Raises TransportError naming the config key to change when a port is taken."""
        self._ctx = zmq.Context()
        for role, port, key in (("trainer", self.trainer_port, "network.trainer_port"),
                                ("worker", self.worker_port, "network.worker_port")):
            sock = new_socket(self._ctx, zmq.ROUTER, self.net.max_message_bytes)
            self._socks[role] = sock
            bind(sock, self.bind_ip, port, key)
        log.info("server listening on %s (trainer port %d, worker port %d), session %s",
                 self.bind_ip, self.trainer_port, self.worker_port, self.session[:8])

    def run(self, stop: threading.Event) -> None:
        """Relay until ``stop`` is set."""
        if self._ctx is None:
            self.open()
        poller = zmq.Poller()
        for sock in self._socks.values():
            poller.register(sock, zmq.POLLIN)
        try:
            while not stop.is_set():
                events = dict(poller.poll(self._poll_timeout_ms()))
                for role, sock in self._socks.items():
                    if sock in events:
                        self._drain(role, sock)
                now = time.monotonic()
                self._flush(now)
                self._heartbeats(now)
        finally:
            self.close()

    def close(self) -> None:
        """Say BYE to every peer and release the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for peer in list(self.peers.values()):
            self._send(peer, Message(MsgType.BYE, "server", body={"reason": "server shutting down"}))
        for sock in self._socks.values():
            sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        log.info("server stopped (%d samples relayed, %d messages rejected)", self.stats["samples_out"],
                 self.stats["rejected"])

    # -- receiving -----------------------------------------------------------------------------------------
    def _poll_timeout_ms(self) -> int:
        timeout = self.net.heartbeat_interval_s / 2
        if self.queue:
            timeout = min(timeout, max(0.0, self.queue[0].received + self.max_delay - time.monotonic()))
        return max(1, int(timeout * 1000))

    def _drain(self, role: str, sock: zmq.Socket, budget: int = 1000) -> None:
        for _ in range(budget):  # bounded, so that one busy socket cannot starve the other
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._receive(role, frames)

    def _receive(self, role: str, frames: list[Any]) -> None:
        rid = frames[0].bytes
        peer = self.peers.get(rid)
        try:
            msg = decode(frames[1:], self.net.max_message_bytes)
            if msg.type is MsgType.HELLO:
                self._hello(role, rid, msg, frames[0])
                return
            if peer is None:
                self._reply(role, rid, Message(MsgType.REJECT, "server", body={"reason": "unknown peer: say HELLO"}))
                return
            check_role(peer.role, msg)
        except VersionMismatch as exc:
            self._reject(role, rid, peer, f"{exc}; install the same netrl version on the server and the {role}")
            self._reply(role, rid, Message(MsgType.REJECT, "server", body={"reason": str(exc)}))
            return
        except ProtocolError as exc:
            self._reject(role, rid, peer, str(exc))
            return
        peer.liveness.heard()
        handler = getattr(self, f"_on_{msg.type.value}", None)
        if handler is None:
            self._reject(role, rid, peer, f"{msg.type.value} is not handled by the server")
            return
        handler(peer, msg, frames[1:])

    def _reject(self, role: str, rid: bytes, peer: Peer | None, reason: str) -> None:
        self.stats["rejected"] += 1
        self._rejections_logged[rid] += 1
        count = self._rejections_logged[rid]
        if count <= 10 or count % 1000 == 0:  # log every problem, but do not let a flood fill the disk
            who = peer.label if peer else f"unidentified {role} {rid[:24]!r}"
            log.warning("rejected a message from %s: %s (%d rejected from this peer)", who, reason, count)

    def _hello(self, role: str, rid: bytes, msg: Message, rid_frame: Any) -> None:
        body = msg.body
        if body["role"] != role:
            self._reject(role, rid, None, f"a {body['role']} connected to the {role} port")
            reason = f"this is the {role} port; a {body['role']} must connect to the other port"
            self._reply(role, rid, Message(MsgType.REJECT, "server", body={"reason": reason}))
            return
        for old_rid, old in list(self.peers.items()):  # a reconnect or a restarted trainer replaces its old entry
            if old_rid != rid and (old.session == body["session"] or (role == "trainer" and old.role == "trainer")):
                log.info("%s replaced by a new connection", old.label)
                self._forget(old_rid)
        address = rid_frame.get("Peer-Address") or "?"
        liveness = Liveness(self.net.heartbeat_interval_s, self.net.heartbeat_liveness)
        peer = Peer(rid, role, body["worker_id"], body["session"], address, liveness)
        self.peers[rid] = peer
        log.info("%s connected (netrl %s)", peer.label, body["netrl_version"])
        self._send(peer, Message(MsgType.WELCOME, "server", body={
            "server_session": self.session, "heartbeat_interval_s": self.net.heartbeat_interval_s}))
        if role == "trainer":
            self.trainer = peer
            self.credit = 0
            self.inflight.clear()
            self.inflight_steps = 0
            if body["session"] != self.trainer_session:
                if self.trainer_session:  # a new trainer process: its versions need not continue the old ones
                    log.info("new trainer session %s; dropping cached weights v%d", peer.session[:8],
                             self.weights_version)
                self.trainer_session = body["session"]
                self.weights, self.weights_version = None, -1
                for other in self.peers.values():
                    other.version, other.inflight_version = -1, None
        else:
            self._send_weights(peer)
            self._pace()

    def _forget(self, rid: bytes) -> None:
        peer = self.peers.pop(rid, None)
        if peer is not None and peer is self.trainer:
            self.trainer = None
            self.progress = None
            self.credit = 0
            self.inflight.clear()
            self.inflight_steps = 0

    # -- handlers, one per message type --------------------------------------------------------------------
    def _on_samples(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        a = msg.arrays
        steps = int(np.count_nonzero(~(a["reset"] | a["context"])))
        peer.samples += steps
        peer.packets += 1
        peer.produced = max(peer.produced, msg.body["produced"])
        self.stats["samples_in"] += steps
        self.queue.append(_Packet(f"{peer.name}/{peer.session}", msg.seq, steps, frames, time.monotonic()))
        self.queued_steps += steps

    def _on_heartbeat(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        pass

    def _on_bye(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        log.info("%s disconnected (%s)", peer.label, msg.body.get("reason", "no reason given"))
        self._forget(peer.rid)

    def _on_ack(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        seqs = [s for s in msg.body["seqs"] if isinstance(s, int)]
        if peer.role == "worker":  # a worker acknowledges the weight versions it loaded
            if seqs:
                peer.version = max(peer.version, max(seqs))
            peer.inflight_version = None
            self._send_weights(peer)
        else:  # the trainer acknowledges bundles
            for seq in seqs:
                self.inflight_steps -= self.inflight.pop(seq, 0)

    def _on_credit(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        self.credit = min(self.credit + max(0, msg.body["bundles"]), 10_000)

    def _on_weights(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        self.weights = frames
        self.weights_version = msg.policy_version
        self.stats["weights_in"] += 1
        log.debug("weights v%d from the trainer", msg.policy_version)
        for worker in self.peers.values():
            if worker.role == "worker":
                self._send_weights(worker)

    def _on_progress(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        self.progress = dict(msg.body)
        self._pace()

    # -- sending -------------------------------------------------------------------------------------------
    def _send(self, peer: Peer, msg: Message) -> bool:
        return self._send_frames(peer, encode(msg))

    def _send_frames(self, peer: Peer, frames: list[Any]) -> bool:
        sock = self._socks[peer.role]
        try:
            sock.send_multipart([peer.rid, *frames], zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.stats["send_full"] += 1  # the peer's queue is full; the caller keeps its state and retries
            return False
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                log.info("%s is unreachable; forgetting it", peer.label)
                self._forget(peer.rid)
                return False
            raise
        peer.liveness.sent()
        return True

    def _reply(self, role: str, rid: bytes, msg: Message) -> None:
        try:
            self._socks[role].send_multipart([rid, *encode(msg)], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            pass  # the peer is gone or flooding us; a reply is a courtesy

    def _send_weights(self, worker: Peer) -> None:
        """Send the newest weights unless the worker has them or another version is still in flight."""
        if self.weights is None or worker.inflight_version is not None or worker.version >= self.weights_version:
            return
        if self._send_frames(worker, self.weights):
            worker.inflight_version = self.weights_version
            self.stats["weights_out"] += 1

    def _flush(self, now: float) -> None:
        """Bundle queued packets for the trainer while it has credit."""
        while self.trainer is not None and self.credit > 0 and self.queue:
            if self.queued_steps < self.min_samples and now - self.queue[0].received < self.max_delay:
                return
            parts: list[list[Any]] = []
            steps = 0
            while self.queue and (steps < self.min_samples or not parts):
                packet = self.queue.popleft()
                parts.append(packet.frames)
                steps += packet.steps
            self.bundle_seq += 1
            if not self._send_frames(self.trainer, encode_bundle("server", self.bundle_seq, parts)):
                return  # packets of a failed send are lost with it; acknowledged delivery recovers them
            self.queued_steps -= steps
            self.credit -= 1
            self.inflight[self.bundle_seq] = steps
            self.inflight_steps += steps
            self.stats["samples_out"] += steps
            self.stats["bundles_out"] += 1

    def _pace(self) -> None:
        """Split the samples the trainer still wants between connected workers (only throttled workers wait)."""
        workers = [p for p in self.peers.values() if p.role == "worker"]
        if self.progress is None or not workers:
            return
        wanted_more = self.progress["wanted"] - self.progress["samples"]
        deficit = max(0, wanted_more - self.queued_steps - self.inflight_steps)
        share = -(-deficit // len(workers))
        for worker in workers:
            allowance = worker.produced + share
            if allowance > worker.allowance:
                worker.allowance = allowance
                self._send(worker, Message(MsgType.PACE, "server", body={"allowance": allowance}))

    def _heartbeats(self, now: float) -> None:
        for rid, peer in list(self.peers.items()):
            if peer.liveness.expired(now):
                log.info("%s lost (no message for %.1f s)", peer.label, peer.liveness.window)
                self.stats["peers_lost"] += 1
                self._forget(rid)
            elif peer.liveness.heartbeat_due(now):
                self._send(peer, Message(MsgType.HEARTBEAT, "server"))

    def snapshot(self) -> dict[str, Any]:
        """Connected peers and counters (for status displays)."""
        return {
            "workers": [{"name": p.name, "session": p.session, "address": p.address, "version": p.version,
                         "samples": p.samples} for p in self.peers.values() if p.role == "worker"],
            "trainer": self.trainer.name if self.trainer else None,
            "weights_version": self.weights_version,
            "queued_samples": self.queued_steps,
            "stats": dict(self.stats),
        }
