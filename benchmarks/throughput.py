"""Collection throughput: env steps/s of one worker running 1, 4 and 16 envs, beside 16 one-env
worker processes.

Every row runs the three roles as processes (``python -m netrl --server/--trainer/--worker``) on
this machine, with the config's env (default CartPole-v1, the gym pipeline's MLP actor), pacing off
(``worker.throttle`` false: the workers step as fast as they can) and CURVE on. The figure is the
env steps the real server accepted per second from all workers together (its ``--status``
counter), measured over ``--seconds`` once every worker has delivered samples and ``--warmup``
more seconds have passed. The trainer receives, logs and stores every sample; by default it does
not train (``trainer.start_training`` is set beyond the run), so that the figure is the workers'
rate and not their share of the cores left by SAC's updates; ``--train`` lets it train.

Rows: ``worker.num_envs`` = 1, 4, 16 in one worker process (``worker.vectorization``: sync by
default), and 16 worker processes of one env each. Each row is measured ``--repeat`` times, the
rows in turn; medians are reported. Targets: 16 envs in one worker >= 5x the steps/s of one env,
and >= the steps/s of 16 one-env processes.

``--watchdog`` measures instead what the env watchdog costs one standalone one-env worker, on
Pendulum-v1 and CartPole-v1, against the same loop with no watchdog (benchmarks/watchdog.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.results import Row
from benchmarks.settings import choose, ints, positive
from netrl.config.load import config_from_dict, config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.monitor.status import query_status
from netrl.net.keys import keygen


@dataclasses.dataclass(frozen=True)
class Settings:
    env: str = "CartPole-v1"  # a Gymnasium id run by the gym pipeline
    envs: tuple[int, ...] = (1, 4, 16)  # worker.num_envs of the one-worker rows
    processes: int = 16  # one-env worker processes of the last row (0: none)
    vectorization: str = "sync"
    seconds: float = 10.0  # measurement window per row
    warmup: float = 3.0  # seconds after every worker delivers, before the window
    start_timeout: float = 240.0
    repeat: int = 1  # measurements per row, in turns; medians
    train: bool = False  # let the trainer train (it competes for the cores)
    security: str = "curve"
    watchdog: bool = False  # instead: one standalone worker with and without the env watchdog

    def __post_init__(self) -> None:
        positive("--envs", min(self.envs, default=0), 1, strict=False)
        positive("--processes", self.processes, strict=False)
        positive("--repeat", self.repeat, 1, strict=False)
        positive("--seconds", self.seconds)
        choose((self.vectorization,), ("sync", "async"), "--vectorization")
        choose((self.security,), ("curve", "none"), "--security")


SMOKE = Settings(envs=(1,), processes=0, seconds=1.0, warmup=0.5)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--env", help=f"Gymnasium id run by the gym pipeline (default {d.env})")
    p.add_argument("--envs", type=ints, help="worker.num_envs of the one-worker rows (1,4,16)")
    p.add_argument("--processes", type=int,
                   help=f"one-env worker processes of the last row, 0: none ({d.processes})")
    p.add_argument("--vectorization", help=f"sync or async (default {d.vectorization})")
    p.add_argument("--seconds", type=float, help=f"measurement window per row ({d.seconds:g})")
    p.add_argument("--warmup", type=float,
                   help=f"seconds after every worker delivers, before the window ({d.warmup:g})")
    p.add_argument("--start-timeout", type=float, help=f"seconds to start ({d.start_timeout:g})")
    p.add_argument("--repeat", type=int, help=f"measurements per row, medians ({d.repeat})")
    p.add_argument("--train", action="store_true", default=None,
                   help="let the trainer train (it competes for the cores)")
    p.add_argument("--security", help=f"curve or none (default {d.security})")
    p.add_argument("--watchdog", action="store_true", default=None,
                   help="instead: a standalone one-env worker's steps/s with the env watchdog "
                   "and without (Pendulum-v1, CartPole-v1; --seconds, --warmup, --repeat)")


def bench_config(tmp: Path, num_envs: int, s: Settings) -> Config:
    data = config_to_dict(Config())
    keygen(tmp / "keys")
    data.update(run_name="throughput", weights_folder=str(tmp), seed=1, keys_dir=str(tmp / "keys"),
                security=s.security, status_interval_s=0)
    data["env"].update(id=s.env)
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"]["status_port"] = free_port()
    data["worker"].update(test_episode_interval=0, throttle=False, num_envs=num_envs,
                          vectorization=s.vectorization)
    data["trainer"].update(epochs=1000, rounds=1, steps=1000)
    if not s.train:  # the trainer stores every sample and never trains: the figure is the workers'
        data["trainer"].update(start_training=2**40)
    data["wandb"]["mode"] = "disabled"
    return config_from_dict(data)


def accepted(port: int) -> tuple[float, int, list[dict[str, Any]]]:
    """(time, env steps the server has accepted from all workers, the workers' entries) from its
    status port."""
    snap = query_status(port, timeout_s=5.0)
    return time.monotonic(), int(snap["stats"]["samples_in"]), list(snap["workers"])


def run_row(tmp: Path, name: str, num_envs: int, processes: int, s: Settings) -> float:
    """Env steps/s the server accepts from ``processes`` worker processes of ``num_envs`` envs."""
    folder = tmp / name
    cfg = bench_config(folder, num_envs, s)
    path = write_config(cfg, folder / "config.json")
    logs = (folder / "roles.log").open("wb")
    server = spawn_role("server", path, stdout=logs, log_level="WARNING")
    procs: list[subprocess.Popen[bytes]] = [spawn_role("trainer", path, stdout=logs,
                                                       log_level="WARNING")]
    procs += [spawn_role("worker", path, "--worker-id", f"w{i:02d}", stdout=logs,
                         log_level="WARNING") for i in range(processes)]
    port = cfg.server.status_port
    try:
        deadline = time.monotonic() + s.start_timeout
        while True:  # every worker connected and delivering (16 importing torch take a while)
            if any(p.poll() is not None for p in [server, *procs]):
                raise SystemExit(f"a process of row {name!r} exited early; see "
                                 f"{folder / 'roles.log'}")
            try:
                _, _, workers = accepted(port)
            except Exception:  # the server is not listening yet
                workers = []
            if len(workers) == processes and all(w["samples"] > 0 for w in workers):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"row {name!r}: {len(workers)} of {processes} workers delivering "
                                 f"after {s.start_timeout} s; see {folder / 'roles.log'}")
            time.sleep(0.5)
        time.sleep(s.warmup)
        t0, n0, _ = accepted(port)
        time.sleep(s.seconds)
        t1, n1, _ = accepted(port)
        return (n1 - n0) / (t1 - t0)
    finally:
        stop_processes(procs, then=[server])
        logs.close()


def run(s: Settings) -> list[Row]:
    if s.watchdog:
        from benchmarks import watchdog

        return watchdog.run(s.warmup, s.seconds, s.repeat)
    rows = [(f"1 worker, {n} env{'s' if n > 1 else ''}", n, 1) for n in s.envs]
    if s.processes:
        rows.append((f"{s.processes} worker processes, 1 env each", 1, s.processes))
    measured: dict[str, list[float]] = {name: [] for name, _, _ in rows}
    with tempfile.TemporaryDirectory(prefix="netrl-throughput-") as d:
        for r in range(s.repeat):
            for i, (name, num_envs, processes) in enumerate(rows):
                rate = run_row(Path(d), f"r{r}-{i}", num_envs, processes, s)
                measured[name].append(rate)
                print(f"{name}: {rate:,.0f} env steps/s", flush=True)
    steps = {name: statistics.median(measured[name]) for name in measured}
    base = next((steps[name] for name, n, procs in rows if (n, procs) == (1, 1)), None)
    params = {"env": s.env, "vectorization": s.vectorization, "train": s.train,
              "security": s.security, "seconds": s.seconds, "repeat": s.repeat,
              "cores": os.cpu_count()}
    out = []
    for name, num_envs, processes in rows:
        judged = (num_envs, processes) == (16, 1)
        ratio = steps[name] / base if base else None
        out.append(Row("throughput", name, "env steps/s", steps[name], "steps/s", base,
                       "1 worker, 1 env", ratio, "x", ">= 5x" if judged else "",
                       ratio >= 5 if judged and ratio is not None else None,
                       {**params, "num_envs": num_envs, "processes": processes},
                       {"runs": measured[name]}))
    sixteen, many = "1 worker, 16 envs", f"{s.processes} worker processes, 1 env each"
    if sixteen in steps and many in steps and s.processes == 16:
        ratio = steps[sixteen] / steps[many]
        out.append(Row("throughput", f"{sixteen} against {many}", "env steps/s", steps[sixteen],
                       "steps/s", steps[many], many, ratio, "x", ">= 1x", ratio >= 1,
                       {**params, "num_envs": 16, "processes": 1}))
    return out
