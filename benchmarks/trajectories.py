"""Sequences that follow trajectories across packets: a batch of 64 sequences of 32 from a
1,000,000-row ReplayMemory written by 16 interleaved workers in 10-row packets (each packet's
context row a true copy of its stream's last row, so every sequence walks the trajectory links
across packets), against contiguous sequences: the same memory written by one worker in
1,000-row packets, where a sequence almost never meets a packet boundary (today's case).
A second pair: prioritized sequence starts (R2D2's priorities) against uniform ones, on the
interleaved memory.

Rows look like a recurrent Pendulum run's: 3 observation floats, 1 action, and a GRU state of
(1, 64) recorded with each step; episodes of 200 steps. Runs alternate (contiguous, interleaved,
uniform, prioritized; ``--repeats`` times each), the median of each is reported. ``--against
PATH`` also times the contiguous case with the netrl tree at PATH (main's, say) in a child
process, alternating with this tree's runs. Targets: interleaved at most 1.5x contiguous;
prioritized at most 5x uniform.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

BATCH, LENGTH, HIDDEN, EPISODE = 64, 32, 64, 200
TARGET_LINKS, TARGET_PRIORITY = 1.5, 5.0


@dataclasses.dataclass(frozen=True)
class Settings:
    rows: int = 1_000_000
    repeats: int = 5  # alternating rounds; each times `batches` batches per case
    batches: int = 20
    against: str = ""  # a netrl tree whose contiguous sequences are timed too (a child process)

    def __post_init__(self) -> None:
        if self.rows < 20_000 or self.repeats < 1 or self.batches < 1:
            raise ValueError("--rows must be >= 20000, --repeats and --batches >= 1")


SMOKE = Settings(rows=20_000, repeats=2, batches=3)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--rows", type=int, help=f"rows in the memory (default {d.rows:,})")
    p.add_argument("--repeats", type=int, help=f"alternating rounds (default {d.repeats})")
    p.add_argument("--batches", type=int, help=f"batches timed per case and round (default {d.batches})")
    p.add_argument("--against", type=str, help="a netrl tree to time contiguous sequences with too")


def packets(rows: int, workers: int, packet: int, seed: int = 0) -> list[Any]:
    """``rows`` rows from ``workers`` one-env workers taking turns, in packets of ``packet`` fresh
    rows, each after one context row that repeats its stream's previous row."""
    from netrl.samples import Buffer

    rng = np.random.default_rng(seed)
    width = 3 + 1 + HIDDEN + 1  # obs, act, state, rew
    last: dict[int, tuple[np.ndarray, bool, bool]] = {}  # each stream's last row, repeated as context
    step = dict.fromkeys(range(workers), 0)
    out: list[Any] = []
    made = 0
    while made < rows:
        w = len(out) % workers
        n = packet + 1
        vals = rng.normal(size=(n, width)).astype(np.float32)
        t = step[w] + np.arange(-1, packet)
        reset = t % (EPISODE + 1) == 0
        truncated = t % (EPISODE + 1) == EPISODE
        context = np.zeros(n, np.bool_)
        context[0] = True
        if w in last:
            vals[0], reset[0], truncated[0] = last[w]
        last[w] = (vals[-1].copy(), bool(reset[-1]), bool(truncated[-1]))
        step[w] += packet
        out.append(Buffer(act=vals[:, 3:4].copy(), obs=vals[:, :3].copy(), rew=vals[:, -1].copy(),
                          terminated=np.zeros(n, np.bool_), truncated=truncated, reset=reset, context=context,
                          policy_version=np.zeros(n, np.int64), worker=f"w{w}/s",
                          env=np.zeros(n, np.uint16),
                          extra={"recurrent_state": vals[:, 4:4 + HIDDEN].reshape(n, 1, HIDDEN).copy()}))
        made += n
    return out


