"""What the server takes from workers: the checks a sample packet passes before the relay, and how much each worker
may send.

::

    worker  --SAMPLES-->  sender, size and layout checks --> SampleRelay.accept()   (or a NACK: never resent)
    trainer --SCHEMA-->   the layout packets are checked against (saved in the spool folder for a restarted server)
    trainer --PROGRESS--> a PACE allowance per worker: the samples the trainer still wants, split between workers
    worker  <--ACK--      every ACK carries the worker's window: its share of the server's memory

The server's loop routes these messages here and supplies the send; :class:`~netrl.admission.Admission` counts and
logs what is rejected.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from netrl.admission import Admission
from netrl.config import NetworkConfig
from netrl.errors import ProtocolError, SampleRejected
from netrl.peers import Peer, PeerTable, QueuedPacket
from netrl.relay import SampleRelay
from netrl.schema import SampleSchema, load_schema, save_schema
from netrl.wire import BUNDLE_HEADER_ROOM, Message, MsgType, frames_nbytes

__all__ = ["SampleIntake"]

log = logging.getLogger(__name__)


class SampleIntake:
    """Worker packets checked for the relay, and each worker's window and PACE allowance.

    The server constructs it (no I/O), hands it the relay in :meth:`open`, and routes SAMPLES, SCHEMA and PROGRESS
    to its ``on_*`` methods; the relay acknowledges workers through :meth:`tell_worker`.
    """

    def __init__(self, net: NetworkConfig, max_queue_bytes: int, schema_path: Path, peers: PeerTable,
                 admission: Admission, stats: collections.Counter[str],
                 send: Callable[[Peer, Message], bool]) -> None:
        self.net, self.max_queue_bytes, self.schema_path = net, max_queue_bytes, schema_path
        self.peers, self.admission, self.stats, self.send = peers, admission, stats, send
        self.relay: SampleRelay | None = None
        self.schema: SampleSchema | None = None
        self.progress: dict[str, int] | None = None  # the trainer's latest PROGRESS (None: no trainer)
        self.workers_joined = False  # since the last pass of the server's loop

    def open(self, relay: SampleRelay) -> None:
        """Take the relay, and the layout a previous run saved (checked until the trainer sends its own)."""
        self.relay = relay
        self.schema = load_schema(self.schema_path)

    # -- packets in ----------------------------------------------------------------------------------------------
    def on_samples(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """A worker's packet: refused with a NACK unless it passes every check, else handed to the relay."""
        assert self.relay is not None
        if msg.body["session"] != peer.session or msg.sender != peer.name:  # the trainer trusts these names
            self._refuse(peer, msg.seq, f"the packet says it is from worker {msg.sender[:64]!r}, session "
                         f"{msg.body['session'][:16]!r}, but this connection said HELLO as {peer.name!r}, session "
                         f"{peer.session[:16]!r}")
            return
        nbytes = frames_nbytes(frames)
        if nbytes > self.relay.bundle_limit:
            self._refuse(peer, msg.seq, f"a packet of {nbytes} bytes cannot reach the trainer, whose messages are "
                         f"capped at network.max_message_bytes ({self.net.max_message_bytes}) with "
                         f"{BUNDLE_HEADER_ROOM} bytes kept for the bundle header: send fewer samples per packet")
            return
        if self.schema is not None:
            try:
                self.schema.check(msg.body, msg.arrays, peer.label)
            except SampleRejected as exc:
                self._refuse(peer, msg.seq, str(exc))
                return
        a = msg.arrays
        steps = int(np.count_nonzero(~(a["reset"] | a["context"])))
        peer.produced = max(peer.produced, msg.body["produced"])
        packet = QueuedPacket(peer.name, msg.body["session"], msg.seq, steps, frames, nbytes, time.monotonic())
        outcome = self.relay.accept(packet, self.peers.trainer is not None)
        if outcome in ("held", "spooled"):
            peer.samples += steps
            peer.packets += 1
            self.stats["samples_in"] += steps

    def _refuse(self, peer: Peer, seq: int, reason: str) -> None:
        """A packet that can never be relayed: logged, counted, and a NACK tells the worker not to resend it."""
        self.admission.reject("worker", peer.rid, peer, reason)
        self.send(peer, Message(MsgType.NACK, "server", body={"seqs": [seq], "retry_s": 0, "reason": f"rejected: "
                                                              f"{reason}"}))

    def on_schema(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """The trainer's sample layout: every packet is checked against it from now on, also after a restart."""
        try:
            schema = SampleSchema.from_wire(msg.body)
        except ProtocolError as exc:
            self.admission.reject("trainer", peer.rid, peer, str(exc))
            return
        if schema != self.schema:
            self.schema = schema
            log.info("sample layout from the trainer: %d fields, checked on every packet", len(schema.leaves))
            save_schema(self.schema_path, msg.body)

    # -- how much each worker may send ---------------------------------------------------------------------------
    def window(self) -> int:
        """Bytes each worker may have in flight: its share of ``max_queue_bytes`` (:meth:`PeerTable.window`)."""
        return self.peers.window(self.max_queue_bytes)

    def tell_worker(self, session: str, kind: MsgType, body: dict[str, Any]) -> None:
        """The relay's ACK or NACK to a worker; an ACK also tells it its current window."""
        worker = self.peers.workers_by_session.get(session)
        if worker is not None:  # a worker that left resends after reconnecting; the trainer deduplicates
            if kind is MsgType.ACK:
                body = {**body, "window": self.window()}
                worker.window = body["window"]
            self.send(worker, Message(kind, "server", body=body))

    def after_joins(self) -> None:
        """Workers joined since the last pass: everyone's share of the server's memory shrank, and the trainer's
        wanted samples are split between more workers."""
        if not self.workers_joined:
            return
        self.workers_joined = False
        window = self.window()
        for worker in self.peers.workers():
            if worker.window != window:
                self.tell_worker(worker.session, MsgType.ACK, {"seqs": []})
        self.pace()

    def on_progress(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """The trainer's PROGRESS (samples it has and wants): the workers' allowances follow it."""
        self.progress = dict(msg.body)
        self.pace()

    def pace(self) -> None:
        """Raise the workers' PACE allowances to cover the samples the trainer wants beyond those on the way."""
        if self.progress is not None:
            wanted_more = self.progress["wanted"] - self.progress["samples"]
            for worker in self.peers.raise_allowances(wanted_more - (self.relay.on_the_way() if self.relay else 0)):
                self.send(worker, Message(MsgType.PACE, "server", body={"allowance": worker.allowance}))
