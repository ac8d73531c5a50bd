"""The server with fake peers on loopback: relaying, the weights cache, pacing, and bad input."""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

import netrl
import netrl.protocol.wire
from netrl.config.sections import NetworkConfig
from netrl.errors import MalformedMessage, NetrlError, VersionMismatch
from netrl.launch import free_port
from netrl.monitor.status import format_status
from netrl.net.thread import Command, command_head
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import (
    BUNDLE_HEADER_ROOM,
    PROTOCOL_VERSION,
    buffer_from_message,
    decode,
    encode,
    samples_message,
)
from netrl.server.relay import SampleRelay
from netrl.server.server import Server
from netrl.server.spool import Spool
from tests.fakes import NET, MakeServer, Peer, sample_buffer, wait_until, weights_message


def test_late_joiner_gets_the_newest_weights_at_hello(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    trainer.send(weights_message(1, "t1"))
    trainer.send(weights_message(2, "t1"))
    wait_until(lambda: srv.weights.complete_version == 2, 5, "v2 cached", poll=0.02)
    worker = Peer(ctx, srv.worker_port, "worker", "late")
    t0 = time.monotonic()
    assert worker.hello().type is MsgType.WELCOME
    got = worker.expect(MsgType.WEIGHTS)
    assert time.monotonic() - t0 < 1.0
    assert got.policy_version == 2 and got.arrays["chunk"].view(np.float32)[0] == 2  # the newest only
    trainer.send(weights_message(3, "t1"))
    trainer.send(weights_message(4, "t1"))  # v3 is still unacknowledged: v4 replaces it at the server
    worker.send(Message(MsgType.ACK, "late", body={"seqs": [2]}))
    assert worker.expect(MsgType.WEIGHTS).policy_version in (3, 4)


def test_a_new_trainer_is_told_the_newest_version_any_trainer_published(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    first = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert first.hello().body["weights_version"] == -1  # nothing published yet
    first.send(weights_message(7, "t1"))
    first.send(weights_message(9, "t1"))
    wait_until(lambda: srv.weights.complete_version == 9, 5, "v9 cached", poll=0.02)
    second = Peer(ctx, srv.trainer_port, "trainer", "trainer")  # e.g. the same trainer restarted after a crash
    assert second.hello().body["weights_version"] == 9
    second.send(weights_message(3, "t2"))  # the cache now holds the new session's v3, but v9 was still published
    wait_until(lambda: srv.weights.complete_version == 3, 5, "the new session's v3 cached", poll=0.02)
    third = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert third.hello().body["weights_version"] == 9


def test_samples_are_bundled_to_the_trainer_within_its_credit(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker.hello()
    for seq in range(1, 4):
        worker.sock.send_multipart(encode(samples_message(sample_buffer(5), "w", worker.session, seq, seq * 4)))
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()
    seen, until = [], time.monotonic() + 0.5
    while time.monotonic() < until:
        msg = trainer.recv(0.05)
        seen += [msg.type] if msg else []
    assert MsgType.BUNDLE not in seen and srv.stats["bundles_out"] == 0  # nothing is sent without credit
    trainer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 1}))
    bundle = trainer.expect(MsgType.BUNDLE)
    parts = [buffer_from_message(decode(p)) for p in bundle.parts]
    # spooled (no trainer yet): >= 5 samples, then what else waits, well under max_bundle_bytes
    assert [p.seq for p in parts] == [1, 2, 3]
    assert all(p.worker == f"w/{worker.session}" for p in parts)


