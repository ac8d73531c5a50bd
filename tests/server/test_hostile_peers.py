"""The server against peers that send well-formed but hostile numbers, ignore their window, or fight over the trainer
port (found by an audit of the running server): each once stopped the server, stalled honest workers, or split a
run's samples between two trainers."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import zmq

from netrl.errors import NetrlError
from netrl.monitor.status import format_status, query_status
from netrl.net.liveness import Liveness
from netrl.net.transport import ClientLink
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import encode, samples_message
from netrl.server.peers import MAX_COUNT, PeerTable, QueuedPacket
from netrl.server.peers import Peer as ServerPeer
from netrl.server.relay import memory_cost
from netrl.server.server import Server
from netrl.server.status import ServerStatus
from tests.fakes import NET, MakeServer, Peer, sample_buffer, wait_until


def progress(trainer: Peer, wanted: int, samples: int = 0) -> None:
    trainer.send(Message(MsgType.PROGRESS, "trainer", body={"trained_steps": 0, "samples": samples,
                                                            "wanted": wanted}))


# -- counters in heartbeats, and --status --------------------------------------------------------------------------
def test_heartbeat_counters_that_are_not_counts_are_ignored_and_status_keeps_answering(
        server: tuple[Server, zmq.Context], caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx = server
    assert srv.sockets.status_port is not None
    worker = Peer(ctx, srv.worker_port, "worker", "evil")
    assert worker.hello().type is MsgType.WELCOME
    stats: dict[Any, Any] = {"dropped_samples": float("nan"), "backlog_bytes": float("inf"), "produced": 2**64 - 1,
                             "backlog_packets": True, b"": 1, "version": -1, "acked_samples": 12.0}
    worker.send(Message(MsgType.HEARTBEAT, "evil", body={"stats": stats}))
    wait_until(lambda: srv.peers.workers()[0].bad_reports == 1, 5, "the heartbeat read", poll=0.02)
    assert srv.peers.workers()[0].reported == {"version": -1, "acked_samples": 12.0}
    assert srv.peers.workers()[0].produced == 0  # 2**64 - 1 is no count: it would overflow every PACE
    snapshot = query_status(srv.sockets.status_port)  # a kept NaN would make the server exit (int(nan): ValueError)
    assert snapshot["dropped"] == 0 and snapshot["workers"][0]["name"] == "evil"
    assert "evil" in format_status(snapshot)
    warnings = [r.getMessage() for r in caplog.records if "ignored 5 heartbeat counters" in r.getMessage()]
    assert len(warnings) == 1 and "worker 'evil'" in warnings[0] and "'dropped_samples'=nan" in warnings[0]
    for _ in range(5):  # every heartbeat says it again: logged a few times, not every time
        worker.send(Message(MsgType.HEARTBEAT, "evil", body={"stats": stats}))
    wait_until(lambda: srv.peers.workers()[0].bad_reports == 6, 5, "the five heartbeats read", poll=0.02)
    assert len([r for r in caplog.records if "heartbeat counters" in r.getMessage()]) == 3


def test_a_status_snapshot_that_fails_is_answered_and_the_server_keeps_serving(
        server: tuple[Server, zmq.Context], monkeypatch: pytest.MonkeyPatch) -> None:
    srv, ctx = server
    assert srv.sockets.status_port is not None

    def bug(self: ServerStatus) -> dict[str, Any]:
        raise ValueError("cannot convert float NaN to integer")

    monkeypatch.setattr(ServerStatus, "snapshot", bug)
    for _ in range(2):  # answered each time: a REP socket left without an answer would never answer again
        with pytest.raises(NetrlError, match=r"could not report its status .*cannot convert float NaN"):
            query_status(srv.sockets.status_port)
    monkeypatch.undo()
    assert query_status(srv.sockets.status_port)["session"] == srv.session
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    assert worker.hello().type is MsgType.WELCOME  # and the relay still runs


def test_a_status_line_that_fails_is_logged_and_the_loop_goes_on(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture,
                                                                 make_server: MakeServer) -> None:
    def bug(snapshot: dict[str, Any]) -> str:
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr("netrl.server.status.status_line", bug)
    srv, ctx = make_server(network=NET, status_interval_s=0.1)
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    assert worker.hello().type is MsgType.WELCOME
    wait_until(lambda: srv.stats["internal_errors"], 5, "a status line (every 0.1 s) to fail", poll=0.02)
    assert Peer(ctx, srv.worker_port, "worker", "w2").hello().type is MsgType.WELCOME
    assert "internal error in the server's loop" in caplog.text


# -- pacing ----------------------------------------------------------------------------------------------------
def test_one_huge_count_never_stalls_the_other_workers_pace(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()
    evil, honest = Peer(ctx, srv.worker_port, "worker", "evil"), Peer(ctx, srv.worker_port, "worker", "honest")
    evil.hello()  # paced first: if its PACE failed to encode, the PACEs after it would never be sent
    honest.hello()
    evil.send(Message(MsgType.HEARTBEAT, "evil", body={"stats": {"produced": 2**64 - 1}}))
    evil.send(samples_message(sample_buffer(5), "evil", evil.session, 1, 2**63 - 1))  # int64: the wire lets it by
    wait_until(lambda: srv.stats["samples_in"], 5, "the evil packet queued", poll=0.02)
    progress(trainer, 100)
    assert honest.expect(MsgType.PACE).body["allowance"] == 48  # (100 less the evil packet's 4 samples) / 2
    assert 0 < evil.expect(MsgType.PACE).body["allowance"] <= MAX_COUNT
    progress(trainer, 2**63 - 1, samples=-5)  # refused: counts from 0 to 2**53 only
    wait_until(lambda: srv.stats["rejected"], 5, "the PROGRESS refused", poll=0.02)
    assert srv.stats["rejected"] == 1 and srv.intake.progress is not None and srv.intake.progress["wanted"] == 100
    progress(trainer, 1000)
    assert honest.expect(MsgType.PACE).body["allowance"] > 50
    assert srv.stats["internal_errors"] == 0


def test_allowances_are_clamped_and_set_only_once_told() -> None:
    table = PeerTable()
    for name, produced in (("huge", MAX_COUNT), ("small", 10)):
        peer = ServerPeer(name.encode(), "worker", name, name, "?", Liveness(1.0, 3))
        peer.produced_up_to(produced)
        table.add(peer)
    raised = dict((p.name, a) for p, a in table.raised_allowances(2**62, idle_after_s=10.0))
    assert raised == {"huge": MAX_COUNT, "small": 10 + MAX_COUNT // 2}  # each fits a PACE
    assert [p.allowance for p in table.workers()] == [0, 0]  # not until the PACE is sent: a lost one is retried
    assert len(table.raised_allowances(2**62, idle_after_s=10.0)) == 2


def test_idle_workers_do_not_dilute_the_busy_workers_share(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()
    busy = Peer(ctx, srv.worker_port, "worker", "busy")
    busy.hello()
    idle = [Peer(ctx, srv.worker_port, "worker", f"idle{i}") for i in range(5)]
    for peer in idle:
        peer.hello()
    wait_until(lambda: len(srv.peers.workers()) == 6, 5, "six workers", poll=0.02)
    progress(trainer, 600)
    assert busy.expect(MsgType.PACE).body["allowance"] == 100  # all new: an equal share each
    assert all(p.expect(MsgType.PACE).body["allowance"] == 100 for p in idle)
    allowance, deadline = 100, time.monotonic() + 4 * NET.heartbeat_interval_s + 0.3
    while time.monotonic() < deadline:  # the busy worker produces all it may; the idle ones only keep alive
        busy.send(Message(MsgType.HEARTBEAT, "busy", body={"stats": {"produced": allowance}}))
        for peer in [trainer, *idle]:
            peer.send(Message(MsgType.HEARTBEAT, peer.name))
        while (msg := busy.recv(0.1)) is not None:  # paced again while the others were not idle yet
            allowance = msg.body["allowance"] if msg.type is MsgType.PACE else allowance
    produced = allowance
    busy.send(Message(MsgType.HEARTBEAT, "busy", body={"stats": {"produced": produced}}))
    wait_until(lambda: next(p for p in srv.peers.workers() if p.name == "busy").produced == produced, 5,
               "the busy worker's count", poll=0.02)
    while busy.recv(0.05) is not None:
        pass
    progress(trainer, 1200, samples=100)
    assert busy.expect(MsgType.PACE).body["allowance"] == produced + 1100  # all that is wanted, not a sixth
    for peer in idle:  # they keep their allowance, and take no new share while they produce nothing
        while (msg := peer.recv(0.05)) is not None:
            assert msg.type is not MsgType.PACE


# -- the send window -------------------------------------------------------------------------------------------
def test_a_worker_that_ignores_its_window_gets_nacks_and_leaves_room_for_the_others(make_server: MakeServer) -> None:
    frames = encode(samples_message(sample_buffer(5), "evil", "s", 1, 4))
    packet_bytes = sum(len(f) for f in frames)
    cost = memory_cost(QueuedPacket("evil", "s", 1, 4, frames, packet_bytes, 0.0))
    assert cost > 5 * packet_bytes  # a tiny packet: holding it costs far more than its bytes
    queue = 100 * cost
    srv, ctx = make_server(network=NET, max_queue_bytes=queue, spool_after_s=60, spool_max_bytes=20 * packet_bytes)
    assert srv.relay is not None
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()  # connected, but it grants no credit: packets wait at the server, in memory
    evil = Peer(ctx, srv.worker_port, "worker", "evil")
    assert evil.hello().body["window"] == queue // 2  # alone: half the memory, the rest is room for others
    for seq in range(1, 151):  # it ignores its window
        evil.send(samples_message(sample_buffer(5), "evil", evil.session, seq, seq * 4))
    # every packet held or refused (a fixed pause is too short for 150 packets on a loaded machine)
    wait_until(lambda: len(srv.relay.held) + srv.stats["window_refusals"] >= 150, 10, "the server to take all")
    held, held_packets = srv.relay.held_cost[evil.session], sum(s == evil.session for s, _ in srv.relay.held)
    assert queue // 2 - 2 * cost < held <= queue // 2 and srv.stats["samples_spooled"] == 0  # its share, no more
    replies = []
    while (msg := evil.recv(0.1)) is not None:
        replies += [msg] if msg.type in (MsgType.NACK, MsgType.ACK) else []
    nacks = [m for m in replies if m.type is MsgType.NACK]
    assert len(nacks) == 150 - held_packets and srv.stats["window_refusals"] == len(nacks)
    assert nacks[0].body["retry_s"] > 0 and "over this worker's window" in nacks[0].body["reason"]
    told = [m.body["window"] for m in replies if m.type is MsgType.ACK]
    assert told[0] == pytest.approx(queue // 2 * packet_bytes / cost, rel=0.05)  # the share, in its bytes
    assert f"packets refused beyond their worker's window {len(nacks)}" in format_status(srv.snapshot())
    honest = Peer(ctx, srv.worker_port, "worker", "honest")
    honest.hello()
    honest.send(samples_message(sample_buffer(5), "honest", honest.session, 1, 4))
    wait_until(lambda: srv.relay.held_cost.get(honest.session), 5, "the honest packet taken", poll=0.02)
    assert srv.relay.held_cost[honest.session] > 0  # in memory: room was left for it
    while (msg := honest.recv(0.1)) is not None:
        assert msg.type is not MsgType.NACK
    evil.send(samples_message(sample_buffer(5), "evil", evil.session, 1, 4))  # a resend of a held packet
    wait_until(lambda: srv.stats["resends_ignored"], 5, "the resend ignored", poll=0.02)
    assert srv.stats["resends_ignored"] == 1


def test_with_no_trainer_a_fast_worker_takes_only_its_share_of_the_spool(make_server: MakeServer) -> None:
    # (names and sessions of one length: every packet has the same size)
    packet_bytes = sum(len(f) for f in encode(samples_message(sample_buffer(5), "sim", "01234567", 1, 4)))
    srv, ctx = make_server(network=NET, spool_max_bytes=10 * packet_bytes)
    sim, robot = Peer(ctx, srv.worker_port, "worker", "sim"), Peer(ctx, srv.worker_port, "worker", "bot")
    sim.hello(), robot.hello()
    for seq in range(1, 11):  # no trainer: all to the spool, as fast as it can
        sim.send(samples_message(sample_buffer(5), "sim", sim.session, seq, seq * 4))
    wait_until(lambda: srv.stats["samples_spooled"] + srv.stats["samples_refused"] >= 40, 10, "all ten settled")
    replies = [m for m in iter(lambda: sim.recv(0.1), None) if m.type in (MsgType.ACK, MsgType.NACK)]
    acked = [seq for m in replies if m.type is MsgType.ACK for seq in m.body["seqs"]]
    nacks = [m for m in replies if m.type is MsgType.NACK]
    assert acked == [1, 2, 3, 4, 5] and [seq for m in nacks for seq in m.body["seqs"]] == [6, 7, 8, 9, 10]
    assert "would pass its share" in nacks[0].body["reason"] and nacks[0].body["retry_s"] > 0
    for seq in range(1, 6):
        robot.send(samples_message(sample_buffer(5), "bot", robot.session, seq, seq * 4))
    wait_until(lambda: srv.stats["samples_spooled"] >= 40, 10, "the robot's packets spooled")
    snap = srv.snapshot()
    assert {w["name"]: w["spooled_bytes"] for w in snap["workers"]} == {"sim": 5 * packet_bytes,
                                                                        "bot": 5 * packet_bytes}
    assert snap["stats"]["spool_share_refusals"] == 5
    assert "beyond its share of the spool 5 " in format_status(snap)


# -- two trainers ----------------------------------------------------------------------------------------------
def _trainer_link(ctx: zmq.Context, srv: Server, session: str) -> ClientLink:
    link = ClientLink(ctx, NET, "trainer", "trainer", session, srv.trainer_port)
    link.open()
    return link


def _drive(links: list[ClientLink], seconds: float) -> None:
    """What each trainer's network thread does: receive, heartbeat, reconnect."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for link in links:
            if link.sock is not None and link.sock.poll(5):
                link.receive()
            link.maintain()


