"""Liveness under a backlog and over a long link: a client busy with a burst of messages keeps heartbeating and keeps
its connection, and the liveness window stretches with a measured round trip."""

from __future__ import annotations

import itertools
import time
from typing import Any

import zmq

from netrl.config.sections import NetworkConfig
from netrl.net.liveness import Liveness
from netrl.net.thread import NetThread
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import decode, encode

NET = NetworkConfig(heartbeat_interval_s=0.1, heartbeat_liveness=5)  # a silent peer is lost after 0.5 s
BACKLOG = 40
WORK_S = 0.05  # what each message costs the client: the backlog takes 2 s, four windows


class SlowClient(NetThread):
    """A role whose every message takes WORK_S to handle, as a bundle of thousands of packets does."""

    def __init__(self, port: int) -> None:
        super().__init__(NET, "trainer", "slow", "session1", port)
        self.handled = 0

    def on_message(self, msg: Message) -> None:
        time.sleep(WORK_S)  # the work itself
        self.handled += 1

    def on_command(self, frames: list[Any]) -> None:
        raise AssertionError("no commands in this test")


def test_a_client_working_through_a_backlog_keeps_heartbeating_and_its_connection() -> None:
    ctx = zmq.Context()
    server = ctx.socket(zmq.ROUTER)
    server.setsockopt(zmq.LINGER, 0)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client = SlowClient(port)
    client.start()
    try:
        rid, *frames = server.recv_multipart()
        assert decode(frames).type is MsgType.HELLO
        welcome = {"server_session": "s1", "heartbeat_interval_s": NET.heartbeat_interval_s,
                   "max_message_bytes": NET.max_message_bytes}
        server.send_multipart([rid, *encode(Message(MsgType.WELCOME, "server", body=welcome))])
        for seq in range(BACKLOG):  # the burst: it all waits at the client before the first one is handled
            server.send_multipart([rid, *encode(Message(MsgType.ACK, "server", body={"seqs": [seq]}))])
        hellos, heard, last_beat = 0, [time.monotonic()], time.monotonic()
        deadline = time.monotonic() + BACKLOG * WORK_S * 3
        while client.handled < BACKLOG and time.monotonic() < deadline:
            now = time.monotonic()
            if now - last_beat >= NET.heartbeat_interval_s:  # an idle server's heartbeats, behind the burst
                server.send_multipart([rid, *encode(Message(MsgType.HEARTBEAT, "server", body={}))])
                last_beat = now
            if server.poll(10):
                _, *frames = server.recv_multipart()
                msg = decode(frames)
                heard.append(time.monotonic())
                hellos += msg.type is MsgType.HELLO
        heard.append(time.monotonic())  # silent until the end counts too
        assert hellos == 0, "the client took the server for lost while it worked, and said HELLO again"
        assert client.handled == BACKLOG
        gaps = [b - a for a, b in itertools.pairwise(heard)]
        window = NET.heartbeat_interval_s * NET.heartbeat_liveness
        assert max(gaps) < window, f"the client was silent for {max(gaps):.2f} s (the server's window: {window} s)"
        assert client.link.ready
    finally:
        client.halt()
        server.close(linger=0)
        ctx.term()


def echo(a: Liveness, b: Liveness, one_way: float, clock: list[float]) -> None:
    """One heartbeat from ``a`` to ``b`` and back, each way taking ``one_way`` seconds of ``clock``."""
    body = a.stamp()
    clock[0] += one_way
    b.on_heartbeat(body)
    reply = b.stamp()
    clock[0] += one_way
    a.on_heartbeat(reply)


def test_the_liveness_window_stretches_with_a_long_round_trip_and_stays_on_a_short_one(monkeypatch: Any) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    near, far = Liveness(0.5, 6), Liveness(0.5, 6)
    peer_near, peer_far = Liveness(0.5, 6), Liveness(0.5, 6)
    for i in range(20):
        echo(near, peer_near, 0.0005, clock)  # a LAN
        echo(far, peer_far, 0.2 + 0.3 * (i % 4 == 0), clock)  # 400 ms, and a retransmission timeout now and then
    assert near.srtt is not None and abs(near.srtt - 0.001) < 1e-6
    assert near.window == 3.0  # as configured
    assert far.srtt is not None and 0.4 < far.srtt < 0.7
    assert 3.0 < far.window <= 30.0  # longer, within MAX_STRETCH times the configured one
    # a peer without round-trip fields (an older netrl) and nonsense echoes change nothing
    before = far.window
    far.on_heartbeat({})
    far.on_heartbeat({"echo": clock[0] + 50.0, "held": 0.0})  # from the future: not this clock's
    assert far.window == before
