"""Who may talk to the server, and the server's account of what it refused.

:class:`Admission` checks each HELLO (the right port, a worker name its CURVE key may use) and adds
the new :class:`~netrl.server.peers.Peer` to the table. It rejects bad messages with a count in the
server's stats and a log line per peer that a flood cannot multiply, replies REJECT where the peer
can act on the reason, and logs connections that failed their ZeroMQ handshake before any message
arrived. A trainer session that replaces another is logged loudly, and the old trainer is told to
stop (two trainers would split the samples between their runs). The server's loop calls it; it never
sends a WELCOME (that carries the server's state: :meth:`netrl.server.membership.Membership.hello`).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from netrl import __version__
from netrl.config.sections import NetworkConfig
from netrl.net.liveness import Liveness
from netrl.protocol.checks import MAX_ENVS
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import encode
from netrl.server.counters import ServerCounters
from netrl.server.peers import Peer, PeerTable
from netrl.server.sockets import ServerSockets
from netrl.util import worth_logging

__all__ = ["Admission"]

log = logging.getLogger(__name__)


class Admission:
    """The server's gate: HELLO checks, rejections and failed handshakes (counted in
    ``stats``, logged sparingly)."""

    def __init__(self, net: NetworkConfig, sockets: ServerSockets, peers: PeerTable,
                 stats: ServerCounters, forget: Callable[[Peer], None], max_workers: int,
                 max_rows_per_packet: int = 65_536) -> None:
        self.net, self.sockets, self.peers, self.stats = net, sockets, peers, stats
        self.max_workers, self.max_rows_per_packet = max_workers, max_rows_per_packet
        self.forget = forget  # the server's: drops a peer and whatever it was doing
        self._rejections_logged: collections.Counter[bytes] = collections.Counter()

    def hello(self, role: str, rid: bytes, msg: Message, rid_frame: Any) -> Peer | None:
        """The new peer for a HELLO on ``role``'s port, or None after refusing it
        with a REJECT that says why.

        Only an accepted HELLO replaces anything: the same connection saying HELLO again, its worker
        session reconnecting (same name and key), or the old trainer."""
        body = msg.body
        if body["role"] != role:
            self.refuse(role, rid, None, f"a {body['role']} connected to the {role} port",
                        f"this is the {role} port; a {body['role']} must connect to the other port")
            return None
        key = ""
        if self.sockets.auth is not None:
            key = self.sockets.auth.key_name(role, rid_frame)
            problem = self.sockets.auth.worker_name_problem(key, body["worker_id"]) if role == "worker" else None
            if problem:
                self.refuse(role, rid, None, problem, problem)
                return None
        liveness = Liveness(self.net.heartbeat_interval_s, self.net.heartbeat_liveness)
        peer = Peer(rid, role, body["worker_id"], body["session"], rid_frame.get("Peer-Address") or "?", liveness,
                    key=key)
        problem = self.peers.session_problem(peer) or self._declared(peer, body)
        if problem:
            self.refuse(role, rid, None, problem, problem)
            return None
        replaced = self.peers.replaced_by(peer)
        if role == "worker" and not replaced and self.peers.worker_count() >= self.max_workers:
            self.stats.refused_full += 1
            # for now: a worker that died without BYE frees its place within the liveness window
            self.refuse(role, rid, None, f"{self.max_workers} workers are "
                                         f"connected (server.max_workers)",
                        f"the server already has {self.max_workers} workers connected, its "
                        f"server.max_workers: raise it in the server's config, or stop a worker",
                        retry_s=max(1.0, self.net.heartbeat_interval_s * self.net.heartbeat_liveness))
            return None
        for old in replaced:
            if role == "trainer" and old.rid != rid and old.session != peer.session:
                self._trainer_replaced(old, peer)
            else:  # the same process: a network blip, or a HELLO again on the same connection
                log.info("%s %s", old.label, "said HELLO again" if old.rid == rid else "replaced by a new connection")
                if role == "worker" and old.session == peer.session:
                    peer.carry_over(old)
            self.forget(old)
        self.peers.add(peer)
        log.info("%s connected (netrl %s)", peer.label, body["netrl_version"])
        twins = [w for w in self.peers.workers() if w.name == peer.name and w is not peer] if role == "worker" else []
        drop_after = self.net.heartbeat_interval_s * self.net.heartbeat_liveness
        for twin in twins:
            silent = time.time() - twin.last_seen
            # half its heartbeats missed: an earlier run of it that ended, restarted
            if silent > drop_after / 2:
                log.info("%s has the name of %s, silent for %.1f s: taken for an earlier "
                         "run of it that ended; it is dropped once silent for %.0f s",
                         peer.label, twin.label, silent, drop_after)
                continue
            log.warning("%s has the name of %s, connected too: unless that is an earlier "
                        "run of it that died (dropped once silent for %.0f s), give each worker "
                        "its own --worker-id (worker.worker_id): the server's logs and status "
                        "cannot tell them apart (by default a worker takes its host name)",
                        peer.label, twin.label, drop_after)
        return peer

    def _declared(self, peer: Peer, body: dict[str, Any]) -> str | None:
        """Take a worker's declared packet bounds and pacing; why it may not connect (packets no
        server cap lets through would be refused one by one), or None."""
        if peer.role != "worker":
            return None
        peer.max_rows, peer.max_bytes = body.get("max_rows", 0), body.get("max_bytes", 0)
        peer.paced = body.get("paced", True)
        peer.num_envs = body.get("num_envs", 1)
        if not 1 <= peer.num_envs <= MAX_ENVS:
            return (f"worker {peer.name!r} declares {peer.num_envs} envs at "
                    f"HELLO: worker.num_envs must be 1 to {MAX_ENVS}")
        if peer.max_rows > self.max_rows_per_packet:
            return (f"worker {peer.name!r} makes packets of up to {peer.max_rows} rows, over "
                    f"this server's server.max_rows_per_packet ({self.max_rows_per_packet}): "
                    f"lower the worker's worker.min_samples_per_worker_packet, or "
                    f"raise server.max_rows_per_packet on the server and the trainer")
        return None

    def _trainer_replaced(self, old: Peer, new: Peer) -> None:
        """Another trainer process took over: the newest trainer gets the samples. If the old one
        still runs (two trainers on one server), a REJECT stops it; without one, it would say HELLO
        again on its next message and the two would take turns, splitting the samples between their
        runs. (One that crashed never reads it.)"""
        log.warning("%s replaces %s, last heard from %.1f s ago: the new trainer gets the "
                    "samples from now on; if the old one is still running, it is told to stop "
                    "(two trainers on one server would split the samples between their runs)",
                    new.label, old.label, time.time() - old.last_seen)
        self.reply("trainer", old.rid, f"replaced by another trainer (session "
                                       f"{new.session[:16]} at {new.address[:48]!r}): a "
                                       f"server serves one trainer at a time, so this one "
                                       f"stops; to keep it, stop the other trainer and restart "
                                       f"this one, or give each trainer its own server")

    def refuse(self, role: str, rid: bytes, peer: Peer | None, reason: str, told: str,
               retry_s: float | None = None) -> None:
        """Reject a message and tell its sender ``told`` (a REJECT, which a netrl client logs and
        acts on: it gives up, unless ``retry_s`` says when to try again)."""
        self.reject(role, rid, peer, reason)
        self.reply(role, rid, told, retry_s)

    def reject(self, role: str, rid: bytes, peer: Peer | None, reason: str) -> None:
        """Count a bad message in ``stats.rejected`` and log it (the sender is not told)."""
        self.stats.rejected += 1
        self.log_rejection(role, rid, peer, reason)

    def log_rejection(self, role: str, rid: bytes, peer: Peer | None, reason: str, first: int = 10) -> None:
        """Log the first ``first`` rejections of a connection, then every 1000th."""
        # a flood from ever new connections must not grow it forever
        if len(self._rejections_logged) > 10_000:
            self._rejections_logged.clear()
        self._rejections_logged[rid] += 1
        count = self._rejections_logged[rid]
        if worth_logging(count, first):
            who = peer.label if peer else f"unidentified {role} {rid[:24]!r}"
            log.warning("rejected a message from %s: %s (%d rejected from this peer)",
                        who, reason, count)

    def reply(self, role: str, rid: bytes, reason: str, retry_s: float | None = None) -> None:
        """A REJECT to a connection that may not be a peer (yet): a courtesy, never an error."""
        # netrl_version: what a client of another protocol version, which cannot read
        # the rest, names in its error
        body: dict[str, Any] = {"reason": reason, "netrl_version": __version__}
        if retry_s is not None:
            body["retry_s"] = retry_s
        msg = Message(MsgType.REJECT, "server", body=body)
        try:
            self.sockets.by_role[role].send_multipart([rid, *encode(msg)], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            pass  # the peer is gone or flooding us

    def failed_handshakes(self, role: str) -> None:
        """Count and log the connections on ``role``'s port that failed their handshake
        since the last call."""
        try:
            failed = self.sockets.failed_handshakes(role)
        except Exception:  # diagnostics must not take the relay down
            self.stats.internal_errors += 1
            log.exception("internal error while reading the %s port's handshake events", role)
            return
        for why in failed:
            count = self.stats.handshake_failed(role)
            if worth_logging(count):
                log.warning("a connection to the %s port failed its handshake: %s (%d so far)",
                            role, why, count)