def test_a_second_trainer_stops_the_first_with_a_reject_that_says_why(
        server: tuple[Server, zmq.Context], caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx = server
    first = _trainer_link(ctx, srv, "first-session")
    _drive([first], 0.3)
    assert first.ready
    second = _trainer_link(ctx, srv, "second-session")
    _drive([first, second], 2.0)  # heartbeats both ways: unless told to stop, the first would say HELLO again, for ever
    assert first.fatal is not None and not first.fatal.startswith("unknown peer")
    assert "replaced by another trainer (session second-session at '127.0.0.1')" in first.fatal
    assert "so this one stops; to keep it, stop the other trainer" in first.fatal and len(first.fatal) < 250
    assert second.ready and second.fatal is None
    assert srv.peers.trainer is not None and srv.peers.trainer.session == "second-session"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "replaces" in
                r.getMessage()]
    assert len(warnings) == 1 and "first-se" in warnings[0] and "second-s" in warnings[0]
    assert "last heard from" in warnings[0]
    first.close()
    second.close()


def test_a_trainer_reconnecting_with_its_session_is_not_told_to_stop(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    old = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert old.hello().type is MsgType.WELCOME
    blip = Peer(ctx, srv.trainer_port, "trainer", "trainer")  # the same process on a new connection
    blip.session = old.session
    assert blip.hello().type is MsgType.WELCOME
    heard = []
    while (msg := old.recv(0.3)) is not None:  # the server's news (its HEARTBEATs) may come; no REJECT
        heard.append(msg.type)
    assert MsgType.REJECT not in heard, heard  # nobody else took its place
    restarted = Peer(ctx, srv.trainer_port, "trainer", "trainer")  # after a crash: a new session, accepted at once
    assert restarted.hello().type is MsgType.WELCOME
    assert "replaced by another trainer" in blip.expect(MsgType.REJECT).body["reason"]
