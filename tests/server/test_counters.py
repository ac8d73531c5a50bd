"""The server's counters: each declared once, an undeclared one refused, and every one in the --status snapshot."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from netrl.server.counters import COUNTERS, ServerCounters
from netrl.server.server import Server

# What `python -m netrl --status --json` lists under "stats": scripts read these keys.
STATUS_KEYS = ("bundles_out", "failed_handshakes_trainer", "failed_handshakes_worker", "internal_errors",
               "layout_refusals", "lifts", "oversized_packets", "pace_refusals", "peers_lost", "refused_full",
               "rejected",
               "replies_withheld", "revocations", "revoked_links", "revoked_refused", "resends_ignored",
               "samples_dropped", "samples_held", "samples_held_lost", "samples_in", "samples_out",
               "samples_refused", "samples_released", "samples_spooled", "samples_trainer_rejected",
               "send_full", "share_notices", "spool_errors", "spool_share_refusals", "unknown_peer",
               "unpaced_denied", "unrevocations", "weights_in", "weights_out", "window_refusals")


def test_a_counter_not_declared_is_refused_at_the_increment() -> None:
    stats = ServerCounters()
    with pytest.raises(AttributeError, match="samples_inn"):
        stats.samples_inn += 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="rejectd"):
        stats.rejectd = 1  # type: ignore[attr-defined]
    with pytest.raises(KeyError, match="samples_inn"):
        stats["samples_inn"]
    stats.samples_in += 4
    assert stats["samples_in"] == 4 and stats.samples_in == 4


def test_each_counter_is_declared_once_with_its_meaning() -> None:
    assert COUNTERS == tuple(f.name for f in dataclasses.fields(ServerCounters)) == STATUS_KEYS
    source = inspect.getsource(ServerCounters)
    for name in COUNTERS:
        [line] = [line for line in source.splitlines() if line.strip().startswith(f"{name}: int = 0")]
        assert line.partition("  # ")[2].strip(), f"{name} is declared without a comment saying what it counts"


def test_the_snapshot_lists_every_declared_counter_and_every_part_counts_in_the_same_one(tmp_path: Path) -> None:
    srv = Server(spool_dir=tmp_path / "spool")
    try:
        assert srv.snapshot()["stats"] == dict.fromkeys(STATUS_KEYS, 0)  # at 0 until they count: no key missing
        assert all(part.stats is srv.stats for part in (srv.admission, srv.out, srv.intake, srv.relay, srv.status))
        srv.stats.window_refusals += 2
        srv.stats.handshake_failed("worker")
        snapshot = srv.snapshot()
        assert list(snapshot["stats"]) == list(STATUS_KEYS)
        assert snapshot["stats"]["window_refusals"] == 2 and snapshot["failed_handshakes"] == {"trainer": 0,
                                                                                                "worker": 1}
    finally:
        srv.close()
