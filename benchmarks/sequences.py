"""Sequence sampling (issue 32): 64 sequences of 32 consecutive transitions from a 1,000,000-row ReplayMemory, with
the vectorised sampler (one index matrix, one gather per column) beside gathering the same sequences item by item
two ways, side by side in one run: a Python walk per sequence reading each row's fields from the ring's columns one
by one, and the same walk through ``get_transition``, the per-item API every memory has (tmrl's way); both stacked.

Rows look like a recurrent Pendulum run's: 3 observation floats, 1 action, and a GRU state of (1, 64) recorded with
each step; episodes of 200 steps in packets of 1,000 rows from 4 envs. Target: the vectorised sampler at least 20x
faster than gathering item by item. The last line of output is one JSON object.

Usage: PYTHONPATH=. .venv/bin/python scripts/bench_sequences.py [--rows 1000000] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from netrl.memory.replay import ReplayMemory
from netrl.samples import Buffer

BATCH, LENGTH, HIDDEN, PACKET, EPISODE = 64, 32, 64, 1000, 200


def packets(rows: int, seed: int = 0) -> list[Buffer]:
    """Packets of PACKET rows: one context row, then an env's steps; each episode starts with a reset row."""
    rng = np.random.default_rng(seed)
    out, t = [], 0
    while t < rows:
        n = min(PACKET, rows - t)
        step = (t + np.arange(n)) % (EPISODE + 1)  # 0: the reset row
        context = np.zeros(n, np.bool_)
        context[0] = True
        out.append(Buffer(
            act=rng.uniform(-2, 2, (n, 1)).astype(np.float32), obs=rng.normal(size=(n, 3)).astype(np.float32),
            rew=rng.normal(size=n).astype(np.float32), terminated=np.zeros(n, np.bool_), truncated=step == EPISODE,
            reset=step == 0, context=context, policy_version=np.zeros(n, np.int64), worker="bench",
            env=np.full(n, len(out) % 4, np.uint16),
            extra={"recurrent_state": rng.normal(size=(n, 1, HIDDEN)).astype(np.float32)}))
        t += n
    return out


def walk(memory: ReplayMemory, s: int) -> tuple[list[int], list[bool]]:
    """The rows of the sequence that starts at row ``s``, one continuation test at a time, padded; and its mask."""
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


def through_the_api(memory: ReplayMemory, starts: np.ndarray, item_of_row: np.ndarray) -> dict[str, np.ndarray]:
    """The same sequences through the per-item API every memory has (``get_transition``, tmrl's way), stacked."""
    fields: dict[str, list[Any]] = {k: [] for k in ("obs", "act", "rew", "next_obs", "terminated", "truncated", "state",
                                                    "mask")}
    for s in starts.tolist():
        rows, mask = walk(memory, s)
        items = [memory.get_transition(int(item_of_row[r])) for r in rows]
        for name, i in (("obs", 0), ("act", 1), ("rew", 2), ("next_obs", 3), ("terminated", 4), ("truncated", 5)):
            fields[name].append(np.stack([np.asarray(t[i], np.float32 if i in (4, 5) else None) for t in items]))
        fields["state"].append(np.stack([t[6]["extra"]["recurrent_state"] for t in items]))
        fields["mask"].append(np.array(mask))
    return {k: np.stack(v) for k, v in fields.items()}


def item_by_item(memory: ReplayMemory, starts: np.ndarray) -> dict[str, np.ndarray]:
    """The same sequences gathered one row at a time: the walk and every field read per item from the columns."""
    cols = memory._cols
    cap = memory.memory_size
    fields: dict[str, list[Any]] = {k: [] for k in ("obs", "act", "rew", "next_obs", "terminated", "truncated", "state",
                                                    "mask")}
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    memory = ReplayMemory(memory_size=args.rows, batch_size=BATCH, sequence_length=LENGTH, seed=0)
    for buf in packets(args.rows + args.rows // 3):  # the ring wraps once
        memory.append_buffer(buf)

    # the same sequences all three ways: same starts, same fields
    starts = memory.sample_indices()
    item_of_row = np.full(memory.memory_size, -1, np.int64)
    item_of_row[memory._ordered_ends()] = np.arange(len(memory))
    memory.sample_indices = lambda: starts  # type: ignore[method-assign]
    fast = memory.sample()
    del memory.sample_indices
    got = {"obs": fast.obs, "next_obs": fast.next_obs, "act": fast.act, "rew": fast.rew, "terminated": fast.terminated,
           "truncated": fast.truncated, "state": fast.extra["recurrent_state"], "mask": fast.extra["mask"]}
    for slow in (item_by_item(memory, starts), through_the_api(memory, starts, item_of_row)):
        for name, tensor in got.items():
            np.testing.assert_array_equal(tensor.numpy(), slow[name], err_msg=name)

    vectorised = timed(memory.sample, args.repeats)  # fresh starts each time, as in training
    fresh = iter([memory.sample_indices() for _ in range(2 * args.repeats + 2)])
    per_row = timed(lambda: item_by_item(memory, next(fresh)), max(3, args.repeats // 4))
    per_item = timed(lambda: through_the_api(memory, next(fresh), item_of_row), max(3, args.repeats // 10))
    result = {"rows": args.rows, "batch": BATCH, "sequence_length": LENGTH,
              "vectorised_ms": round(vectorised * 1e3, 3), "item_by_item_columns_ms": round(per_row * 1e3, 3),
              "item_by_item_get_transition_ms": round(per_item * 1e3, 3),
              "speedup_vs_columns": round(per_row / vectorised, 1),
              "speedup_vs_get_transition": round(per_item / vectorised, 1), "target_speedup": 20}
    print(f"{BATCH} sequences of {LENGTH} from {args.rows:,} rows, one batch:")
    print(f"  vectorised (index matrix, one gather per column)      {vectorised * 1e3:9.3f} ms")
    print(f"  item by item, each row's fields read from the columns {per_row * 1e3:9.3f} ms  "
          f"{result['speedup_vs_columns']}x slower")
    print(f"  item by item through get_transition (tmrl's way)      {per_item * 1e3:9.3f} ms  "
          f"{result['speedup_vs_get_transition']}x slower")
    print(json.dumps(result))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
