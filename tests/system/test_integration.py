"""The three roles as separate OS processes on 127.0.0.1 with free ports."""

from __future__ import annotations

import csv
import re
import signal
import time
from pathlib import Path

from tests.conftest import Procs
from tests.fakes import small_config


def test_three_roles_learn_exchange_weights_and_stop_on_sigint(tmp_path: Path, procs: Procs) -> None:
    config = small_config(tmp_path, trainer={"epochs": 1000, "rounds": 1, "steps": 40})
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    trainer = procs.spawn("trainer", config)
    worker = procs.spawn("worker", config, log_level="DEBUG")

    metrics = tmp_path / "weights" / "test" / "metrics.csv"
    deadline = time.monotonic() + 60
    versions: list[int] = []
    while time.monotonic() < deadline:
        versions = [int(v) for v in re.findall(r"weights v(\d+) ready", procs.log(worker))]
        if len(versions) >= 3 and metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    assert len(versions) >= 2 and versions == sorted(versions) and len(set(versions)) == len(versions), versions

    with metrics.open() as f:
        rounds = list(csv.DictReader(f))
    assert int(rounds[-1]["samples"]) > 0  # samples reached the trainer's memory
    assert int(rounds[-1]["memory_len"]) > 0
    assert any(r["lag_max"] != "" for r in rounds)  # policy lag is measured from the versions the worker tagged

    # the relay is often a small rented VM: after relaying samples, a schema and weights, it has not loaded torch
    server_maps = Path(f"/proc/{server.pid}/maps")
    if server_maps.exists():
        assert "/torch/" not in server_maps.read_text()
        assert "/torch/" in Path(f"/proc/{trainer.pid}/maps").read_text()  # the check sees torch where it is

    t0 = time.monotonic()
    worker.send_signal(signal.SIGINT)  # the worker first, so the server logs its goodbye before stopping itself
    procs.wait_for(server, r"disconnected \(shutting down\)", timeout=4)
    for p in (trainer, server):
        p.send_signal(signal.SIGINT)
    for p in (worker, trainer, server):
        p.wait(timeout=5)
    assert time.monotonic() - t0 < 5
    assert [p.returncode for p in (worker, trainer, server)] == [0, 0, 0]
    for p in (worker, trainer, server):
        assert "exited cleanly" in procs.log(p)
    server_log = procs.log(server)
    assert re.search(r"worker '.*' \(127\.0\.0\.1, session \w+, key worker\) connected", server_log)
    assert re.search(r"trainer 'trainer' \(127\.0\.0\.1, session \w+, key trainer\) connected", server_log)
    assert re.search(r"worker '.*' \(127\.0\.0\.1, session \w+, key worker\) disconnected", server_log)
    assert (tmp_path / "weights" / "test" / "policy.pt").exists()
    assert list((tmp_path / "weights" / "test").glob("worker_policy_*.pt"))
