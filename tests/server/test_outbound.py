"""What the server does when a peer's queue is full: messages that must arrive are kept and sent later."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import zmq

from netrl.net.liveness import Liveness
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import decode, samples_message, weight_parts
from netrl.server.counters import ServerCounters
from netrl.server.outbound import ACK_CHUNK, MAX_OUTBOX, Outbound
from netrl.server.peers import Peer
from netrl.server.weight_cache import WeightCache
from tests.fakes import NET, MakeServer, sample_buffer, wait_until
from tests.fakes import Peer as RawPeer


class FullSocket:
    """A ROUTER stand-in whose peer queue is full until ``room`` is set; records what it sent."""

    def __init__(self) -> None:
        self.room = False
        self.sent: list[Message] = []

    def send_multipart(self, frames: list[Any], flags: int = 0, copy: bool = True) -> None:
        if not self.room:
            raise zmq.Again()
        self.sent.append(decode([bytes(f) for f in frames[1:]]))


class FakeSockets:
    def __init__(self) -> None:
        self.by_role = {"worker": FullSocket()}


def make_outbound() -> tuple[Outbound, FullSocket, Peer, list[str]]:
    sockets, lost = FakeSockets(), []
    out = Outbound(sockets, ServerCounters(), WeightCache(1 << 20),  # type: ignore[arg-type]
                   lambda peer, why: (lost.append(why), out.forget(peer)))
    peer = Peer(b"w1", "worker", "w1", "s" * 16, "127.0.0.1", Liveness(1.0, 3))
    return out, sockets.by_role["worker"], peer, lost


def test_acks_nacks_and_paces_a_full_queue_refused_are_merged_and_sent_in_order_once_it_has_room() -> None:
    out, sock, peer, lost = make_outbound()
    out.must_send(peer, Message(MsgType.ACK, "server", body={"seqs": [1], "window": 100}))
    out.must_send(peer, Message(MsgType.PACE, "server", body={"allowance": 10}))
    out.must_send(peer, Message(MsgType.ACK, "server", body={"seqs": [2, 3], "window": 200}))
    out.must_send(peer, Message(MsgType.ACK, "server", body={"seqs": [4], "window": 300}))  # merges with the last
    out.must_send(peer, Message(MsgType.NACK, "server", body={"seqs": [5], "retry_s": 1.0, "reason": "full"}))
    out.must_send(peer, Message(MsgType.NACK, "server", body={"seqs": [6], "retry_s": 1.0, "reason": "full"}))
    out.must_send(peer, Message(MsgType.NACK, "server", body={"seqs": [7], "retry_s": 0, "reason": "bad"}))
    out.must_send(peer, Message(MsgType.PACE, "server", body={"allowance": 20}))  # replaces the waiting one
    out.retry()
    assert sock.sent == [] and out.waiting()  # still full: nothing is dropped
    sock.room = True
    out.retry()
    assert [(m.type, m.body) for m in sock.sent] == [
        (MsgType.ACK, {"seqs": [1], "window": 100}),
        (MsgType.ACK, {"seqs": [2, 3, 4], "window": 300}),
        (MsgType.NACK, {"seqs": [5, 6], "retry_s": 1.0, "reason": "full"}),
        (MsgType.NACK, {"seqs": [7], "retry_s": 0, "reason": "bad"}),
        (MsgType.PACE, {"allowance": 20}),
    ]
    assert not out.waiting() and lost == []
    out.must_send(peer, Message(MsgType.ACK, "server", body={"seqs": [8], "window": 1}))  # room: sent at once
    assert sock.sent[-1].body["seqs"] == [8] and not out.waiting()


def test_a_worker_that_reads_nothing_is_declared_lost_when_its_outbox_is_full() -> None:
    out, _, peer, lost = make_outbound()
    for seq in range(MAX_OUTBOX * ACK_CHUNK):  # merged ACKs fill MAX_OUTBOX messages of ACK_CHUNK seqs each
        out.must_send(peer, Message(MsgType.ACK, "server", body={"seqs": [seq], "window": 1}))
    assert lost == [] and len(out.outboxes[peer.rid]) == MAX_OUTBOX
    out.must_send(peer, Message(MsgType.ACK, "server", body={"seqs": [-1], "window": 1}))
    assert lost == [f"it read none of its last {MAX_OUTBOX} messages while its queue was full"]
    assert not out.waiting() and peer.rid not in out.outboxes  # forgotten: it resends when it reconnects


def slow_worker(ctx: zmq.Context, port: int) -> RawPeer:
    """A worker that queues almost nothing on its side, so the server's queue to it fills while it does not read."""
    worker = RawPeer.__new__(RawPeer)
    worker.sock = ctx.socket(zmq.DEALER)
    worker.sock.setsockopt(zmq.LINGER, 0)
    worker.sock.setsockopt(zmq.RCVHWM, 1)
    worker.sock.setsockopt(zmq.RCVBUF, 4096)
    worker.sock.connect(f"tcp://127.0.0.1:{port}")
    worker.role, worker.name, worker.session = "worker", "slow", "slow-session"
    return worker


