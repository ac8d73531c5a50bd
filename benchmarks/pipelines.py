"""Benchmarks of the real-time and image pipelines, each part measured side by side in one run.

wire    Bytes per sample on the wire for the image pipeline (4x64x64 uint8 stacks), from one recorded stream of
        ImageReach steps (random actions, episodes of up to 50 steps), packed exactly as a worker packs it
        (BufferBuilder, 100 samples per packet, samples_message + encode): naive full stacks, each frame once,
        with zstd / lz4, with PNG and JPEG frame codecs. Also the worker's CPU cost per sample (compressor + encode)
        and the trainer's (decode + append to FrameStackMemory). For noisy frames (sensor noise sigma 3, default)
        and clean ones. Target: >= 6x fewer bytes than naive stacks with lossless settings.
jitter  The worker's step period at 20 Hz (rtgym drone, 1.07M-parameter actor) while the trainer publishes new
        weights every 2 s, against the same loop with no weight updates; each condition runs in fresh server and
        trainer processes, conditions alternate, medians over repeats. The trainer only publishes (a perturbed
        actor), so both conditions load the machine alike. Target: p99 within 2 ms of the no-update loop.
memory  Sampling batches of 256 from a FrameStackMemory of --memory-rows transitions: the vectorised sample()
        against tmrl's per-item approach (get_transition per item, then collate).

The last line of output is one JSON object with every number.

Usage: .venv/bin/python scripts/bench_pipelines.py [--part wire|jitter|memory|all] [--seconds 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("WANDB_MODE", "disabled")

import numpy as np
import torch

from netrl.config.load import config_from_dict, config_to_dict, load_config
from netrl.config.sections import Config
from netrl.envs.image import ImageReachEnv
from netrl.envs.realtime import StepTimer, period_stats
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.memory.base import collate
from netrl.memory.frames import FrameStackCompressor, FrameStackMemory, decode_frame
from netrl.net.keys import client_keys, keygen
from netrl.pipelines.make import make_pipeline
from netrl.protocol.wire import buffer_from_message, decode, encode, samples_message
from netrl.samples import Buffer, BufferBuilder
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker

PACKET = 100  # samples per packet

# -- wire ---------------------------------------------------------------------------------------------------------


def record_stream(noise: float, steps: int, seed: int = 0) -> list[tuple[Any, ...]]:
    """Rows as a worker records them: (act, obs, rew, terminated, truncated, reset)."""
    env = ImageReachEnv(noise=noise)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    rows: list[tuple[Any, ...]] = [(np.zeros(2, np.float32), obs, 0.0, False, False, True)]
    while len(rows) < steps:
        act = rng.uniform(-1, 1, 2).astype(np.float32)
        obs, rew, terminated, truncated, _ = env.step(act)
        rows.append((act, obs, rew, terminated, truncated, False))
        if terminated or truncated:
            obs, _ = env.reset()
            rows.append((np.zeros(2, np.float32), obs, 0.0, False, False, True))
    return rows


def packets(rows: list[tuple[Any, ...]], compressor: Any, overlap: int, codec: str) -> Iterator[tuple[list[Any], int]]:
    """Encoded packets (frames) and their transition counts, packed as RolloutWorker packs them."""
    builder = BufferBuilder(PACKET + overlap + 2, overlap)
    for act, obs, rew, term, trunc, reset in rows:
        if compressor is not None:
            act, obs, rew, term, trunc, _ = compressor(act, obs, rew, term, trunc, {})
        builder.add(act, obs, rew, term, trunc, reset, 0)
        if len(builder) >= PACKET or builder.full:
            buf = builder.cut()
            assert buf is not None
            yield encode(samples_message(buf, "bench", "s", 1, 0), codec), int(buf.transition_end.sum())  # type: ignore[arg-type]


VARIANTS = [  # name, frame codec (None: full stacks), packet compression, lossless
    ("naive full stacks (tmrl's layout)", None, "none", True),
    ("naive full stacks + zstd", None, "zstd", True),
    ("each frame once", "raw", "none", True),
    ("each frame once + lz4", "raw", "lz4", True),
    ("each frame once + zstd (default)", "raw", "zstd", True),
    ("each frame once, PNG (zlib RLE) + zstd", "png", "zstd", True),
    ("each frame once, PNG (zlib default) + zstd", ("png", "default"), "zstd", True),
    ("each frame once, JPEG q95 + zstd", ("jpeg", 95), "zstd", False),
    ("each frame once, JPEG q75 + zstd", ("jpeg", 75), "zstd", False),
]


def bench_wire(noise: float, steps: int) -> list[dict[str, Any]]:
    rows = record_stream(noise, steps)
    originals = np.stack([r[1][-1] for r in rows])  # newest frame of every row, for the lossy codecs' error
    results = []
    for name, frame_codec, codec, lossless in VARIANTS:
        compressor, overlap = None, 1
        if frame_codec is not None:
            kind, option = (frame_codec, None) if isinstance(frame_codec, str) else frame_codec
            compressor = (FrameStackCompressor("png", png_strategy=option or "rle") if kind == "png"  # type: ignore[arg-type]
                          else FrameStackCompressor(kind, option or 95))  # type: ignore[arg-type]
            overlap = 4
        t0 = time.perf_counter()
        encoded = list(packets(rows, compressor, overlap, codec))
        worker_s = time.perf_counter() - t0
        nbytes = sum(sum(memoryview(f).nbytes for f in frames) for frames, _ in encoded)
        samples = sum(n for _, n in encoded)
        memory = FrameStackMemory(memory_size=len(rows) * 2, stack=4) if compressor is not None else None
        t0 = time.perf_counter()
        bufs: list[Buffer] = []
        for frames, _ in encoded:
            buf = buffer_from_message(decode([bytes(memoryview(f)) for f in frames]))
            bufs.append(buf)
            if memory is not None:
                memory.append_buffer(buf)
        trainer_s = time.perf_counter() - t0
        error = 0.0
        if not lossless:
            fresh = [b for b in bufs]
            payload = np.concatenate([b.obs[0][~b.context] for b in fresh])
            lengths = np.concatenate([b.obs[1][~b.context] for b in fresh])
            decoded = np.stack([decode_frame(p, int(n)) for p, n in zip(payload, lengths, strict=True)])
            error = float(np.abs(decoded.astype(int) - originals[:len(decoded)]).mean())
        results.append({"variant": name, "bytes_per_sample": nbytes / samples, "lossless": lossless,
                        "worker_us_per_sample": worker_s / samples * 1e6,
                        "trainer_us_per_sample": trainer_s / samples * 1e6, "mean_abs_error": error})
    naive = results[0]["bytes_per_sample"]
    for r in results:
        r["ratio"] = naive / r["bytes_per_sample"]
    return results


# -- jitter -------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class PublishEvery(TrainingOffline):
    """A trainer that does not train: it takes samples and publishes a perturbed actor every ``interval`` s."""

    interval: float = 0.0

    def run_epoch(self, source: Any, stop: threading.Event) -> Iterator[dict[str, Any]]:
        assert self.agent is not None
        last = time.monotonic()
        while not stop.is_set():
            self.ingest(source)
            source.wait(0.05)
            if self.interval > 0 and time.monotonic() - last >= self.interval:
                last = time.monotonic()
                with torch.no_grad():
                    for p in self.agent.get_actor().parameters():
                        p.add_(torch.randn_like(p), alpha=1e-4)
                self.publish(source)
        yield from ()


def fake_trainer(config_path: str, interval: float) -> None:
    from netrl.__main__ import install_stop_signals, setup_logging
    from netrl.trainer.trainer import Trainer

    cfg = load_config(config_path)
    setup_logging("trainer", "INFO")
    torch.set_num_threads(1)
    stop = threading.Event()
    install_stop_signals(stop)
    pipe = make_pipeline(cfg)
    training_cls = partial(PublishEvery, interval=interval, env_cls=pipe.env_cls, memory_cls=pipe.memory_cls,
                           training_agent_cls=pipe.training_agent_cls, epochs=1, memory_size=10_000, batch_size=32)
    keys = client_keys(cfg.keys_dir, "trainer", "trainer") if cfg.security == "curve" else None
    Trainer(training_cls, cfg.network.server_ip, str(cfg.run_dir / "policy.pt"), server_port=cfg.network.trainer_port,
            network=cfg.network, run_dir=cfg.run_dir, wandb_mode="disabled", resume=False, persist_samples=False,
            sample_compressor=pipe.sample_compressor, keys=keys).run(stop)


def jitter_config(folder: Path) -> Config:
    """The drone pipeline with a 1.07M-parameter actor, CURVE-encrypted as by default."""
    keygen(folder / "keys")
    data = config_to_dict(Config())
    data.update(run_name="jitter", weights_folder=str(folder), torch_threads=1, keys_dir=str(folder / "keys"))
    data["env"]["pipeline"] = "drone"
    data["agent"]["hidden_sizes"] = [1024, 1024]  # a 1.07M-parameter actor
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"]["status_port"] = free_port()  # never the default port of a server already running here
    data["worker"].update(worker_id="jitter", min_samples_per_worker_packet=20)
    data["wandb"]["mode"] = "disabled"
    return config_from_dict(data)


def run_jitter(interval: float, seconds: float, save: bool, folder: Path) -> dict[str, Any]:
    cfg = jitter_config(folder)
    path = write_config(cfg, folder / "config.json")
    logs = [(folder / f"{r}.log").open("wb") for r in ("server", "trainer")]
    server = spawn_role("server", path, stdout=logs[0])
    time.sleep(1.0)
    trainer = subprocess.Popen([sys.executable, __file__, "--fake-trainer", str(path), "--interval", str(interval)],
                               stdout=logs[1], stderr=subprocess.STDOUT, start_new_session=True)
    try:
        time.sleep(4.0)  # the trainer builds its model and publishes v1
        pipe = make_pipeline(cfg)
        worker = RolloutWorker.from_config(cfg, pipe)
        if not save:
            worker.model_path = None
        stop = threading.Event()
        timer = threading.Timer(seconds, stop.set)
        timer.start()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            worker.run(0, stop=stop)
        timer.cancel()
        env = worker.env
        assert isinstance(env, StepTimer)
        periods = env.periods[40:]  # skip the start-up (first inference, first weights)
        timeouts = sum("Time-step timed out" in str(w.message) for w in caught)
        return {**period_stats(periods), "versions_applied": worker.version, "rtgym_timeouts": timeouts}
    finally:
        stop_processes([trainer, server], timeout=15)
        for f in logs:
            f.close()


JITTER_CONDITIONS = [("no weight updates", 0.0, True), ("weights every 2 s", 2.0, True),
                     ("weights every 2 s, not saved to disk", 2.0, False)]


def bench_jitter(seconds: float, repeats: int) -> list[dict[str, Any]]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in JITTER_CONDITIONS}
    with tempfile.TemporaryDirectory(prefix="netrl-jitter-") as tmp:
        for rep in range(repeats):
            for i, (name, interval, save) in enumerate(JITTER_CONDITIONS):
                r = run_jitter(interval, seconds, save, Path(tmp) / f"{rep}-{i}")
                print(f"  repeat {rep + 1}, {name}: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                      f"max {r['max_ms']:.2f} ms, {r['steps']} steps, {r['versions_applied']} versions", flush=True)
                runs[name].append(r)
    out = []
    for name, rs in runs.items():
        med = {k: float(np.median([r[k] for r in rs])) for k in ("p50_ms", "p99_ms", "max_ms", "versions_applied",
                                                                 "rtgym_timeouts")}
        out.append({"condition": name, **med, "steps": sum(r["steps"] for r in rs), "repeats": len(rs),
                    "p99_each": [round(r["p99_ms"], 2) for r in rs]})
    return out


# -- memory -------------------------------------------------------------------------------------------------------


def bench_memory(rows: int) -> dict[str, Any]:
    memory = FrameStackMemory(memory_size=rows, batch_size=256, stack=4, seed=0)
    n = 1000
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (n, 64, 64), dtype=np.uint8)
    reset = np.zeros(n, bool)
    reset[::51] = True  # episodes of 50 steps
    flags = np.zeros(n, bool)
    buf = Buffer(act=rng.uniform(-1, 1, (n, 2)).astype(np.float32), obs=frames, rew=np.zeros(n, np.float32),
                 terminated=flags, truncated=flags, reset=reset, context=flags, policy_version=np.zeros(n, np.int64))
    t0 = time.perf_counter()
    while memory.total_appended < rows:
        memory.append_buffer(buf)
    fill_s = time.perf_counter() - t0
    for _ in range(3):
        memory.sample()
    fast = []
    for _ in range(50):
        t = time.perf_counter()
        memory.sample()
        fast.append(time.perf_counter() - t)
    slow = []
    for _ in range(5):  # tmrl's approach: get_transition per item, then collate
        t = time.perf_counter()
        items = memory.rng.integers(0, len(memory), size=memory.batch_size)
        columns = zip(*(memory.get_transition(int(i))[:6] for i in items), strict=True)
        batch = [collate(list(column), "cpu") for column in columns]
        slow.append(time.perf_counter() - t)
        assert batch[0].shape == (memory.batch_size, 4, 64, 64)
    return {"rows": rows, "transitions": len(memory), "fill_s": fill_s, "vectorised_ms": 1000 * float(np.median(fast)),
            "per_item_ms": 1000 * float(np.median(slow)), "speedup": float(np.median(slow) / np.median(fast))}


# -- report -------------------------------------------------------------------------------------------------------


def wire_table(results: dict[str, list[dict[str, Any]]]) -> str:
    noisy, clean = results["noise 3"], results["noise 0"]
    lines = ["| image sample on the wire (4x64x64 uint8) | bytes/sample, noisy frames | vs naive | bytes/sample, "
             "clean frames | vs naive | worker CPU | trainer CPU |", "|---|---|---|---|---|---|---|"]
    for a, b in zip(noisy, clean, strict=True):
        err = "" if a["lossless"] else f" (lossy, mean abs error {a['mean_abs_error']:.1f} gray levels)"
        lines.append(f"| {a['variant']}{err} | {a['bytes_per_sample']:,.0f} | {a['ratio']:.2f}x | "
                     f"{b['bytes_per_sample']:,.0f} | {b['ratio']:.1f}x | {a['worker_us_per_sample']:.0f} us | "
                     f"{a['trainer_us_per_sample']:.0f} us |")
    return "\n".join(lines)


def jitter_table(results: list[dict[str, Any]]) -> str:
    lines = ["| worker loop at 20 Hz, 1.07M-parameter actor | p50 | p99 | max | versions applied | rtgym time-outs |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['condition']} | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms | {r['max_ms']:.2f} ms | "
                     f"{r['versions_applied']:.0f} | {r['rtgym_timeouts']:.0f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["wire", "jitter", "memory", "all"], default="all")
    p.add_argument("--steps", type=int, default=3000, help="env steps recorded for the wire part")
    p.add_argument("--seconds", type=float, default=60.0, help="length of each jitter run")
    p.add_argument("--repeats", type=int, default=3, help="jitter runs per condition")
    p.add_argument("--memory-rows", type=int, default=1_000_000, help="transitions in the memory part")
    p.add_argument("--fake-trainer", help=argparse.SUPPRESS)
    p.add_argument("--interval", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.fake_trainer:
        fake_trainer(args.fake_trainer, args.interval)
        return 0
    torch.set_num_threads(1)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # the finally clauses stop the server and trainer processes

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)  # also when started in the background, where SIGINT is ignored
    out: dict[str, Any] = {}
    if args.part in ("wire", "all"):
        out["wire"] = {f"noise {s:g}": bench_wire(s, args.steps) for s in (3.0, 0.0)}
        print(wire_table(out["wire"]), flush=True)
    if args.part in ("jitter", "all"):
        out["jitter"] = bench_jitter(args.seconds, args.repeats)
        print(jitter_table(out["jitter"]), flush=True)
    if args.part in ("memory", "all"):
        out["memory"] = m = bench_memory(args.memory_rows)
        print(f"memory: batch of 256 from {m['transitions']:,} transitions: vectorised {m['vectorised_ms']:.2f} ms, "
              f"per item {m['per_item_ms']:.1f} ms ({m['speedup']:.0f}x)", flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
