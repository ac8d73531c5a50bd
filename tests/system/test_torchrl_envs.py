"""The three roles as processes with a TorchRL env on the worker: a pipeline of torchrl_pipeline (env.pipeline
"tests.interop.pipelines:pendulum"), the worker stepping two of its envs in a SerialEnv. Samples with the env's
info column reach the trainer, which trains; the server loads neither torch nor torchrl."""

from __future__ import annotations

import csv
import re
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("torchrl")

from tests.conftest import Procs
from tests.fakes import small_config


def test_a_worker_steps_a_batch_of_torchrl_envs_for_a_trainer_in_three_processes(tmp_path: Path,
                                                                                  procs: Procs) -> None:
    config = small_config(tmp_path, env={"pipeline": "tests.interop.pipelines:pendulum"},
                          worker={"num_envs": 2, "vectorization": "sync"},
                          trainer={"epochs": 1000, "rounds": 1, "steps": 40})
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    trainer = procs.spawn("trainer", config)
    worker = procs.spawn("worker", config)
    metrics = tmp_path / "weights" / "test" / "metrics.csv"
    deadline = time.monotonic() + 90
    rounds: list[dict[str, str]] = []
    while time.monotonic() < deadline:
        if metrics.exists():
            with metrics.open() as f:
                rounds = list(csv.DictReader(f))
            if len(rounds) >= 2:
                break
        assert worker.poll() is None and trainer.poll() is None, procs.log(worker)[-3000:] + procs.log(trainer)[-3000:]
        time.sleep(0.3)
    assert len(rounds) >= 2 and int(rounds[-1]["samples"]) > 0, procs.log(trainer)[-3000:]
    # the packets hold the info column the trainer's layout declares: none was refused for it
    assert "refused a packet" not in procs.log(server)
    # the server relays the info column; it never loads torch (torchrl needs it), which the worker has loaded
    server_maps = Path(f"/proc/{server.pid}/maps")
    if server_maps.exists():
        assert "/torch/" not in server_maps.read_text()
        assert "/torch/" in Path(f"/proc/{worker.pid}/maps").read_text()
    worker.send_signal(signal.SIGINT)
    procs.wait_for(server, r"disconnected \(shutting down\)", timeout=10)
    for p in (trainer, server):
        p.send_signal(signal.SIGINT)
    for p in (worker, trainer, server):
        p.wait(timeout=10)
    assert [p.returncode for p in (worker, trainer, server)] == [0, 0, 0], procs.log(worker)[-3000:]
    episodes = list((tmp_path / "weights" / "test").glob("episodes_*.csv"))
    assert episodes and re.search(r"^.*,50,", episodes[0].read_text(), re.M)  # StepCounter's 50-step episodes
