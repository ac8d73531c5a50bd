"""Packets refused for the trainer's sample layout: the worker keeps them (within its backlog) and delivers them once
a trainer with their layout connects; the trainer is told each cause once.

Here the worker is the real delivery path (:class:`WorkerLink`) and the trainers are fake peers over 127.0.0.1; the
end-to-end case with a real Trainer and RolloutWorker is in tests/trainer/test_layout_refused.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import zmq

from netrl.launch import free_port
from netrl.monitor.status import format_status, query_status
from netrl.net.thread import Command, command_head
from netrl.net.transport import new_session
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import decode, encode, frames_nbytes, samples_message, split_bundle
from netrl.samples import Buffer, flatten
from netrl.server.server import Server
from netrl.server.status import status_line
from netrl.trainer.delivery import Deliveries
from netrl.trainer.link import TrainerLink
from netrl.worker.link import WorkerLink
from tests.fakes import NET, Peer, running_server, sample_buffer, wait_until

ROWS = 5  # rows per packet: an episode's first observation, then 4 transitions


def schema_of(**changed: tuple[str, tuple[int, ...]]) -> SampleSchema:
    """The layout of sample_buffer's packets, with the leaves in ``changed`` given another dtype and row shape."""
    buf = sample_buffer(ROWS)
    act_spec, act = flatten(buf.act, "act")
    obs_spec, obs = flatten(buf.obs, "obs")
    leaves = {name: (np.asarray(v).dtype.str, tuple(np.asarray(v).shape[1:])) for name, v in act + obs}
    assert set(changed) <= set(leaves)
    return SampleSchema(act_spec, obs_spec, {**leaves, **changed})


def packet(seq: int) -> list[object]:
    frames = encode(samples_message(sample_buffer(ROWS), "w1", "w1-session", seq, seq * (ROWS - 1)))
    return [command_head(Command.PACKET, seq, ROWS - 1), *frames]


class FakeTrainer(Peer):
    """A trainer that sends its layout and collects what the server sends it: NOTICEs, and the packets of the
    bundles it acknowledges."""

    def __init__(self, ctx: zmq.Context, port: int, name: str, schema: SampleSchema) -> None:
        super().__init__(ctx, port, "trainer", name)
        assert self.hello().type is MsgType.WELCOME
        self.send(Message(MsgType.SCHEMA, name, body=schema.to_wire()))
        self.send(Message(MsgType.CREDIT, name, body={"bundles": 100}))
        self.notices: list[dict[str, str]] = []
        self.seqs: list[int] = []  # every packet it received, in order, duplicates included

    def take(self) -> None:
        self.send(Message(MsgType.HEARTBEAT, self.name))
        while (msg := self.recv(0.02)) is not None:
            if msg.type is MsgType.NOTICE:
                self.notices.append(msg.body)
            elif msg.type is MsgType.BUNDLE:
                self.seqs += [decode(part).seq for part in split_bundle(msg)]
                self.send(Message(MsgType.ACK, self.name, body={"seqs": [msg.seq]}))


