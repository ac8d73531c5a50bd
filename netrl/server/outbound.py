"""The server's sends to its peers, and what it does when a peer's queue is full.

The server's loop never blocks on a peer: it sends with NOBLOCK, and ZeroMQ refuses a send once a
peer's queue holds ``SNDHWM`` messages (a worker on a slow link receiving a large weight version, or
one that stopped reading for a while). What a refused send meant decides what happens to it:

* ACK, NACK and PACE must arrive, or a worker waits forever: for the acknowledgement of a packet
  the server no longer holds, or for an allowance the trainer already granted. They wait in the
  peer's outbox, in order, and are sent again on every pass of the loop; ACKs (and NACKs with the
  same reason) that pile up there merge into one message, and a newer PACE replaces an older one. A
  worker whose outbox still reaches :data:`MAX_OUTBOX` messages does not read at all: it is declared
  lost, and resends its unacknowledged packets when it reconnects.
* Weight parts resume where they stopped (:meth:`~netrl.server.weight_cache.WeightCache.stream`
  keeps each model's place).
* Bundles to the trainer are rebuilt by the relay; heartbeats, WELCOME and
  BYE are not worth keeping.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable
from typing import Any

import zmq

from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import encode
from netrl.server.counters import ServerCounters
from netrl.server.peers import Peer
from netrl.server.sockets import ServerSockets
from netrl.server.weight_cache import WeightCache

__all__ = ["ACK_CHUNK", "MAX_OUTBOX", "Outbound"]

log = logging.getLogger(__name__)

MAX_OUTBOX = 256  # messages a peer's outbox holds (up to ACK_CHUNK seqs each)
                  # before it is declared lost
ACK_CHUNK = 1000  # seqs one merged ACK or NACK carries (a header may list 40,000 items)
_MERGED = (MsgType.ACK, MsgType.NACK)


class Outbound:
    """Sends to peers on the server's sockets; ``lost`` is called for a peer whose connection
    closed or that does not read its messages."""

    def __init__(self, sockets: ServerSockets, stats: ServerCounters, weights: WeightCache,
                 lost: Callable[[Peer, str], None]) -> None:
        self.sockets, self.stats, self.weights, self.lost = sockets, stats, weights, lost
        # by routing id: messages a full queue refused
        self.outboxes: dict[bytes, collections.deque[Message]] = {}
        self.blocked: dict[bytes, Peer] = {}  # peers with an outbox, or a weight version whose
                                              # parts stopped

    def send(self, peer: Peer, msg: Message) -> bool:
        """Best effort: False if the peer's queue was full (the message is
        dropped) or it is gone."""
        return self.send_frames(peer, encode(msg)) is True

    def send_frames(self, peer: Peer, frames: list[Any]) -> bool | None:
        """True: sent; False: the peer's queue is full; None: its connection closed
        (the peer is lost)."""
        sock = self.sockets.by_role[peer.role]
        try:
            sock.send_multipart([peer.rid, *frames], zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.stats.send_full += 1
            return False
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                self.lost(peer, "its connection closed")
                return None
            raise
        peer.liveness.sent()
        return True

    def must_send(self, peer: Peer, msg: Message) -> None:
        """An ACK, NACK or PACE: sent now, or kept in the peer's outbox and sent
        when its queue has room."""
        box = self.outboxes.get(peer.rid)
        if box is None:
            sent = self.send_frames(peer, encode(msg))
            if sent is not False:
                return  # sent, or the peer is gone
            box = self.outboxes[peer.rid] = collections.deque()
            self.blocked[peer.rid] = peer
        last = box[-1] if box else None
        if last is not None and msg.type is last.type and _merges(last, msg):
            # with the newest window
            last.body = {**msg.body, "seqs": [*last.body["seqs"], *msg.body["seqs"]]}
            return
        if msg.type is MsgType.PACE:  # allowances only grow: the newest replaces any still waiting
            for i, waiting in enumerate(box):
                if waiting.type is MsgType.PACE:
                    del box[i]
                    break
        if len(box) >= MAX_OUTBOX:
            self.lost(peer, f"it read none of its last {MAX_OUTBOX} "
                            f"messages while its queue was full")
            return
        box.append(msg)

    def stream_weights(self, worker: Peer) -> None:
        """Send ``worker`` the parts of the newest version it lacks; the rest follows
        when its queue has room."""
        if self.outboxes.get(worker.rid):
            return  # its acknowledgements first, in order: retry() streams after them
        results: list[bool | None] = []

        def send(frames: list[Any]) -> bool:
            results.append(self.send_frames(worker, frames))
            return results[-1] is True

        self.stats.weights_out += self.weights.stream(worker, send)
        if results and results[-1] is False:
            self.blocked[worker.rid] = worker  # its queue filled mid-version: retry() resumes it

    def stream_weights_to(self, workers: Iterable[Peer]) -> None:
        """:meth:`stream_weights` to each of ``workers`` (a copy of the peer table's: a send may
        forget an unreachable worker)."""
        for worker in workers:
            self.stream_weights(worker)

    def retry(self) -> None:
        """Once per pass of the loop: send what full queues refused, oldest first,
        while they take it."""
        for rid, peer in list(self.blocked.items()):
            box = self.outboxes.get(rid)
            while box and self.send(peer, box[0]):
                box.popleft()
            if box or rid not in self.blocked:
                continue  # still full, or lost meanwhile
            self.outboxes.pop(rid, None)
            del self.blocked[rid]
            if peer.role == "worker":
                self.stream_weights(peer)

    def forget(self, peer: Peer) -> None:
        """The peer left (the server calls this from its forget): what waited for it is dropped; a
        worker resends its unacknowledged packets when it reconnects."""
        self.outboxes.pop(peer.rid, None)
        self.blocked.pop(peer.rid, None)

    def waiting(self) -> bool:
        return bool(self.blocked)


def _merges(last: Message, msg: Message) -> bool:
    if msg.type not in _MERGED or len(last.body["seqs"]) + len(msg.body["seqs"]) > ACK_CHUNK:
        return False
    # "spooled" and "delivered to the trainer" stay apart: a stopping worker tells them
    if msg.type is MsgType.ACK:
        return bool(last.body.get("spooled")) == bool(msg.body.get("spooled"))
    keys = ("reason", "retry_s", "layout")  # (a NACK's layout: which one refused them)
    return [last.body.get(k) for k in keys] == [msg.body.get(k) for k in keys]