def test_compressed_images_are_relayed_as_they_came_and_checked_by_the_trainer(
        server: tuple[Server, zmq.Context]) -> None:
    """The server reads image packets' layout, not their pixels: it never inflates them (the trainer does)."""
    srv, ctx = server
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker.hello()
    sent = []
    for seq in (1, 2):
        frames = [bytes(f) for f in encode(samples_message(sample_buffer(50, image=True), "w", worker.session, seq,
                                                           seq * 49), "zstd")]
        i = 1 + [a["name"] for a in msgpack.unpackb(frames[0])["arrays"]].index("obs")
        assert msgpack.unpackb(frames[0])["arrays"][i - 1]["codec"] == "zstd"
        if seq == 1:  # its header says 12,800 bytes, as the header of the image does; the rest is garbage
            frames[i] = frames[i][:len(frames[i]) // 2] + bytes(len(frames[i]) - len(frames[i]) // 2)
        worker.sock.send_multipart(frames)
        sent.append(frames)
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()
    trainer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 1}))
    bundle = trainer.expect(MsgType.BUNDLE)
    assert [[bytes(f) for f in p] for p in bundle.parts] == sent and srv.stats["rejected"] == 0
    with pytest.raises(MalformedMessage, match="'obs': zstd data does not decompress"):
        decode(bundle.parts[0])
    assert buffer_from_message(decode(bundle.parts[1])).seq == 2