def test_a_worker_whose_queue_was_full_still_gets_every_weight_part_and_every_ack(make_server: MakeServer) -> None:
    parts, part_bytes = 1500, 8192  # more parts than the server queues for one peer
    # The subject is a full queue, not liveness: on a loaded machine, sending 1,500 parts kept the
    # worker silent (and the server's thread from its loop) past NET's 1 s, and both peers were
    # forgotten before the queue ever filled.
    patient = dataclasses.replace(NET, heartbeat_liveness=100)
    srv, ctx = make_server(network=patient, min_samples_per_server_packet=1,
                           max_packet_delay_s=0.01)
    trainer = RawPeer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    trainer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 100}))
    worker = slow_worker(ctx, srv.worker_port)
    assert worker.hello().type is MsgType.WELCOME
    flat = np.arange(parts * part_bytes, dtype=np.uint32).astype(np.uint8)
    for msg in weight_parts("trainer", trainer.session, 1, 0, flat, [["w", "|u1", [flat.nbytes], 0]],
                            part_bytes):
        trainer.send(msg)

    def keep_alive() -> None:
        worker.send(Message(MsgType.HEARTBEAT, "slow"))
        trainer.send(Message(MsgType.HEARTBEAT, "trainer"))

    # the worker reads nothing meanwhile
    full = wait_until(lambda: keep_alive() or srv.stats["send_full"], 60,
                      "the slow worker's queue full", poll=0.1)
    assert full > 0  # its queue did fill
    for seq in (1, 2, 3):  # relayed and acknowledged by the trainer while the worker's queue is full
        worker.send(samples_message(sample_buffer(), "slow", worker.session, seq, 5 * seq))
    acked_bundles = 0
    deadline = time.monotonic() + 60.0  # (ends on its condition; the deadline stops a hang)
    while acked_bundles < 3 and time.monotonic() < deadline:
        msg = trainer.recv(0.1)
        if msg is not None and msg.type is MsgType.BUNDLE:
            trainer.send(Message(MsgType.ACK, "trainer", body={"seqs": [msg.seq]}))
            acked_bundles += len(msg.parts)
        keep_alive()
    assert acked_bundles == 3 and srv.stats["send_full"] > full  # the ACKs met a full queue too
    chunks: list[bytes] = []
    acked: set[int] = set()
    deadline = time.monotonic() + 60.0
    while (len(chunks) < parts or acked != {1, 2, 3}) and time.monotonic() < deadline:
        msg = worker.recv(0.05)  # now it reads everything
        if msg is None:
            keep_alive()
        elif msg.type is MsgType.WEIGHTS:
            chunks.append(msg.arrays["chunk"].tobytes())
        elif msg.type is MsgType.ACK:
            acked |= set(msg.body["seqs"])
    assert acked == {1, 2, 3}
    assert len(chunks) == parts and b"".join(chunks) == flat.tobytes()
    assert [p.name for p in srv.peers.workers()] == ["slow"]  # it was slow, not lost
