"""The three roles as processes with a TorchRL env on the worker, the worker stepping two of its envs in a
SerialEnv: a pipeline of torchrl_pipeline (netrl's SAC), and TorchRL all through (a TorchRL policy acting on the
worker, TorchRL's SACLoss training it). Samples with the env's info column, and the policy's out_keys as extra
outputs, reach the trainer, which trains; the server loads no torch."""

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


@pytest.mark.parametrize("pipeline", ["pendulum", "torchrl_sac"])
def test_a_worker_steps_a_batch_of_torchrl_envs_for_a_trainer_in_three_processes(tmp_path: Path, procs: Procs,
                                                                                  pipeline: str) -> None:
    config = small_config(tmp_path, env={"pipeline": f"tests.interop.pipelines:{pipeline}"},
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
    if pipeline == "torchrl_sac":  # TorchRL's loss trained on them (its terms are the round's metrics)
        assert any(r.get("loss_qvalue") not in (None, "") for r in rounds), rounds[-1]
    # the packets hold the info column (and the policy's extra outputs) the trainer's layout declares: none was
    # refused for it
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
