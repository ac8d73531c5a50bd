"""The server's spool on disk: it resumes from HEAD, acknowledges out of order, skips damage and says where, and keeps
emptied segments for reuse."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from netrl.config.sections import NetworkConfig
from netrl.errors import FolderInUse
from netrl.launch import free_port
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import PROTOCOL_VERSION, encode, frames_nbytes, samples_message
from netrl.server.counters import ServerCounters
from netrl.server.layout_hold import MAX_LAYOUTS, LayoutHold
from netrl.server.peers import QueuedPacket
from netrl.server.relay import SampleRelay
from netrl.server.server import Server
from netrl.server.spool import Spool
from netrl.trainer.delivery import Deliveries
from netrl.trainer.link import TrainerLink
from tests.fakes import PATIENT_NET, Peer, flip_byte, running_server, sample_buffer, upto


def test_spool_resumes_from_head_and_acknowledges_out_of_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10_000).open()
    for seq in range(1, 7):
        spool.push([b"x" * 100], {"worker": "w", "session": "s", "seq": seq, "steps": 10})
    assert (spool.packets, spool.steps) == (6, 60)
    first = spool.take(upto(20, 0))
    second = spool.take(upto(20, 0))
    assert [p.meta["seq"] for p in first + second] == [1, 2, 3, 4]
    spool.ack(second[0].position)  # out of order: the head cannot move past 1 and 2 yet
    assert spool.packets == 6
    for p in first:
        spool.ack(p.position)
    assert (spool.packets, spool.steps) == (3, 30)  # 1, 2 and 3 are done; 4 is out but not acknowledged
    spool.close()
    again = Spool(tmp_path, max_bytes=10_000).open()  # a restarted server resends from the persisted head
    assert [p.meta["seq"] for p in again.take(upto(1000, 0))] == [4, 5, 6]
    again.rewind()
    assert [p.meta["seq"] for p in again.take(upto(1, 0))] == [4]
    again.rewind()
    assert [p.meta["seq"] for p in again.take(upto(1, 250))] == [4, 5]  # then while 100-byte packets fit
    again.rewind()
    assert [p.meta["seq"] for p in again.take(upto(0, 50))] == [4]  # at least one packet, however big
    assert not again.fits(10_000) and again.fits(100)
    again.close()


def three_packets_first_acked(folder: Path) -> Spool:
    """A closed spool of packets 1 to 3 whose HEAD has moved past packet 1."""
    spool = Spool(folder, max_bytes=10_000).open()
    for seq in range(1, 4):
        spool.push([b"x" * 100], {"worker": "w", "session": "s", "seq": seq, "steps": 10})
    spool.ack(spool.take(upto(1, 0))[0].position)
    spool.close()
    return spool


@pytest.mark.parametrize("head", ["{torn", '{"segment": 9, "offset": 0}', '{"segment": 1, "offset": 30}',
                                  '{"segment": 1, "offset": -5}', '{"segment": 1e400, "offset": 0}'])
def test_an_unreadable_spool_head_resends_the_spool_from_its_start_and_loses_nothing(
        tmp_path: Path, head: str, caplog: pytest.LogCaptureFixture) -> None:
    three_packets_first_acked(tmp_path)
    (tmp_path / "HEAD").write_text(head)  # garbage, a position past the log's end, or inside a packet
    again = Spool(tmp_path, max_bytes=10_000).open()
    assert [p.meta["seq"] for p in again.take(upto(1000, 0))] == [1, 2, 3]  # 1 again: the trainer discards it
    unreadable = ("{torn", '{"segment": 1, "offset": -5}', '{"segment": 1e400, "offset": 0}')
    problem = "HEAD is unreadable" if head in unreadable else "where the spool has no readable packet"
    assert problem in caplog.text and "sent again from its start" in caplog.text
    again.close()


def test_a_damaged_spool_packet_is_reported_and_the_others_are_sent(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path, max_bytes=10_000).open()
    for seq in range(1, 5):
        spool.push([b"x" * 100], {"worker": "w", "session": "s", "seq": seq, "steps": 10})
    spool.close()
    flip_byte(spool.log, 1)
    with caplog.at_level(logging.WARNING, logger="netrl.storage.segments"):
        again = Spool(tmp_path, max_bytes=10_000).open()  # damage is skipped and reported, not raised
    assert (again.packets, again.steps) == (3, 30)
    taken = again.take(upto(1000, 0))
    assert [p.meta["seq"] for p in taken] == [1, 3, 4]
    assert "is damaged from offset" in caplog.text and "are lost and skipped" in caplog.text
    for p in taken:
        again.ack(p.position)
    again.close()
    assert Spool(tmp_path, max_bytes=10_000).open().packets == 0  # the head moved past the damage: none sent again


@pytest.mark.parametrize("where", ["data", "header"])
def test_damage_at_the_spool_head_is_skipped_or_resends_the_spool_and_says_where_it_is(
        tmp_path: Path, where: str, caplog: pytest.LogCaptureFixture) -> None:
    spool = three_packets_first_acked(tmp_path)
    head = json.loads((tmp_path / "HEAD").read_text())
    # Packet 2, where HEAD points, is damaged: HEAD itself reads well.
    flip_byte(spool.log, 1, back=3 if where == "data" else (list(spool.log.read())[1].next.offset - head["offset"]))
    again = Spool(tmp_path, max_bytes=10_000).open()
    taken = [p.meta["seq"] for p in again.take(upto(1000, 0))]
    if where == "data":  # the record still starts at HEAD, and a reader skips it: nothing is sent again
        assert taken == [3] and "is damaged from offset" in caplog.text and "HEAD" not in caplog.text
    else:  # no record can be found at HEAD: the whole spool again (1 too; the trainer discards it)
        assert taken == [1, 3]
        assert (f"HEAD leads to {(head['segment'], head['offset'])}, where the spool has no readable packet"
                in caplog.text and "sent again from its start" in caplog.text and "is unreadable" not in caplog.text)
    again.close()


def test_damage_found_while_the_server_runs_is_skipped_and_the_spool_still_drains(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path, max_bytes=100_000, segment_bytes=1_000).open()
    for seq in range(1, 9):  # about two 400-byte packets per segment
        spool.push([b"x" * 400], {"worker": "w", "session": "s", "seq": seq, "steps": 10})
    assert (spool.packets, spool.steps) == (8, 80)
    segments = spool.log.segments()
    (tmp_path / f"{segments[1]:08d}.seg").unlink()  # packets 3 and 4, deleted under the running server
    flip_byte(spool.log, -1)  # and packet 8, the newest, damaged on disk
    with caplog.at_level(logging.WARNING, logger="netrl.storage.segments"):
        taken = spool.take(upto(1000, 1 << 20))  # not FileNotFoundError on every try, stalling the spool
    assert [p.meta["seq"] for p in taken] == [1, 2, 5, 6, 7]
    assert "was deleted while in use" in caplog.text and "is damaged from offset" in caplog.text
    assert not spool.pending() and spool.take(upto(1000, 1 << 20)) == []  # not empty bundles for ever
    for p in taken:
        spool.ack(p.position)
    assert (spool.packets, spool.steps, spool.bytes) == (0, 0, 0)  # the lost packets do not stay counted
    spool.push([b"y" * 400], {"worker": "w", "session": "s", "seq": 9, "steps": 10})
    assert spool.pending() and [p.meta["seq"] for p in spool.take(upto(1, 0))] == [9]
    spool.close()


def test_a_spool_segment_deleted_under_its_head_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path, max_bytes=100_000, segment_bytes=1_000).open()
    for seq in range(1, 7):  # about two 400-byte packets per segment
        spool.push([b"x" * 400], {"worker": "w", "session": "s", "seq": seq, "steps": 10})
    spool.ack(spool.take(upto(1, 0))[0].position)
    spool.close()
    assert json.loads((tmp_path / "HEAD").read_text())["segment"] == 1
    (tmp_path / "00000001.seg").unlink()  # by hand, with packet 2 in it
    with caplog.at_level(logging.WARNING, logger="netrl.server.spool"):
        again = Spool(tmp_path, max_bytes=100_000, segment_bytes=1_000).open()
    assert [p.meta["seq"] for p in again.take(upto(1000, 0))] == [3, 4, 5, 6]
    assert "segment files 00000001.seg to 00000001.seg are missing" in caplog.text and "are lost" in caplog.text
    again.close()


@pytest.mark.parametrize("max_bytes", [3_000, 16_000, 1 << 20])
def test_spool_keeps_emptied_segments_for_reuse_within_a_quarter_of_its_cap(tmp_path: Path, max_bytes: int) -> None:
    spool = Spool(tmp_path, max_bytes=max_bytes, segment_bytes=1_000).open()
    for seq in range(12):  # about one 900-byte packet per segment
        while not spool.fits(900):
            for p in spool.take(upto(1, 0)):
                spool.ack(p.position)
            spool.close()  # persists the head, which drops the emptied segments
        spool.push([b"x" * 900], {"worker": "w", "session": "s", "seq": seq, "steps": 1})
    for p in spool.take(upto(1 << 30, 0)):
        spool.ack(p.position)
    spool.close()
    free = list(tmp_path.glob("*.free"))
    assert sum(f.stat().st_size for f in free) <= max_bytes // 4
    assert len(free) == min(4, max_bytes // 4 // 1_000)  # 0 for the smallest spool: it keeps nothing
    assert Spool(tmp_path, max_bytes=max_bytes, segment_bytes=1_000).open().packets == 0


def test_a_second_server_on_a_spool_in_use_is_refused_before_touching_it(tmp_path: Path) -> None:
    with running_server(network=PATIENT_NET, spool_dir=tmp_path / "spool"):
        second = Server(trainer_port=free_port(), worker_port=free_port(), spool_dir=tmp_path / "spool")
        with pytest.raises(FolderInUse, match="spool folder .* is in use .*another spool folder "
                                              r"\(config.json: server.spool_dir\)"):
            second.open()
        second.close()
    third = Server(trainer_port=free_port(), worker_port=free_port(), spool_dir=tmp_path / "spool")
    third.open()  # the first let it go when it closed
    third.close()


def test_a_spool_drained_in_a_burst_records_its_head_and_frees_its_segments_soon_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("netrl.server.spool.time.monotonic", lambda: clock[0])
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1_000).open()
    for seq in range(12):  # about one 900-byte packet per segment
        spool.push([b"x" * 900], {"worker": "w", "session": "s", "seq": seq, "steps": 1})
    for p in spool.take(upto(1 << 30, 0)):
        spool.ack(p.position)  # a burst: the head is saved at the first acknowledgement only
    assert spool.packets == 0 and len(list(tmp_path.glob("*.seg"))) >= 11
    spool.tick()  # too soon after the last save
    assert len(list(tmp_path.glob("*.seg"))) >= 11
    clock[0] += 0.5
    spool.tick()  # a pass of the server's loop, with nothing else happening
    assert len(list(tmp_path.glob("*.seg"))) <= 1
    crashed = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1_000).open()  # no close: as after a crash
    assert crashed.packets == 0  # the head on disk covers the whole burst
    crashed.close()
    spool.close()


def test_packets_an_older_netrl_spooled_reach_an_upgraded_trainer(tmp_path: Path) -> None:
    # A server upgraded in place finds its spool as protocol version 1 wrote it; the trainer takes only today's
    # version from the server, so the spool hands them on at it (their content is valid today: see wire.py).
    sent = {seq: sample_buffer(5 + seq) for seq in (1, 2)}
    spool = Spool(tmp_path, max_bytes=1 << 20).open()
    for seq, buf in sent.items():
        frames = [bytes(f) for f in encode(samples_message(buf, "w", "s" * 16, seq, seq * 10))]
        header = msgpack.unpackb(frames[0])
        header["v"] = 1 if seq == 1 else PROTOCOL_VERSION  # packet 2 was spooled after the upgrade
        spool.push([msgpack.packb(header), *frames[1:]], {"worker": "w", "session": "s" * 16, "seq": seq,
                                                          "steps": len(buf)})
    spool.close()
    link = TrainerLink(NetworkConfig(), "trainer", "t" * 16, free_port(), 8, Deliveries(None), None)  # never started
    try:
        with running_server(spool_dir=tmp_path, network=PATIENT_NET) as (srv, ctx):
            trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
            assert trainer.hello().type is MsgType.WELCOME
            trainer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 1}))
            bundle = trainer.expect(MsgType.BUNDLE, timeout=5)
            link.on_message(bundle)  # what the trainer's network thread does with it: decoded as from a live peer
    finally:
        link.halt()
    assert link.stats["rejected"] == 0
    [(bufs, _)] = link.inbox
    assert [(b.worker, b.seq) for b in bufs] == [("w/" + "s" * 16, 1), ("w/" + "s" * 16, 2)]
    for buf in bufs:
        want = sent[buf.seq]
        for name in ("act", "rew", "terminated", "reset", "policy_version"):
            np.testing.assert_array_equal(getattr(buf, name), getattr(want, name))
        for got, expected in zip(buf.obs, want.obs, strict=True):
            np.testing.assert_array_equal(got, expected)


# -- packets the trainer refused for their layout: the held folder --------------------------------

def refusing_relay(tmp_path: Path, spool_bytes: int = 1 << 20) -> tuple[SampleRelay, list[Any]]:
    """A relay whose trainer takes every bundle, and the list of what it told workers."""
    told: list[Any] = []
    relay = SampleRelay(Spool(tmp_path / "spool", spool_bytes).open(), 1, 1 << 20, 1 << 30, 10.0,
                        max_queue_bytes=1 << 30, spool_after_s=60.0, stats=ServerCounters(),
                        send_to_trainer=lambda frames: True,
                        tell_worker=lambda *said: told.append(said), workers=lambda: ["wb"])
    relay.hold.open()
    relay.trainer_layout(TRAINERS)
    return relay, told


TRAINERS = 7  # the trainer's layout tag: no packet of sample_buffer's has it


def layout_packet(seq: int) -> QueuedPacket:
    """A packet of worker wb (session "sb") as the server holds it, in memory."""
    frames = encode(samples_message(sample_buffer(5), "wb", "sb", seq, seq * 4))
    return QueuedPacket("wb", "sb", seq, 4, frames, frames_nbytes(frames), 0.0)


def test_a_packet_in_memory_refused_for_its_layout_is_held_on_disk_and_its_worker_told_so(
        tmp_path: Path) -> None:
    relay, told = refusing_relay(tmp_path)
    for seq in (1, 2, 3):
        assert relay.accept(layout_packet(seq), trainer_connected=True) == "held"
    relay.add_credit(1)
    relay.flush(now=0.0, trainer_connected=True)
    assert len(relay.inflight[1]) == 3  # one bundle
    relay.trainer_acked([1], {"layout_refused": [0], "rejected": [2]})
    # 1 held (on disk: its worker may let it go), 2 delivered, 3 refused for good (the trainer
    # said why): a NACK that its worker counts as rejected, never sent again
    assert sorted((kind.value, body["seqs"], body.get("spooled"), body.get("retry_s"))
                  for _, kind, body in told) == [
        ("ack", [1], True, None), ("ack", [2], None, None), ("nack", [3], None, 0)]
    [nack] = [body for _, kind, body in told if kind is MsgType.NACK]
    assert nack["reason"] == "the trainer refused it (its log says why)" and "layout" not in nack
    stats = relay.stats
    assert (stats.samples_out, stats.samples_held, stats.samples_trainer_rejected) == (4, 4, 4)
    assert relay.mem_bytes == 0 and not relay.held and relay.inflight_steps == 0
    assert relay.snapshot()["held"]["samples"] == 4 and relay.on_the_way() == 0
    layout = next(iter(relay.hold.stores))
    relay.trainer_left()
    relay.trainer_layout(layout)  # a trainer of its layout: the packet goes back to the spool
    assert relay.spool.steps == 4 and relay.hold.steps == 0 and relay.stats.samples_released == 4
    assert not (tmp_path / "spool" / "held" / f"{layout:012x}").exists()


def test_a_refused_packet_the_held_folder_cannot_keep_goes_back_to_its_worker_or_is_counted_lost(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    one = layout_packet(1).nbytes
    relay, told = refusing_relay(tmp_path, spool_bytes=2 * one)  # the held folder holds 2 as well
    for seq in (1, 2):  # no trainer: spooled
        assert relay.accept(layout_packet(seq), trainer_connected=False) == "spooled"
    told.clear()
    relay.add_credit(1)
    relay.flush(now=0.0, trainer_connected=True)
    relay.trainer_acked([1], {"layout_refused": [0, 1]})
    assert relay.hold.packets == 2 and relay.stats.samples_held == 8 and not told
    assert relay.accept(layout_packet(3), trainer_connected=True) == "held"  # memory this time
    relay.add_credit(1)
    relay.flush(now=0.0, trainer_connected=True)
    relay.trainer_acked([2], {"layout_refused": [0]})
    # the held folder is full: the worker keeps it, told why, until the layout changes
    [(session, kind, body)] = told
    assert (session, kind, body["seqs"], body["layout"]) == ("sb", MsgType.NACK, [3], TRAINERS)
    assert "server.spool_max_bytes" in body["reason"] and relay.stats.samples_held_lost == 0
    relay.accept(layout_packet(4), trainer_connected=False)  # spooled, then refused: nowhere to go
    relay.add_credit(1)
    with caplog.at_level(logging.ERROR, logger="netrl.server.layout_hold"):
        relay.flush(now=0.0, trainer_connected=True)
        relay.trainer_acked([3], {"layout_refused": [0]})
    assert relay.stats.samples_held_lost == 4 and relay.spool.packets == 0
    assert "lost spooled packet 4 of worker wb (4 samples)" in caplog.text
    assert "raise server.spool_max_bytes" in caplog.text


def test_held_packets_go_back_to_the_spool_as_its_room_allows(tmp_path: Path) -> None:
    one = layout_packet(1).nbytes
    hold = LayoutHold(tmp_path / "held", 1 << 20, ServerCounters())
    hold.open()
    for seq in (1, 2, 3):
        assert hold.keep(5, layout_packet(seq).frames, {"worker": "wb", "session": "sb", "seq": seq,
                                                        "steps": 4}) is None
    hold.close()
    again = LayoutHold(tmp_path / "held", 1 << 20, ServerCounters())
    again.open()  # as after a restart
    assert again.describe() == {"packets": 3, "samples": 12, "bytes": 3 * one,
                                "layouts": {"000000000005": {"packets": 3, "samples": 12,
                                                             "workers": ["wb"]}}}
    spool = Spool(tmp_path / "spool", max_bytes=2 * one).open()
    assert again.release(6, spool) == 0 and again.release(5, spool) == 8  # two fit
    assert spool.packets == 2 and again.packets == 1
    for sp in spool.take(lambda *_: True):
        spool.ack(sp.position)
    assert again.release(5, spool) == 4 and again.stores == {}
    assert [sp.meta["seq"] for sp in spool.take(lambda *_: True)] == [3]
    assert not (tmp_path / "held" / "000000000005").exists()


def test_the_held_folder_keeps_packets_of_a_bounded_number_of_layouts(tmp_path: Path) -> None:
    # a worker could make a new layout per packet, and each held layout keeps a file open
    hold = LayoutHold(tmp_path / "held", 1 << 20, ServerCounters())
    hold.open()
    frames = layout_packet(1).frames
    meta = {"worker": "wb", "session": "sb", "seq": 1, "steps": 4}
    try:
        assert all(hold.keep(tag, frames, meta) is None for tag in range(1, MAX_LAYOUTS + 1))
        problem = hold.keep(MAX_LAYOUTS + 1, frames, meta)
        assert problem is not None and f"packets of {MAX_LAYOUTS} other layouts" in problem
        assert hold.keep(1, frames, meta) is None  # a layout already held takes more
        assert len(hold.stores) == MAX_LAYOUTS and hold.packets == MAX_LAYOUTS + 1
    finally:
        hold.close()
