"""Every refusal answered: a refused HELLO gets a REJECT naming the field and the reason, a peer
whose message is refused gets a NOTICE (its connection stays), and no answer outgrows what it
answers (or ANSWER_FLOOR, less than a connection's handshake) or comes more than once per
connection per heartbeat interval."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import zmq

from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import decode, encode, samples_message
from netrl.server.admission import ANSWER_FLOOR, answer_within
from netrl.server.server import Server
from netrl.worker.link import WorkerLink
from tests.fakes import NET, Peer, sample_buffer, wait_until, weights_message


def raw_hello(peer: Peer, **fields: Any) -> list[bytes]:
    return encode(Message(MsgType.HELLO, peer.name, body={
        "role": "worker", "netrl_version": "0.1.0", "worker_id": peer.name,
        "session": peer.session, **fields}))


def answer(peer: Peer, frames: list[bytes]) -> tuple[Message, int]:
    """Send ``frames``; the REJECT or NOTICE that answers them, and its size on the wire."""
    peer.sock.send_multipart(frames)
    if not peer.sock.poll(2000):
        raise AssertionError(f"{peer.name} got no answer within 2 s")
    reply = peer.sock.recv_multipart()
    return decode(reply), sum(len(f) for f in reply)


@pytest.mark.parametrize(("fields", "named"), [({"max_rows": 0}, "'max_rows' is 0, not >= 1"),
                                               ({"max_rows": -5}, "'max_rows' is -5, not >= 1"),
                                               ({"max_bytes": 0}, "'max_bytes' is 0, not >= 1"),
                                               ({"paced": "no"}, "'paced' is a str, not a bool")])
def test_a_malformed_hello_is_answered_with_the_field_and_the_reason(
        server: tuple[Server, zmq.Context], fields: dict[str, Any], named: str) -> None:
    srv, ctx = server
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    frames = raw_hello(worker, **fields)
    reply, size = answer(worker, frames)
    # for good (no retry_s): the same HELLO would fail again
    assert reply.type is MsgType.REJECT and "retry_s" not in reply.body
    assert named in reply.body["reason"] and reply.body["reason"].startswith("hello ")
    assert size <= max(sum(len(f) for f in frames), ANSWER_FLOOR)
    assert srv.stats["rejected"] == 1 and srv.peers.worker_count() == 0


def test_a_flood_of_refused_hellos_gets_one_answer_per_heartbeat_interval(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    frames = raw_hello(worker, max_rows=0)
    for _ in range(50):
        worker.sock.send_multipart(frames)
    assert worker.expect(MsgType.REJECT).type is MsgType.REJECT
    assert worker.recv(NET.heartbeat_interval_s / 2) is None  # the other 49 counted, not answered
    wait_until(lambda: srv.stats["rejected"] == 50 and srv.stats["replies_withheld"] == 49, 5,
               "all 50 counted", poll=0.02)
    time.sleep(NET.heartbeat_interval_s)
    worker.sock.send_multipart(frames)  # an interval later: answered again
    assert worker.expect(MsgType.REJECT).type is MsgType.REJECT


def test_an_answer_never_outgrows_what_it_answers() -> None:
    long = "hello 'paced' " + "x" * 2000
    msg = Message(MsgType.REJECT, "server", body={"reason": long, "netrl_version": "0.1.0"})
    frames = answer_within(msg, 300)
    assert frames is not None and sum(len(f) for f in frames) <= 300
    reason = decode(frames).body["reason"]
    assert reason.startswith("hello 'paced' ") and reason.endswith("...")
    tiny = Message(MsgType.REJECT, "server",
                   body={"reason": "hello 'paced' is a str", "netrl_version": "0.1.0"})
    assert answer_within(tiny, 100) is None  # no room to say anything: not answered
    assert answer_within(tiny, 1000) is not None


def test_a_peer_whose_message_is_refused_gets_a_notice_and_keeps_its_connection(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    trainer.send(Message(MsgType.PROGRESS, "trainer",
                         body={"trained_steps": 0, "samples": 0, "wanted": -1}))
    notice = trainer.expect(MsgType.NOTICE)
    assert notice.body["refused"] and "progress counts {'wanted': -1}" in notice.body["reason"]
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    assert worker.hello().type is MsgType.WELCOME
    worker.send(weights_message(1, worker.session, sender="w"))  # only the trainer publishes
    notice = worker.expect(MsgType.NOTICE)
    assert "a worker may not send weights messages" in notice.body["reason"]
    bad = Message(MsgType.HEARTBEAT, "w", body={"stats": {}, "held": "soon"})
    worker.sock.send_multipart(encode(bad))  # within the interval: counted, not answered
    wait_until(lambda: srv.stats["replies_withheld"] == 1, 5, "the heartbeat refused", poll=0.02)
    worker.send(samples_message(sample_buffer(5), "w", worker.session, 1, 4))  # still connected
    wait_until(lambda: srv.stats["samples_in"] == 4, 5, "its packet accepted", poll=0.02)
    assert srv.stats["rejected"] == 3
    assert {p.name for p in srv.peers.values()} == {"trainer", "w"}


def test_a_worker_logs_the_notice_of_a_refused_message(caplog: pytest.LogCaptureFixture) -> None:
    link = WorkerLink(NET, "w", "s", 1, None, 1 << 20, 1 << 20)
    notice = Message(MsgType.NOTICE, "server", body={
        "cause": "refused", "reason": "heartbeat 'held' is a str", "refused": True})
    try:
        with caplog.at_level(logging.WARNING, logger="netrl.worker.link"):
            link.on_other_message(notice)
    finally:  # a link never halted leaves its context to the garbage collector, whose term() can
        link.halt()  # hang a later test
    assert "the server refused a message of this worker: heartbeat 'held' is a str" in caplog.text
    assert link.counts["refused_notices"] == 1
