"""Trajectory views in replay (issue 32), each beside its baseline in the same run.

prioritized  a batch of 256 from a ReplayMemory of 1,000,000 rows (Pendulum-sized rows, episodes of 200 steps) with
             prioritized replay, plus the priority update a training step makes for it, against a uniform batch from
             the same rows. Timed in turns (a round of each, 20 rounds), medians, with one torch thread as the
             trainer runs. Target: at most 5x the uniform batch. Shown too: the same with 3-step returns.

Usage: .venv/bin/python scripts/bench_replay_views.py [--rows 1000000] [--rounds 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from netrl.memory.replay import ReplayMemory
from netrl.samples import Buffer

BATCH = 256
PRIORITIZED_TARGET = 5.0  # prioritized sample + update within this many times a uniform sample


def pendulum_rows(n: int, start: int, episode: int = 200) -> Buffer:
    """``n`` rows of Pendulum-sized samples (3 observation floats, 1 action), a new episode every ``episode`` steps."""
    rng = np.random.default_rng(start)
    rows = np.arange(start, start + n)
    return Buffer(act=rng.uniform(-2, 2, (n, 1)).astype(np.float32), obs=rng.normal(size=(n, 3)).astype(np.float32),
                  rew=rng.uniform(-16, 0, n).astype(np.float32), terminated=np.zeros(n, bool),
                  truncated=(rows % (episode + 1)) == episode, reset=(rows % (episode + 1)) == 0,
                  context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64))


def filled(rows: int, **kwargs: Any) -> ReplayMemory:
    memory = ReplayMemory(memory_size=rows, batch_size=BATCH, seed=0, **kwargs)
    for start in range(0, rows + 1000, 1000):  # a little more than full: the ring has wrapped, as in a long run
        memory.append_buffer(pendulum_rows(1000, start))
    return memory


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def bench_prioritized(rows: int, rounds: int) -> dict[str, Any]:
    """Uniform batches, prioritized batches plus their update, and the same with 3-step returns, timed in turns."""
    t0 = time.perf_counter()
    memories = {"uniform": filled(rows), "prioritized": filled(rows, prioritized=True),
                "prioritized_3step": filled(rows, prioritized=True, n_step=3, gamma=0.99)}
    fill_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    td = rng.exponential(size=BATCH)

    def step(memory: ReplayMemory) -> Callable[[], Any]:
        if not memory.prioritized:
            return memory.sample
        return lambda: (memory.sample(), memory.update_priority(td))

    steps = {name: step(m) for name, m in memories.items()}
    for fn in steps.values():
        timed(fn, 20)  # warm up: first batches allocate their buffers
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            times[name] += timed(fn, 50)
    us = {name: float(np.median(t)) * 1e6 for name, t in times.items()}
    ratio = us["prioritized"] / us["uniform"]
    return {"section": "prioritized", "rows": rows, "transitions": len(memories["uniform"]), "batch": BATCH,
            "fill_s": round(fill_s, 1), "uniform_us": round(us["uniform"], 1),
            "prioritized_us": round(us["prioritized"], 1), "prioritized_3step_us": round(us["prioritized_3step"], 1),
            "ratio": round(ratio, 2), "ratio_3step": round(us["prioritized_3step"] / us["uniform"], 2),
            "target": PRIORITIZED_TARGET, "met": ratio <= PRIORITIZED_TARGET}


def report(r: dict[str, Any]) -> None:
    print(f"batch of {r['batch']} from {r['transitions']:,} transitions ({r['rows']:,} rows), one torch thread:")
    print(f"  uniform sample                        {r['uniform_us']:9.1f} us")
    print(f"  prioritized sample + update_priority  {r['prioritized_us']:9.1f} us  {r['ratio']:.2f}x")
    print(f"  the same with 3-step returns          {r['prioritized_3step_us']:9.1f} us  {r['ratio_3step']:.2f}x")
    print(f"  target: prioritized <= {r['target']:g}x uniform: {'met' if r['met'] else 'NOT met'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [bench_prioritized(args.rows, args.rounds)]
    for r in results:
        report(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(json.dumps(results))
    return 0 if all(r["met"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
