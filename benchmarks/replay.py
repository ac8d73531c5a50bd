"""Replay sampling, two parts, each beside its baseline in the same run:

batch        batches of 256 from a memory of 1M transitions, vectorised, against tmrl's approach:
             get_transition for each of the 256 items, then collate them into tensors. Vector: a
             ReplayMemory of 12-float observations. Image: a FrameStackMemory, which stores each
             64x64 frame once and rebuilds 4-frame stacks when it samples. With torch's threads
             (one per core) and with one (the trainer's torch_threads default). Timed in turns
             (20 batches, then one per-item batch, ``--rounds`` rounds); the ratio is the median of
             the rounds'. Target: >= 20x.
prioritized  a batch of 256 from a ReplayMemory of 1,000,000 rows (Pendulum-sized rows, episodes of
             200 steps, the ring wrapped once) with prioritized replay, plus the priority update a
             training step makes for it, against a uniform batch from the same rows; the same with
             3-step returns beside it. Timed in turns (50 of each per round, 20 rounds), medians,
             one torch thread as the trainer runs. Target: at most 5x the uniform batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.results import Row
from benchmarks.settings import choose, names, positive
from netrl.memory.base import MemoryDataloading, collate
from netrl.memory.replay import ReplayMemory
from netrl.samples import Buffer

PARTS = ("batch", "prioritized")
BATCH = 256
PRIORITIZED_TARGET = 5.0  # prioritized sample + update within this many times a uniform sample


@dataclasses.dataclass(frozen=True)
class Settings:
    parts: tuple[str, ...] = PARTS
    rows: int = 1_000_000
    rounds: int = 10  # batch: rounds of 20 vectorised batches and one per-item batch
    prioritized_rounds: int = 20  # prioritized: rounds of 50 batches of each kind

    def __post_init__(self) -> None:
        choose(self.parts, PARTS, "--parts")
        positive("--rows", self.rows, 1000, strict=False)
        positive("--rounds", min(self.rounds, self.prioritized_rounds), 1, strict=False)


QUICK = Settings(rows=200_000, rounds=4)
SMOKE = Settings(rows=20_000, rounds=2, prioritized_rounds=2)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--parts", type=names, help=f"which parts (default {','.join(d.parts)})")
    p.add_argument("--rows", type=int, help=f"rows in each memory (default {d.rows:,})")
    p.add_argument("--rounds", type=int, help=f"batch part: rounds (default {d.rounds})")
    p.add_argument("--prioritized-rounds", type=int,
                   help=f"prioritized part: rounds (default {d.prioritized_rounds})")


def run(s: Settings) -> list[Row]:
    rows = []
    if "batch" in s.parts:
        rows += bench_batches(s)
    if "prioritized" in s.parts:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            rows += bench_prioritized(s.rows, s.prioritized_rounds)
        finally:
            torch.set_num_threads(threads)
    return rows


# -- batch ---------------------------------------------------------------------------------------
def _episodes(n: int, obs: np.ndarray, act_dim: int, episode: int) -> Buffer:
    rng = np.random.default_rng(0)
    reset = np.arange(n) % (episode + 1) == 0
    return Buffer(act=rng.uniform(-1, 1, (n, act_dim)).astype(np.float32), obs=obs,
                  rew=np.zeros(n, np.float32), terminated=np.zeros(n, bool),
                  truncated=np.zeros(n, bool), reset=reset, context=np.zeros(n, bool),
                  policy_version=np.zeros(n, np.int64))


def speed(memory: MemoryDataloading, packet: Buffer, rows: int, rounds: int = 10,
          fast_per_round: int = 20) -> dict[str, Any]:
    """Fill ``memory`` with ``rows`` rows, then time vectorised batches against per-item ones with
    torch's threads (one per core) and with one thread, as the trainer runs with
    ``torch_threads: 1``."""
    t0 = time.perf_counter()
    while getattr(memory, "total_appended", 0) < rows:
        memory.append_buffer(packet)
    fill_s = time.perf_counter() - t0
    for _ in range(3):
        memory.sample()
    threads = torch.get_num_threads()
    got = {"transitions": len(memory), "fill_s": fill_s, "torch_threads": threads,
           **_interleaved(memory, rounds, fast_per_round)}
    torch.set_num_threads(1)
    try:
        one = _interleaved(memory, rounds, fast_per_round)
    finally:
        torch.set_num_threads(threads)
    return got | {f"{k}_one_thread": v for k, v in one.items()}


def _interleaved(memory: MemoryDataloading, rounds: int, fast_per_round: int) -> dict[str, Any]:
    """Each round times ``fast_per_round`` vectorised batches and then one per-item batch, so that
    both sides of a round's ratio see the same machine (on this VM, memory bandwidth and CPU time
    swing apart from one minute to the next); the ratio is the median of the rounds'."""
    fast, slow, ratios = [], [], []
    for _ in range(rounds):
        times = []
        for _ in range(fast_per_round):
            t = time.perf_counter()
            memory.sample()
            times.append(time.perf_counter() - t)
        t = time.perf_counter()  # tmrl: get_transition per item, then collate
        items = memory.rng.integers(0, len(memory), size=memory.batch_size)
        columns = zip(*(memory.get_transition(int(i))[:6] for i in items), strict=True)
        batch = [collate(list(column), "cpu") for column in columns]
        slow.append(time.perf_counter() - t)
        assert batch[0].shape[0] == memory.batch_size
        fast += times
        ratios.append(slow[-1] / float(np.median(times)))
    return {"batches_s": 1 / float(np.median(fast)),
            "per_item_batches_s": 1 / float(np.median(slow)),
            "ratio": float(np.median(ratios)), "ratio_per_round": ratios}


