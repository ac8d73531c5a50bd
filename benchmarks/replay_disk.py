"""Replay on disk (memory.storage disk) against replay in RAM, two parts:

speed  batches of 256 stacks of 4 84x84 uint8 frames from a FrameStackMemory of ``--rows`` frames in
       RAM, and from the same memory with its columns in memory-mapped files (netrl.memory.disk),
       filled alike; the page cache holds the file (it was just written). Timed in turns (
       ``--batches`` batches of each per round, ``--rounds`` rounds); the ratio is the median of the
       rounds' disk batches/s over RAM batches/s. Target: >= 50%.
large  a FrameStackMemory on disk of ``--large-rows`` 84x84 frames (2,000,000: about 14 GB), filled
       fast through append_buffer with packets of 10,000 frames, then sampled alone: the process's
       resident memory meanwhile (psutil, its peak sampled after every packet and batch; RssFile at
       the end). Then a RAM memory of ``--rows`` frames is filled beside it and both are sampled
       in turns. Targets: peak RSS under 2 GiB; batches at >= 50% of RAM's.

One torch thread, as the trainer runs. The files go in a new folder under ``--folder`` (default: the
system's temporary folder), removed at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from benchmarks.results import Row
from benchmarks.settings import choose, names, positive
from netrl.memory.disk import DiskRing, file_rss
from netrl.memory.frames import FrameStackMemory
from netrl.samples import Buffer

PARTS = ("speed", "large")
BATCH, STACK, FRAME = 256, 4, (84, 84)
SPEED_TARGET = 0.5  # disk batches/s over RAM batches/s
RSS_TARGET = 2 * 2**30
PACKET = 10_000  # frames per packet when filling


@dataclasses.dataclass(frozen=True)
class Settings:
    parts: tuple[str, ...] = PARTS
    rows: int = 200_000  # speed (and large's RAM baseline): frames in each memory
    large_rows: int = 2_000_000
    rounds: int = 10
    batches: int = 20  # per memory per round
    folder: str = ""

    def __post_init__(self) -> None:
        choose(self.parts, PARTS, "--parts")
        positive("--rows", self.rows, 2 * PACKET, strict=False)
        positive("--large-rows", self.large_rows, 2 * PACKET, strict=False)
        positive("--rounds", min(self.rounds, self.batches), 1, strict=False)


QUICK = Settings(rows=100_000, large_rows=500_000, rounds=5)
SMOKE = Settings(rows=20_000, large_rows=40_000, rounds=2, batches=5)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--parts", type=names, help=f"which parts (default {','.join(d.parts)})")
    p.add_argument(
        "--rows", type=int, help=f"frames in the speed part's memories (default {d.rows:,})"
    )
    p.add_argument(
        "--large-rows",
        type=int,
        help=f"frames in the large part's memory (default {d.large_rows:,})",
    )
    p.add_argument("--rounds", type=int, help=f"rounds of turns (default {d.rounds})")
    p.add_argument(
        "--batches", type=int, help=f"batches of each memory per round (default {d.batches})"
    )
    p.add_argument("--folder", help="where the column files go (default: the temporary folder)")


def run(s: Settings) -> list[Row]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="netrl-replay-disk-", dir=s.folder or None))
    try:
        rows = []
        if "speed" in s.parts:
            rows.append(bench_speed(s, folder))
        if "large" in s.parts:
            rows += bench_large(s, folder)
        return rows
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        torch.set_num_threads(threads)


def frames_packet(n: int, seed: int, episode: int = 50) -> Buffer:
    rng = np.random.default_rng(seed)
    reset = np.arange(n) % (episode + 1) == 0
    return Buffer(
        act=rng.uniform(-1, 1, (n, 2)).astype(np.float32),
        obs=rng.integers(0, 256, (n, *FRAME), dtype=np.uint8),
        rew=np.zeros(n, np.float32),
        terminated=np.zeros(n, bool),
        truncated=np.zeros(n, bool),
        reset=reset,
        context=np.zeros(n, bool),
        policy_version=np.zeros(n, np.int64),
    )


class Peak:
    """The process's peak resident memory, sampled when asked."""

    def __init__(self) -> None:
        self.process, self.rss = psutil.Process(), 0

    def __call__(self) -> None:
        self.rss = max(self.rss, self.process.memory_info().rss)


