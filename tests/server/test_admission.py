"""Who may say what to the server: identities tied to their port and HELLO, and the weights cache's checks.

Each test is a hostile or confused peer (found by an audit of the running server) that once got further than it
should: a copied routing id, a reused session, a packet naming another worker, a flood of sessions on one
connection, oversized heartbeat stats, weight parts that contradict each other, and acknowledgements of weights
never sent.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pytest
import zmq

from netrl.config.sections import NetworkConfig
from netrl.errors import MalformedMessage
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import decode, encode, samples_message
from netrl.server.peers import MAX_REPORTED
from netrl.server.server import Server
from netrl.server.weight_cache import WeightCache
from tests.fakes import MakeServer, Peer, sample_buffer, wait_until, weights_message

pytestmark = pytest.mark.server(max_weights_bytes=1 << 16)


def test_a_trainers_routing_id_on_the_worker_port_is_just_another_worker(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer", rid=b"trainer:abc:1")
    assert trainer.hello().type is MsgType.WELCOME
    copycat = Peer(ctx, srv.worker_port, "worker", "copycat", rid=b"trainer:abc:1")
    assert copycat.hello().type is MsgType.WELCOME  # a worker, known by (worker port, id)
    copycat.send(weights_message(10**6, session="evil", sender="trainer", value=0.0))
    wait_until(lambda: srv.stats["rejected"], 5, "the copycat's weights refused", poll=0.02)
    assert srv.weights.version == -1 and srv.stats["rejected"] == 1  # a worker may not send weights
    assert srv.peers.trainer is not None and srv.peers.trainer.name == "trainer"
    copycat.send(Message(MsgType.BYE, "copycat"))
    wait_until(lambda: not srv.peers.workers(), 5, "the copycat gone", poll=0.02)
    assert srv.peers.trainer is not None  # its BYE ended the copycat only
    trainer.send(weights_message(1, "t1"))
    wait_until(lambda: srv.weights.complete_version == 1, 5, "the trainer's weights cached", poll=0.02)


def test_a_session_belongs_to_one_worker_and_never_to_the_trainer(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    victim = Peer(ctx, srv.worker_port, "worker", "robot-1")
    assert victim.hello().type is MsgType.WELCOME
    thief = Peer(ctx, srv.worker_port, "worker", "robot-2")
    thief.session = victim.session
    reply = thief.hello()
    assert reply.type is MsgType.REJECT and "belongs to the connected worker 'robot-1'" in reply.body["reason"]
    assert srv.peers.workers_by_session[victim.session].name == "robot-1"  # refused before replacing anything
    impostor = Peer(ctx, srv.worker_port, "worker", "trainer")
    impostor.session = trainer.session
    assert impostor.hello().type is MsgType.WELCOME  # a worker like any other: the trainer is not replaced
    # (no wait: the server answered that HELLO once it had handled it)
    assert srv.peers.trainer is not None and srv.peers.trainer.session == trainer.session
    again = Peer(ctx, srv.worker_port, "worker", "robot-1")  # the victim itself, reconnecting, takes its session
    again.session = victim.session
    assert again.hello().type is MsgType.WELCOME
    assert len(srv.peers.workers()) == 2  # robot-1 (the new connection) and the impostor


def test_a_packet_must_come_from_the_worker_and_session_that_said_hello(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    victim, forger = Peer(ctx, srv.worker_port, "worker", "robot-1"), Peer(ctx, srv.worker_port, "worker", "robot-2")
    assert victim.hello().type is forger.hello().type is MsgType.WELCOME
    forged = sample_buffer(5)
    forged.rew[:] = 1e6
    forger.sock.send_multipart(encode(samples_message(forged, "robot-1", victim.session, 1, 5)))
    nack = forger.expect(MsgType.NACK)
    assert nack.body["seqs"] == [1] and nack.body["retry_s"] == 0
    assert "from worker 'robot-1'" in nack.body["reason"] and "said HELLO as 'robot-2'" in nack.body["reason"]
    forger.sock.send_multipart(encode(samples_message(forged, "robot-2", victim.session, 2, 5)))  # its name only
    assert "session" in forger.expect(MsgType.NACK).body["reason"]
    assert srv.stats["samples_in"] == 0 and srv.stats["rejected"] == 2
    victim.sock.send_multipart(encode(samples_message(sample_buffer(5), "robot-1", victim.session, 1, 5)))
    assert victim.expect(MsgType.ACK, MsgType.NACK).type is MsgType.ACK  # the real seq 1 is still its own
    wait_until(lambda: srv.stats["samples_in"], 5, "the victim's packet queued", poll=0.02)
    assert srv.stats["samples_in"] == 4


def test_hello_again_on_one_connection_replaces_its_own_entry(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    peer = Peer(ctx, srv.worker_port, "worker", "restless")
    for i in range(30):
        peer.session = f"session-{i}"
        assert peer.hello().type is MsgType.WELCOME
    wait_until(lambda: list(srv.peers.workers_by_session) == ["session-29"], 5, "the last HELLO's entry", poll=0.02)
    assert len(srv.peers) == 1 and list(srv.peers.workers_by_session) == ["session-29"]


def test_heartbeat_stats_keep_a_few_short_counters(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    worker = Peer(ctx, srv.worker_port, "worker", "chatty")
    assert worker.hello().type is MsgType.WELCOME
    stats: dict[str, Any] = {"dropped_samples": 3, "x" * 500: 1, "Bad\nName": 2, "text": "no"}
    stats.update({f"counter_{i}": i for i in range(2000)})
    worker.send(Message(MsgType.HEARTBEAT, "chatty", body={"stats": stats}))
    reported = wait_until(lambda: srv.peers.workers()[0].reported, 5, "the heartbeat's counters", poll=0.02)
    assert len(reported) == MAX_REPORTED and reported["dropped_samples"] == 3
    assert all(len(k) <= 40 and k.isidentifier() for k in reported)


def test_a_worker_acknowledges_only_the_weights_it_was_sent(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer, worker = Peer(ctx, srv.trainer_port, "trainer", "trainer"), Peer(ctx, srv.worker_port, "worker", "w")
    trainer.hello()
    trainer.send(weights_message(1, "t1"))
    worker.hello()
    assert worker.expect(MsgType.WEIGHTS).policy_version == 1
    worker.send(Message(MsgType.ACK, "w", body={"seqs": [2**62]}))  # a version it was never sent
    wait_until(lambda: srv.stats["rejected"], 5, "the acknowledgement refused", poll=0.02)
    assert srv.peers.workers()[0].version == -1 and srv.stats["rejected"] == 1
    worker.send(Message(MsgType.ACK, "w", body={"seqs": [1]}))
    trainer.send(weights_message(2, "t1"))
    assert worker.expect(MsgType.WEIGHTS).policy_version == 2  # it still gets every new version
    assert srv.peers.workers()[0].version == 1


def test_hello_text_that_could_forge_log_lines_is_refused() -> None:
    hello = {"role": "worker", "netrl_version": "0.1.0", "worker_id": "w1", "session": "s1"}
    for field, value in (("session", "ab\n12:00:00 I forged line"), ("session", "s" * 65),
                         ("netrl_version", "0.1\x1b[31m"), ("netrl_version", "9" * 100)):
        with pytest.raises(MalformedMessage, match=f"HELLO {field}"):
            decode(encode(Message(MsgType.HELLO, "w1", body={**hello, field: value})))


def test_a_bye_reason_is_logged_quoted_and_short(server: tuple[Server, zmq.Context],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx = server
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker.hello()
    with caplog.at_level(logging.INFO, logger="netrl.server.membership"):
        worker.send(Message(MsgType.BYE, "w", body={"reason": "bye\n12:00:00 I forged line" + "x" * 10_000}))
        line = wait_until(lambda: next((r.getMessage() for r in caplog.records if "disconnected" in r.getMessage()),
                                       None), 5, "the BYE logged", poll=0.02)
    assert "\n" not in line and "'bye\\n12:00:00 I forged line" in line and len(line) < 400


# -- the weights cache on its own -------------------------------------------------------------------------------
def part(cache: WeightCache, version: int, i: int, parts: int, offset: int, size: int, nbytes: int) -> str | None:
    layout = [["w", "|u1", [nbytes], 0]] if i == 0 else []
    return cache.add(version, i, parts, offset, nbytes, size, [f"v{version}p{i}".encode()], layout)


def test_weight_parts_must_continue_each_other() -> None:
    cache = WeightCache(max_bytes=1000)
    assert part(cache, 1, 0, 2, 0, 64, 128) is None
    assert "does not continue the 64 of 128 bytes" in str(part(cache, 1, 1, 2, 0, 64, 4096))  # another size
    assert "does not continue" in str(part(cache, 1, 1, 2, 96, 32, 128))  # a gap
    assert part(cache, 1, 1, 2, 64, 64, 128) is None and cache.complete_version == 1
    assert part(cache, 2, 0, 2, 0, 64, 128) is None
    assert "end at byte 96 of 128" in str(part(cache, 2, 1, 2, 64, 32, 128))  # the rest never written
    assert cache.version == cache.complete_version == 1  # v2 abandoned: v1 is what workers get


def test_versions_only_grow_and_stay_within_the_size_limit() -> None:
    cache = WeightCache(max_bytes=1000)
    assert part(cache, 5, 0, 1, 0, 64, 64) is None
    assert "older than v5" in str(part(cache, 1, 0, 1, 0, 64, 64))
    assert "over server.max_weights_bytes (1000)" in str(part(cache, 6, 0, 2**20, 0, 64, 2**62))
    assert part(cache, 5, 0, 1, 0, 64, 64) is None and cache.completed == 1  # a resend of v5: ignored
    assert cache.complete_version == 5


def test_a_version_its_trainer_left_unfinished_gives_way_to_the_last_complete_one(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()
    trainer.send(weights_message(1, "t1"))
    half = weights_message(2)
    half.body.update(parts=2, nbytes=2 * half.arrays["chunk"].nbytes)
    trainer.send(half)  # part 0 of 2, and then the trainer is gone
    early = Peer(ctx, srv.worker_port, "worker", "early")
    early.hello()
    assert early.expect(MsgType.WEIGHTS).policy_version == 2  # cut-through: the part that arrived
    trainer.send(Message(MsgType.BYE, "trainer"))
    wait_until(lambda: srv.weights.version == 1, 5, "v2 abandoned with its trainer", poll=0.02)
    assert srv.snapshot()["weights_version"] == 1
    late = Peer(ctx, srv.worker_port, "worker", "late")
    late.hello()
    got = late.expect(MsgType.WEIGHTS)
    assert got.policy_version == 1 and np.all(got.arrays["chunk"].view(np.float32) == 1)
    assert early.expect(MsgType.WEIGHTS).policy_version == 1  # and so does the worker left with half of v2


def test_two_connected_workers_of_one_name_are_warned_about_unless_the_first_fell_silent(
        caplog: pytest.LogCaptureFixture, make_server: MakeServer) -> None:
    network = NetworkConfig(heartbeat_interval_s=0.5, heartbeat_liveness=8)  # dropped once silent for 4 s
    srv, ctx = make_server(network=network)
    with caplog.at_level(logging.INFO, logger="netrl.server.admission"):
        first = Peer(ctx, srv.worker_port, "worker", "robot-1")
        other = Peer(ctx, srv.worker_port, "worker", "robot-2")
        assert first.hello().type is MsgType.WELCOME and other.hello().type is MsgType.WELCOME
        assert "has the name of" not in caplog.text
        twin = Peer(ctx, srv.worker_port, "worker", "robot-1")  # another process, another session: both are served
        assert twin.hello().type is MsgType.WELCOME
        said = wait_until(lambda: [r for r in caplog.records if "has the name of" in r.getMessage()], 5,
                          "the warning about the twin", poll=0.02)
        assert len(said) == 1 and said[0].levelno == logging.WARNING
        assert "give each worker its own --worker-id" in said[0].getMessage()
        assert said[0].getMessage().count("'robot-1'") == 2 and len(srv.peers.workers()) == 3
        time.sleep(2.2)  # robot-2 falls silent for over half that: as a worker whose machine went down
        restarted = Peer(ctx, srv.worker_port, "worker", "robot-2")  # its restart, under the same (default) name
        assert restarted.hello().type is MsgType.WELCOME
        wait_until(lambda: len([r for r in caplog.records if "has the name of" in r.getMessage()]) > 1, 5,
                   "the note about the restart", poll=0.02)
    said = [r for r in caplog.records if "has the name of" in r.getMessage()]
    assert len(said) == 2 and said[1].levelno == logging.INFO
    assert "taken for an earlier run of it that ended; it is dropped once silent for 4 s" in said[1].getMessage()
