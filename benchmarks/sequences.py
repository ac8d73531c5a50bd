"""Sequence sampling: 64 sequences of 32 consecutive transitions from a 1,000,000-row ReplayMemory,
with the vectorised sampler (one index matrix, one gather per column) beside gathering the same
sequences item by item two ways, side by side in one run: a Python walk per sequence reading each
row's fields from the ring's columns one by one, and the same walk through ``get_transition``, the
per-item API every memory has (tmrl's way); both stacked, and checked equal field by field.

Rows look like a recurrent Pendulum run's: 3 observation floats, 1 action, and a GRU state of
(1, 64) recorded with each step; episodes of 200 steps in packets of 1,000 rows from 4 envs, the
ring wrapped once, fresh starts for every batch. Target: the vectorised sampler at least 20x faster
than gathering item by item.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

import numpy as np

from benchmarks.results import Row
from benchmarks.settings import positive
from netrl.memory.replay import ReplayMemory
from netrl.samples import Buffer

BATCH, LENGTH, HIDDEN, PACKET, EPISODE = 64, 32, 64, 1000, 200
TARGET = 20.0  # the vectorised batch at least this many times faster than item by item


@dataclasses.dataclass(frozen=True)
class Settings:
    rows: int = 1_000_000
    repeats: int = 20  # vectorised batches timed; a quarter (a tenth) as many item by item

    def __post_init__(self) -> None:
        positive("--rows", self.rows, 10 * PACKET, strict=False)
        positive("--repeats", self.repeats, 1, strict=False)


SMOKE = Settings(rows=20_000, repeats=4)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--rows", type=int, help=f"rows in the memory (default {d.rows:,})")
    p.add_argument("--repeats", type=int, help=f"vectorised batches timed (default {d.repeats})")


def packets(rows: int, seed: int = 0) -> list[Buffer]:
    """Packets of PACKET rows: one context row, then an env's steps; each episode starts with a
    reset row."""
    rng = np.random.default_rng(seed)
    out: list[Buffer] = []
    t = 0
    while t < rows:
        n = min(PACKET, rows - t)
        step = (t + np.arange(n)) % (EPISODE + 1)  # 0: the reset row
        context = np.zeros(n, np.bool_)
        context[0] = True
        out.append(Buffer(
            act=rng.uniform(-2, 2, (n, 1)).astype(np.float32),
            obs=rng.normal(size=(n, 3)).astype(np.float32),
            rew=rng.normal(size=n).astype(np.float32), terminated=np.zeros(n, np.bool_),
            truncated=step == EPISODE, reset=step == 0, context=context,
            policy_version=np.zeros(n, np.int64), worker="bench",
            env=np.full(n, len(out) % 4, np.uint16),
            extra={"recurrent_state": rng.normal(size=(n, 1, HIDDEN)).astype(np.float32)}))
        t += n
    return out


def walk(memory: ReplayMemory, s: int) -> tuple[list[int], list[bool]]:
    """The rows of the sequence that starts at row ``s``, one continuation test at a time, padded;
    and its mask."""
    cols, cap = memory._cols, memory.memory_size
    oldest = memory._pos if memory._size == cap else 0
    rows, k = [s], s
    while len(rows) < LENGTH:
        nxt = (k + 1) % cap
        if ((k - oldest) % cap + 1 >= memory._size or not cols["end"][nxt] or cols["terminated"][k]
                or cols["truncated"][k]):
            break
        rows.append(nxt)
        k = nxt
    mask = [True] * len(rows) + [False] * (LENGTH - len(rows))
    return rows + [rows[-1]] * (LENGTH - len(rows)), mask


FIELDS = ("obs", "act", "rew", "next_obs", "terminated", "truncated", "state", "mask")


def through_the_api(memory: ReplayMemory, starts: np.ndarray,
                    item_of_row: np.ndarray) -> dict[str, np.ndarray]:
    """The same sequences through the per-item API every memory has (``get_transition``, tmrl's
    way), stacked."""
    fields: dict[str, list[Any]] = {k: [] for k in FIELDS}
    for s in starts.tolist():
        rows, mask = walk(memory, s)
        items = [memory.get_transition(int(item_of_row[r])) for r in rows]
        for i, name in enumerate(FIELDS[:6]):
            dtype = np.float32 if name in ("terminated", "truncated") else None
            fields[name].append(np.stack([np.asarray(t[i], dtype) for t in items]))
        fields["state"].append(np.stack([t[6]["extra"]["recurrent_state"] for t in items]))
        fields["mask"].append(np.array(mask))
    return {k: np.stack(v) for k, v in fields.items()}


def item_by_item(memory: ReplayMemory, starts: np.ndarray) -> dict[str, np.ndarray]:
    """The same sequences gathered one row at a time: the walk and every field read per item from
    the columns."""
    cols = memory._cols
    cap = memory.memory_size
    fields: dict[str, list[Any]] = {k: [] for k in FIELDS}
    for s in starts.tolist():
        rows, mask = walk(memory, s)
        fields["obs"].append(np.stack([cols["obs"][(r - 1) % cap] for r in rows]))
        fields["next_obs"].append(np.stack([cols["obs"][r] for r in rows]))
        fields["act"].append(np.stack([cols["act"][r] for r in rows]))
        fields["rew"].append(np.array([cols["rew"][r] for r in rows]))
        fields["terminated"].append(np.array([cols["terminated"][r] for r in rows], np.float32))
        fields["truncated"].append(np.array([cols["truncated"][r] for r in rows], np.float32))
        fields["state"].append(np.stack([cols["extra/recurrent_state"][r] for r in rows]))
        fields["mask"].append(np.array(mask))
    return {k: np.stack(v) for k, v in fields.items()}


def timed(fn: Any, repeats: int) -> float:
    fn()  # warm-up: the reused output buffers are allocated
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def run(s: Settings) -> list[Row]:
    memory = ReplayMemory(memory_size=s.rows, batch_size=BATCH, sequence_length=LENGTH, seed=0)
    for buf in packets(s.rows + s.rows // 3):  # the ring wraps once
        memory.append_buffer(buf)

    # the same sequences all three ways: same starts, same fields
    starts = memory.sample_indices()
    item_of_row = np.full(memory.memory_size, -1, np.int64)
    item_of_row[memory._ordered_ends()] = np.arange(len(memory))
    memory.sample_indices = lambda: starts  # type: ignore[method-assign]
    fast = memory.sample()
    del memory.sample_indices
    got = {"obs": fast.obs, "next_obs": fast.next_obs, "act": fast.act, "rew": fast.rew,
           "terminated": fast.terminated, "truncated": fast.truncated,
           "state": fast.extra["recurrent_state"], "mask": fast.extra["mask"]}
    for slow in (item_by_item(memory, starts), through_the_api(memory, starts, item_of_row)):
        for name, tensor in got.items():
            np.testing.assert_array_equal(tensor.numpy(), slow[name], err_msg=name)

    vectorised = timed(memory.sample, s.repeats)  # fresh starts each time, as in training
    fresh = iter([memory.sample_indices() for _ in range(2 * s.repeats + 2)])
    per_row = timed(lambda: item_by_item(memory, next(fresh)), max(3, s.repeats // 4))
    per_item = timed(lambda: through_the_api(memory, next(fresh), item_of_row),
                     max(3, s.repeats // 10))
    result = {"rows": s.rows, "batch": BATCH, "sequence_length": LENGTH,
              "vectorised_ms": round(vectorised * 1e3, 3),
              "item_by_item_columns_ms": round(per_row * 1e3, 3),
              "item_by_item_get_transition_ms": round(per_item * 1e3, 3),
              "speedup_vs_columns": round(per_row / vectorised, 1),
              "speedup_vs_get_transition": round(per_item / vectorised, 1)}
    print(f"{BATCH} sequences of {LENGTH} from {s.rows:,} rows, one batch: vectorised "
          f"{vectorised * 1e3:.3f} ms | item by item from the columns {per_row * 1e3:.3f} ms, "
          f"{result['speedup_vs_columns']}x slower | item by item through get_transition "
          f"{per_item * 1e3:.3f} ms, {result['speedup_vs_get_transition']}x slower", flush=True)
    where = f"{BATCH} sequences of {LENGTH} from {s.rows:,} rows"
    params = dataclasses.asdict(s)
    return [Row("sequences", f"{where}, against get_transition per item", "one batch",
                result["vectorised_ms"], "ms", result["item_by_item_get_transition_ms"],
                "get_transition per item", result["speedup_vs_get_transition"], "x faster",
                f">= {TARGET:g}x faster", result["speedup_vs_get_transition"] >= TARGET, params,
                result),
            Row("sequences", f"{where}, against a per-row walk of the columns", "one batch",
                result["vectorised_ms"], "ms", result["item_by_item_columns_ms"],
                "per-row walk of the columns", result["speedup_vs_columns"], "x faster",
                f">= {TARGET:g}x faster", result["speedup_vs_columns"] >= TARGET, params, result)]