def fill(memory: FrameStackMemory, rows: int, peak: Peak | None = None) -> float:
    """Seconds to append ``rows`` frames, in packets of :data:`PACKET` (two packets of random
    frames, alternating: generating 14 GB of random bytes would take longer than writing them)."""
    packets = [frames_packet(PACKET, 0), frames_packet(PACKET, 1)]
    t0 = time.perf_counter()
    while memory.total_appended < rows:
        memory.append_buffer(packets[(memory.total_appended // PACKET) % 2])
        if peak is not None:
            peak()
    return time.perf_counter() - t0


def turns(
    memories: dict[str, FrameStackMemory], s: Settings, peak: Peak | None = None
) -> dict[str, Any]:
    """Batches/s of each memory, timed in turns; the ratio is disk over RAM, the median of the
    rounds'."""
    for m in memories.values():
        for _ in range(3):
            m.sample()  # buffers allocated
    per: dict[str, list[float]] = {name: [] for name in memories}
    ratios = []
    for _ in range(s.rounds):
        rate = {}
        for name, m in memories.items():
            times = []
            for _ in range(s.batches):
                t = time.perf_counter()
                m.sample()
                times.append(time.perf_counter() - t)
                if peak is not None:
                    peak()
            per[name] += times
            rate[name] = 1 / float(np.median(times))
        ratios.append(rate["disk"] / rate["ram"])
        if peak is not None:
            peak()
    return {
        "ram_batches_s": 1 / float(np.median(per["ram"])),
        "disk_batches_s": 1 / float(np.median(per["disk"])),
        "ratio": float(np.median(ratios)),
        "ratio_per_round": [round(r, 3) for r in ratios],
    }


def bench_speed(s: Settings, folder: Path) -> Row:
    storage = DiskRing(folder / "speed")
    memories = {
        "ram": FrameStackMemory(memory_size=s.rows, batch_size=BATCH, stack=STACK, seed=0),
        "disk": FrameStackMemory(
            memory_size=s.rows, batch_size=BATCH, stack=STACK, seed=0, ring_storage=storage
        ),
    }
    try:
        fills = {name: fill(m, s.rows) for name, m in memories.items()}
        r = turns(memories, s) | {
            "fill_ram_s": round(fills["ram"], 1),
            "fill_disk_s": round(fills["disk"], 1),
            "file_gib": round(s.rows * np.prod(FRAME) / 2**30, 2),
            "trims": storage.trims,
            "rss_file_mib": (file_rss() or 0) // 2**20,
        }
    finally:
        storage.close()
    print(
        f"speed: {s.rows:,} frames ({r['file_gib']} GiB), batch {BATCH} stacks of {STACK}: RAM "
        f"{r['ram_batches_s']:.0f} batches/s | disk {r['disk_batches_s']:.0f} batches/s, "
        f"{r['ratio']:.0%} (rounds {r['ratio_per_round']}); {r['trims']} trims, RssFile "
        f"{r['rss_file_mib']} MiB",
        flush=True,
    )
    return Row(
        "replay_disk",
        f"FrameStackMemory of {s.rows:,} 84x84 frames, batch {BATCH} stacks of {STACK}",
        "batches/s, page cache warm",
        r["disk_batches_s"],
        "batches/s",
        r["ram_batches_s"],
        "the same memory in RAM",
        r["ratio"],
        "%",
        f">= {SPEED_TARGET:.0%}",
        r["ratio"] >= SPEED_TARGET,
        {"part": "speed", "rows": s.rows, "rounds": s.rounds, "batches": s.batches},
        r,
    )


def bench_large(s: Settings, folder: Path) -> list[Row]:
    """Resident memory first, with the large memory alone in the process (filled, then sampled as
    many batches as the turns take); then the turns, with a RAM memory beside it."""
    peak = Peak()
    peak()
    start_rss = peak.rss
    storage = DiskRing(folder / "large")
    large = FrameStackMemory(
        memory_size=s.large_rows, batch_size=BATCH, stack=STACK, seed=0, ring_storage=storage
    )
    try:
        fill_s = fill(large, s.large_rows, peak)
        fill_peak = peak.rss
        t0 = time.perf_counter()
        for _ in range(s.rounds * s.batches):
            large.sample()
            peak()
        alone_s = (time.perf_counter() - t0) / (s.rounds * s.batches)
        info = psutil.Process().memory_full_info()
        r = {
            "large_rows": s.large_rows,
            "file_gib": round(s.large_rows * np.prod(FRAME) / 2**30, 2),
            "fill_s": round(fill_s, 1),
            "fill_gib_s": round(s.large_rows * np.prod(FRAME) / 2**30 / fill_s, 2),
            "rss_before_mib": start_rss // 2**20,
            "peak_rss_fill_mib": fill_peak // 2**20,
            "peak_rss_mib": peak.rss // 2**20,
            "rss_end_mib": info.rss // 2**20,
            "uss_end_mib": info.uss // 2**20,
            "rss_file_end_mib": (file_rss() or 0) // 2**20,
            "alone_batches_s": round(1 / alone_s, 1),
        }
        ram = FrameStackMemory(memory_size=s.rows, batch_size=BATCH, stack=STACK, seed=0)
        r["fill_ram_s"] = round(fill(ram, s.rows), 1)
        r |= turns({"ram": ram, "disk": large}, s)
        r["trims"] = storage.trims
        del ram
    finally:
        storage.close()
    print(
        f"large: {s.large_rows:,} frames ({r['file_gib']} GiB) filled in {r['fill_s']} s "
        f"({r['fill_gib_s']} GiB/s); peak RSS {r['peak_rss_mib']:,} MiB (while filling "
        f"{r['peak_rss_fill_mib']:,}, before {r['rss_before_mib']}), RssFile then "
        f"{r['rss_file_end_mib']} MiB, {r['trims']} trims; batches/s alone "
        f"{r['alone_batches_s']:.0f}; in turns: disk {r['disk_batches_s']:.0f} | RAM "
        f"({s.rows:,} frames) {r['ram_batches_s']:.0f}, "
        f"{r['ratio']:.0%}",
        flush=True,
    )
    params = {
        "part": "large",
        "large_rows": s.large_rows,
        "rows": s.rows,
        "rounds": s.rounds,
        "batches": s.batches,
    }
    where = f"FrameStackMemory on disk of {s.large_rows:,} 84x84 frames ({r['file_gib']} GiB)"
    peak_bytes = r["peak_rss_mib"] * 2**20
    return [
        Row(
            "replay_disk",
            where,
            "peak RSS, filling and sampling",
            r["peak_rss_mib"],
            "MiB",
            target="< 2 GiB",
            met=peak_bytes < RSS_TARGET,
            params=params,
            detail=r,
        ),
        Row(
            "replay_disk",
            f"{where}, batch {BATCH} stacks of {STACK}",
            "batches/s",
            r["disk_batches_s"],
            "batches/s",
            r["ram_batches_s"],
            f"a memory in RAM of {s.rows:,} frames",
            r["ratio"],
            "%",
            f">= {SPEED_TARGET:.0%}",
            r["ratio"] >= SPEED_TARGET,
            params,
            r,
        ),
    ]
