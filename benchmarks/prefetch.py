"""Batches prepared ahead: SAC gradient steps/s through netrl's training loop with trainer.prefetch off and on.

Rows: the MLP SAC at batch 256 (Pendulum-sized: 3 observations, 1 action, 256x256) and the image pipeline's CNN SAC at
batch 64 (4x64x64 uint8 stacks, stored as whole stacks in a ReplayMemory), each with prefetch off and on, with the
replay columns in host memory and, on a CUDA machine, on the device (memory.device cuda). The memory is filled with
random packets first, so the loop never waits for samples. Each run trains one warm-up round, not counted, then one
measured round; the runs of a row alternate off/on ``--repeat`` times and the medians are reported.

Reported per run: gradient steps/s, the share of wall time the update waited for its batch (the loop's
sample_fraction: inside memory.sample without prefetch, waiting for the batch gathered ahead with it), and the share
outside agent.train (1 - train_fraction; the trainer target is <= 10%).

On CPU the trainer gathers ahead only where a core is free beside torch's threads (``--threads``, 1 by default as in
config.json's torch_threads; netrl.memory.prefetch.core_free also reads the load average). ``--ahead force`` (the
default) gathers ahead in the "on" runs whatever the load, to measure what it does; ``--ahead auto`` leaves the choice
to the trainer, as a run does.

Usage: .venv/bin/python scripts/bench_prefetch.py [--rows mlp,cnn] [--device cpu|cuda] [--steps 400]
       [--cnn-steps 40] [--repeat 3] [--threads 1] [--ahead force|auto] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from typing import Any

import gymnasium
import numpy as np
import torch

from netrl.agents.cnn import CNNActorCritic
from netrl.agents.sac import MLPActorCritic, SACAgent
from netrl.memory import prefetch as prefetch_module
from netrl.memory.prefetch import core_free
from netrl.memory.replay import ReplayMemory
from netrl.samples import Buffer
from netrl.training.loop import TrainingOffline
from netrl.util import partial


class _Source:
    """A SampleSource that hands over its packets once and publishes nowhere."""

    def __init__(self, packets: list[Buffer]) -> None:
        self.packets = packets

    def fetch(self) -> list[Buffer]:
        out, self.packets = self.packets, []
        return out

    def wait(self, timeout: float) -> None:
        time.sleep(timeout)

    def publish(self, actor: torch.nn.Module, version: int, trained_steps: int) -> None:
        pass

    def progress(self, *args: Any) -> None:
        pass

    def taken_version(self) -> int:
        return -1


ROWS: dict[str, dict[str, Any]] = {
    "mlp": {"obs": gymnasium.spaces.Box(-1, 1, (3,), np.float32), "batch": 256, "memory": 100_000,
            "model": partial(MLPActorCritic, hidden_sizes=(256, 256))},
    "cnn": {"obs": gymnasium.spaces.Box(0, 255, (4, 64, 64), np.uint8), "batch": 64, "memory": 5_000,
            "model": partial(CNNActorCritic, hidden_sizes=(256, 256))},
}
ACT = gymnasium.spaces.Box(-1, 1, (1,), np.float32)


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
                          rew=rng.normal(size=n).astype(np.float32), terminated=np.arange(n) % 200 == 199,
                          truncated=np.zeros(n, bool), reset=np.arange(n) % 200 == 0, context=np.zeros(n, bool),
                          policy_version=np.zeros(n, np.int64), worker="bench", seq=seq))
    return out


def run(row: str, device: str, memory_device: str, prefetch: bool, steps: int) -> dict[str, Any]:
    spec = ROWS[row]
    training = TrainingOffline(env_cls=(spec["obs"], ACT), memory_cls=ReplayMemory,
                               training_agent_cls=partial(SACAgent, model_cls=spec["model"]), epochs=1, rounds=2,
                               steps=steps, update_model_interval=10**9, update_buffer_interval=10**9,
                               max_training_steps_per_env_step=1e9, memory_size=spec["memory"],
                               batch_size=spec["batch"], seed=0, device=device, prefetch=prefetch,
                               memory_device=memory_device)
    training.build()
    source = _Source(_packets(spec["obs"], min(spec["memory"], 20_000)))
    warm_up, measured = training.run_epoch(source, threading.Event())  # type: ignore[arg-type]
    return {"row": row, "device": device, "memory_device": memory_device, "prefetch": prefetch,
            "steps_per_s": measured["steps_per_s"], "sample_fraction": measured["sample_fraction"],
            "outside_train": 1 - measured["train_fraction"], "warm_up_s": warm_up["wall_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="mlp,cnn")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=400, help="measured steps of the MLP row (and its warm-up)")
    parser.add_argument("--cnn-steps", type=int, default=40, help="measured steps of the CNN row (and its warm-up)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (config.json: torch_threads)")
    parser.add_argument("--ahead", choices=["force", "auto"], default="force")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {args.threads} torch thread(s)"
    print(f"device: {where}; a core free beside torch's threads now: {core_free()} (load average "
          f"{os.getloadavg()[0]:.1f} on {len(os.sched_getaffinity(0))} cores); prefetch on: {args.ahead}")
    if args.ahead == "force":
        prefetch_module.core_free = lambda: True
    storages = ["cpu", "cuda"] if args.device.startswith("cuda") else ["cpu"]
    results = []
    print("| row | memory.device | prefetch | steps/s | waiting for a batch | outside agent.train | warm-up s |")
    print("|---|---|---|---|---|---|---|")
    for row in args.rows.split(","):
        steps = args.cnn_steps if row == "cnn" else args.steps
        for storage in storages:
            runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
            for _ in range(args.repeat):
                for prefetch in (False, True):  # in turns: a machine shared with other jobs slows both alike
                    runs[prefetch].append(run(row, args.device, storage, prefetch, steps))
            for prefetch, rs in runs.items():
                med = {k: statistics.median(r[k] for r in rs) for k in ("steps_per_s", "sample_fraction",
                                                                         "outside_train", "warm_up_s")}
                results.append({**rs[0], **med, "runs": rs})
                print(f"| {row} (batch {ROWS[row]['batch']}) | {storage} | {'on' if prefetch else 'off'} | "
                      f"{med['steps_per_s']:.1f} | {med['sample_fraction']:.1%} | {med['outside_train']:.1%} | "
                      f"{med['warm_up_s']:.1f} |")
            off, on = (statistics.median(r["steps_per_s"] for r in runs[p]) for p in (False, True))
            print(f"|   prefetch on / off | | | {on / off:.2f}x | | | |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