def test_a_worker_keeps_packets_refused_for_the_trainers_layout_within_its_backlog_and_delivers_them_to_the_next(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    wrong = FakeTrainer(ctx, srv.trainer_port, "wrong", schema_of(**{"obs/1": ("<f4", (4,))}))
    wait_until(lambda: srv.schema is not None, 5, "the wrong trainer's layout at the server", poll=0.01)
    nbytes = frames_nbytes(packet(1)[1:])
    kept = 4  # the backlog holds 4 packets and a half: the oldest of 10 are dropped
    link = WorkerLink(NET, "w1", "w1-session", srv.worker_port, None, kept * nbytes + nbytes // 2, 1 << 20)
    link.link.hello_extra = {"max_rows": ROWS, "paced": False}
    link.start()
    try:
        for seq in range(1, 11):  # one at a time: each is refused and held before the next comes
            link.hand_over(packet(seq))
            wait_until(lambda s=seq: s in link.held, 5, f"packet {seq} held", poll=0.01)  # type: ignore[misc]
            wrong.take()
        assert sorted(link.held) == list(range(11 - kept, 11))  # the newest: the oldest were dropped ...
        assert link.counts["dropped_packets"] == 10 - kept  # ... counted
        assert link.counts["dropped_samples"] == (10 - kept) * (ROWS - 1)
        assert link.counts["layout_refused_packets"] == 10 and link.counts["rejected_packets"] == 0
        assert link.backlog_bytes <= link.max_backlog_bytes
        assert srv.stats["layout_refusals"] == 10 and srv.stats["samples_in"] == 0
        wait_until(lambda: wrong.take() or wrong.notices, 5, "a NOTICE at the wrong trainer", poll=0.01)
        assert len(wrong.notices) == 1  # ten refusals, one cause
        assert wrong.notices[0]["cause"] == ("field 'obs/1' has dtype <f4 and row shape (2,); the trainer expects "
                                             "<f4 and (4,)")
        assert "Trainer(..., sample_compressor=...)" in wrong.notices[0]["reason"]
        assert wrong.seqs == []

        fixed = FakeTrainer(ctx, srv.trainer_port, "fixed", schema_of())
        wait_until(lambda: fixed.take() or sorted(fixed.seqs) == list(range(11 - kept, 11)), 10,
                   "the kept packets at the fixed trainer", poll=0.01)
        wait_until(lambda: fixed.take() or not link.backlog, 5, "the worker's backlog acknowledged", poll=0.01)
        fixed.take()
        assert sorted(fixed.seqs) == list(range(11 - kept, 11))  # every one kept, none twice, no dropped one
        assert fixed.notices == [] and link.held == {} and srv.stats["layout_refusals"] == 10
        assert link.counts["acked_packets"] == kept
    finally:
        link.halt()


def test_a_server_tells_the_trainer_each_cause_once_per_connection_and_other_refusals_stay_refused(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = FakeTrainer(ctx, srv.trainer_port, "trainer", schema_of(act=("<f8", (2,))))
    wait_until(lambda: srv.schema is not None, 5, "the trainer's layout at the server", poll=0.01)
    worker = Peer(ctx, srv.worker_port, "worker", "w2")
    assert worker.hello().type is MsgType.WELCOME
    nacks: list[dict[str, object]] = []
    for seq in (1, 2, 3):
        worker.send(samples_message(sample_buffer(ROWS), "w2", worker.session, seq, seq * (ROWS - 1)))
        nacks.append(worker.expect(MsgType.NACK).body)
    assert [n["layout"] for n in nacks] == [srv.schema.tag] * 3  # type: ignore[union-attr]
    wait_until(lambda: trainer.take() or trainer.notices, 5, "a NOTICE", poll=0.01)
    bad = sample_buffer(ROWS)
    bad.act = bad.act.astype(np.float64)  # the trainer's layout now, but a NaN: refused for good, no NOTICE
    bad.rew[1] = np.nan
    worker.send(samples_message(bad, "w2", worker.session, 4, 4 * (ROWS - 1)))
    nack = worker.expect(MsgType.NACK).body
    assert "layout" not in nack and nack["retry_s"] == 0 and "rejected" in str(nack["reason"])
    trainer.take()
    assert [n["cause"] for n in trainer.notices] == ["field 'act' has dtype <f4 and row shape (2,); the trainer "
                                                     "expects <f8 and (2,)"]


# -- packets the server spooled, refused by a trainer for their layout -----------------------------

B = {"obs/1": ("<f4", (4,))}  # another layout: 4 floats in obs/1 instead of 2
SAMPLES = ROWS - 1  # per packet


def other_layout_buffer() -> Buffer:
    """sample_buffer's packet in layout B."""
    buf = sample_buffer(ROWS)
    buf.obs = (buf.obs[0], np.zeros((ROWS, 4), np.float32))
    return buf


def spool_from(ctx: zmq.Context, srv: Server, name: str, buf: Buffer, packets: int) -> None:
    """A worker that sends ``packets`` packets while no trainer is connected: each is spooled."""
    worker = Peer(ctx, srv.worker_port, "worker", name)
    assert worker.hello().type is MsgType.WELCOME
    for seq in range(1, packets + 1):
        worker.send(samples_message(buf, name, worker.session, seq, seq * SAMPLES))
        ack = worker.expect(MsgType.ACK)
        assert ack.body["seqs"] == [seq] and ack.body["spooled"] is True
    worker.send(Message(MsgType.BYE, name))


def trainer_link(srv: Server, schema: SampleSchema) -> TrainerLink:
    """A real trainer's network thread of this layout: it checks each packet of a bundle."""
    link = TrainerLink(NET, "trainer", new_session(), srv.trainer_port, 8, Deliveries(), None,
                       schema)
    link.start()
    return link


def got(link: TrainerLink) -> list[tuple[str, int]]:
    """The packets a trainer took into its inbox: (worker, seq), sorted."""
    return sorted((buf.worker.split("/")[0], buf.seq) for bufs, _ in list(link.inbox) for buf in bufs)


def stop_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("server stopped")]


def test_spooled_packets_refused_for_their_layout_wait_on_disk_for_a_trainer_of_theirs_across_a_restart(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The outside check's loss: packets spooled while no trainer was connected went to a trainer of
    # another layout, which refused them; the server counted them as delivered and dropped them.
    caplog.set_level(logging.INFO)
    spool = tmp_path / "spool"
    status_port = free_port()
    settings = {"spool_dir": spool, "network": NET, "min_samples_per_server_packet": 1,
                "status_port": status_port}
    with running_server(**settings) as (srv, ctx):
        spool_from(ctx, srv, "wa", sample_buffer(ROWS), 3)  # the first trainer's layout
        spool_from(ctx, srv, "wb", other_layout_buffer(), 2)  # another one
        assert srv.spool.packets == 5
        first = trainer_link(srv, schema_of())
        try:
            wait_until(lambda: got(first) == [("wa", 1), ("wa", 2), ("wa", 3)], 10, "wa's packets",
                       poll=0.01)
            wait_until(lambda: srv.spool.packets == 0, 10, "the spool drained", poll=0.01)
        finally:
            first.halt()
        assert first.stats["layout_refused"] == 2 and first.stats["rejected"] == 0
        assert srv.stats["samples_out"] == 3 * SAMPLES  # delivered: wa's alone
        assert srv.stats["samples_held"] == 2 * SAMPLES
        tag = f"{schema_of(**B).tag:012x}"
        snapshot = query_status(status_port)  # what --status gets
        held = snapshot["held"]
        assert held["packets"] == 2 and held["samples"] == 2 * SAMPLES
        assert held["layouts"] == {tag: {"packets": 2, "samples": 2 * SAMPLES, "workers": ["wb"]}}
        assert (f"; held for another sample layout {2 * SAMPLES} samples in 2 packets ({tag}: "
                f"{2 * SAMPLES} samples from wb)") in format_status(snapshot)
        assert f" | held {2 * SAMPLES} | " in status_line(snapshot)
    [stop] = stop_lines(caplog)
    assert stop.startswith(
        f"server stopped: {3 * SAMPLES} samples delivered to the trainer; 0 spooled for it (0 "
        f"packets); {2 * SAMPLES} held for another sample layout (2 packets in 1 layout, in "
        f"{spool / 'held'}: sent when a trainer with theirs connects); 0 in memory"), stop

    caplog.clear()
    with running_server(**settings) as (srv, ctx):
        assert srv.snapshot()["held"]["samples"] == 2 * SAMPLES  # from before the restart
        other = trainer_link(srv, schema_of(**B))
        try:
            wait_until(lambda: got(other) == [("wb", 1), ("wb", 2)], 10, "wb's packets", poll=0.01)
            wait_until(lambda: srv.stats["samples_out"] == 2 * SAMPLES, 10, "their ACK", poll=0.01)
        finally:
            other.halt()
        assert other.stats["layout_refused"] == other.stats["rejected"] == 0
        assert srv.snapshot()["held"] == {"packets": 0, "samples": 0, "bytes": 0, "layouts": {}}
    assert not any((spool / "held").iterdir())  # the layout's folder went with its packets
    [stop] = stop_lines(caplog)
    assert stop.startswith(f"server stopped: {2 * SAMPLES} samples delivered to the trainer; 0 "
                           f"spooled for it (0 packets); 0 held for another sample layout"), stop
