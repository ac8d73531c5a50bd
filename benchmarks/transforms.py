"""The worker's step with and without env transforms (env.transforms), conditions alternating:

step    A RolloutWorker (no network: its packets are kept in memory) running the gym pipeline's
        MLP actor on Pendulum-v1 for --episodes episodes of 200 steps, with env.transforms
        empty (the baseline) and with a Compose of two (RewardScaling, StepCounter); the time
        per worker step (act, env step, row into its packet), median over --repeats runs of each.
        The figure is the time the transforms add per step, against the 50 ms of a 20 Hz loop.
env     The same env's step alone (Pendulum-v1 through the pipeline's env class, --steps x 20
        steps), with and without the two transforms: the overhead without the worker's noise.
image   The image pipeline's env step (ImageReach, one 64x64 frame a step, stacked by CatFrames)
        with and without a Resize to 84x84 in front, median over --repeats runs of --steps steps.

Target: a Compose of two transforms adds under 1% of a 20 Hz step (0.5 ms).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any

import numpy as np
import torch

from benchmarks.results import Row
from benchmarks.settings import positive
from netrl.config.load import config_from_dict
from netrl.pipelines.make import make_pipeline
from netrl.worker.worker import RolloutWorker

PERIOD_MS = 50.0  # a 20 Hz loop
TARGET_SHARE = 0.01  # of its period
TWO = [{"name": "RewardScaling", "scale": 0.1}, {"name": "StepCounter", "max_steps": 1000}]


@dataclasses.dataclass(frozen=True)
class Settings:
    episodes: int = 5  # Pendulum episodes (200 steps each) per worker run
    repeats: int = 7  # runs per condition, alternating
    steps: int = 500  # image env steps per run

    def __post_init__(self) -> None:
        positive("--episodes", self.episodes, 1, strict=False)
        positive("--repeats", self.repeats, 1, strict=False)
        positive("--steps", self.steps, 10, strict=False)


SMOKE = Settings(episodes=1, repeats=2, steps=50)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--episodes", type=int, help=f"Pendulum episodes per worker run ({d.episodes})")
    p.add_argument("--repeats", type=int, help=f"runs per condition, alternating ({d.repeats})")
    p.add_argument("--steps", type=int, help=f"image env steps per run ({d.steps})")


def worker_step_ms(transforms: list[dict[str, Any]], episodes: int) -> float:
    """Milliseconds per step of a worker running ``episodes`` Pendulum episodes."""
    pipeline = make_pipeline(config_from_dict({"env": {"transforms": transforms}}))
    worker = RolloutWorker(pipeline.env_cls, pipeline.actor_module_cls, seed=0, run_dir=None,
                           min_samples_per_worker_packet=200)
    worker.local_packets = []
    worker.start()
    try:
        start = time.perf_counter()
        worker.run(0, nb_episodes=episodes)
        took = time.perf_counter() - start
        steps = sum(int((~b.reset).sum()) for b in worker.local_packets)
    finally:
        worker.close()
    return took / max(steps, 1) * 1e3


def env_step_us(transforms: list[dict[str, Any]], steps: int) -> float:
    env = make_pipeline(config_from_dict({"env": {"transforms": transforms}})).env_cls()
    action = np.zeros(1, np.float32)
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        if any(env.step(action)[2:4]):
            env.reset()
    took = time.perf_counter() - start
    env.close()
    return took / steps * 1e6


def image_step_ms(transforms: list[dict[str, Any]], steps: int) -> float:
    env = make_pipeline(config_from_dict({"env": {"pipeline": "image",
                                                  "transforms": transforms}})).env_cls()
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (steps, 2)).astype(np.float32)
    env.reset(seed=0)
    start = time.perf_counter()
    for a in actions:
        if any(env.step(a)[2:4]):
            env.reset()
    took = time.perf_counter() - start
    env.close()
    return took / steps * 1e3


def alternate(fn: Any, conditions: dict[str, Any], repeats: int) -> dict[str, float]:
    """The median of ``repeats`` runs of ``fn(condition)`` per condition, conditions alternating."""
    times: dict[str, list[float]] = {name: [] for name in conditions}
    for _ in range(repeats):
        for name, arg in conditions.items():
            times[name].append(fn(arg))
    return {name: statistics.median(v) for name, v in times.items()}


def run(s: Settings) -> list[Row]:
    torch.set_num_threads(1)
    worker = alternate(lambda t: worker_step_ms(t, s.episodes), {"none": [], "two": TWO},
                       s.repeats)
    added = worker["two"] - worker["none"]
    print(f"worker step: {worker['none']:.3f} ms without transforms, {worker['two']:.3f} ms with "
          f"RewardScaling + StepCounter ({added * 1e3:+.1f} us a step, "
          f"{added / PERIOD_MS:+.3%} of a 20 Hz step)", flush=True)
    env = alternate(lambda t: env_step_us(t, 20 * s.steps), {"none": [], "two": TWO}, s.repeats)
    print(f"env step: {env['none']:.1f} us, {env['two']:.1f} us with the two transforms "
          f"({env['two'] - env['none']:+.1f} us)", flush=True)
    resize = [{"name": "Resize", "w": 84, "h": 84}]
    image = alternate(lambda t: image_step_ms(t, s.steps), {"none": [], "resize": resize},
                      s.repeats)
    print(f"image env step: {image['none']:.3f} ms, {image['resize']:.3f} ms with a Resize to "
          f"84x84 before CatFrames", flush=True)
    target = f"adds < {TARGET_SHARE:.0%} of a 20 Hz step ({PERIOD_MS * TARGET_SHARE:g} ms)"
    params = dataclasses.asdict(s)
    return [
        Row("transforms", "worker step, Pendulum, RewardScaling + StepCounter", "time per step",
            worker["two"], "ms", worker["none"], "no transforms", added * 1e3, "us added",
            target, added < PERIOD_MS * TARGET_SHARE, params=params, detail=worker),
        Row("transforms", "Pendulum env step, RewardScaling + StepCounter", "time per step",
            env["two"], "us", env["none"], "no transforms", env["two"] - env["none"],
            "us added", params=params, detail=env),
        Row("transforms", "image env step, Resize 64 -> 84 before CatFrames(4)", "time per step",
            image["resize"], "ms", image["none"], "no Resize",
            (image["resize"] - image["none"]) * 1e3, "us added", params=params, detail=image),
    ]