def build(rows: int, workers: int, packet: int, **kwargs: Any) -> Any:
    from netrl.memory.replay import ReplayMemory

    memory = ReplayMemory(memory_size=rows, batch_size=BATCH, sequence_length=LENGTH, seed=0, **kwargs)
    for buf in packets(rows + rows // 3, workers, packet):  # the ring wraps once
        memory.append_buffer(buf)
    return memory


def timed(memory: Any, batches: int, prioritized: bool = False) -> float:
    """Seconds per batch (a prioritized one gets its priorities back, as in training)."""
    memory.sample()  # warm-up: the reused output buffers are allocated
    t0 = time.perf_counter()
    for _ in range(batches):
        batch = memory.sample()
        if prioritized:
            memory.update_priority(np.abs(batch.rew.numpy()), batch.extra["index"].numpy())
    return (time.perf_counter() - t0) / batches


def child(rows: int, batches: int) -> None:
    """In a child process with another tree's netrl: time its contiguous sequences on request."""
    memory = build(rows, 1, 1000)
    for line in sys.stdin:
        if not line.strip():
            break
        print(json.dumps(timed(memory, batches)), flush=True)


def run(s: Settings) -> list[Any]:
    from benchmarks.results import Row

    other = None
    if s.against:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(s.against)}
        code = (f"import importlib.util, sys; spec = importlib.util.spec_from_file_location('t', {__file__!r}); "
                f"m = sys.modules['t'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
                f"m.child({s.rows}, {s.batches})")
        other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=env)
    contiguous = build(s.rows, 1, 1000)
    interleaved = build(s.rows, 16, 10)
    prioritized = build(s.rows, 16, 10, prioritized=True)
    crossed = float(np.mean(interleaved.sample().extra["mask"].numpy().sum(1) > 11))  # longer than one packet
    times: dict[str, list[float]] = {"contiguous": [], "interleaved": [], "uniform": [], "prioritized": [],
                                     "against": []}
    for _ in range(s.repeats):  # alternating, so that load from others falls on every case alike
        times["contiguous"].append(timed(contiguous, s.batches))
        times["interleaved"].append(timed(interleaved, s.batches))
        if other is not None:
            assert other.stdin is not None and other.stdout is not None
            other.stdin.write("go\n")
            other.stdin.flush()
            times["against"].append(json.loads(other.stdout.readline()))
        times["uniform"].append(timed(interleaved, s.batches))
        times["prioritized"].append(timed(prioritized, s.batches, prioritized=True))
    if other is not None:
        assert other.stdin is not None
        other.stdin.write("\n")
        other.stdin.close()
        other.wait(timeout=60)
    ms = {k: float(np.median(v)) * 1e3 for k, v in times.items() if v}
    links = ms["interleaved"] / ms["contiguous"]
    prio = ms["prioritized"] / ms["uniform"]
    params = dataclasses.asdict(s)
    detail = {"ms": {k: round(v, 3) for k, v in ms.items()}, "runs_ms": times,
              "sequences_longer_than_a_packet": crossed}
    where = f"{BATCH} sequences of {LENGTH} from {s.rows:,} rows"
    print(f"{where}: contiguous (1 worker, 1000-row packets) {ms['contiguous']:.3f} ms | interleaved (16 workers, "
          f"10-row packets) {ms['interleaved']:.3f} ms, {links:.2f}x | uniform {ms['uniform']:.3f} ms, prioritized "
          f"{ms['prioritized']:.3f} ms, {prio:.2f}x | {crossed:.0%} of interleaved sequences longer than a packet"
          + (f" | contiguous with {s.against}: {ms['against']:.3f} ms" if "against" in ms else ""), flush=True)
    rows = [Row("trajectories", f"{where}, 16 workers in 10-row packets", "one batch", round(ms["interleaved"], 3),
                "ms", round(ms["contiguous"], 3), "1 worker in 1000-row packets", round(links, 2), "x",
                f"<= {TARGET_LINKS:g}x", links <= TARGET_LINKS, params, detail),
            Row("trajectories", f"{where}, prioritized starts (R2D2)", "one batch", round(ms["prioritized"], 3),
                "ms", round(ms["uniform"], 3), "uniform starts", round(prio, 2), "x",
                f"<= {TARGET_PRIORITY:g}x", prio <= TARGET_PRIORITY, params, detail)]
    if "against" in ms:
        rows.append(Row("trajectories", f"{where}, 16 workers in 10-row packets", "one batch",
                        round(ms["interleaved"], 3), "ms", round(ms["against"], 3),
                        f"contiguous with {s.against}", round(ms["interleaved"] / ms["against"], 2), "x",
                        f"<= {TARGET_LINKS:g}x", ms["interleaved"] / ms["against"] <= TARGET_LINKS, params, detail))
    return rows
