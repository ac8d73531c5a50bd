"""Who may talk to the server, and the server's account of what it refused.

:class:`Admission` checks each HELLO (the right port, a worker name its CURVE key may use, the
packet bounds and pacing a worker declares) and adds the new :class:`~netrl.server.peers.Peer` to
the table. Being exempt from PACE is granted by the server's configuration
(``server.unpaced_workers`` names the keys), never claimed: a worker whose HELLO says ``paced``
false without that grant is paced like any other, and told why when a packet is held. It counts
each bad message in the server's stats and logs it, per peer, in lines a flood cannot multiply,
and answers every refusal it can: a REJECT to a connection that is not a peer (its HELLO was
refused or malformed: the reason names the field), a NOTICE to a peer whose message was refused
(its connection stays). An answer never outgrows the message it answers (or ``ANSWER_FLOOR``,
less than a connection's handshake) and a connection gets at most one per heartbeat interval, so
a flood never makes the server send more than it receives (``replies_withheld`` counts the
refusals left unanswered). It logs connections that failed their
ZeroMQ handshake before any message arrived. A trainer session that replaces another is logged
loudly, and the old trainer is told to stop (two trainers would split the samples between their
runs). The server's loop calls it; it never sends a WELCOME (that carries the server's state:
:meth:`netrl.server.membership.Membership.hello`).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Collection
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

__all__ = ["ANSWER_FLOOR", "UNDECLARED_ROWS", "Admission", "answer_within"]

log = logging.getLogger(__name__)

# The rows a packet may hold from a worker that declared no bound at HELLO (netrl's own workers
# always declare one): fifty times a default worker's packet, not server.max_rows_per_packet; its
# bytes follow from the trainer's layout (netrl.server.intake.SampleIntake.packet_limits).
UNDECLARED_ROWS = 1024
# connections whose last answer is remembered (a flood from ever new connections must not grow it)
MAX_REMEMBERED = 10_000
# An answer to a refused message may take this many bytes even if the message was smaller: a new
# connection sends more than that in ZeroMQ's handshake alone (a 64-byte greeting and its READY;
# with CURVE, over 500), and a connection gets one answer per heartbeat interval at most. A 116-byte
# HELLO is then told its whole reason.
ANSWER_FLOOR = 256


class Admission:
    """The server's gate: HELLO checks, rejections and failed handshakes (counted in
    ``stats``, logged sparingly)."""

    def __init__(self, net: NetworkConfig, sockets: ServerSockets, peers: PeerTable,
                 stats: ServerCounters, forget: Callable[[Peer], None], max_workers: int,
                 max_rows_per_packet: int = 65_536, unpaced: Collection[str] = ()) -> None:
        self.net, self.sockets, self.peers, self.stats = net, sockets, peers, stats
        self.max_workers, self.max_rows_per_packet = max_workers, max_rows_per_packet
        self.unpaced = frozenset(unpaced)  # server.unpaced_workers: keys exempt from PACE
        self.forget = forget  # the server's: drops a peer and whatever it was doing
        self._rejections_logged: collections.Counter[bytes] = collections.Counter()
        self._answered: dict[bytes, float] = {}  # connection -> when it was last answered
        self._denied = 0  # HELLOs that asked for paced false without the grant
        # why a worker may not connect for its key or name (the server's Revocations set it)
        self.revoked: Callable[[Peer], str | None] = lambda peer: None

    def hello(self, role: str, rid: bytes, msg: Message, rid_frame: Any,
              received: int | None = None) -> Peer | None:
        """The new peer for a HELLO on ``role``'s port, or None after refusing it
        with a REJECT that says why (``received``: the HELLO's bytes, which the REJECT never
        outgrows).

        Only an accepted HELLO replaces anything: the same connection saying HELLO again, its worker
        session reconnecting (same name and key), or the old trainer."""
        body = msg.body
        if body["role"] != role:
            self.refuse(role, rid, None, f"a {body['role']} connected to the {role} port",
                        f"this is the {role} port; a {body['role']} must connect to the other "
                        f"port", received=received)
            return None
        key = ""
        if self.sockets.auth is not None:
            key = self.sockets.auth.key_name(role, rid_frame)
            problem = self.sockets.auth.worker_name_problem(key, body["worker_id"]) if role == "worker" else None
            if problem:
                self.refuse(role, rid, None, problem, problem, received=received)
                return None
        liveness = Liveness(self.net.heartbeat_interval_s, self.net.heartbeat_liveness)
        peer = Peer(rid, role, body["worker_id"], body["session"], rid_frame.get("Peer-Address") or "?", liveness,
                    key=key)
        problem = ((self.revoked(peer) if role == "worker" else None)
                   or self.peers.session_problem(peer) or self._declared(peer, body))
        if problem:
            self.refuse(role, rid, None, problem, problem, received=received)
            return None
        replaced = self.peers.replaced_by(peer)
        if role == "worker" and not replaced and self.peers.worker_count() >= self.max_workers:
            self.stats.refused_full += 1
            # for now: a worker that died without BYE frees its place within the liveness window
            self.refuse(role, rid, None, f"{self.max_workers} workers are "
                                         f"connected (server.max_workers)",
                        f"the server already has {self.max_workers} workers connected, its "
                        f"server.max_workers: raise it in the server's config, or stop a worker",
                        retry_s=max(1.0, self.net.heartbeat_interval_s * self.net.heartbeat_liveness),
                        received=received)
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
        peer.asked_unpaced = body.get("paced", True) is False
        peer.paced = not (peer.asked_unpaced and self.unpaced_key(peer) in self.unpaced)
        if peer.asked_unpaced and peer.paced:
            self._denied += 1
            self.stats.unpaced_denied += 1
            if worth_logging(self._denied, first=5):
                log.warning("%s asks to be exempt from pacing (paced false at HELLO: a real-time "
                            "env, or worker.throttle false), but server.unpaced_workers does not "
                            "name %r: it is paced like any other worker, its packets held beyond "
                            "its PACE allowance; add %r to the server's server.unpaced_workers if "
                            "its env cannot wait (%d such HELLOs so far)", peer.label,
                            self.unpaced_key(peer), self.unpaced_key(peer), self._denied)
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

    @staticmethod
    def unpaced_key(peer: Peer) -> str:
        """What server.unpaced_workers names for ``peer``: its CURVE key's name (the shared key's,
        "worker", covers every worker using it), or without CURVE its worker name."""
        return peer.key or peer.name

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
               retry_s: float | None = None, received: int | None = None) -> None:
        """Reject a message and tell its sender ``told`` (a REJECT, which a netrl client logs and
        acts on: it gives up, unless ``retry_s`` says when to try again; ``received``: the bytes of
        the message refused, see :meth:`reply`)."""
        self.reject(role, rid, peer, reason)
        self.reply(role, rid, told, retry_s, received)

    def reject(self, role: str, rid: bytes, peer: Peer | None, reason: str,
               received: int | None = None) -> None:
        """Count a bad message in ``stats.rejected`` and log it; with ``received`` (its bytes) its
        sender is told why: a REJECT to a connection that is not a peer, a NOTICE to a peer (see
        :meth:`reply`)."""
        self.stats.rejected += 1
        self.log_rejection(role, rid, peer, reason)
        if received is None:
            return
        if peer is None:
            self.reply(role, rid, reason, received=received)
        else:
            self.notify(peer, reason, received)

    def log_rejection(self, role: str, rid: bytes, peer: Peer | None, reason: str, first: int = 10) -> None:
        """Log the first ``first`` rejections of a connection, then every 1000th."""
        # a flood from ever new connections must not grow it forever
        if len(self._rejections_logged) > MAX_REMEMBERED:
            self._rejections_logged.clear()
        self._rejections_logged[rid] += 1
        count = self._rejections_logged[rid]
        if worth_logging(count, first):
            who = peer.label if peer else f"unidentified {role} {rid[:24]!r}"
            log.warning("rejected a message from %s: %s (%d rejected from this peer)",
                        who, reason, count)

    def reply(self, role: str, rid: bytes, reason: str, retry_s: float | None = None,
              received: int | None = None) -> None:
        """A REJECT to a connection that may not be a peer (yet): a courtesy, never an error.

        ``received``: the bytes of the message it answers. The REJECT is then no larger, or
        ``ANSWER_FLOOR`` (its reason cut short, or it is not sent), and the connection gets at most
        one per heartbeat interval: a flood never makes the server send more than it receives."""
        # netrl_version: what a client of another protocol version, which cannot read
        # the rest, names in its error
        body: dict[str, Any] = {"reason": reason, "netrl_version": __version__}
        if retry_s is not None:
            body["retry_s"] = retry_s
        self._answer(role, rid, MsgType.REJECT, body, received)

    def notify(self, peer: Peer, reason: str, received: int) -> None:
        """A NOTICE to a connected ``peer`` whose message was refused: why, with the field. Its
        connection stays (a REJECT would end it). Limited as :meth:`reply`'s REJECTs are."""
        self._answer(peer.role, peer.rid, MsgType.NOTICE,
                     {"cause": "refused", "reason": reason, "refused": True}, received)

    def _answer(self, role: str, rid: bytes, kind: MsgType, body: dict[str, Any],
                received: int | None) -> None:
        """Send ``kind`` with ``body`` to ``rid`` on ``role``'s port, within the limits of
        :meth:`reply` when ``received`` is given (``replies_withheld`` counts what it
        withholds)."""
        if received is not None:
            now = time.monotonic()
            if now - self._answered.get(rid, -1e18) < self.net.heartbeat_interval_s:
                self.stats.replies_withheld += 1
                return
            frames = answer_within(Message(kind, "server", body=body), max(received, ANSWER_FLOOR))
            if frames is None:
                self.stats.replies_withheld += 1
                return
            if len(self._answered) > MAX_REMEMBERED:
                self._answered.clear()
            self._answered[rid] = now
        else:
            frames = encode(Message(kind, "server", body=body))
        self._send(role, rid, frames)

    def send(self, role: str, rid: bytes, msg: Message) -> None:
        """``msg`` to connection ``rid`` on ``role``'s port, peer or not (an answer to a request
        from an authenticated port: ``--revoke``)."""
        self._send(role, rid, encode(msg))

    def _send(self, role: str, rid: bytes, frames: list[Any]) -> None:
        try:
            self.sockets.by_role[role].send_multipart([rid, *frames], zmq.NOBLOCK, copy=False)
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


def answer_within(msg: Message, limit: int) -> list[Any] | None:
    """``msg`` encoded in at most ``limit`` bytes, its reason cut short if need be (None: not even a
    short one fits)."""
    frames = encode(msg)
    over = sum(len(f) for f in frames) - limit
    if over <= 0:
        return frames
    text = msg.body["reason"].encode()
    keep = len(text) - over - 4  # the "..." and a byte of the string's msgpack header
    if keep < 16:  # a reason too short to say anything
        return None
    msg.body["reason"] = text[:keep].decode(errors="ignore") + "..."
    frames = encode(msg)
    return frames if sum(len(f) for f in frames) <= limit else None
