"""Replay sampling: batches of 256 from a memory of 1M transitions, vectorised against tmrl's per-item approach.

Vector: ReplayMemory of 12-float observations. Image: FrameStackMemory, which stores each 64x64 frame once and
rebuilds 4-frame stacks when it samples. The baseline is what tmrl does: get_transition for each of the 256 items,
then collate them into tensors.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from netrl.memory.base import MemoryDataloading, collate
from netrl.memory.replay import ReplayMemory
from netrl.samples import Buffer

ROWS = 1_000_000


def _episodes(n: int, obs: np.ndarray, act_dim: int, episode: int) -> Buffer:
    rng = np.random.default_rng(0)
    reset = np.arange(n) % (episode + 1) == 0
    return Buffer(act=rng.uniform(-1, 1, (n, act_dim)).astype(np.float32), obs=obs, rew=np.zeros(n, np.float32),
                  terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), reset=reset, context=np.zeros(n, bool),
                  policy_version=np.zeros(n, np.int64))


def speed(memory: MemoryDataloading, packet: Buffer, rows: int, rounds: int = 10, fast_per_round: int = 20
          ) -> dict[str, Any]:
    """Fill ``memory`` with ``rows`` rows, then time vectorised batches against per-item ones with torch's
    threads (one per core) and with one thread, as the trainer runs with ``torch_threads: 1``."""
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
    """Each round times ``fast_per_round`` vectorised batches and then one per-item batch, so that both sides of a
    round's ratio see the same machine (on this VM, memory bandwidth and CPU time swing apart from one minute to
    the next); the ratio is the median of the rounds'."""
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
    return {"batches_s": 1 / float(np.median(fast)), "per_item_batches_s": 1 / float(np.median(slow)),
            "ratio": float(np.median(ratios)), "ratio_per_round": ratios}


def bench_replay(quick: bool) -> list[dict[str, Any]]:
    from netrl.memory.frames import FrameStackMemory

    rows, rounds = (200_000, 4) if quick else (ROWS, 10)
    rng = np.random.default_rng(0)
    out = []
    vector = ReplayMemory(memory_size=rows, batch_size=256, seed=0)
    got = speed(vector, _episodes(1000, rng.normal(size=(1000, 12)).astype(np.float32), 2, 200), rows, rounds)
    out.append({"section": "replay", "kind": "vector", **got})
    del vector
    image = FrameStackMemory(memory_size=rows, batch_size=256, stack=4, seed=0)
    frames = rng.integers(0, 256, (1000, 64, 64), dtype=np.uint8)
    got = speed(image, _episodes(1000, frames, 2, 50), rows, rounds)
    out.append({"section": "replay", "kind": "image", **got})
    for r in out:
        print(f"replay {r['kind']:<6} {r['transitions']:,} transitions  vectorised {r['batches_s']:8.0f} batches/s | "
              f"per item {r['per_item_batches_s']:6.1f} batches/s | {r['ratio']:.0f}x with {r['torch_threads']} torch "
              f"threads; {r['batches_s_one_thread']:8.0f} batches/s, {r['ratio_one_thread']:.0f}x with one",
              flush=True)
    return out
