"""Batches prepared ahead: SAC gradient steps/s through netrl's training loop with
trainer.prefetch off and on.

Rows: the MLP SAC at batch 256 (Pendulum-sized: 3 observations, 1 action, 256x256) and the image
pipeline's CNN SAC at batch 64 (4x64x64 uint8 stacks, stored as whole stacks in a ReplayMemory),
each with prefetch off and on, with the replay columns in host memory and, on a CUDA machine, on
the device (memory.device cuda). The memory is filled with random packets first, so the loop never
waits for samples. Each run trains one warm-up round, not counted, then one measured round; the
runs of a row alternate off/on ``--repeat`` times and the medians are reported.

Reported per run: gradient steps/s, the share of wall time the update waited for its batch (the
loop's sample_fraction: inside memory.sample without prefetch, waiting for the batch gathered
ahead with it), and the share outside agent.train (1 - train_fraction; the trainer target is
<= 10%).

On CPU the trainer gathers ahead only where a core is free beside torch's threads (``--threads``,
1 by default as in config.json's torch_threads; netrl.memory.prefetch.core_free also reads the
load average). ``--ahead force`` (the default) gathers ahead in the "on" runs whatever the load,
to measure what it does; ``--ahead auto`` leaves the choice to the trainer, as a run does.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import threading
from typing import Any

import gymnasium
import numpy as np
import torch

from benchmarks.results import Row
from benchmarks.settings import choose, names, positive
from benchmarks.trainer import FilledSource, device_of
from netrl.agents.cnn import CNNActorCritic
from netrl.agents.sac import MLPActorCritic, SACAgent
from netrl.memory import prefetch as prefetch_module
from netrl.memory.prefetch import core_free
from netrl.memory.replay import ReplayMemory
from netrl.samples import Buffer
from netrl.training.loop import TrainingOffline
from netrl.util import partial

ROWS: dict[str, dict[str, Any]] = {
    "mlp": {"obs": gymnasium.spaces.Box(-1, 1, (3,), np.float32), "batch": 256, "memory": 100_000,
            "model": partial(MLPActorCritic, hidden_sizes=(256, 256))},
    "cnn": {"obs": gymnasium.spaces.Box(0, 255, (4, 64, 64), np.uint8), "batch": 64,
            "memory": 5_000, "model": partial(CNNActorCritic, hidden_sizes=(256, 256))},
}
ACT = gymnasium.spaces.Box(-1, 1, (1,), np.float32)


@dataclasses.dataclass(frozen=True)
class Settings:
    rows: tuple[str, ...] = tuple(ROWS)
    device: str = "auto"  # auto: cuda where there is one, else cpu
    steps: int = 400  # measured steps of the MLP row (and its warm-up)
    cnn_steps: int = 40  # measured steps of the CNN row (and its warm-up)
    repeat: int = 3
    threads: int = 1  # torch threads (config.json's torch_threads)
    ahead: str = "force"  # force: gather ahead in the "on" runs whatever the load; auto: as a run

    def __post_init__(self) -> None:
        choose(self.rows, ROWS, "--rows")
        choose((self.ahead,), ("force", "auto"), "--ahead")
        positive("--steps", min(self.steps, self.cnn_steps), 1, strict=False)
        positive("--repeat", self.repeat, 1, strict=False)
        positive("--threads", self.threads, 1, strict=False)


SMOKE = Settings(rows=("mlp",), steps=10, cnn_steps=4, repeat=1)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--rows", type=names, help=f"which rows (default {','.join(d.rows)})")
    p.add_argument("--device", help="cpu, cuda, ... (default: cuda where there is one)")
    p.add_argument("--steps", type=int, help=f"measured steps of the MLP row ({d.steps})")
    p.add_argument("--cnn-steps", type=int, help=f"measured steps of the CNN row ({d.cnn_steps})")
    p.add_argument("--repeat", type=int, help=f"off/on runs per row, medians ({d.repeat})")
    p.add_argument("--threads", type=int, help=f"torch threads (default {d.threads})")
    p.add_argument("--ahead", help="force (default) or auto: see above")


def _packets(obs_space: gymnasium.spaces.Box, rows: int, per_packet: int = 500) -> list[Buffer]:
    rng = np.random.default_rng(0)
    out = []
    for seq, start in enumerate(range(0, rows, per_packet)):
        n = min(per_packet, rows - start)
        if obs_space.dtype == np.uint8:
            obs = rng.integers(0, 256, (n, *obs_space.shape), np.uint8)
        else:
            obs = rng.uniform(-1, 1, (n, *obs_space.shape)).astype(np.float32)
        out.append(Buffer(act=rng.uniform(-1, 1, (n, 1)).astype(np.float32), obs=obs,
                          rew=rng.normal(size=n).astype(np.float32),
                          terminated=np.arange(n) % 200 == 199, truncated=np.zeros(n, bool),
                          reset=np.arange(n) % 200 == 0, context=np.zeros(n, bool),
                          policy_version=np.zeros(n, np.int64), worker="bench", seq=seq))
    return out


def measure(row: str, device: str, memory_device: str, prefetch: bool,
            steps: int) -> dict[str, Any]:
    spec = ROWS[row]
    training = TrainingOffline(env_cls=(spec["obs"], ACT), memory_cls=ReplayMemory,
                               training_agent_cls=partial(SACAgent, model_cls=spec["model"]),
                               epochs=1, rounds=2, steps=steps, update_model_interval=10**9,
                               update_buffer_interval=10**9, max_training_steps_per_env_step=1e9,
                               memory_size=spec["memory"], batch_size=spec["batch"], seed=0,
                               device=device, prefetch=prefetch, memory_device=memory_device)
    training.build()
    source = FilledSource(_packets(spec["obs"], min(spec["memory"], 20_000)))
    warm_up, measured = training.run_epoch(source, threading.Event())
    return {"row": row, "device": device, "memory_device": memory_device, "prefetch": prefetch,
            "steps_per_s": measured["steps_per_s"], "sample_fraction": measured["sample_fraction"],
            "outside_train": 1 - measured["train_fraction"], "warm_up_s": warm_up["wall_s"]}


def run(s: Settings) -> list[Row]:
    torch.set_num_threads(s.threads)
    device = device_of(s.device)
    where = (torch.cuda.get_device_name() if device.startswith("cuda")
             else f"CPU, {s.threads} torch thread(s)")
    print(f"prefetch: device {where}; a core free beside torch's threads now: {core_free()} "
          f"(load average {os.getloadavg()[0]:.1f} on {len(os.sched_getaffinity(0))} cores); "
          f"prefetch on: {s.ahead}", flush=True)
    if s.ahead == "force":
        prefetch_module.core_free = lambda: True
    storages = ["cpu", "cuda"] if device.startswith("cuda") else ["cpu"]
    out = []
    for row in s.rows:
        steps = s.cnn_steps if row == "cnn" else s.steps
        for storage in storages:
            runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
            for _ in range(s.repeat):
                for prefetch in (False, True):  # in turns: other jobs' load slows both alike
                    runs[prefetch].append(measure(row, device, storage, prefetch, steps))
            med = {p: {k: statistics.median(r[k] for r in rs)
                       for k in ("steps_per_s", "sample_fraction", "outside_train", "warm_up_s")}
                   for p, rs in runs.items()}
            for prefetch, rs in runs.items():
                m = med[prefetch]
                print(f"  {row} (batch {ROWS[row]['batch']}), memory.device {storage}, prefetch "
                      f"{'on' if prefetch else 'off'}: {m['steps_per_s']:.1f} steps/s, waiting for "
                      f"a batch {m['sample_fraction']:.1%}, outside agent.train "
                      f"{m['outside_train']:.1%}, warm-up {m['warm_up_s']:.1f} s", flush=True)
                off = med[False]["steps_per_s"]
                out.append(Row(
                    "prefetch", f"{row} SAC, batch {ROWS[row]['batch']}, memory.device {storage}, "
                    f"prefetch {'on' if prefetch else 'off'}", "gradient steps/s",
                    m["steps_per_s"], "steps/s", off, "prefetch off", m["steps_per_s"] / off, "x",
                    params={"row": row, "device": device, "memory_device": storage,
                            "prefetch": prefetch, "steps": steps, "repeat": s.repeat,
                            "threads": s.threads, "ahead": s.ahead},
                    detail={**rs[0], **m, "runs": rs}))
    return out