def bench_batches(s: Settings) -> list[Row]:
    from netrl.memory.frames import FrameStackMemory

    rng = np.random.default_rng(0)
    out = []
    vector = ReplayMemory(memory_size=s.rows, batch_size=BATCH, seed=0)
    obs = rng.normal(size=(1000, 12)).astype(np.float32)
    out.append(("vector", speed(vector, _episodes(1000, obs, 2, 200), s.rows, s.rounds)))
    del vector
    image = FrameStackMemory(memory_size=s.rows, batch_size=BATCH, stack=4, seed=0)
    frames = rng.integers(0, 256, (1000, 64, 64), dtype=np.uint8)
    out.append(("image", speed(image, _episodes(1000, frames, 2, 50), s.rows, s.rounds)))
    rows = []
    for kind, r in out:
        print(f"replay {kind:<6} {r['transitions']:,} transitions  vectorised "
              f"{r['batches_s']:8.0f} batches/s | per item {r['per_item_batches_s']:6.1f} "
              "batches/s | "
              f"{r['ratio']:.0f}x with {r['torch_threads']} torch threads; "
              f"{r['batches_s_one_thread']:8.0f} batches/s, {r['ratio_one_thread']:.0f}x with one",
              flush=True)
        rows.append(Row("replay", f"{kind}, batch {BATCH} of {r['transitions']:,}, "
                        f"{r['torch_threads']} torch threads", "batches/s", r["batches_s"],
                        "batches/s", r["per_item_batches_s"], "tmrl's per-item loop", r["ratio"],
                        "x", ">= 20x", r["ratio"] >= 20,
                        {"part": "batch", "kind": kind, "rows": s.rows, "rounds": s.rounds}, r))
    return rows


# -- prioritized ---------------------------------------------------------------------------------
def pendulum_rows(n: int, start: int, episode: int = 200) -> Buffer:
    """``n`` rows of Pendulum-sized samples (3 observation floats, 1 action), a new episode every
    ``episode`` steps."""
    rng = np.random.default_rng(start)
    rows = np.arange(start, start + n)
    return Buffer(act=rng.uniform(-2, 2, (n, 1)).astype(np.float32),
                  obs=rng.normal(size=(n, 3)).astype(np.float32),
                  rew=rng.uniform(-16, 0, n).astype(np.float32), terminated=np.zeros(n, bool),
                  truncated=(rows % (episode + 1)) == episode, reset=(rows % (episode + 1)) == 0,
                  context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64))


def filled(rows: int, **kwargs: Any) -> ReplayMemory:
    memory = ReplayMemory(memory_size=rows, batch_size=BATCH, seed=0, **kwargs)
    for start in range(0, rows + 1000, 1000):  # a little more than full: the ring has wrapped
        memory.append_buffer(pendulum_rows(1000, start))
    return memory


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def bench_prioritized(rows: int, rounds: int) -> list[Row]:
    """Uniform batches, prioritized batches plus their update, and the same with 3-step returns,
    timed in turns."""
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
    r = {"rows": rows, "transitions": len(memories["uniform"]), "batch": BATCH,
         "fill_s": round(fill_s, 1), "uniform_us": round(us["uniform"], 1),
         "prioritized_us": round(us["prioritized"], 1),
         "prioritized_3step_us": round(us["prioritized_3step"], 1),
         "ratio": round(us["prioritized"] / us["uniform"], 2),
         "ratio_3step": round(us["prioritized_3step"] / us["uniform"], 2)}
    print(f"batch of {BATCH} from {r['transitions']:,} transitions ({rows:,} rows), one torch "
          f"thread: uniform sample {r['uniform_us']:.1f} us | prioritized sample + update_priority "
          f"{r['prioritized_us']:.1f} us, {r['ratio']:.2f}x | the same with 3-step returns "
          f"{r['prioritized_3step_us']:.1f} us, {r['ratio_3step']:.2f}x", flush=True)
    where = f"batch {BATCH} of {r['transitions']:,}, one torch thread"
    params = {"part": "prioritized", "rows": rows, "rounds": rounds}
    return [Row("replay", f"prioritized, {where}", "sample() + update_priority()",
                r["prioritized_us"], "us", r["uniform_us"], "uniform sample()", r["ratio"], "x",
                f"<= {PRIORITIZED_TARGET:g}x", r["ratio"] <= PRIORITIZED_TARGET, params, r),
            Row("replay", f"prioritized, 3-step returns, {where}", "sample() + update_priority()",
                r["prioritized_3step_us"], "us", r["uniform_us"], "uniform sample()",
                r["ratio_3step"], "x", params=params, detail=r)]
