"""Helpers for the delivery tests: read what reached the trainer, what the server spooled, what workers reported."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from netrl.protocol.wire import buffer_from_message, decode
from netrl.storage.segments import SegmentLog

SUMMARY = re.compile(r"worker (\S+) session (\w+): (\d+) samples produced in (\d+) packets; (\d+) acknowledged, "
                     r"(\d+) dropped, (\d+) rejected, (\d+) unacknowledged")


@dataclass
class WorkerSummary:
    name: str
    session: str
    produced: int
    packets: int
    acked: int
    dropped: int
    rejected: int
    unacked: int


def worker_summary(log_text: str) -> WorkerSummary:
    m = SUMMARY.search(log_text)
    assert m, f"no worker summary in:\n{log_text[-2000:]}"
    name, session, *numbers = m.groups()
    return WorkerSummary(name, session, *map(int, numbers))


def delivered(run_dir: Path) -> dict[tuple[str, int], int]:
    """(session, seq) -> transitions, for every packet in the trainer's sample log; fails on a duplicate."""
    out: dict[tuple[str, int], int] = {}
    if not (run_dir / "samples").exists():
        return out
    for rec in SegmentLog(run_dir / "samples", readonly=True).read():
        buf = buffer_from_message(decode(rec.frames))
        key = (buf.worker.rsplit("/", 1)[1], buf.seq)
        assert key not in out, f"packet {key} entered the trainer's memory twice"
        out[key] = int(np.count_nonzero(buf.transition_end))
    return out


def spooled(spool_dir: Path) -> dict[tuple[str, int], int]:
    """(session, seq) -> samples, for packets still in a stopped server's spool (after its HEAD)."""
    from netrl.server.spool import Spool

    if not spool_dir.exists():
        return {}
    spool = Spool(spool_dir, max_bytes=1 << 40).open()
    try:
        return {(p.meta["session"], p.meta["seq"]): int(p.meta["steps"]) for p in spool.take(lambda *_: True)}
    finally:
        spool.close()


def log_time(line: str) -> float:
    """Unix time of a log line stamped HH:MM:SS.mmm today."""
    stamp = line.split(" ", 1)[0]
    today = datetime.now().strftime("%Y-%m-%d")
    return datetime.strptime(f"{today} {stamp}", "%Y-%m-%d %H:%M:%S.%f").timestamp()


def first_line(text: str, pattern: str) -> str:
    for line in text.splitlines():
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no log line matches {pattern!r}")