def test_pace_splits_the_trainers_wish_between_workers(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    workers = [Peer(ctx, srv.worker_port, "worker", f"w{i}") for i in range(2)]
    for w in workers:
        w.hello()
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()
    trainer.send(Message(MsgType.PROGRESS, "trainer", body={"trained_steps": 0, "samples": 0, "wanted": 100}))
    assert [w.expect(MsgType.PACE).body["allowance"] for w in workers] == [50, 50]


def test_bad_input_is_counted_and_the_server_keeps_relaying(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    attacker = Peer(ctx, srv.worker_port, "worker", "evil")
    attacker.sock.send_multipart([os.urandom(40)])  # random bytes before any HELLO
    attacker.sock.send_multipart([b"", b"", b""])
    attacker.hello()
    attacker.send(weights_message(99, "t1"))  # a worker may not publish weights
    frames = encode(samples_message(sample_buffer(5), "evil", attacker.session, 1, 5))
    header: dict[str, Any] = msgpack.unpackb(frames[0])
    header["arrays"][0]["dtype"] = "|O"
    attacker.sock.send_multipart([msgpack.packb(header), *frames[1:]])
    good = Peer(ctx, srv.worker_port, "worker", "good")
    good.hello()
    good.sock.send_multipart(encode(samples_message(sample_buffer(5), "good", good.session, 1, 5)))
    wait_until(lambda: srv.stats["rejected"] >= 4 and srv.stats["samples_in"], 5, "all of it read", poll=0.02)
    assert srv.stats["rejected"] == 4
    assert srv.weights.version == -1 and not srv.weights.parts  # the worker's weights were refused
    assert srv.stats["samples_in"] == 4  # only the good worker's packet (4 transitions) was queued
    assert {p.name for p in srv.peers.values()} == {"evil", "good"}


def test_messages_before_hello_get_a_reject_that_asks_for_hello(server: tuple[Server, zmq.Context],
                                                                caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx = server
    peer = Peer(ctx, srv.worker_port, "worker", "w")
    for _ in range(3):
        peer.send(Message(MsgType.HEARTBEAT, "w"))
        assert "say HELLO" in peer.expect(MsgType.REJECT).body["reason"]
        time.sleep(NET.heartbeat_interval_s)  # a connection gets one answer per heartbeat interval
    assert srv.stats["unknown_peer"] == 3 and srv.stats["rejected"] == 0  # counted, and shown by --status
    assert "messages before HELLO 3" in format_status(srv.snapshot())
    for _ in range(20):  # a burst: one answer, not twenty
        peer.send(Message(MsgType.HEARTBEAT, "w"))
    assert "say HELLO" in peer.expect(MsgType.REJECT).body["reason"]
    assert peer.recv(NET.heartbeat_interval_s / 2) is None
    wait_until(lambda: srv.stats["replies_withheld"] == 19, 5, "the burst counted", poll=0.02)
    logged = [r.getMessage() for r in caplog.records if "before HELLO" in r.getMessage()]
    assert len(logged) == 1 and "a heartbeat message before HELLO" in logged[0]  # once per connection


def test_a_worker_on_the_trainer_port_is_refused_with_the_reason(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    worker_on_trainer_port = Peer(ctx, srv.trainer_port, "worker", "w")
    reply = worker_on_trainer_port.hello()
    assert reply.type is MsgType.REJECT and "trainer port" in reply.body["reason"]


@pytest.mark.parametrize("role", ["worker", "trainer"])
@pytest.mark.parametrize("theirs", [1, 2, PROTOCOL_VERSION + 1])  # 1, 2: a netrl from before versions 2 and 3
def test_a_peer_of_another_protocol_version_is_refused_at_hello_and_both_sides_say_why(
        server: tuple[Server, zmq.Context], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
        role: str, theirs: int) -> None:
    srv, ctx = server
    other = Peer(ctx, srv.worker_port if role == "worker" else srv.trainer_port, role, "other")
    frames = encode(Message(MsgType.HELLO, "other", body={"role": role, "netrl_version": "0.0.1",
                                                          "worker_id": "other", "session": "s"}))
    header = msgpack.unpackb(frames[0])
    header["v"] = theirs  # its HELLO as that netrl sends it: only the version differs
    other.sock.send_multipart([msgpack.packb(header)])
    assert other.sock.poll(2000)
    reply = other.sock.recv_multipart()
    said = (f"peer speaks netrl protocol {theirs}, this process speaks protocol {PROTOCOL_VERSION}; "
            "peer runs netrl 0.0.1")
    assert decode(reply).body["reason"] == said
    assert f"{said}; install the same netrl version on the server and the {role}" in caplog.text
    assert srv.stats["rejected"] == 1 and not srv.peers  # logged, counted, not admitted
    # What that peer makes of the REJECT: the same wire code at its own version (netrl.net.transport then stops
    # the role with this message and what to install)
    monkeypatch.setattr(netrl.protocol.wire, "PROTOCOL_VERSION", theirs)
    with pytest.raises(VersionMismatch) as info:
        decode(reply)
    assert str(info.value) == (f"peer speaks netrl protocol {PROTOCOL_VERSION}, this process speaks protocol "
                               f"{theirs}; peer runs netrl {netrl.__version__}")


def test_silent_peers_are_declared_lost_with_the_backlog_a_worker_last_reported(
        server: tuple[Server, zmq.Context], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    srv, ctx = server
    quiet, busy = Peer(ctx, srv.worker_port, "worker", "quiet"), Peer(ctx, srv.worker_port, "worker", "busy")
    quiet.hello()
    busy.hello()
    busy.send(Message(MsgType.HEARTBEAT, "busy", body={"stats": {"backlog_packets": 7, "backlog_bytes": 3 << 20}}))
    assert len(srv.peers) == 2
    # neither answers again (killed, say): both are lost after NET's 1 s of silence
    wait_until(lambda: not len(srv.peers), 5, "both peers declared lost", poll=0.05)
    assert srv.stats["peers_lost"] == 2
    assert re.search(r"worker 'quiet' \(.*\) lost \(no message for 1\.0 s\)\n", caplog.text), caplog.text
    assert re.search(r"worker 'busy' \(.*\) lost \(no message for 1\.0 s\); it last reported 7 unacknowledged "
                     r"packets \(3\.0 MiB\): it resends them if it reconnects, and they are lost if it died",
                     caplog.text), caplog.text


def test_workers_beyond_max_workers_are_refused_with_the_key_to_raise(make_server: MakeServer) -> None:
    srv, ctx = make_server(network=NET, max_workers=2)
    first, second = Peer(ctx, srv.worker_port, "worker", "w1"), Peer(ctx, srv.worker_port, "worker", "w2")
    assert first.hello().type is MsgType.WELCOME and second.hello().type is MsgType.WELCOME
    third = Peer(ctx, srv.worker_port, "worker", "w3")
    reply = third.hello()
    assert reply.type is MsgType.REJECT and "already has 2 workers connected" in reply.body["reason"]
    assert "server.max_workers" in reply.body["reason"]
    assert first.hello().type is MsgType.WELCOME  # a connected worker saying HELLO again keeps its place
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME  # the cap is on workers only
    assert sorted(p.name for p in srv.peers.workers()) == ["w1", "w2"]
    assert srv.stats["refused_full"] == 1


def test_a_full_spool_refuses_packets_with_a_nack_that_says_why(make_server: MakeServer) -> None:
    frames = encode(samples_message(sample_buffer(5), "w", "s", 1, 5))
    packet_bytes = sum(len(f) for f in frames)
    srv, ctx = make_server(network=NET, spool_max_bytes=int(2.5 * packet_bytes))
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker.hello()
    replies = []
    for seq in range(1, 5):  # no trainer: each packet goes to the spool, which holds two
        worker.sock.send_multipart(encode(samples_message(sample_buffer(5), "w", worker.session, seq, seq * 4)))
        replies.append(worker.expect(MsgType.ACK, MsgType.NACK))
    assert [r.type for r in replies] == [MsgType.ACK, MsgType.ACK, MsgType.NACK, MsgType.NACK]
    assert replies[2].body["seqs"] == [3] and "spool are full" in replies[2].body["reason"]
    assert replies[2].body["retry_s"] > 0  # the worker keeps the packet and resends it later
    assert srv.stats["samples_refused"] == 8 and srv.stats["samples_spooled"] == 8
    snapshot = srv.snapshot()
    assert snapshot["refused"] == 8 and snapshot["dropped"] == 0 and len(srv.peers) == 1  # refused, not lost


def test_a_disk_that_refuses_the_spool_costs_neither_packets_nor_the_server(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, make_server: MakeServer) -> None:
    def disk_full(*args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def bug(*args: Any) -> None:
        raise RuntimeError("a bug in the loop")

    monkeypatch.setattr(Spool, "push", disk_full)
    monkeypatch.setattr(SampleRelay, "spool_stale", bug)  # fails on every pass of the loop
    srv, ctx = make_server(network=NET, max_packet_delay_s=0.01)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker.hello()
    packet = encode(samples_message(sample_buffer(5), "w", worker.session, 1, 4))
    worker.sock.send_multipart(packet)  # no trainer: it would go to the spool
    nack = worker.expect(MsgType.NACK)
    assert nack.body["reason"] == "the server cannot write its spool" and nack.body["retry_s"] > 0
    wait_until(lambda: srv.stats["internal_errors"] > 3, 5, "the loop to fail on a few passes", poll=0.02)
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME  # still serving, heartbeats and all
    trainer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 1}))
    worker.sock.send_multipart(packet)  # the worker kept it and resends: now it goes straight through
    parts = [buffer_from_message(decode(p)) for p in trainer.expect(MsgType.BUNDLE).parts]
    assert [p.seq for p in parts] == [1]
    assert srv.stats["spool_errors"] == 1 and srv.stats["internal_errors"] > 3
    logged = [r for r in caplog.records if "internal error in the server's loop" in r.getMessage()]
    assert len(logged) == 1  # once a minute at most, however often it fails


def test_an_unreadable_saved_layout_is_ignored_until_the_trainer_sends_its_own(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, make_server: MakeServer) -> None:
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "schema.json").write_text('{"act": "float32[2]", "obs"')  # cut short by a crash
    srv, ctx = make_server(network=NET)
    assert srv.schema is None and "ignoring the saved sample layout" in caplog.text
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    assert worker.hello().type is MsgType.WELCOME  # and it relays


def test_a_taken_status_port_costs_only_the_status_port(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                         make_server: MakeServer) -> None:
    from netrl.launch import free_port

    port = free_port()
    first, _ = make_server(network=NET, spool_dir=tmp_path / "a", status_port=port)
    second, ctx = make_server(network=NET, spool_dir=tmp_path / "b", status_port=port)
    worker = Peer(ctx, second.worker_port, "worker", "w")
    assert worker.hello().type is MsgType.WELCOME  # the second server relays all the same
    assert first.sockets.status is not None and second.sockets.status is None
    assert "relaying without a status port" in caplog.text and "server.status_port" in caplog.text


def test_workers_share_half_the_servers_memory_and_keep_to_their_share(make_server: MakeServer) -> None:
    from netrl.server.peers import QueuedPacket
    from netrl.server.relay import memory_cost
    from netrl.worker.link import WorkerLink

    frames = encode(samples_message(sample_buffer(500), "w", "s", 1, 499))
    packet_bytes = sum(len(f) for f in frames)
    cost = memory_cost(QueuedPacket("w", "s", 1, 499, frames, packet_bytes, 0.0))  # bytes, plus holding them
    queue = 20 * packet_bytes
    srv, ctx = make_server(network=NET, max_queue_bytes=queue, spool_after_s=60)
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()  # connected, but it grants no credit: packets wait at the server, in memory
    first = Peer(ctx, srv.worker_port, "worker", "first")
    assert first.hello().body["window"] == queue // 2
    link = WorkerLink(NET, "w", "s", srv.worker_port, None, max_backlog_bytes=1 << 30, send_window_bytes=1 << 30)
    link.start()
    try:
        shrunk = first.expect(MsgType.ACK)  # a second worker joined: the first one's share halves
        assert shrunk.body == {"seqs": [], "window": queue // 4}
        for seq in range(1, 41):  # 40 packets, twice what the server holds in memory
            body = encode(samples_message(sample_buffer(500), "w", "s", seq, seq * 499))
            link.command([command_head(Command.PACKET, seq, 499), *body])
        # a fixed 1.5 s, not a wait for one event: the checks below need the exchange settled (the link's window
        # full, every NACK counted at both ends), which no single counter marks
        for _ in range(15):  # (the fake peers keep alive)
            trainer.send(Message(MsgType.HEARTBEAT, "trainer"))
            first.send(Message(MsgType.HEARTBEAT, "first"))
            time.sleep(0.1)
        assert 0 < srv.relay.held_cost["s"] <= queue // 4  # its share of the memory, not 40 packets
        assert srv.stats["samples_spooled"] == 0  # and nothing overflowed to disk
        # WELCOME's window counts bytes, not what holding them costs: what its first window takes beyond its
        # share is refused (it resends it), and an ACK tells it the window that fits
        assert link.server_window == pytest.approx(queue // 4 * packet_bytes / cost, rel=0.01)
        assert link.counts["nacked_packets"] == srv.stats["window_refusals"] <= 2
    finally:
        link.halt(0.5)


def test_a_packet_the_trainer_could_not_accept_is_refused_for_good(make_server: MakeServer) -> None:
    net = NetworkConfig(heartbeat_interval_s=0.2, heartbeat_liveness=5, max_message_bytes=1 << 16)
    big = encode(samples_message(sample_buffer(1000), "w", "s", 1, 1000))  # ~40 KB: fits 64 KiB, not 64 less 32
    assert (1 << 16) - BUNDLE_HEADER_ROOM < sum(len(f) for f in big) < 1 << 16
    srv, ctx = make_server(network=net)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker.hello()
    worker.send(samples_message(sample_buffer(1000), "w", worker.session, 1, 1000))
    nack = worker.expect(MsgType.NACK)
    assert nack.body["seqs"] == [1] and nack.body["retry_s"] == 0  # never resent: it can never fit
    assert "network.max_message_bytes (65536)" in nack.body["reason"]
    worker.send(samples_message(sample_buffer(5), "w", worker.session, 2, 1005))
    assert worker.expect(MsgType.ACK).body["seqs"] == [2]  # the server carries on relaying
    assert srv.stats["rejected"] == 1 and srv.relay is not None and srv.relay.spool.packets == 1


def test_a_worker_with_a_larger_message_limit_drops_what_the_server_cannot_take(
        caplog: pytest.LogCaptureFixture, make_server: MakeServer) -> None:
    from netrl.worker.link import WorkerLink

    server_net = NetworkConfig(heartbeat_interval_s=0.2, heartbeat_liveness=5, max_message_bytes=1 << 16)
    big = encode(samples_message(sample_buffer(2000), "w", "s", 1, 2000))  # ~80 KB: over the server's 64 KiB
    srv, _ = make_server(network=server_net)
    link = WorkerLink(NET, "w", "s", srv.worker_port, None, max_backlog_bytes=1 << 30, send_window_bytes=1 << 30)
    link.start()
    try:
        deadline = time.monotonic() + 5
        while not link.link.ready and time.monotonic() < deadline:
            time.sleep(0.02)
        link.command([command_head(Command.PACKET, 1, 2000), *big])
        small = encode(samples_message(sample_buffer(5), "w", "s", 2, 2005))
        link.command([command_head(Command.PACKET, 2, 5), *small])
        assert link.flush(2, 5.0)  # the small one is acknowledged: the connection survived
        assert link.counts["rejected_packets"] == 1 and link.counts["rejected_samples"] == 2000
        assert link.counts["connections"] == 1 and link.counts["acked_samples"] == 5
    finally:
        link.halt(0.5)
    said = caplog.text
    assert "the server's network.max_message_bytes is 65536 and this worker's is 268435456" in said
    assert "packet 1 of 2000 samples is dropped" in said


def test_a_connection_that_never_finishes_its_handshake_is_closed_and_counted(caplog: pytest.LogCaptureFixture,
                                                                             make_server: MakeServer) -> None:
    import socket

    net = NetworkConfig(heartbeat_interval_s=0.2, heartbeat_liveness=5, handshake_timeout_s=0.5)
    srv, _ = make_server(network=net)
    conn = socket.create_connection(("127.0.0.1", srv.worker_port))  # a flood's half-open connection
    conn.settimeout(5.0)
    t0 = time.monotonic()
    try:
        while conn.recv(4096):  # the server's greeting, then nothing until it gives up on us
            pass
    except ConnectionResetError:
        pass
    finally:
        conn.close()
    assert time.monotonic() - t0 < 3.0  # ZeroMQ's default would hold it for 30 s
    deadline = time.monotonic() + 2
    while not srv.stats["failed_handshakes_worker"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.snapshot()["failed_handshakes"] == {"trainer": 0, "worker": 1}  # counted for --status
    assert "a connection to the worker port failed its handshake: it sent nothing before " in caplog.text


class _Backlog:
    """A socket stand-in with ``n`` messages waiting."""

    def __init__(self, n: int) -> None:
        self.waiting = n

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> list[Any]:
        if self.waiting == 0:
            raise zmq.Again()
        self.waiting -= 1
        return [zmq.Frame(b"rid"), zmq.Frame(b"msg")]


def test_a_flooded_port_is_drained_a_budget_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Between two passes the server's loop flushes bundles to the trainer: a burst from many workers must not hold
    # them up (draining everything at once would keep the server accepting for seconds, at 1% of its rate).
    srv = Server(network=NET, spool_dir=str(tmp_path / "spool"))
    seen: list[str] = []
    monkeypatch.setattr(srv, "_receive", lambda role, frames: seen.append(role))
    flood = _Backlog(100)
    srv._drain("worker", flood)  # type: ignore[arg-type]
    assert len(seen) == 32 and flood.waiting == 68  # the rest waits for the next pass
    for _ in range(3):
        srv._drain("worker", flood)  # type: ignore[arg-type]
    assert len(seen) == 100 and flood.waiting == 0
    srv._drain("worker", flood)  # type: ignore[arg-type]  # nothing waiting: returns at once
    assert len(seen) == 100


def test_a_server_that_cannot_bind_reports_the_error_and_no_shutdown_summary(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, make_server: MakeServer) -> None:
    import threading

    from netrl.errors import TransportError
    from netrl.launch import free_port

    first, _ = make_server(spool_dir=tmp_path / "first")
    second = Server(trainer_port=first.trainer_port, worker_port=free_port(), spool_dir=tmp_path / "second")
    with caplog.at_level(logging.INFO), pytest.raises(TransportError, match="could not bind"):
        second.run(threading.Event())
    assert "server stopped" not in caplog.text  # it never served: a summary of zeros would read like a normal stop


def test_a_busy_worker_hears_at_once_that_a_trainer_came_or_went(make_server: MakeServer) -> None:
    # If the news of whether a trainer is connected rode only on idle heartbeats, a worker whose packets keep the
    # link busy would keep "no trainer is connected to the server" in its status line for as long as it is busy.
    net = NetworkConfig(heartbeat_interval_s=1.0, heartbeat_liveness=10)
    srv, ctx = make_server(network=net, max_packet_delay_s=0.01)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    assert worker.hello().type is MsgType.WELCOME
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    told: list[tuple[float, int]] = []  # (when, trainer_connected) of each HEARTBEAT the worker got
    events: dict[str, float] = {}
    start, seq = time.monotonic(), 0
    while time.monotonic() - start < 3.0:
        elapsed = time.monotonic() - start
        if elapsed > 1.2 and "joined" not in events:
            assert trainer.hello().type is MsgType.WELCOME
            events["joined"] = time.monotonic()
        if elapsed > 2.2 and "left" not in events:
            trainer.send(Message(MsgType.BYE, "trainer", body={"reason": "done"}))
            events["left"] = time.monotonic()
        seq += 1  # a packet every 50 ms: spooled and acknowledged while no trainer is there, so never idle
        worker.send(samples_message(sample_buffer(5), "w", worker.session, seq, seq * 4))
        end = time.monotonic() + 0.05
        while (msg := worker.recv(max(0.0, end - time.monotonic()))) is not None:
            if msg.type is MsgType.HEARTBEAT and "stats" in msg.body:
                told.append((time.monotonic(), msg.body["stats"]["trainer_connected"]))
            if time.monotonic() >= end:
                break
    joined = [t - events["joined"] for t, connected in told if connected == 1]
    left = [t - events["left"] for t, connected in told if connected == 0 and t > events["left"]]
    assert joined and joined[0] < 0.5, told  # not after the next idle heartbeat interval (1 s)
    assert left and left[0] < 0.5, told


def test_samples_dropped_by_a_worker_that_left_still_count_in_the_snapshot(server: tuple[Server, zmq.Context]
                                                                           ) -> None:
    # Summing the drops of the workers connected now, a snapshot would lose those of a worker that dropped samples
    # and left: --status would say 0 while its log says they were lost.
    srv, ctx = server

    def report(peer: Peer, dropped: int) -> None:
        peer.send(Message(MsgType.HEARTBEAT, peer.name, body={"stats": {"dropped_samples": dropped}}))

    def dropped_after(expected: int) -> int:
        deadline = time.monotonic() + 2.0
        while srv.snapshot()["dropped"] != expected and time.monotonic() < deadline:
            time.sleep(0.02)
        return int(srv.snapshot()["dropped"])

    a, b = Peer(ctx, srv.worker_port, "worker", "a"), Peer(ctx, srv.worker_port, "worker", "b")
    assert a.hello().type is MsgType.WELCOME and b.hello().type is MsgType.WELCOME
    report(a, 7)
    report(b, 5)
    assert dropped_after(12) == 12
    a.send(Message(MsgType.BYE, "a", body={"reason": "done"}))
    wait_until(lambda: len(srv.snapshot()["workers"]) == 1, 5, "a's BYE", poll=0.02)
    assert dropped_after(12) == 12
    again = Peer(ctx, srv.worker_port, "worker", "a")
    again.session = a.session  # the same worker process, reconnected: its reports are cumulative
    assert again.hello().type is MsgType.WELCOME
    report(again, 9)
    assert dropped_after(14) == 14  # 9 + 5, not 7 + 9 + 5


def test_an_idle_server_with_long_heartbeats_stops_promptly(tmp_path: Path) -> None:
    # The loop sees the stop event only between polls: polling for heartbeat_interval_s / 2 with 60 s heartbeats
    # (the limit is a day), an idle server would take up to 30 s to obey Ctrl+C.
    import threading

    from netrl.launch import free_port

    srv = Server(trainer_port=free_port(), worker_port=free_port(), spool_dir=tmp_path / "spool",
                 network=NetworkConfig(heartbeat_interval_s=60.0, handshake_timeout_s=600.0))
    srv.open()
    stop = threading.Event()
    thread = threading.Thread(target=srv.run, args=(stop,), daemon=True)
    thread.start()
    time.sleep(0.5)  # time passes on purpose: the loop is now inside an idle poll
    t0 = time.monotonic()
    stop.set()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - t0 < 1.0


def test_a_server_runs_once_and_one_closed_before_running_holds_nothing(tmp_path: Path) -> None:
    def server() -> Server:
        return Server(trainer_port=ports[0], worker_port=ports[1], spool_dir=tmp_path / "spool")

    ports = free_port(), free_port()
    stop = threading.Event()
    stop.set()  # each run() opens, then closes at once
    srv = server()
    srv.run(stop)
    with pytest.raises(NetrlError, match=r"this Server \(worker port \d+\) is closed: .*; create a new Server"):
        srv.run(stop)  # it would serve nothing, without a word
    closed_first = server()
    closed_first.close()
    with pytest.raises(NetrlError, match="is closed"):
        closed_first.run(stop)  # it would bind the ports and lock the spool folder for good
    opened = server()
    opened.open()
    opened.close()
    last = server()
    last.open()  # the ports and the spool folder are free: nothing above kept them
    last.close()


def test_close_from_another_thread_stops_run_which_closes_its_own_sockets(tmp_path: Path) -> None:
    srv = Server(trainer_port=free_port(), worker_port=free_port(), spool_dir=tmp_path / "spool")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            srv.run(threading.Event())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: srv._listening, 10, "the server listening", poll=0.02)
    srv.close()  # returns once run() has closed
    assert not thread.is_alive() and errors == []
    again = Server(trainer_port=srv.trainer_port, worker_port=srv.worker_port, spool_dir=tmp_path / "spool")
    again.open()  # the ports and the spool folder are free
    again.close()


def test_a_peer_that_says_bye_and_closes_at_once_is_logged_as_a_clean_stop(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A worker stopping says BYE and closes its socket. A send to it in between (weights the trainer has just
    # published) finds the connection closed while the BYE waits unread: forgetting it then, the server would log
    # the worker as lost, and its BYE as "a bye message before HELLO", with a request to say HELLO to a peer that
    # has gone.
    srv = Server(trainer_port=free_port(), worker_port=free_port(), network=NET, spool_dir=tmp_path / "spool")
    srv.open()  # the loop's steps are driven by hand below, in the order the race takes
    ctx = zmq.Context()
    sock = srv.sockets.by_role["worker"]
    try:
        peer = Peer(ctx, srv.worker_port, "worker", "w")
        peer.send(Message(MsgType.HELLO, "w", body={"role": "worker", "netrl_version": "0.1.0", "worker_id": "w",
                                                    "session": peer.session}))
        wait_until(lambda: sock.poll(50) and (srv._drain("worker", sock) or True) and bool(srv.peers.workers()), 5,
                   "the HELLO")
        (known,) = srv.peers.workers()
        peer.send(Message(MsgType.BYE, "w", body={"reason": "worker stopping"}))
        assert sock.poll(2000)  # the BYE waits in the server's socket, unread
        peer.sock.close()
        with caplog.at_level(logging.INFO, logger="netrl"):
            wait_until(lambda: srv.out.send(known, Message(MsgType.HEARTBEAT, "server")) is False
                       and bool(srv.members.gone), 5, "a send to find the connection closed")
            srv._forget_gone()  # the end of the loop's pass
        assert "disconnected (worker stopping)" in caplog.text and "lost" not in caplog.text, caplog.text
        assert not srv.peers.workers() and "before HELLO" not in caplog.text
    finally:
        srv.close()
        ctx.destroy(0)
