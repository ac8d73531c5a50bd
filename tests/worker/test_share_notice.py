"""A worker over its share of the replay memory is told (issue 43, item 1, after an outside check:
the trainer refused its packets and only the trainer's log said so). The server's NOTICE names the
cap and the key; the worker counts the packets and rows, and logs one line per spell of such
refusals, not one per notice (the trainer reports once a second)."""

from __future__ import annotations

import logging

import pytest

import netrl.worker.link
from netrl.protocol.messages import Message, MsgType
from netrl.worker.link import WorkerLink
from tests.fakes import NET


def share_notice(packets: int, rows: int) -> Message:
    return Message(MsgType.NOTICE, "server", body={
        "cause": "replay_share", "packets": packets, "rows": rows,
        "reason": "the trainer refused 3 packet(s) (600 rows) of worker w since its last report: "
                  "they would take it over its share of the replay memory, 6,250 rows (it holds "
                  "6,250). The trainer's memory.max_worker_share sets the share"})


def test_share_refusals_are_counted_and_logged_once_per_spell(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(netrl.worker.link.time, "monotonic", lambda: clock[0])
    link = WorkerLink(NET, "w", "s", 1, None, 1 << 20, 1 << 20)
    try:
        with caplog.at_level(logging.WARNING, logger="netrl.worker.link"):
            for _ in range(20):  # a spell: a notice a second for 20 s
                link.on_other_message(share_notice(3, 600))
                clock[0] += 1.0
            clock[0] += netrl.worker.link.SHARE_SPELL_GAP_S + 1  # quiet, then a new spell
            link.on_other_message(share_notice(1, 200))
    finally:  # a link never halted leaves its context to the garbage collector
        link.halt()
    lines = [r.getMessage() for r in caplog.records if "memory.max_worker_share" in r.getMessage()]
    assert len(lines) == 2 and "6,250 rows" in lines[0]
    assert (link.counts["share_refused_packets"], link.counts["share_refused_rows"]) == (61, 12_200)
    assert link.counts["share_refusal_spells"] == 2
    assert link.counts["refused_notices"] == 0  # not one of its own messages refused
