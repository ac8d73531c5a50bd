"""A worker that connects to a restarted server resends its unacknowledged packets: rows it made
before this server knew it, which no PACE of this server granted. They must not be charged to its
allowance for new steps: a worker that had finished (its count no longer rises) would otherwise be
held for good once they exceed one share, and the trainer, waiting for them (the RemoteCollector
yields only a full batch), would never raise its wish (the stall of issue 45, item 5)."""

from __future__ import annotations

import time

import pytest
import zmq

from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import decode, samples_message, split_bundle
from netrl.server.peers import MAX_EARLY
from netrl.server.peers import Peer as PeerEntry
from netrl.server.server import Server
from tests.fakes import Peer, sample_buffer

LEAD = 12  # samples the fake trainer wants beyond those it has: three packets' worth
PACKETS = 40  # the finished worker's backlog: 160 steps, many times the trainer's lead


def hello(worker: Peer) -> None:
    worker.send(Message(MsgType.HELLO, worker.name, body={
        "role": "worker", "netrl_version": "0.1.0", "worker_id": worker.name,
        "session": worker.session, "max_rows": 5, "paced": True}))
    assert worker.expect(MsgType.WELCOME).type is MsgType.WELCOME


@pytest.mark.server(min_samples_per_server_packet=1)
def test_a_finished_workers_resends_to_a_restarted_server_are_not_held_for_pacing(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    trainer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 100}))
    got: set[int] = set()

    def progress() -> None:
        trainer.send(Message(MsgType.PROGRESS, "trainer", body={
            "trained_steps": 0, "samples": 4 * len(got), "wanted": 4 * len(got) + LEAD}))

    progress()
    worker = Peer(ctx, srv.worker_port, "worker", "finished")
    hello(worker)

    def heartbeat() -> None:  # its count: every step made (200), the last PACKETS not acknowledged
        worker.send(Message(MsgType.HEARTBEAT, "finished", body={"stats": {
            "produced": 200, "backlog_packets": PACKETS - len(acked), "held_packets": 0}}))

    acked: set[int] = set()
    nacks: list[str] = []
    deadline = time.monotonic() + 8.0
    first = True  # its resends go at once on connecting, its first heartbeat after them
    while len(got) < PACKETS and time.monotonic() < deadline:
        if not first:
            heartbeat()
        first = False
        for seq in range(1, PACKETS + 1):  # the backlog, resent until acknowledged
            if seq not in acked:
                worker.send(samples_message(sample_buffer(5), "finished", worker.session, seq,
                                            40 + 4 * seq))
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            msg = trainer.recv(0.01)
            if msg is not None and msg.type is MsgType.BUNDLE:
                for part in split_bundle(msg):
                    got.add(decode(part).seq)
                trainer.send(Message(MsgType.ACK, "trainer", body={"seqs": [msg.seq]}))
                progress()
            reply = worker.recv(0.01)
            if reply is not None and reply.type is MsgType.ACK:
                acked.update(reply.body["seqs"])
            elif reply is not None and reply.type is MsgType.NACK:
                nacks.append(reply.body["reason"])
    assert len(got) == PACKETS, (len(got), srv.stats["pace_refusals"], nacks[-1:])
    assert acked == set(range(1, PACKETS + 1))


def test_rows_charged_before_the_first_heartbeat_are_given_back_if_they_were_resends() -> None:
    """The backlog goes at once on connecting, the first heartbeat a moment later: packets accepted
    meanwhile were charged; those made before the heartbeat's count are given back, also when the
    server has acknowledged them since (spooled), so that the heartbeat's backlog omits them."""
    peer = PeerEntry(b"r", "worker", "w", "s", "127.0.0.1", None)  # type: ignore[arg-type]
    peer.pace_budget = 10
    for made in (150, 160, 260):  # two of the backlog, one made after the heartbeat's count
        peer.charged(made, 5)
    assert peer.pace_budget == -5
    peer.report({"produced": 200, "backlog_packets": 0, "held_packets": 0})
    peer.first_report()
    assert peer.pace_budget == 5  # the two resends' 10 rows back, not the new packet's
    assert not peer.resend(190, False)  # its backlog was empty: nothing after it goes unpaced
    peer.charged(300, 5)
    assert peer.pace_budget == 0 and peer.charged_early == []  # charged once known, kept no more


def test_a_first_heartbeat_claiming_a_huge_backlog_skips_pace_for_at_most_max_early_packets() -> None:
    """The resend exemption rests on the worker's own counts: a worker that inflates them must not get an unpaced
    flood out of it (its replay share caps what it holds besides)."""
    peer = PeerEntry(b"r", "worker", "w", "s", "127.0.0.1", None)  # type: ignore[arg-type]
    peer.report({"produced": 10**12, "backlog_packets": 10**12, "held_packets": 10**12})
    peer.first_report()
    assert peer.resends_left == MAX_EARLY
