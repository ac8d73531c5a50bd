"""The trainer's side of what an operator does and sees (issue 43, items 1 and 2, after an outside
check): --lift releases a quarantined worker's kept-aside rows and says what was released and what
is gone; --unrevoke lets a worker's packets in again; and the trainer reports each worker's rows
against its share of the replay memory, its refusals over it, and the quarantined workers."""

from __future__ import annotations

from typing import Any

from netrl.protocol.messages import MsgType
from netrl.trainer.operator import OperatorBox
from tests.trainer.test_revocation import sampled_workers
from tests.training.test_plausibility import WARM, packet, training


class Operated:
    """A source with nothing to fetch and an operator box, as the trainer's link has."""

    def __init__(self) -> None:
        self.operator = OperatorBox("trainer", lambda: None, lambda: None)

    def fetch(self) -> list[Any]:
        return []

    def revocations(self) -> list[str]:  # as TrainerLink.revocations
        return self.operator.revocations()

    def answers(self) -> list[dict[str, Any]]:
        out = [m.body for m in self.operator.outgoing if m.type is MsgType.LIFT]
        self.operator.outgoing.clear()
        return out


def warmed() -> Any:
    t = training()
    for seq in range(1, WARM + 1):
        for name in ("w1", "w2"):
            t.add(packet(seq, name))
    return t


def test_a_lift_releases_the_held_rows_unjudged_and_says_what_is_gone() -> None:
    t, source = warmed(), Operated()
    check = t.ingester.plausibility
    check.hold_rows = 40  # one packet: the older of two held is dropped, and gone
    assert t.add(packet(1000, "w2", reward=1e5)) == 0  # quarantined, held
    assert t.add(packet(1001, "w2")) == 0  # held too; 1000 is dropped beyond the hold
    assert sampled_workers(t) == {"w1"}
    t.ingest(source)
    report = source.operator.take_report()
    assert report["quarantined"]["w2"][0] == 40 and "robust scales" in report["quarantined"]["w2"][1]
    assert report["workers"]["w2"][0] == WARM * 40  # its rows, kept but never sampled
    source.operator.lifts.append({"worker": "w2", "ask": 7})
    steps = t.ingest(source)
    [answer] = source.answers()
    assert answer["ask"] == 7 and answer["was"] is True
    assert (answer["packets"], answer["rows"], answer["gone"]) == (1, 40, 40)
    assert answer["hidden"] == WARM * 40
    assert "40 rows it sent while quarantined are gone" in answer["reason"]
    assert steps == 39  # the released packet's env steps (its first row is a reset)
    assert sampled_workers(t) == {"w1", "w2"}
    assert t.memory.rows_of("w2") == (WARM + 1) * 40
    assert not check.workers["w2"].quarantined
    # lifting again: said plainly that it is not quarantined
    source.operator.lifts.append({"worker": "w2", "ask": 8})
    t.ingest(source)
    [again] = source.answers()
    assert again["was"] is False and "'w2' is not quarantined" in again["reason"]


def test_a_lifted_packet_with_the_implausible_values_is_taken_not_judged_again() -> None:
    t, source = warmed(), Operated()
    assert t.add(packet(1000, "w2", reward=1e5)) == 0
    source.operator.lifts.append({"worker": "w2", "ask": 1})
    t.ingest(source)
    [answer] = source.answers()
    assert answer["packets"] == 1 and answer["gone"] == 0
    assert not t.ingester.plausibility.workers["w2"].quarantined  # the operator let it in
    assert t.add(packet(1001, "w2", reward=1e5)) == 0  # a new one is judged as ever
    assert t.ingester.plausibility.workers["w2"].quarantined


def test_an_unrevoke_lets_the_workers_packets_in_again() -> None:
    t, source = warmed(), Operated()
    source.operator.revoked.append("w1")
    t.ingest(source)
    assert t.add(packet(500, "w1")) == 0 and t.memory.rows_of("w1") == 0
    source.operator.unrevoked.append("w1")
    t.ingest(source)
    assert t.add(packet(501, "w1")) == 39 and t.memory.rows_of("w1") == 40


def test_the_report_shows_each_workers_rows_against_its_share_and_the_refusals() -> None:
    t, source = warmed(), Operated()
    t.ingester.max_share = 0.0001  # 10 rows: less than each already holds
    cap = t.ingester.share_cap("w1")
    assert t.add(packet(600, "w1")) == 0  # over its share: refused
    t.ingest(source)
    workers = source.operator.take_report()["workers"]
    assert workers["w1"] == [WARM * 40, cap, 1, 40]
    assert workers["w2"] == [WARM * 40, cap, 0, 0]
    t.ingest(source)  # within the second: no new report
    assert source.operator.take_report() == {}
