"""Who is connected to the server: a peer joins with HELLO and leaves by BYE, by falling silent, or
when a send finds its connection gone.

:class:`Membership` answers an admitted HELLO with a WELCOME that carries the server's state (its
session, the worker's window, the newest weights and, in sync collection, the batch under way), then
starts streaming the newest weights to a worker. It heartbeats every peer and declares lost one that
stayed silent past its liveness window; it forgets a peer that said BYE, and a peer a send found
gone once the loop's pass has read that port again. Forgetting a peer drops what waited for it; a
trainer's leaving also tells the relay and the weights cache.
:class:`~netrl.server.admission.Admission` decides whether a HELLO is let in at all; the server's
loop calls both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import zmq

from netrl.config.sections import NetworkConfig
from netrl.protocol.checks import FORMAT_NAME, MAX_MODELS
from netrl.protocol.messages import PEER_NAME, Message, MsgType
from netrl.server.admission import Admission
from netrl.server.counters import ServerCounters
from netrl.server.intake import SampleIntake
from netrl.server.outbound import Outbound
from netrl.server.peers import Peer, PeerTable
from netrl.server.relay import SampleRelay
from netrl.server.sockets import ServerSockets
from netrl.server.status import ServerStatus
from netrl.server.weight_cache import WeightCache

__all__ = ["MAX_DECLARED_FORMATS", "Membership"]

log = logging.getLogger(__name__)

MAX_DECLARED_FORMATS = 64  # weight formats a worker may say it decodes
SCAN_FRACTION = 0.1  # of the heartbeat interval: how often heartbeats() visits every peer


class Membership:
    """Peers joining and leaving: WELCOMEs, heartbeats, and the peers the server forgets."""

    def __init__(self, net: NetworkConfig, session: str, sockets: ServerSockets, peers: PeerTable,
                 stats: ServerCounters, admission: Admission, out: Outbound, weights: WeightCache,
                 intake: SampleIntake, relay: SampleRelay, status: ServerStatus) -> None:
        self.net, self.session, self.sockets, self.peers = net, session, sockets, peers
        self.stats, self.admission, self.out, self.weights = stats, admission, out, weights
        self.intake, self.relay, self.status = intake, relay, status
        # found gone by a send, in this pass of the loop
        self.gone: dict[tuple[str, bytes], tuple[Peer, str]] = {}
        self._slow = 0  # workers whose link cannot carry float32 in the budget (WeightCache)
        # workers whose link rate is not measured yet: the trainer sends small parts for them (a
        # 1 MiB part could outlive a slow link's liveness window before it is found slow)
        self._unmeasured = 0
        self._slow_at = 0.0  # monotonic time to count them again
        # heartbeats(): when the next scan of every peer is due, and the news it told
        self._next_scan, self._scanned_news = 0.0, (-1, -1)

    def hello(self, role: str, rid: bytes, msg: Message, rid_frame: Any,
              received: int | None = None) -> None:
        """A HELLO (of ``received`` bytes): admitted (or refused, and told why) by
        :class:`Admission`, then welcomed with the server's state."""
        declared = _declared_weights(msg.body) if role == "worker" else ([], [])
        if isinstance(declared, str):
            self.admission.refuse(role, rid, None, declared, declared, received=received)
            return
        peer = self.admission.hello(role, rid, msg, rid_frame, received)
        if peer is None:
            return
        if role == "worker":
            peer.wants, peer.decodes = declared
        welcome = {"server_session": self.session,
                   "heartbeat_interval_s": self.net.heartbeat_interval_s,
                   "max_message_bytes": self.net.max_message_bytes}
        if role == "worker":
            welcome["window"] = peer.window = self.intake.window_for(peer)
            progress = self.intake.progress or {}
            newest = self.weights.newest.get("policy", -1)
            # sync collection: the batch of the weights it is about to get (a worker joining
            # mid-batch waits for the next: netrl.worker.runners.sync)
            if progress.get("batch_version", -1) == newest >= 0:
                welcome["weights_version"] = newest
                welcome["batch_steps"] = progress["batch_steps"]
        else:  # a restarted trainer numbers its weights after these: no number names two actors
            welcome["weights_version"] = self.weights.newest.get("policy", -1)
        welcome["models"] = self.weights.newest_versions()  # (each model's counter)
        self.out.send(peer, Message(MsgType.WELCOME, "server", body=welcome))
        if role == "trainer":
            self.relay.trainer_joined()
            self.weights.trainer_session(peer.session, self.peers.values())
        else:
            self.status.worker_joined(peer)
            self.out.stream_weights(peer)
            # told once per pass of the loop: joins come in bursts
            self.intake.workers_joined = True

    def on_bye(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        # cut short, and quoted unless printable: no forged log lines
        reason = msg.body.get("reason", "")[:200]
        log.info("%s disconnected (%s)", peer.label,
                 (reason if reason.isprintable() else repr(reason)) or "no reason given")
        self.forget(peer)

    def lost_on_send(self, peer: Peer, why: str) -> None:
        """A send found ``peer`` gone (its connection closed, or it reads nothing): it is forgotten
        at the end of this pass of the loop, after its socket is read once more. A client that stops
        says BYE and closes at once: a send to it in between finds the connection closed while the
        BYE still waits unread, and forgetting the peer right then would log a clean stop as a lost
        peer, and its BYE as a message before HELLO."""
        self.gone.setdefault((peer.role, peer.rid), (peer, why))

    def forget_gone(self, drain: Callable[[str], None]) -> None:
        """The end of the loop's pass: each port with a peer a send found gone is read once more
        (``drain``), and those peers still known are forgotten as lost."""
        gone, self.gone = self.gone, {}
        for role in {role for role, _ in gone}:
            drain(role)  # a BYE among them forgets its peer as a clean stop
        for (role, rid), (peer, why) in gone.items():
            if self.peers.get(role, rid) is peer:
                self.lost(peer, why)

    def lost(self, peer: Peer, why: str) -> None:
        """A peer went away without BYE. A worker's unacknowledged packets are lost if it died, so
        say how many."""
        self.stats.peers_lost += 1
        packets = peer.reported.get("backlog_packets", 0)
        nbytes = peer.reported.get("backlog_bytes", 0)
        if packets:
            log.warning("%s lost (%s); it last reported %d unacknowledged packets (%.1f MiB): it "
                        "resends them if it reconnects, and they are lost if it died", peer.label,
                        why, packets, nbytes / 2**20)
        else:
            log.info("%s lost (%s)", peer.label, why)
        self.forget(peer)

    def forget(self, peer: Peer) -> None:
        self.peers.remove(peer)
        self.out.forget(peer)
        if peer.role == "worker":
            self.status.worker_left(peer)
        if peer.role == "trainer":
            self.intake.progress = None
            self.relay.trainer_left()
            self.weights.trainer_left()
            self.out.stream_weights_to(self.peers.workers())

    def heartbeats(self, now: float) -> None:
        """Once per pass of the loop: a peer silent past its window is lost; a peer that heard
        nothing for an interval gets a HEARTBEAT, a worker also whenever the news in it changed."""
        # why a throttled worker waits: told as soon as it changes
        connected = int(self.peers.trainer is not None)
        # Messages waiting unread on a port may be the silent peer's: only a port the loop has
        # caught up with tells.
        unread = {role: bool(int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)
                  for role, sock in self.sockets.by_role.items()}
        # the layout: a worker keeps the packets another one refused, and sends them again once it
        # changes
        news: dict[str, int] = {"trainer_connected": connected, "layout": self.intake.layout_tag}
        told = (connected, news["layout"])
        # The scan below visits every peer: run on every pass of the loop, it made each message
        # cost O(peers) (1,024 workers: a millisecond a pass). A tenth of the interval delays a
        # heartbeat, or a loss, by that much at most; news goes out at the next pass.
        if now < self._next_scan and told == self._scanned_news:
            return
        self._next_scan = now + SCAN_FRACTION * self.net.heartbeat_interval_s
        self._scanned_news = told
        # a worker acts at random until it holds worker.init_random_frames (a busy worker hears
        # it in its PACEs)
        if self.intake.progress is not None:
            news["trainer_samples"] = self.intake.progress["samples"]
        # network.weight_format adaptive: the trainer adds the compact formats while a worker's
        # link is slow (counted once per heartbeat interval, not on every pass of the loop)
        if now >= self._slow_at:
            self._slow_at = now + self.net.heartbeat_interval_s
            self._slow = self.weights.slow_workers(self.peers.workers(), now)
            self._unmeasured = sum(w.link.rate is None for w in self.peers.workers())
        for peer in self.peers.values():
            if peer.liveness.expired(now) and not unread[peer.role]:
                self.lost(peer, f"no message for {peer.liveness.window:.1f} s")
            elif peer.role == "worker" and (peer.liveness.heartbeat_due(now) or peer.told != told):
                # a busy worker's link never falls idle: without this, it would keep the news of
                # the last idle moment
                body = {"stats": news, **peer.liveness.stamp()}
                if self.out.send(peer, Message(MsgType.HEARTBEAT, "server", body=body)):
                    peer.told = told
            elif peer.role == "trainer" and (peer.liveness.heartbeat_due(now)
                                             or peer.told != (self._slow, self._unmeasured)):
                # a trainer's link is busy with samples: told when a count changes
                counts = {"slow_workers": self._slow, "unmeasured_workers": self._unmeasured}
                body = {"stats": counts, **peer.liveness.stamp()}
                if self.out.send(peer, Message(MsgType.HEARTBEAT, "server", body=body)):
                    peer.told = (self._slow, self._unmeasured)
            elif peer.liveness.heartbeat_due(now):
                heartbeat = Message(MsgType.HEARTBEAT, "server", body=peer.liveness.stamp())
                self.out.send(peer, heartbeat)


def _declared_weights(body: dict[str, Any]) -> tuple[list[str], list[str]] | str:
    """A worker HELLO's ``models`` and ``formats`` (absent: the policy, in float32), or what is
    wrong with them."""
    models, formats = body.get("models", ["policy"]), body.get("formats", ["float32"])
    for key, names, rule, limit in (("models", models, PEER_NAME, MAX_MODELS),
                                    ("formats", formats, FORMAT_NAME, MAX_DECLARED_FORMATS)):
        if len(names) > limit or not all(isinstance(n, str) and rule.fullmatch(n) for n in names):
            # the field first: a REJECT quoting it may be cut short to the HELLO's size
            return (f"hello {key!r} is not a list of at most {limit} valid names (a model: 1 to "
                    "64 letters, digits, '.', '_' or '-'; a format: a lower-case letter, then up "
                    f"to 31 lower-case letters, digits or _): {str(names)[:120]}")
    return list(models), list(formats)
