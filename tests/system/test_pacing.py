"""Pacing that holds at the source, with the three roles as processes: a throttled worker of 8 envs beside a slow
trainer steps only while the trainer's PACE leaves room for a row of every env, so the server holds nothing back,
its samples arrive within trainer.max_policy_lag, and a Ctrl+C leaves nothing unacknowledged."""

from __future__ import annotations

import csv
import signal
from pathlib import Path

from tests.conftest import Procs
from tests.fakes import small_config, wait_until
from tests.reliability import delivered, worker_summary

MAX_POLICY_LAG = 5


def rounds(run_dir: Path) -> list[dict[str, str]]:
    path = run_dir / "metrics.csv"
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def test_a_paced_worker_of_8_envs_delivers_fresh_samples_and_stops_clean_with_nothing_lost(
        tmp_path: Path, procs: Procs) -> None:
    # a SAC trainer of 256x256 on batches of 256 trains far slower than 8 Pendulums step: the worker waits for PACE
    # most of the time, which is where a vector worker used to run past its allowance
    config = small_config(tmp_path,
                          trainer={"epochs": 100_000, "rounds": 1, "steps": 100, "start_training": 100,
                                   "worker_lead": 100, "update_model_interval": 10, "update_buffer_interval": 10,
                                   "max_policy_lag": MAX_POLICY_LAG},
                          worker={"num_envs": 8, "throttle": True, "min_samples_per_worker_packet": 10},
                          agent={"hidden_sizes": [256, 256]}, memory={"memory_size": 100_000, "batch_size": 256})
    run_dir = tmp_path / "weights" / "test"
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    trainer = procs.spawn("trainer", config)
    worker = procs.spawn("worker", config)
    wait_until(lambda: len(rounds(run_dir)) >= 6, 120, "600 training steps")

    worker.send_signal(signal.SIGINT)  # a clean stop: everything it made is acknowledged, so it exits 0
    assert worker.wait(timeout=30) == 0, procs.log(worker)[-3000:]
    s = worker_summary(procs.log(worker))
    assert (s.acked, s.dropped, s.rejected, s.unacked) == (s.produced, 0, 0, 0), s
    # nothing lost: each of its packets reaches the trainer's memory once
    wait_until(lambda: sum(delivered(run_dir).values()) >= s.produced, 60, "every sample at the trainer")
    got = delivered(run_dir)
    assert sorted(seq for session, seq in got if session == s.session) == list(range(1, s.packets + 1))
    assert sum(got.values()) == s.produced
    for p in (trainer, server):
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=15) == 0

    # it never ran past its allowance: the server held no packet back for it
    assert "over this worker's PACE allowance" not in procs.log(server)
    # and the trainer, asking for no more than it trains on within max_policy_lag versions, got no stale sample
    lines = rounds(run_dir)
    assert all(int(r["lag_max"] or 0) <= MAX_POLICY_LAG for r in lines), [r["lag_max"] for r in lines]
    assert all(int(r["stale_samples"] or 0) == 0 for r in lines), [r["stale_samples"] for r in lines]
