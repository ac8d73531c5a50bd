"""Trainer overhead: the fraction of the trainer's wall time spent outside agent.train in a steady
run, three processes and one.

The real three-process pipeline (Pendulum-v1, SAC 256x256, batch 256) runs with an unthrottled
worker, so the trainer never waits for samples; its rounds report the time inside agent.train and
inside memory.sample. The same loop in a single process (netrl.local) shows what the networking
adds. The first round includes start-up and is left out. Target: <= 10% in the pipeline.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import tempfile
import threading
from pathlib import Path
from typing import Any

from benchmarks.results import Row
from benchmarks.settings import positive
from netrl.config.load import config_from_dict, config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.net.keys import keygen


@dataclasses.dataclass(frozen=True)
class Settings:
    rounds: int = 5
    steps: int = 1000  # training steps per round
    start_training: int = 2000  # samples in memory before the first round

    def __post_init__(self) -> None:
        positive("--rounds", self.rounds, 2, strict=False)  # the first is left out
        positive("--steps", self.steps)
        positive("--start-training", self.start_training)


QUICK = Settings(rounds=3, steps=500)
SMOKE = Settings(rounds=2, steps=50, start_training=300)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--rounds", type=int, help=f"training rounds, the first left out ({d.rounds})")
    p.add_argument("--steps", type=int, help=f"training steps per round ({d.steps})")
    p.add_argument("--start-training", type=int,
                   help=f"samples before training ({d.start_training})")


def _config(tmp: Path, s: Settings) -> dict[str, Any]:
    data = config_to_dict(Config())
    data.update(weights_folder=str(tmp / "w"), keys_dir=str(tmp / "keys"), run_name="overhead",
                seed=1)
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"]["status_port"] = free_port()
    data["worker"].update(throttle=False, test_episode_interval=0)
    data["trainer"].update(epochs=1, rounds=s.rounds, steps=s.steps,
                           start_training=s.start_training)
    data["wandb"]["mode"] = "disabled"
    return data


def _fractions(rows: list[dict[str, Any]]) -> dict[str, float]:
    steady = rows[1:] or rows  # the first round includes start-up
    wall = sum(float(r["wall_s"]) for r in steady)
    train = sum(float(r["train_fraction"]) * float(r["wall_s"]) for r in steady)
    sample = sum(float(r["sample_fraction"]) * float(r["wall_s"]) for r in steady)
    return {"train_fraction": train / wall, "sample_fraction": sample / wall,
            "overhead": 1 - train / wall,
            "steps_per_s": sum(float(r["steps_per_s"]) * float(r["wall_s"]) for r in steady) / wall}


def pipeline(tmp: Path, s: Settings) -> dict[str, float]:
    data = _config(tmp / "pipeline", s)
    keygen(data["keys_dir"])
    path = write_config(data, tmp / "overhead.json")
    log = (tmp / "overhead.log").open("wb")
    procs = [spawn_role("server", path, stdout=log), spawn_role("trainer", path, stdout=log),
             spawn_role("worker", path, stdout=log, log_level="WARNING")]
    try:
        procs[1].wait(timeout=s.rounds * s.steps / 20 + 120)
    finally:
        stop_processes(procs, timeout=10)
    with (Path(data["weights_folder"]) / "overhead" / "metrics.csv").open(newline="") as f:
        return _fractions(list(csv.DictReader(f)))


def single(tmp: Path, s: Settings) -> dict[str, float]:
    import torch

    from netrl.local import run_local
    from netrl.pipelines.make import make_pipeline
    from netrl.trainer.trainer import Trainer
    from netrl.worker.worker import RolloutWorker

    cfg = config_from_dict({**_config(tmp / "single", s), "security": "none"})  # no network here
    torch.set_num_threads(1)
    pipe = make_pipeline(cfg)
    worker = RolloutWorker.from_config(cfg, pipe)
    worker.episode_log = None
    training = Trainer.from_config(cfg, pipe).training_cls()
    rows: list[dict[str, Any]] = []
    run_local(training, worker, threading.Event(), rows.append)
    return _fractions(rows)


def run(s: Settings) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="netrl-bench-") as d:
        tmp = Path(d)
        net = pipeline(tmp, s)
        loc = single(tmp, s)
    out = []
    for name, r in (("pipeline", net), ("single process", loc)):
        print(f"overhead {name:<15} agent.train {r['train_fraction']:6.1%} of wall time, "
              f"memory.sample {r['sample_fraction']:5.1%}, outside agent.train "
              f"{r['overhead']:5.1%} ({r['steps_per_s']:.0f} steps/s)", flush=True)
        target = "<= 10%" if name == "pipeline" else ""
        out.append(Row("overhead", name, "trainer time outside agent.train", r["overhead"],
                       "share", target=target,
                       met=r["overhead"] <= 0.10 if target else None,
                       params={"run": name, **dataclasses.asdict(s)}, detail=r))
    return out
