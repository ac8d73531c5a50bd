"""netrl as a remote collector: frames/s that a TorchRL training loop receives, against
TorchRL's own ``MultiSyncCollector``.

netrl row: a server and ``--workers`` worker processes (``python -m netrl``, CURVE on, the gym
pipeline's actor for ``--env``, ``worker.num_envs`` = ``--envs``) and a
:class:`~netrl.interop.collector.RemoteCollector` in this process, iterated as a TorchRL loop
iterates it: every batch a TensorDict of ``--frames-per-batch`` frames (the server hop and the
TensorDict conversion included), async collection (``--sync`` for sync: one weight version per
batch, published before it). TorchRL row: ``MultiSyncCollector`` with ``--workers`` processes, each
stepping a ``SerialEnv`` of ``--envs`` ``GymEnv(--env)``, the same batch size, a policy of the same
shape (an MLP of the config's ``agent.hidden_sizes`` and an argmax, as netrl's DQN actor).

Each row counts the frames its loop receives over ``--seconds``, after ``--warmup`` batches; the
rows alternate, ``--repeat`` times each, on the same machine; medians are reported. Target: netrl
>= 3x TorchRL's frames/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.results import Row
from benchmarks.settings import choose, positive
from netrl.config.load import config_from_dict, config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.net.keys import keygen


@dataclasses.dataclass(frozen=True)
class Settings:
    env: str = "CartPole-v1"
    workers: int = 2  # processes, on both sides
    envs: int = 16  # envs per worker process
    frames_per_batch: int = 1024
    seconds: float = 10.0  # measurement window per row
    warmup: int = 5  # batches before the window
    repeat: int = 3  # measurements per row, alternating; medians
    sync: bool = False
    security: str = "curve"

    def __post_init__(self) -> None:
        positive("--workers", self.workers, 1, strict=False)
        positive("--envs", self.envs, 1, strict=False)
        positive("--frames-per-batch", self.frames_per_batch, 1, strict=False)
        positive("--seconds", self.seconds)
        positive("--warmup", self.warmup, strict=False)
        positive("--repeat", self.repeat, 1, strict=False)
        choose((self.security,), ("curve", "none"), "--security")


SMOKE = Settings(envs=2, frames_per_batch=64, seconds=1.0, warmup=1, repeat=1)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--env", help=f"Gymnasium id (default {d.env})")
    p.add_argument("--workers", type=int, help=f"worker processes on each side ({d.workers})")
    p.add_argument("--envs", type=int, help=f"envs per worker process ({d.envs})")
    p.add_argument("--frames-per-batch", type=int, help=f"frames per batch ({d.frames_per_batch})")
    p.add_argument("--seconds", type=float, help=f"measurement window per row ({d.seconds:g})")
    p.add_argument("--warmup", type=int, help=f"batches before the window ({d.warmup})")
    p.add_argument("--repeat", type=int, help=f"measurements per row, alternating ({d.repeat})")
    p.add_argument(
        "--sync",
        action="store_true",
        default=None,
        help="netrl collects synchronously (one weight version per batch)",
    )
    p.add_argument("--security", help=f"curve or none (default {d.security})")


def bench_config(tmp: Path, s: Settings) -> Config:
    data = config_to_dict(Config())
    keygen(tmp / "keys")
    data.update(
        run_name="collector",
        weights_folder=str(tmp),
        seed=1,
        keys_dir=str(tmp / "keys"),
        security=s.security,
        status_interval_s=0,
    )
    data["env"].update(id=s.env)
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"]["status_port"] = free_port()
    data["worker"].update(test_episode_interval=0, num_envs=s.envs, throttle=True)
    data["wandb"]["mode"] = "disabled"
    return config_from_dict(data)


def window(batches: Any, s: Settings) -> float:
    """Frames/s that iterating ``batches`` yields over ``s.seconds``, after ``s.warmup`` batches."""
    it = iter(batches)
    for _ in range(s.warmup):
        next(it)
    frames, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < s.seconds:
        frames += int(next(it).numel())
    return frames / (time.perf_counter() - t0)


def netrl_row(tmp: Path, s: Settings) -> float:
    from netrl.interop.collector import RemoteCollector
    from netrl.pipelines.make import make_pipeline

    cfg = bench_config(tmp, s)
    path = write_config(cfg, tmp / "config.json")
    logs = (tmp / "roles.log").open("wb")
    server = spawn_role("server", path, stdout=logs, log_level="WARNING")
    workers = [
        spawn_role("worker", path, "--worker-id", f"w{i}", stdout=logs, log_level="WARNING")
        for i in range(s.workers)
    ]
    try:
        pipeline = make_pipeline(cfg)
        env = pipeline.env_cls()
        policy = pipeline.actor_module_cls(env.observation_space, env.action_space)
        with RemoteCollector(
            cfg,
            policy,
            frames_per_batch=s.frames_per_batch,
            sync=s.sync,
            rollout_fragment_length=max(1, s.frames_per_batch // (s.workers * s.envs)),
        ) as collector:
            return window(collector, s)
    finally:
        stop_processes(workers, then=[server])
        logs.close()


def serial_env(env: str, n: int) -> Any:
    from torchrl.envs import GymEnv, SerialEnv

    return SerialEnv(n, functools.partial(GymEnv, env))


def torchrl_policy(env: str, hidden: tuple[int, ...]) -> Any:
    """An MLP on the observation and an argmax over its outputs, as a one-hot action."""
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.envs import GymEnv
    from torchrl.modules import MLP, QValueModule

    probe = GymEnv(env)
    spec = probe.action_spec
    net = MLP(
        in_features=probe.observation_spec["observation"].shape[-1],
        out_features=spec.shape[-1],
        num_cells=list(hidden),
    )  # not lazy: it is sent to the worker processes
    return TensorDictSequential(
        TensorDictModule(net, ["observation"], ["action_value"]), QValueModule(spec=spec)
    )


def torchrl_row(s: Settings, hidden: tuple[int, ...]) -> float:
    from torchrl.collectors import MultiSyncCollector

    make = functools.partial(serial_env, s.env, s.envs)
    collector = MultiSyncCollector(
        [make] * s.workers,
        torchrl_policy(s.env, hidden),
        frames_per_batch=s.frames_per_batch,
        total_frames=-1,
    )
    try:
        return window(collector, s)
    finally:
        collector.shutdown()


def run(s: Settings) -> list[Row]:
    hidden = tuple(Config().agent.hidden_sizes)
    measured: dict[str, list[float]] = {"netrl": [], "torchrl": []}
    with tempfile.TemporaryDirectory(prefix="netrl-collector-") as d:
        for r in range(s.repeat):
            measured["netrl"].append(netrl_row(Path(d) / f"r{r}", s))
            print(f"netrl RemoteCollector: {measured['netrl'][-1]:,.0f} frames/s", flush=True)
            measured["torchrl"].append(torchrl_row(s, hidden))
            print(
                f"TorchRL MultiSyncCollector: {measured['torchrl'][-1]:,.0f} frames/s", flush=True
            )
    value, base = statistics.median(measured["netrl"]), statistics.median(measured["torchrl"])
    ratio = value / base if base else None
    params = {
        "env": s.env,
        "workers": s.workers,
        "envs": s.envs,
        "frames_per_batch": s.frames_per_batch,
        "sync": s.sync,
        "security": s.security,
        "seconds": s.seconds,
        "warmup": s.warmup,
        "repeat": s.repeat,
        "hidden_sizes": list(hidden),
        "cores": os.cpu_count(),
    }
    return [
        Row(
            "collector",
            f"{s.workers} workers x {s.envs} envs, {s.env}",
            "frames/s received",
            value,
            "frames/s",
            base,
            "TorchRL MultiSyncCollector, same processes and envs",
            ratio,
            "x",
            ">= 3x",
            ratio >= 3 if ratio is not None else None,
            params,
            measured,
        )
    ]
