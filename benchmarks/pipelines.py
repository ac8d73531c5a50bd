"""The real-time and image pipelines, each part measured beside its baseline in one run:

wire    Bytes per sample on the wire for the image pipeline (4x64x64 uint8 stacks), from one
        recorded stream of ImageReach steps (random actions, episodes of up to 50 steps), packed
        exactly as a worker packs it (BufferBuilder, 100 samples per packet, samples_message +
        encode): naive full stacks (tmrl's layout, the baseline), each frame once, with zstd / lz4,
        with PNG and JPEG frame codecs. Also the worker's CPU cost per sample (compressor + encode)
        and the trainer's (decode + append to FrameStackMemory). For noisy frames (sensor noise
        sigma 3, default) and clean ones. Target: >= 6x fewer bytes than naive stacks, lossless.
jitter  The worker's step period at 20 Hz (rtgym drone, 1.07M-parameter actor) while the trainer
        publishes new weights every 2 s, against the same loop with no weight updates; each
        condition runs in fresh server and trainer processes, conditions alternate, medians over
        repeats. The trainer only publishes (a perturbed actor), so both conditions load the
        machine alike. Target: p99 within 2 ms of the no-update loop.
memory  Sampling batches of 256 from a FrameStackMemory of --memory-rows transitions: the
        vectorised sample() against tmrl's per-item approach (get_transition per item, then
        collate).

The drone and image pipelines' learning runs are rows of the learning family (``--row drone``,
``--row image``).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import child
from benchmarks.results import Row
from benchmarks.settings import choose, names, positive
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
PARTS = ("wire", "jitter", "memory")
WIRE_TARGET = 6.0  # lossless: at least this many times fewer bytes than tmrl's layout
JITTER_TARGET_MS = 2.0  # p99 with new weights at most this much above the loop without


@dataclasses.dataclass(frozen=True)
class Settings:
    parts: tuple[str, ...] = PARTS
    steps: int = 3000  # env steps recorded for the wire part
    seconds: float = 60.0  # length of each jitter run
    repeats: int = 3  # jitter runs per condition
    memory_rows: int = 1_000_000  # transitions in the memory part

    def __post_init__(self) -> None:
        choose(self.parts, PARTS, "--parts")
        positive("--steps", self.steps, PACKET, strict=False)
        positive("--seconds", self.seconds)
        positive("--repeats", self.repeats, 1, strict=False)
        positive("--memory-rows", self.memory_rows, 1000, strict=False)


SMOKE = Settings(steps=300, seconds=3.0, repeats=1, memory_rows=20_000)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--parts", type=names, help=f"which parts (default {','.join(d.parts)})")
    p.add_argument("--steps", type=int, help=f"env steps recorded for the wire part ({d.steps})")
    p.add_argument("--seconds", type=float, help=f"length of each jitter run ({d.seconds:g})")
    p.add_argument("--repeats", type=int, help=f"jitter runs per condition ({d.repeats})")
    p.add_argument("--memory-rows", type=int,
                   help=f"transitions in the memory part ({d.memory_rows:,})")


def run(s: Settings) -> list[Row]:
    torch.set_num_threads(1)
    rows: list[Row] = []
    if "wire" in s.parts:
        rows += wire_rows({f"noise {n:g}": bench_wire(n, s.steps) for n in (3.0, 0.0)}, s)
    if "jitter" in s.parts:
        rows += jitter_rows(bench_jitter(s.seconds, s.repeats), s)
    if "memory" in s.parts:
        m = bench_memory(s.memory_rows)
        print(f"memory: batch of 256 from {m['transitions']:,} transitions: vectorised "
              f"{m['vectorised_ms']:.2f} ms, per item {m['per_item_ms']:.1f} ms "
              f"({m['speedup']:.0f}x)", flush=True)
        rows.append(Row("pipelines", f"FrameStackMemory, batch of 256 from {m['transitions']:,}",
                        "one batch", m["vectorised_ms"], "ms", m["per_item_ms"],
                        "get_transition per item, then collate", m["speedup"], "x faster",
                        params={"part": "memory", "memory_rows": s.memory_rows}, detail=m))
    return rows


# -- wire ----------------------------------------------------------------------------------------


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


def packets(rows: list[tuple[Any, ...]], compressor: Any, overlap: int,
            codec: str) -> Iterator[tuple[list[Any], int]]:
    """Encoded packets (frames) and their transition counts, packed as RolloutWorker packs them."""
    builder = BufferBuilder(PACKET + overlap + 2, overlap)
    for act, obs, rew, term, trunc, reset in rows:
        if compressor is not None:
            act, obs, rew, term, trunc, _ = compressor(act, obs, rew, term, trunc, {})
        builder.add(act, obs, rew, term, trunc, reset, 0)
        if len(builder) >= PACKET or builder.full:
            buf = builder.cut()
            assert buf is not None
            message = samples_message(buf, "bench", "s", 1, 0)
            frames = encode(message, codec)  # type: ignore[arg-type]
            yield frames, int(buf.transition_end.sum())


# name, frame codec (None: full stacks, else a kind or a kind and its option), packet compression,
# lossless
VARIANTS: list[tuple[str, Any, Any, bool]] = [
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
    originals = np.stack([r[1][-1] for r in rows])  # each row's newest frame: the lossy ones' error
    results: list[dict[str, Any]] = []
    for name, frame_codec, codec, lossless in VARIANTS:
        compressor: FrameStackCompressor | None = None
        overlap = 1
        if frame_codec is not None:
            kind: Any
            kind, option = (frame_codec, None) if isinstance(frame_codec, str) else frame_codec
            compressor = (FrameStackCompressor("png", png_strategy=option or "rle")
                          if kind == "png" else FrameStackCompressor(kind, option or 95))
            overlap = 4
        t0 = time.perf_counter()
        encoded = list(packets(rows, compressor, overlap, codec))
        worker_s = time.perf_counter() - t0
        nbytes = sum(sum(memoryview(f).nbytes for f in frames) for frames, _ in encoded)
        samples = sum(n for _, n in encoded)
        memory = (FrameStackMemory(memory_size=len(rows) * 2, stack=4) if compressor is not None
                  else None)
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
            decoded = np.stack([decode_frame(p, int(n))
                                for p, n in zip(payload, lengths, strict=True)])
            error = float(np.abs(decoded.astype(int) - originals[:len(decoded)]).mean())
        results.append({"variant": name, "bytes_per_sample": nbytes / samples,
                        "lossless": lossless, "worker_us_per_sample": worker_s / samples * 1e6,
                        "trainer_us_per_sample": trainer_s / samples * 1e6,
                        "mean_abs_error": error})
    naive = results[0]["bytes_per_sample"]
    for r in results:
        r["ratio"] = naive / r["bytes_per_sample"]
    return results


# -- jitter --------------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class PublishEvery(TrainingOffline):
    """A trainer that does not train: it takes samples and publishes a perturbed actor every
    ``interval`` s."""

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


def child_fake_trainer(config_path: str, interval: str) -> None:
    """The trainer of a jitter run: a real Trainer whose loop only publishes (PublishEvery)."""
    from netrl.__main__ import install_stop_signals, setup_logging
    from netrl.trainer.trainer import Trainer

    cfg = load_config(config_path)
    setup_logging("trainer", "INFO")
    torch.set_num_threads(1)
    stop = threading.Event()
    install_stop_signals(stop)
    pipe = make_pipeline(cfg)
    training_cls = partial(PublishEvery, interval=float(interval), env_cls=pipe.env_cls,
                           memory_cls=pipe.memory_cls, training_agent_cls=pipe.training_agent_cls,
                           epochs=1, memory_size=10_000, batch_size=32)
    keys = client_keys(cfg.keys_dir, "trainer", "trainer") if cfg.security == "curve" else None
    Trainer(training_cls, cfg.network.server_ip, str(cfg.run_dir / "policy.pt"),
            server_port=cfg.network.trainer_port, network=cfg.network, run_dir=cfg.run_dir,
            wandb_mode="disabled", resume=False, persist_samples=False,
            sample_compressor=pipe.sample_compressor, keys=keys).run(stop)


def jitter_config(folder: Path) -> Config:
    """The drone pipeline with a 1.07M-parameter actor, CURVE-encrypted as by default."""
    keygen(folder / "keys")
    data = config_to_dict(Config())
    data.update(run_name="jitter", weights_folder=str(folder), torch_threads=1,
                keys_dir=str(folder / "keys"))
    data["env"]["pipeline"] = "drone"
    data["agent"]["hidden_sizes"] = [1024, 1024]  # a 1.07M-parameter actor
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"]["status_port"] = free_port()  # never the default port of a running server
    data["worker"].update(worker_id="jitter", min_samples_per_worker_packet=20)
    data["wandb"]["mode"] = "disabled"
    return config_from_dict(data)


def run_jitter(interval: float, seconds: float, save: bool, folder: Path) -> dict[str, Any]:
    cfg = jitter_config(folder)
    path = write_config(cfg, folder / "config.json")
    logs = [(folder / f"{r}.log").open("wb") for r in ("server", "trainer")]
    server = spawn_role("server", path, stdout=logs[0])
    time.sleep(1.0)
    trainer = child(child_fake_trainer, str(path), str(interval), log=logs[1])
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
        return {**period_stats(periods), "versions_applied": worker.version,
                "rtgym_timeouts": timeouts}
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
                print(f"  repeat {rep + 1}, {name}: p50 {r['p50_ms']:.2f} ms, p99 "
                      f"{r['p99_ms']:.2f} ms, max {r['max_ms']:.2f} ms, {r['steps']} steps, "
                      f"{r['versions_applied']} versions", flush=True)
                runs[name].append(r)
    out = []
    for name, rs in runs.items():
        med = {k: float(np.median([r[k] for r in rs]))
               for k in ("p50_ms", "p99_ms", "max_ms", "versions_applied", "rtgym_timeouts")}
        out.append({"condition": name, **med, "steps": sum(r["steps"] for r in rs),
                    "repeats": len(rs), "p99_each": [round(r["p99_ms"], 2) for r in rs]})
    return out


# -- memory --------------------------------------------------------------------------------------
def bench_memory(rows: int) -> dict[str, Any]:
    memory = FrameStackMemory(memory_size=rows, batch_size=256, stack=4, seed=0)
    n = 1000
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (n, 64, 64), dtype=np.uint8)
    reset = np.zeros(n, bool)
    reset[::51] = True  # episodes of 50 steps
    flags = np.zeros(n, bool)
    buf = Buffer(act=rng.uniform(-1, 1, (n, 2)).astype(np.float32), obs=frames,
                 rew=np.zeros(n, np.float32), terminated=flags, truncated=flags, reset=reset,
                 context=flags, policy_version=np.zeros(n, np.int64))
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
    return {"rows": rows, "transitions": len(memory), "fill_s": fill_s,
            "vectorised_ms": 1000 * float(np.median(fast)),
            "per_item_ms": 1000 * float(np.median(slow)),
            "speedup": float(np.median(slow) / np.median(fast))}


# -- rows ----------------------------------------------------------------------------------------
def wire_rows(results: dict[str, list[dict[str, Any]]], s: Settings) -> list[Row]:
    rows = []
    for noise, label in (("noise 3", "noisy camera"), ("noise 0", "clean frames")):
        naive = results[noise][0]["bytes_per_sample"]
        for r in results[noise]:
            lossy = "" if r["lossless"] else (f" (lossy: mean error {r['mean_abs_error']:.1f} gray "
                                              "levels)")
            print(f"wire, {label}: {r['variant']}{lossy}: {r['bytes_per_sample']:,.0f} bytes per "
                  f"sample, {r['ratio']:.2f}x fewer than naive, worker "
                  f"{r['worker_us_per_sample']:.0f} us, trainer "
                  f"{r['trainer_us_per_sample']:.0f} us per sample", flush=True)
            png = r["variant"].startswith("each frame once, PNG (zlib RLE)")
            judged = noise == "noise 3" and png
            rows.append(Row("pipelines", f"{r['variant']}{lossy}, {label}",
                            "bytes per image sample on the wire", r["bytes_per_sample"], "bytes",
                            naive, "naive full stacks (tmrl's layout)", r["ratio"],
                            "x fewer bytes", f">= {WIRE_TARGET:g}x fewer" if judged else "",
                            r["ratio"] >= WIRE_TARGET if judged else None,
                            {"part": "wire", "noise": noise, "steps": s.steps}, r))
    return rows


def jitter_rows(results: list[dict[str, Any]], s: Settings) -> list[Row]:
    base = results[0]["p99_ms"]  # no weight updates
    rows = []
    for r in results:
        print(f"worker loop at 20 Hz, {r['condition']}: p50 {r['p50_ms']:.2f} ms, p99 "
              f"{r['p99_ms']:.2f} ms, max {r['max_ms']:.2f} ms, {r['versions_applied']:.0f} "
              f"versions applied, {r['rtgym_timeouts']:.0f} rtgym time-outs", flush=True)
        judged = r["condition"] == "weights every 2 s"
        rows.append(Row("pipelines", f"worker loop at 20 Hz, {r['condition']}", "step period p99",
                        r["p99_ms"], "ms", base, "no weight updates", r["p99_ms"] / base, "x",
                        f"<= +{JITTER_TARGET_MS:g} ms" if judged else "",
                        r["p99_ms"] - base <= JITTER_TARGET_MS if judged else None,
                        {"part": "jitter", "seconds": s.seconds, "repeats": s.repeats}, r))
    return rows
