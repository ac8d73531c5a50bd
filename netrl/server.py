"""Server: relays sample packets from workers to the trainer and weights from the trainer to every worker.

One thread, one poll loop over two ROUTER sockets (``trainer_port``, ``worker_port``)::

    worker --SAMPLES--> queue (memory, unacknowledged) --BUNDLE--> trainer --ACK--> server --ACK--> worker
                  \\---> spool (disk, acknowledged at once) --BUNDLE--/
    worker <--WEIGHTS parts-- newest-weights cache <--WEIGHTS parts-- trainer

Where a packet goes, and when its worker hears back:

* a trainer is connected and the packets held in memory stay under ``max_queue_bytes``: it waits in memory and the
  worker gets its ACK when the trainer acknowledges the bundle that carried it (until then the worker keeps it);
  if the trainer takes no bundle for ``spool_after_s``, waiting packets move to the spool and are acknowledged;
* otherwise it is appended to the spool on disk and acknowledged at once; bundles take spooled packets first;
* if the spool is full too, the worker gets a NACK and resends later (its own backlog is bounded and counts drops).

Bundles go out only while the trainer has credit, so a slow trainer never makes the server's memory grow. The
newest weights are cached and sent to a worker the moment it says HELLO. Weights arrive in parts and each part is
forwarded as soon as it arrives, so the two hops overlap; a worker gets the next version only after acknowledging
the previous one (or, if a newer version starts while it is still receiving one, the newer one from its start).
peer, counted (``stats["rejected"]``) and dropped.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from zmq.auth.thread import ThreadAuthenticator

from netrl.config import Config, NetworkConfig
from netrl.errors import ProtocolError, SampleRejected, VersionMismatch
from netrl.keys import SHARED_WORKER, KeyRing, ServerKeys, server_keys
from netrl.peers import Peer, QueuedPacket
from netrl.schema import SampleSchema
from netrl.spool import Spool
from netrl.status import Rates
from netrl.transport import Liveness, bind, new_session, new_socket
from netrl.wire import Message, MsgType, check_role, decode, encode, encode_bundle, frames_nbytes

__all__ = ["Server"]

log = logging.getLogger(__name__)


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


class Server:
    """The central relay. Construct (no I/O), then ``run(stop)``; ``close()`` is idempotent.

    Args:
        min_samples_per_server_packet: samples bundled before sending to the trainer (tmrl's name).
        bind_ip: interface to bind; 127.0.0.1 by default.
        trainer_port, worker_port: the two ports (tmrl's defaults 55555 and 55556).
        network: heartbeat, size and reconnect settings.
        max_packet_delay_s: a bundle is sent after this long even if it has fewer samples.
        max_queue_bytes: sample data held in memory (queued or in flight to the trainer) before spooling.
        spool_after_s: a queued packet the trainer has not taken after this long is moved to the spool.
        spool_dir, spool_max_bytes, fsync: the disk spool.
        keys: the server's CURVE keypair and allow-lists; None runs unencrypted (``"security": "none"``).
        status_port: loopback port answering ``python -m netrl --status`` (None: no status port).
        status_interval_s: seconds between status log lines (0: none).
    """

    def __init__(self, min_samples_per_server_packet: int = 200, *, bind_ip: str = "127.0.0.1",
                 trainer_port: int = 55555, worker_port: int = 55556, network: NetworkConfig | None = None,
                 max_packet_delay_s: float = 0.05, max_queue_bytes: int = 64 << 20, spool_after_s: float = 2.0,
                 spool_dir: str | Path = "weights/server-spool", spool_max_bytes: int = 1 << 30,
                 fsync: bool = False, keys: ServerKeys | None = None, status_port: int | None = None,
                 status_interval_s: float = 10.0) -> None:
        self.min_samples = min_samples_per_server_packet
        self.bind_ip = bind_ip
        self.trainer_port = trainer_port
        self.worker_port = worker_port
        self.net = network or NetworkConfig()
        self.max_delay = max_packet_delay_s
        self.max_queue_bytes = max_queue_bytes
        self.spool_after = spool_after_s
        self.spool_dir, self.spool_max_bytes, self.fsync = spool_dir, spool_max_bytes, fsync
        self.keys = keys
        self.status_port, self.status_interval = status_port, status_interval_s
        self.rates = Rates()
        self.started = time.time()
        self._next_tick = self._next_status_line = 0.0
        self.keyring: KeyRing | None = None
        self._auth: ThreadAuthenticator | None = None
        self.schema: SampleSchema | None = None
        self.session = new_session()
        self.peers: dict[bytes, Peer] = {}
        self.by_session: dict[str, Peer] = {}
        self.trainer: Peer | None = None
        self.trainer_session = ""
        self.weights: list[list[Any]] = []  # frames of each part of the newest version received so far
        self.weights_parts = 0  # how many parts that version has
        self.weights_version = -1
        self.spool: Spool | None = None
        self.queue: collections.deque[QueuedPacket] = collections.deque()  # in memory, not yet sent
        self.held: set[tuple[str, int]] = set()  # (session, seq) of packets in memory, queued or in flight
        self.mem_bytes = 0
        self.queued_steps = 0
        self.credit = 0
        self.bundle_seq = 0
        self.inflight: dict[int, list[QueuedPacket]] = {}
        self.inflight_steps = 0
        self.last_bundle_at = 0.0
        self.progress: dict[str, int] | None = None
        self.stats: collections.Counter[str] = collections.Counter()
        self._ctx: zmq.Context | None = None
        self._socks: dict[str, zmq.Socket] = {}
        self._status: zmq.Socket | None = None
        self._closed = False
        self._rejections_logged: collections.Counter[bytes] = collections.Counter()
        self._last_full_warning = 0.0

    @classmethod
    def from_config(cls, cfg: Config) -> Server:
        s = cfg.server
        spool_dir = s.spool_dir or Path(cfg.weights_folder) / "server-spool"
        keys = server_keys(cfg.keys_dir) if cfg.security == "curve" else None
        return cls(s.min_samples_per_server_packet, bind_ip=s.bind_ip, trainer_port=cfg.network.trainer_port,
                   worker_port=cfg.network.worker_port, network=cfg.network, max_packet_delay_s=s.max_packet_delay_s,
                   max_queue_bytes=s.max_queue_bytes, spool_after_s=s.spool_after_s, spool_dir=spool_dir,
                   spool_max_bytes=s.spool_max_bytes, fsync=s.fsync, keys=keys, status_port=s.status_port,
                   status_interval_s=cfg.status_interval_s)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Open the spool and bind both ports (TransportError names the config key to change)."""
        self.spool = Spool(self.spool_dir, self.spool_max_bytes, self.fsync)
        schema_file = Path(self.spool_dir) / "schema.json"
        if schema_file.exists():  # the trainer's last schema, so packets are checked before it reconnects
            self.schema = SampleSchema.from_wire(json.loads(schema_file.read_text()))
        self._ctx = zmq.Context()
        if self.keys is not None:
            self.keyring = KeyRing(self.keys.allow_dir)
            self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger("netrl.zap"))
            self._auth.start()
        else:
            log.warning("SECURITY IS OFF (\"security\": \"none\"): traffic on ports %d and %d is unencrypted and "
                        "unauthenticated; anyone who can reach them can send samples or connect as the trainer and "
                        "push weights to every worker%s", self.trainer_port, self.worker_port,
                        "" if _loopback(self.bind_ip) else f". This server binds {self.bind_ip}, beyond loopback")
        for role, port, key in (("trainer", self.trainer_port, "network.trainer_port"),
                                ("worker", self.worker_port, "network.worker_port")):
            sock = new_socket(self._ctx, zmq.ROUTER, self.net.max_message_bytes, hwm=1000)
            if self.keys is not None and self._auth is not None and self.keyring is not None:
                sock.curve_server = True
                sock.curve_secretkey = self.keys.secret
                sock.curve_publickey = self.keys.public
                sock.zap_domain = f"netrl-{role}".encode()  # each port has its own allow-list
                self._auth.configure_curve_callback(f"netrl-{role}", self.keyring.provider(role))
            self._socks[role] = sock
            bind(sock, self.bind_ip, port, key)
        if self.status_port is not None:
            self._status = new_socket(self._ctx, zmq.REP, 1 << 16)
            bind(self._status, "127.0.0.1", self.status_port, "server.status_port")  # never beyond loopback
        log.info("server listening on %s (trainer port %d, worker port %d), %s, session %s, spool %s",
                 self.bind_ip, self.trainer_port, self.worker_port,
                 "CURVE keys from " + str(self.keys.allow_dir) if self.keys else "UNENCRYPTED", self.session[:8],
                 self.spool_dir)

    def run(self, stop: threading.Event) -> None:
        """Relay until ``stop`` is set."""
        try:
            if self._ctx is None:
                self.open()
            poller = zmq.Poller()
            for sock in self._socks.values():
                poller.register(sock, zmq.POLLIN)
            if self._status is not None:
                poller.register(self._status, zmq.POLLIN)
            while not stop.is_set():
                events = dict(poller.poll(self._poll_timeout_ms()))
                for role, sock in self._socks.items():
                    if sock in events:
                        self._drain(role, sock)
                if self._status is not None and self._status in events:
                    self._answer_status()
                now = time.monotonic()
                self._flush(now)
                self._spool_stale(now)
                self._heartbeats(now)
                self._tick(now)
        finally:
            self.close()

    def close(self) -> None:
        """Say BYE to every peer, close the spool and release the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for peer in list(self.peers.values()):
            self._send(peer, Message(MsgType.BYE, "server", body={"reason": "server shutting down"}))
        for sock in self._socks.values():
            sock.close(linger=0)
        if self._status is not None:
            self._status.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        if self._ctx is not None:
            self._ctx.term()
        if self.spool is not None:
            self.spool.close()
        held = len(self.queue) + sum(len(b) for b in self.inflight.values())
        log.info("server stopped: %d samples relayed, %d messages rejected, %d samples spooled in all (%d packets "
                 "still on disk), %d refused (spool full), %d packets held in memory (their workers still have "
                 "them)", self.stats["samples_out"], self.stats["rejected"], self.stats["samples_spooled"],
                 self.spool.packets if self.spool else 0, self.stats["samples_refused"], held)

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
            try:
                self._receive(role, frames)
            except Exception:  # a bug must not take the relay down: log it loudly, count it, carry on
                self.stats["internal_errors"] += 1
                log.exception("internal error while handling a message on the %s port", role)

    def _receive(self, role: str, frames: list[Any]) -> None:
        rid = frames[0].bytes
        peer = self.peers.get(rid)
        if peer is not None:
            peer.liveness.heard()  # any data proves the peer is alive, even a message we then reject
        try:
            msg = decode(frames[1:], self.net.max_message_bytes)
            if msg.type is MsgType.HELLO:
                self._hello(role, rid, msg, frames[0])
                return
            if peer is None:  # e.g. a client of a server that restarted: it says HELLO again when told
                self.stats["unknown_peer"] += 1
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
        peer.last_seen = time.time()
        handler = getattr(self, f"_on_{msg.type.value}", None)
        if handler is None:
            self._reject(role, rid, peer, f"{msg.type.value} is not handled by the server")
            return
        handler(peer, msg, frames[1:])

    def _reject(self, role: str, rid: bytes, peer: Peer | None, reason: str) -> None:
        self.stats["rejected"] += 1
        self._rejections_logged[rid] += 1
        count = self._rejections_logged[rid]
        if count <= 10 or count % 1000 == 0:  # log every kind of problem, but do not let a flood fill the disk
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
        key = ""
        if self.keyring is not None:  # CURVE: ZAP put the client's public key in the User-Id property
            key = self.keyring.name(role, (rid_frame.get("User-Id") or "").encode()) or "?"
            if role == "worker" and key not in (SHARED_WORKER, body["worker_id"]):
                reason = f"key {key!r} belongs to worker {key!r}; this worker calls itself {body['worker_id']!r}"
                self._reject(role, rid, None, reason)
                self._reply(role, rid, Message(MsgType.REJECT, "server", body={"reason": reason}))
                return
        liveness = Liveness(self.net.heartbeat_interval_s, self.net.heartbeat_liveness)
        peer = Peer(rid, role, body["worker_id"], body["session"], address, liveness, key=key)
        self.peers[rid] = peer
        self.by_session[peer.session] = peer
        log.info("%s connected (netrl %s)", peer.label, body["netrl_version"])
        self._send(peer, Message(MsgType.WELCOME, "server", body={
            "server_session": self.session, "heartbeat_interval_s": self.net.heartbeat_interval_s}))
        if role == "trainer":
            self._trainer_joined(peer)
        else:
            self._send_weights(peer)
            self._pace()

    def _trainer_joined(self, peer: Peer) -> None:
        self.trainer = peer
        self.credit = 0
        if peer.session != self.trainer_session:
            if self.trainer_session:  # a new trainer process: its versions need not continue the old ones
                log.info("new trainer session %s; dropping cached weights v%d", peer.session[:8], self.weights_version)
            self.trainer_session = peer.session
            self.weights, self.weights_version = [], -1
            for other in self.peers.values():
                other.version, other.inflight_version, other.streaming = -1, None, None

    def _forget(self, rid: bytes) -> None:
        peer = self.peers.pop(rid, None)
        if peer is None:
            return
        if self.by_session.get(peer.session) is peer:
            del self.by_session[peer.session]
        if peer is self.trainer:
            self.trainer = None
            self.progress = None
            self.credit = 0
            self._requeue_inflight()

    def _requeue_inflight(self) -> None:
        """The trainer left without acknowledging some bundles: their packets go back to the front."""
        for seq in sorted(self.inflight, reverse=True):
            for packet in reversed(self.inflight.pop(seq)):
                if packet.spool_position is None:
                    self.queue.appendleft(packet)
                    self.queued_steps += packet.steps
        self.inflight_steps = 0
        if self.spool is not None:
            self.spool.rewind()

    # -- handlers, one per message type --------------------------------------------------------------------
    def _on_samples(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        if self.schema is not None:
            try:
                self.schema.check(msg.body, msg.arrays, peer.label)
            except SampleRejected as exc:
                self._reject("worker", peer.rid, peer, str(exc))
                self._send(peer, Message(MsgType.NACK, "server", body={"seqs": [msg.seq], "retry_s": 0,
                                                                       "reason": f"rejected: {exc}"}))
                return
        a = msg.arrays
        steps = int(np.count_nonzero(~(a["reset"] | a["context"])))
        key = (msg.body["session"], msg.seq)
        peer.produced = max(peer.produced, msg.body["produced"])
        if key in self.held:  # a resend of a packet we still hold: it is acknowledged with the original
            self.stats["resends_ignored"] += 1
            return
        nbytes = frames_nbytes(frames)
        packet = QueuedPacket(peer.name, key[0], key[1], steps, frames, nbytes, time.monotonic())
        assert self.spool is not None
        if self.trainer is not None and self.mem_bytes + nbytes <= self.max_queue_bytes:
            self.queue.append(packet)
            self.held.add(key)
            self.mem_bytes += nbytes
            self.queued_steps += steps
        elif self.spool.fits(nbytes):
            if not self.spool.packets:
                log.info("spooling packets to %s: %s", self.spool_dir, "no trainer is connected" if self.trainer is None
                         else f"the memory queue is full ({self.mem_bytes} bytes)")
            self.spool.push(frames, {"worker": peer.name, "session": key[0], "seq": key[1], "steps": steps})
            self.stats["samples_spooled"] += steps
            self._send(peer, Message(MsgType.ACK, "server", body={"seqs": [msg.seq]}))
        else:
            self.stats["samples_refused"] += steps
            self._warn_full(peer)
            self._send(peer, Message(MsgType.NACK, "server", body={"seqs": [msg.seq], "retry_s": 1.0,
                                                                   "reason": "server queue and spool are full"}))
            return
        peer.samples += steps
        peer.packets += 1
        self.stats["samples_in"] += steps

    def _warn_full(self, peer: Peer) -> None:
        now = time.monotonic()
        if now - self._last_full_warning > 10:
            self._last_full_warning = now
            log.warning("memory queue (%d bytes) and spool (%d of %d bytes) are full: refusing packets from %s "
                        "until the trainer catches up (%d samples refused so far)", self.mem_bytes,
                        self.spool.bytes if self.spool else 0, self.spool_max_bytes, peer.label,
                        self.stats["samples_refused"])

    def _on_heartbeat(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        stats = msg.body.get("stats")
        if isinstance(stats, dict):
            peer.reported = {k: v for k, v in stats.items() if isinstance(v, (int, float))}
            produced = stats.get("produced")
            if isinstance(produced, int) and produced > peer.produced:
                # a worker that reconnected to a restarted server: pace it from its real count, not from zero
                peer.produced = produced
                self._pace()

    def _on_bye(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        log.info("%s disconnected (%s)", peer.label, msg.body.get("reason", "no reason given"))
        self._forget(peer.rid)

    def _on_ack(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        seqs = [s for s in msg.body["seqs"] if isinstance(s, int) and not isinstance(s, bool)]
        if peer.role == "worker":  # a worker acknowledges the weight versions it loaded
            if seqs:
                peer.version = max(peer.version, max(seqs))
            peer.inflight_version = None
            self._send_weights(peer)
            return
        acks: dict[str, list[int]] = collections.defaultdict(list)  # the trainer acknowledges bundles
        spooled_before = self.spool.packets if self.spool else 0
        for seq in seqs:
            for packet in self.inflight.pop(seq, []):
                self.inflight_steps -= packet.steps
                if packet.spool_position is not None:
                    assert self.spool is not None
                    self.spool.ack(packet.spool_position)
                else:
                    self.held.discard((packet.session, packet.seq))
                    self.mem_bytes -= packet.nbytes
                    acks[packet.session].append(packet.seq)
        if spooled_before and self.spool is not None and not self.spool.packets:
            log.info("spool drained: the trainer has every spooled packet")
        for session, worker_seqs in acks.items():
            worker = self.by_session.get(session)
            if worker is not None:  # a worker that left resends after reconnecting; the trainer deduplicates
                self._send(worker, Message(MsgType.ACK, "server", body={"seqs": worker_seqs}))

    def _on_credit(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        self.credit = min(self.credit + max(0, msg.body["bundles"]), 10_000)

    def _on_weights(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        b, version = msg.body, msg.policy_version
        if b["part"] == 0:
            self.weights, self.weights_version, self.weights_parts = [frames], version, b["parts"]
        elif version == self.weights_version and b["part"] == len(self.weights) and b["parts"] == self.weights_parts:
            self.weights.append(frames)
        else:
            self._reject("trainer", peer.rid, peer, f"weights v{version} part {b['part']} arrived out of order")
            return
        if len(self.weights) == self.weights_parts:
            log.debug("weights v%d from the trainer (%d parts)", version, self.weights_parts)
            self.stats["weights_in"] += 1
        for worker in list(self.peers.values()):  # a send may forget an unreachable worker
            if worker.role == "worker":
                self._send_weights(worker)

    def _on_schema(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        try:
            schema = SampleSchema.from_wire(msg.body)
        except ProtocolError as exc:
            self._reject("trainer", peer.rid, peer, str(exc))
            return
        if schema != self.schema:
            self.schema = schema
            path = Path(self.spool_dir) / "schema.json"
            path.write_text(json.dumps(msg.body))
            log.info("sample layout from the trainer: %d fields, checked on every packet", len(schema.leaves))

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
                log.info("%s lost (its connection closed)", peer.label)
                self.stats["peers_lost"] += 1
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
        """Stream the newest version's parts to a worker that lacks it, as far as they have arrived.

        A worker waits for the acknowledgement of a version it received completely before it gets another (so a
        slow worker gets the newest version, not every version); a newer version preempts one still streaming."""
        version = self.weights_version
        if not self.weights or worker.version >= version or worker.inflight_version == version:
            return
        if worker.streaming != version:
            if worker.inflight_version is not None and worker.streaming is None:
                return  # it has a complete older version to acknowledge first
            worker.streaming, worker.sent_parts = version, 0
        while worker.sent_parts < len(self.weights):
            if not self._send_frames(worker, self.weights[worker.sent_parts]):
                return
            worker.sent_parts += 1
        if worker.sent_parts == self.weights_parts:
            worker.inflight_version, worker.streaming = version, None
            self.stats["weights_out"] += 1

    def _flush(self, now: float) -> None:
        """Bundle spooled, then queued packets for the trainer while it has credit."""
        assert self.spool is not None
        while self.trainer is not None and self.credit > 0:
            spooled = self.spool.pending()
            if not spooled and (not self.queue or (self.queued_steps < self.min_samples
                                                   and now - self.queue[0].received < self.max_delay)):
                return
            packets: list[QueuedPacket] = []
            steps = 0
            if spooled:
                for sp in self.spool.take(self.min_samples):
                    packets.append(QueuedPacket(sp.meta["worker"], sp.meta["session"], sp.meta["seq"],
                                                int(sp.meta["steps"]), sp.frames, sp.nbytes, now, sp.position))
                    steps += packets[-1].steps
            while self.queue and (steps < self.min_samples or not packets):
                packet = self.queue.popleft()
                self.queued_steps -= packet.steps
                packets.append(packet)
                steps += packet.steps
            self.bundle_seq += 1
            bundle = encode_bundle("server", self.bundle_seq, [p.frames for p in packets])
            if not self._send_frames(self.trainer, bundle):
                self._untake(packets)  # nothing is lost: the bundle is rebuilt when the trainer can take it
                return
            self.inflight[self.bundle_seq] = packets
            self.inflight_steps += steps
            self.credit -= 1
            self.stats["samples_out"] += steps
            self.stats["bundles_out"] += 1
            self.last_bundle_at = now

    def _untake(self, packets: list[QueuedPacket]) -> None:
        for packet in reversed([p for p in packets if p.spool_position is None]):
            self.queue.appendleft(packet)
            self.queued_steps += packet.steps
        spooled = [p.spool_position for p in packets if p.spool_position is not None]
        if spooled and self.spool is not None:
            self.spool.untake(min(spooled))

    def _spool_stale(self, now: float) -> None:
        """The trainer has taken nothing for ``spool_after_s``: move packets waiting that long to disk and
        acknowledge them, so workers stop holding them. (A trainer that keeps taking bundles is left to drain the
        queue: spooling then would only add disk work, and the workers' send windows already bound the queue.)"""
        assert self.spool is not None
        if now - self.last_bundle_at < self.spool_after:
            return
        acks: dict[str, list[int]] = collections.defaultdict(list)
        while self.queue and now - self.queue[0].received > self.spool_after and self.spool.fits(self.queue[0].nbytes):
            packet = self.queue.popleft()
            if not self.spool.packets:
                log.info("spooling packets to %s: the trainer is not keeping up", self.spool_dir)
            self.spool.push(packet.frames, {"worker": packet.worker, "session": packet.session, "seq": packet.seq,
                                            "steps": packet.steps})
            self.stats["samples_spooled"] += packet.steps
            self.queued_steps -= packet.steps
            self.mem_bytes -= packet.nbytes
            self.held.discard((packet.session, packet.seq))
            acks[packet.session].append(packet.seq)
        for session, seqs in acks.items():
            worker = self.by_session.get(session)
            if worker is not None:
                self._send(worker, Message(MsgType.ACK, "server", body={"seqs": seqs}))

    def _pace(self) -> None:
        """Split the samples the trainer still wants between connected workers (only throttled workers wait)."""
        workers = [p for p in self.peers.values() if p.role == "worker"]
        if self.progress is None or not workers:
            return
        wanted_more = self.progress["wanted"] - self.progress["samples"]
        on_the_way = self.queued_steps + self.inflight_steps + (self.spool.steps if self.spool else 0)
        share = -(-max(0, wanted_more - on_the_way) // len(workers))
        for worker in workers:  # (a list: a send may forget an unreachable worker)
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
        """Connected peers, rates, queues and counters (what ``--status`` shows)."""
        spool = self.spool
        workers = [p.describe() for p in self.peers.values() if p.role == "worker"]
        by_workers = sum(int(w["reported"].get("dropped_samples", 0)) for w in workers)
        return {
            "session": self.session, "uptime_s": time.time() - self.started,
            "workers": workers,
            "trainer": self.trainer.describe() if self.trainer else None,
            "progress": self.progress,
            "weights_version": self.weights_version,
            "rates": self.rates.rates(),
            "queued_samples": self.queued_steps, "queued_bytes": self.mem_bytes,
            "inflight_samples": self.inflight_steps,
            "spool": {"packets": spool.packets if spool else 0, "samples": spool.steps if spool else 0,
                      "bytes": spool.bytes if spool else 0, "max_bytes": self.spool_max_bytes},
            "rejected": self.stats["rejected"], "refused": self.stats["samples_refused"],
            "dropped_by_workers": by_workers, "dropped": self.stats["samples_refused"] + by_workers,
            "stats": dict(self.stats),
        }

    def _answer_status(self) -> None:
        assert self._status is not None
        try:
            frames = self._status.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        try:
            request = decode(frames, 1 << 16)
            body = {"snapshot": self.snapshot()} if request.type is MsgType.STATUS else {}
        except ProtocolError as exc:
            self.stats["rejected"] += 1
            log.warning("rejected a status request: %s", exc)
            body = {}
        self._status.send_multipart(encode(Message(MsgType.STATUS, "server", body=body)))  # REP must answer

    def _tick(self, now: float) -> None:
        """Once a second: sample the rates; every ``status_interval_s``: one status line."""
        if now < self._next_tick:
            return
        self._next_tick = now + 1.0
        self.rates.record({"samples_in": self.stats["samples_in"], "samples_out": self.stats["samples_out"]}, now)
        if self.status_interval and now >= self._next_status_line:
            self._next_status_line = now + self.status_interval
            if self._next_status_line - self.status_interval > 0 and self.peers:
                rates = self.rates.rates()
                versions = " ".join(f"{p.name}:v{p.version}" for p in self.peers.values() if p.role == "worker")
                log.info("status | %d workers [%s] | trainer %s | in %.0f/s out %.0f/s | queued %d | spool %d | "
                         "rejected %d", sum(p.role == "worker" for p in self.peers.values()), versions or "-",
                         "connected" if self.trainer else "absent", rates.get("samples_in", 0),
                         rates.get("samples_out", 0), self.queued_steps, self.spool.steps if self.spool else 0,
                         self.stats["rejected"])
