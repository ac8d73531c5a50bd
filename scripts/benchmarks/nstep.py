"""The n-step row of scripts/bench_learning.py (issue 32): SAC with 3-step returns and prioritized replay beside plain
SAC on Pendulum-v1, the same seeds, in the same run.

Both use the pendulum row's config (256x256 SAC, batch 256, update-to-data ratio 1, training from 1,000 samples),
the same worker, memory class, agent and training loop, in one process each (netrl.local: the network moves the
same packets and changes nothing the memory or the agent do, and two cores cannot hold six processes' worth of
training in a fair race). The only difference: ``memory.n_step`` 3 and ``memory.prioritized`` true (alpha 0.6,
beta 0.4 annealed to 1 over 10,000 training steps). Each run reports the env steps at which the mean return of
its last 10 training episodes first reaches -200; the row is the median over the seeds.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import crossing, median_steps
from netrl.config.load import config_from_dict, config_to_dict
from netrl.config.sections import Config
from netrl.local import run_local
from netrl.pipelines.make import make_pipeline
from netrl.trainer.trainer import Trainer
from netrl.worker.worker import RolloutWorker

THRESHOLD = -200.0
WINDOW = 10
VARIANTS: dict[str, dict[str, Any]] = {
    "sac": {},
    "sac_3step_prioritized": {"n_step": 3, "prioritized": True, "priority_beta_steps": 10_000},
}


def bench_config(tmp: Path, seed: int, memory: dict[str, Any]) -> Config:
    data = config_to_dict(Config())
    data.update(run_name="bench", weights_folder=str(tmp), seed=seed, security="none")
    data["worker"].update(test_episode_interval=0, min_samples_per_worker_packet=20, worker_id="bench")
    data["trainer"].update(epochs=1000, rounds=1, steps=500, update_model_interval=20, update_buffer_interval=20,
                           start_training=1000, worker_lead=100, max_training_steps_per_env_step=1.0)
    data["memory"].update(memory)
    data["wandb"]["mode"] = "disabled"
    return config_from_dict(data)


def run_one(tmp: Path, seed: int, variant: str, max_steps: int) -> dict[str, Any]:
    cfg = bench_config(tmp / f"{variant}-{seed}", seed, VARIANTS[variant])
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(seed)
    pipeline = make_pipeline(cfg)
    episodes = cfg.run_dir / "episodes_bench.csv"
    stop = threading.Event()
    worker = RolloutWorker.from_config(cfg, pipeline)
    worker.episode_log_level = logging.DEBUG
    training = Trainer.from_config(cfg, pipeline).training_cls()
    steps: int | None = None
    t0 = time.monotonic()

    def on_round(_: dict[str, Any]) -> None:
        nonlocal steps
        found = crossing(episodes, THRESHOLD, WINDOW)
        steps = None if found is None else found[0]
        if steps is not None or worker.produced >= max_steps:
            stop.set()

    run_local(training, worker, stop, on_round)
    result = {"variant": variant, "seed": seed, "steps_to_-200": steps, "wall_s": round(time.monotonic() - t0, 1)}
    print(f"  {variant:<24} seed {seed}: {steps if steps is not None else f'> {max_steps}'} env steps "
          f"({result['wall_s']} s)", flush=True)
    return result


def run_row(tmp: Path, seeds: list[int], max_steps: int) -> dict[str, Any]:
    runs = [run_one(tmp, seed, variant, max_steps) for seed in seeds for variant in VARIANTS]
    row: dict[str, Any] = {"row": "nstep", "env": "Pendulum-v1", "threshold": THRESHOLD, "max_steps": max_steps,
                           "seeds": seeds, "runs": runs}
    row.update(median_steps(runs, VARIANTS, max_steps))
    return row


def report(row: dict[str, Any]) -> None:
    print(f"{row['env']}: env steps to a mean training return >= {row['threshold']:g} (last {WINDOW} episodes), "
          f"seeds {row['seeds']}")
    for variant in VARIANTS:
        r = row[variant]
        print(f"  {variant:<24} median {r['median_steps']:>8,}   per seed {r['steps']}")
    ratio = row["sac_3step_prioritized"]["median_steps"] / row["sac"]["median_steps"]
    print(f"  3-step prioritized / plain: {ratio:.2f}x the env steps")
