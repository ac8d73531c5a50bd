"""The trainer's side of revocation (issue 43, item 2): told by the server that a worker was revoked, the
trainer drops that worker's rows from its replay memory and refuses its packets still on their way; with
trainer.implausible "refuse", it asks the server to revoke a worker itself."""

from __future__ import annotations

import zmq

from netrl.protocol.messages import Message, MsgType
from netrl.server.revocation import ask_revoke
from netrl.server.server import Server
from netrl.trainer.delivery import Deliveries
from netrl.trainer.link import TrainerLink
from netrl.training.plausibility import Plausibility
from tests.fakes import NET, Peer, wait_until
from tests.training.test_plausibility import WARM, packet


def hello(peer: Peer) -> Message:
    peer.send(Message(MsgType.HELLO, peer.name, body={
        "role": peer.role, "netrl_version": "0.1.0", "worker_id": peer.name, "session": peer.session}))
    return peer.expect(MsgType.WELCOME, MsgType.REJECT)


def test_the_trainer_hears_of_a_revocation_and_can_ask_for_one(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    link = TrainerLink(NET, "trainer", "t" * 16, srv.trainer_port, 8, Deliveries(), None)
    link.start()
    try:
        wait_until(lambda: link.link.ready, 5, "the trainer connected", poll=0.02)
        w1, w2 = Peer(ctx, srv.worker_port, "worker", "w1"), Peer(ctx, srv.worker_port, "worker", "w2")
        assert hello(w1).type is MsgType.WELCOME and hello(w2).type is MsgType.WELCOME
        assert ask_revoke("127.0.0.1", srv.trainer_port, "w1", "by hand", None)["links"] == 1
        heard: list[str] = []
        wait_until(lambda: heard.extend(link.revocations()) or heard, 5, "the REVOKE at the trainer", poll=0.02)
        assert heard == ["w1"]
        link.revoke("w2", "the trainer found implausible values: reward 1e+05")  # trainer.implausible: refuse
        told = w2.expect(MsgType.REJECT)
        assert "revoked by the trainer" in told.body["reason"] and "reward 1e+05" in told.body["reason"]
        wait_until(lambda: srv.peers.worker_count() == 0, 2, "both cut off", poll=0.02)
        wait_until(lambda: heard.extend(link.revocations()) or "w2" in heard, 5, "the answer", poll=0.02)
    finally:
        link.halt()


class Owned:
    """A memory that keeps each row's worker, with the API netrl's memories have (netrl.memory.owners)."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.hidden: set[str] = set()

    def worker_rows(self) -> dict[str, int]:
        return dict(self.rows)

    def drop_worker(self, worker: str) -> int:
        return self.rows.pop(worker, 0)

    def set_quarantined(self, worker: str, flag: bool) -> int:
        (self.hidden.add if flag else self.hidden.discard)(worker)
        return self.rows.get(worker, 0)


def test_a_revoked_workers_rows_are_dropped_and_its_late_packets_refused() -> None:
    memory = Owned()
    check = Plausibility("quarantine", 200.0, None, 10_000, memory)
    for seq in range(1, WARM + 1):
        for name in ("w1", "w2"):
            buf = packet(seq, name)
            assert check.admit(buf)
            memory.rows[buf.worker] = memory.rows.get(buf.worker, 0) + len(buf)
    memory.rows["w1/an-earlier-session"] = 7  # every session of the worker goes
    assert check.revoked("w1") == WARM * 40 + 7
    assert memory.worker_rows() == {"w2/s-w2": WARM * 40}
    assert not check.admit(packet(999, "w1"))  # on its way before the revocation
    assert check.metrics()["revoked_workers"] == 1 and check.counts["revoked_packets"] == 1
    # quarantine hides what a worker wrote before, and lifting it hands back what was held
    assert not check.admit(packet(1000, "w2", reward=1e5))
    assert memory.hidden == {"w2/s-w2"}
    assert [b.seq for b in check.lift("w2")] == [1000] and not memory.hidden
