"""The server drains a spool a bundle per pass of its loop, so its heartbeats keep their pace meanwhile."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
import zmq

from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import samples_message
from netrl.server import relay
from netrl.server.server import Server
from tests.fakes import NET, Peer, sample_buffer, wait_until

BUNDLE_COST_S = 0.25  # what building one bundle costs here: 4,096 packets take about this on a busy 2-core machine
PACKETS = 8


@pytest.mark.server(min_samples_per_server_packet=4, max_bundle_bytes=1)  # one packet (4 samples) per bundle
def test_draining_a_spool_keeps_heartbeats_to_every_worker_on_time(server: tuple[Server, zmq.Context],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    srv, ctx = server
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker.hello()
    for seq in range(1, PACKETS + 1):  # no trainer yet: spooled, and acknowledged at once
        worker.send(samples_message(sample_buffer(5), "w", worker.session, seq, seq * 5))
    wait_until(lambda: srv.spool.packets == PACKETS, 5, "the packets in the spool")
    encode_bundle = relay.encode_bundle

    def costly(*args: Any, **kwargs: Any) -> list[Any]:
        time.sleep(BUNDLE_COST_S)  # the cost itself, on the server's thread
        return encode_bundle(*args, **kwargs)

    monkeypatch.setattr(relay, "encode_bundle", costly)
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()
    trainer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": PACKETS}))  # the whole backlog at once
    heard, beats = [time.monotonic()], 0
    deadline = time.monotonic() + PACKETS * BUNDLE_COST_S + 2.0
    while srv.stats["bundles_out"] < PACKETS and time.monotonic() < deadline:
        for peer in (worker, trainer):  # both stay alive (the trainer reads its bundles later)
            peer.send(Message(MsgType.HEARTBEAT, peer.name, body={}))
        msg = worker.recv(0.1)
        if msg is not None:
            heard.append(time.monotonic())
            beats += msg.type is MsgType.HEARTBEAT
    assert srv.stats["bundles_out"] == PACKETS
    gap = max(b - a for a, b in itertools.pairwise(heard))
    # each pass builds one bundle and then heartbeats: the worker waits no longer than one bundle and an interval
    assert gap < BUNDLE_COST_S + 2 * NET.heartbeat_interval_s, f"the worker heard nothing for {gap:.2f} s"
    assert beats >= 2
    assert srv.stats["peers_lost"] == 0
    trainer.send(Message(MsgType.ACK, "trainer", body={"seqs": list(range(1, PACKETS + 1))}))
    wait_until(lambda: srv.spool.packets == 0, 5, "the spool drained")
