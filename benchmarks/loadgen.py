"""A load generator: many worker sessions in one process, each a real worker as the server sees it.

Every simulated worker holds netrl's own client link (:class:`~netrl.net.transport.ClientLink`: its
DEALER socket, the CURVE handshake with its own key on the server's allow-list, HELLO, heartbeats,
reconnects with back-off) and sends Pendulum sample packets built by netrl's own code: the HELLO's
packet bounds and the first packet come from a real :class:`~netrl.worker.packets.PacketMaker`,
every packet is a :func:`~netrl.protocol.wire.samples_message` encoded by
:func:`~netrl.protocol.wire.encode`. It counts the server's ACKs, acknowledges each weight version
as a worker's network thread does, and notes when each version reached each worker (it does not
decode the weights: a real worker does so on its own machine, off the server's clock).

One thread drives them all with one ``zmq.Poller``: a thread per worker (as ``WorkerLink`` is)
would cost a thousand threads. Each worker sends ``rows`` rows every ``period`` seconds, its first
packet at a random offset, so that the load is spread over the period as independent machines'.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from netrl.config.sections import NetworkConfig
from netrl.net.keys import client_keys
from netrl.net.transport import ClientLink, new_session
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.weight_formats import format_names
from netrl.protocol.wire import encode, samples_message
from netrl.samples import Buffer
from netrl.worker.packets import PacketMaker

__all__ = ["LoadGenerator", "SimWorker", "pendulum_rows"]


def pendulum_rows(maker: PacketMaker, rows: int, seed: int) -> Buffer:
    """``rows`` Pendulum rows (obs 3 floats, act 1 float) through a real worker's packet maker, and
    the packet it cuts from them."""
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1, 1, 3).astype(np.float32)
    maker.add(np.zeros(1, np.float32), obs, 0.0, False, False, {}, True, -1, networked=True)
    for _ in range(rows):
        obs = rng.uniform(-1, 1, 3).astype(np.float32)
        act = rng.uniform(-2, 2, 1).astype(np.float32)
        maker.add(act, obs, float(rng.uniform(-16, 0)), False, False, {}, False, -1,
                  networked=True)
    packet = maker.cut()
    assert packet is not None  # it holds ``rows`` transitions
    return packet


@dataclasses.dataclass
class SimWorker:
    """One simulated worker session: its link, its packet and what happened to it."""

    link: ClientLink
    packet: Buffer
    next_send: float
    seq: int = 0
    produced: int = 0
    sent: int = 0  # packets the link took
    refused: int = 0  # packets the link refused (not connected): a real worker keeps them
    acked: int = 0  # packets the server acknowledged
    nacked: int = 0  # refusals for now (the server's memory share full): sent again, as a worker does
    rejected: int = 0  # refusals for good (none expected: counted, never sent again)
    # seq -> frames, until acknowledged; and when a refused one goes again
    pending: dict[int, list[Any]] = dataclasses.field(default_factory=dict)
    retry: dict[int, float] = dataclasses.field(default_factory=dict)
    weights: dict[int, float] = dataclasses.field(default_factory=dict)  # version -> time.time()

    @property
    def reconnects(self) -> int:
        return max(0, self.link._connections - 1)


class LoadGenerator:
    """``names`` worker sessions against the server at ``net``'s worker port.

    Calling sequence::

        gen = LoadGenerator(net, keys_dir, names, rows=10, period=0.5)
        gen.open()                       # every link connects and says HELLO
        while ...: gen.step(0.01)        # poll, answer, send what is due, heartbeat
        gen.close()
    """

    def __init__(self, net: NetworkConfig, keys_dir: str | Path | None, names: list[str],
                 rows: int, period: float, seed: int = 0) -> None:
        self.net, self.rows, self.period = net, rows, period
        self.ctx = zmq.Context()
        # each link holds a DEALER and a handshake monitor: past zmq's default of 1,023 sockets
        self.ctx.set(zmq.MAX_SOCKETS, 4 * len(names) + 64)
        rng = random.Random(seed)
        self.workers: list[SimWorker] = []
        self.by_socket: dict[zmq.Socket, SimWorker] = {}
        self._polled: set[zmq.Socket] = set()
        now = time.monotonic()
        for i, name in enumerate(names):
            session = new_session()
            keys = None if keys_dir is None else client_keys(keys_dir, "worker", name)
            link = ClientLink(self.ctx, net, "worker", name, session, net.worker_port, keys=keys)
            maker = PacketMaker(name, session, 2 * rows, 1, None, "none", net.max_message_bytes,
                                None)
            packet = pendulum_rows(maker, rows, seed + i)
            link.hello_extra = {**maker.bounds(), "paced": False, "models": ["policy"],
                                "formats": format_names()}
            self.workers.append(SimWorker(link, packet, now + rng.uniform(0, period)))
        self.poller = zmq.Poller()
        self.sending = True  # False: the workers only answer and heartbeat (a run's drain)
        self.cpu_start = time.process_time()

    def open(self) -> None:
        for w in self.workers:
            w.link.open()

    def _sync_poller(self) -> None:
        """A link that reconnected holds a new socket: poll that one."""
        live = {w.link.sock: w for w in self.workers if w.link.sock is not None}
        for sock in self._polled - live.keys():
            self.poller.unregister(sock)
        for sock in live.keys() - self._polled:
            self.poller.register(sock, zmq.POLLIN)
        self._polled, self.by_socket = set(live), live

    def step(self, timeout_s: float) -> None:
        """One round: read what arrived, send the packets due, keep every link alive."""
        self._sync_poller()
        for sock, _ in self.poller.poll(int(timeout_s * 1000)):
            w = self.by_socket[sock]
            for msg in w.link.receive():
                self._handle(w, msg)
        now = time.monotonic()
        for w in self.workers:
            if self.sending and now >= w.next_send:
                self._send(w)
                w.next_send += self.period
                if w.next_send < now:  # fell behind (a loaded machine): no burst to catch up
                    w.next_send = now + self.period
            if w.retry:
                self._resend(w, now)
            w.link.maintain()

    def _send(self, w: SimWorker) -> None:
        w.seq += 1
        w.produced += self.rows
        frames = encode(samples_message(w.packet, w.link.name, w.link.session, w.seq, w.produced))
        if w.link.send(frames):
            w.sent += 1
            w.pending[w.seq] = frames
        else:
            w.refused += 1

    def _resend(self, w: SimWorker, now: float) -> None:
        for seq, due in list(w.retry.items()):
            if now >= due and seq in w.pending and w.link.send(w.pending[seq]):
                del w.retry[seq]

    def _handle(self, w: SimWorker, msg: Message) -> None:
        if msg.type is MsgType.ACK:
            for seq in msg.body["seqs"]:
                if isinstance(seq, int) and w.pending.pop(seq, None) is not None:
                    w.acked += 1
        elif msg.type is MsgType.NACK:
            retry_s = float(msg.body["retry_s"])
            for seq in msg.body["seqs"]:
                if not isinstance(seq, int) or seq not in w.pending:
                    continue
                if retry_s <= 0 or msg.body.get("layout") is not None:
                    w.rejected += 1
                    del w.pending[seq]
                else:
                    w.nacked += 1
                    w.retry[seq] = time.monotonic() + min(max(retry_s, 0.05), 30.0)
        elif msg.type is MsgType.WEIGHTS:
            if msg.body["part"] == msg.body["parts"] - 1:  # the whole version is here
                w.weights.setdefault(msg.policy_version, time.time())
                ack = {"seqs": [msg.policy_version], "model": msg.body.get("model", "policy"),
                       "format": msg.body.get("format", "float32")}
                w.link.send(encode(Message(MsgType.ACK, w.link.name, body=ack)))

    def totals(self) -> dict[str, Any]:
        return {"workers": len(self.workers),
                "connected": sum(w.link.ready for w in self.workers),
                "sent": sum(w.sent for w in self.workers),
                "refused": sum(w.refused for w in self.workers),
                "acked": sum(w.acked for w in self.workers),
                "nacked": sum(w.nacked for w in self.workers),
                "rejected": sum(w.rejected for w in self.workers),
                "reconnects": sum(w.reconnects for w in self.workers),
                "cpu_s": time.process_time() - self.cpu_start}

    def close(self) -> None:
        for w in self.workers:
            w.link.close()
        self.ctx.destroy(0)
