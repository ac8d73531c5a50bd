"""The trainer's side of revocation (issue 43, item 2): told by the server that a worker was
revoked, the trainer drops that worker's rows from its replay memory and refuses its packets still
on their way; with trainer.implausible "refuse", it asks the server to revoke a worker itself."""

from __future__ import annotations

from typing import Any

import zmq

from netrl.protocol.messages import MsgType
from netrl.protocol.wire import samples_message
from netrl.server.revocation import ask_revoke
from netrl.server.server import Server
from netrl.trainer.delivery import Deliveries
from netrl.trainer.link import TrainerLink
from tests.fakes import NET, Peer, wait_until
from tests.training.test_plausibility import WARM, packet, training


def test_the_trainer_hears_of_a_revocation_and_can_ask_for_one(
    server: tuple[Server, zmq.Context],
) -> None:
    srv, ctx = server
    link = TrainerLink(NET, "trainer", "t" * 16, srv.trainer_port, 8, Deliveries(), None)
    link.start()
    try:
        wait_until(lambda: link.link.ready, 5, "the trainer connected", poll=0.02)
        w1, w2 = (
            Peer(ctx, srv.worker_port, "worker", "w1"),
            Peer(ctx, srv.worker_port, "worker", "w2"),
        )
        assert w1.hello().type is MsgType.WELCOME and w2.hello().type is MsgType.WELCOME
        assert ask_revoke("127.0.0.1", srv.trainer_port, "w1", "by hand", None)["links"] == 1
        heard: list[str] = []
        wait_until(
            lambda: heard.extend(link.revocations()) or heard,
            5,
            "the REVOKE at the trainer",
            poll=0.02,
        )
        assert heard == ["w1"]
        link.revoke(
            "w2", "the trainer found implausible values: reward 1e+05"
        )  # trainer.implausible: refuse
        told = w2.expect(MsgType.REJECT)
        assert (
            "revoked by the trainer" in told.body["reason"]
            and "reward 1e+05" in told.body["reason"]
        )
        wait_until(lambda: srv.peers.worker_count() == 0, 2, "both cut off", poll=0.02)
        wait_until(
            lambda: heard.extend(link.revocations()) or "w2" in heard, 5, "the answer", poll=0.02
        )
    finally:
        link.halt()


def test_a_revoked_workers_rows_are_dropped_and_its_late_packets_refused() -> None:
    t = training()
    assert t.memory is not None and t.ingester is not None and t.ingester.plausibility is not None
    for seq in range(1, WARM + 1):
        for name in ("w1", "w2"):
            t.add(packet(seq, name))
    t.add(packet(5000, "w1/an-earlier-session"))  # every session of the worker goes
    held = t.memory.worker_rows()
    assert held["w1"] == (WARM + 1) * 40 and held["w2"] == WARM * 40
    t.ingest(Heard(["w1"]))  # type: ignore[arg-type]  # the server told the trainer's link
    assert t.memory.rows_of("w1") == 0 and t.memory.worker_rows() == {"w2": WARM * 40}
    assert t.ingester.plausibility.metrics()["revoked_rows_dropped"] == (WARM + 1) * 40
    assert sampled_workers(t) == {"w2"}  # no batch draws w1's rows
    assert t.add(packet(999, "w1")) == 0  # on its way before the revocation
    assert t.ingester.plausibility.counts["revoked_packets"] == 1


def test_quarantine_hides_what_the_worker_wrote_before_and_lifting_hands_it_all_back() -> None:
    t = training()
    assert t.memory is not None and t.ingester is not None and t.ingester.plausibility is not None
    check = t.ingester.plausibility
    for seq in range(1, WARM + 1):
        for name in ("w1", "w2"):
            t.add(packet(seq, name))
    assert t.add(packet(1000, "w2", reward=1e5)) == 0
    assert t.memory.rows_of("w2") == WARM * 40  # kept, but never sampled
    assert sampled_workers(t) == {"w1"}
    held = check.lift("w2")
    assert [b.seq for b in held] == [1000]
    assert sampled_workers(t) == {"w1", "w2"}


def sampled_workers(t: Any, draws: int = 20) -> set[str]:
    """The worker names in ``draws`` batches of the loop's memory."""
    names: set[str] = set()
    for _ in range(draws):
        t.memory.sample()
        names |= {w.split("/")[0] for w in t.memory.batch_workers()}
    return names


class Heard:
    """A source that has nothing to fetch, and heard of these revocations."""

    def __init__(self, revoked: list[str]) -> None:
        self.revoked = revoked

    def fetch(self) -> list[Any]:
        return []

    def revocations(self) -> list[str]:
        out, self.revoked = self.revoked, []
        return out


def test_revoke_on_the_command_line_takes_the_workers_rows_out_of_a_running_trainers_batches(
    server: tuple[Server, zmq.Context],
) -> None:
    """End to end: workers' packets through a real server into the trainer's link and memory;
    --revoke's request reaches the server, which cuts the worker off and tells the link; the
    loop's next ingest drops the worker's rows."""
    srv, ctx = server
    t = training()
    assert t.memory is not None
    link = TrainerLink(NET, "trainer", "t" * 16, srv.trainer_port, 8, Deliveries(), None)
    link.start()
    try:
        wait_until(lambda: link.link.ready, 5, "the trainer connected", poll=0.02)
        workers = [Peer(ctx, srv.worker_port, "worker", name) for name in ("w1", "w2")]
        for worker in workers:
            assert worker.hello().type is MsgType.WELCOME
        for seq in range(1, WARM + 1):
            for worker in workers:
                buf = packet(seq, worker.name)
                worker.send(samples_message(buf, worker.name, worker.session, seq, 40 * seq))
        wait_until(
            lambda: t.ingest(link) >= 0 and t.memory is not None and len(t.memory) >= 2 * WARM * 39,
            10,
            "every packet in the trainer's memory",
            poll=0.05,
        )
        assert sampled_workers(t) == {"w1", "w2"}
        assert ask_revoke("127.0.0.1", srv.trainer_port, "w1", "left", None)["links"] == 1
        wait_until(
            lambda: t.ingest(link) >= 0 and t.memory is not None and not t.memory.rows_of("w1"),
            5,
            "w1's rows dropped",
            poll=0.05,
        )
        assert sampled_workers(t) == {"w2"}
    finally:
        link.halt()
