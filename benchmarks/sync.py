"""Sync collection overhead: the share of an iteration's wall time spent waiting for the slowest
worker and for the weights to arrive, with 1, 2 and 4 workers of equal speed.

An iteration is: the trainer publishes v, every worker collects ``--fragment`` steps of each of its
``--envs`` envs under v and sends them, the trainer trains once on the batch (``frames_per_batch``
= workers x envs x fragment) and publishes v + 1. Its wall time splits into the training (netrl's
PPO, 10 epochs of minibatches of 64 over the batch; or, with ``--agent timed``, a stand-in whose
train() takes ``--train-s``), the collection itself (the workers' own stepping time per fragment,
which they report in their heartbeats) and the rest: the overhead, waiting for the slowest worker
and for weights and packets to cross the server. Each env step costs ``--step-ms`` of sleep (a
simulator in another process), so the workers' speed does not depend on the cores left.

The server and the trainer run as threads of this process, each worker in a process of its own,
on loopback; the first two iterations, while the workers start, are left out. Target: <= 15% with
4 workers.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import multiprocessing
import statistics
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch

from benchmarks.results import Row
from benchmarks.settings import choose, ints, positive
from netrl.actor import ActorModule
from netrl.agents.base import TrainingAgent
from netrl.agents.ppo import PPOActor, PPOAgent
from netrl.config.sections import NetworkConfig
from netrl.launch import free_port
from netrl.memory.rollout import RolloutMemory
from netrl.samples import Batch
from netrl.server.server import Server
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import count_of
from netrl.worker.worker import RolloutWorker

OBS = gymnasium.spaces.Box(-1e6, 1e6, (4,), np.float32)
ACT = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
NET = NetworkConfig(heartbeat_interval_s=0.5, heartbeat_liveness=10)
TARGET = 0.15  # the share waiting, with 4 workers


@dataclasses.dataclass(frozen=True)
class Settings:
    workers: tuple[int, ...] = (1, 2, 4)
    iterations: int = 20  # measured, after two while the workers start
    envs: int = 8  # per worker
    fragment: int = 64  # steps of each env per iteration
    step_ms: float = 1.0  # sleep per env step
    agent: str = "ppo"  # ppo, or timed: a stand-in whose train() sleeps --train-s
    train_s: float = 0.2

    def __post_init__(self) -> None:
        positive("--workers", min(self.workers, default=0), 1, strict=False)
        positive("--iterations", self.iterations, 2, strict=False)
        positive("--envs", self.envs, 1, strict=False)
        positive("--fragment", self.fragment, 1, strict=False)
        choose((self.agent,), ("ppo", "timed"), "--agent")


SMOKE = Settings(workers=(1,), iterations=4, envs=2, fragment=16)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--workers", type=ints, help="worker counts (default 1,2,4)")
    p.add_argument("--iterations", type=int, help=f"iterations measured ({d.iterations})")
    p.add_argument("--envs", type=int, help=f"envs per worker ({d.envs})")
    p.add_argument("--fragment", type=int, help=f"steps of each env per iteration ({d.fragment})")
    p.add_argument("--step-ms", type=float, help=f"sleep per env step ({d.step_ms:g} ms)")
    p.add_argument("--agent", help="ppo (default), or timed: train() sleeps --train-s")
    p.add_argument("--train-s", type=float, help=f"with --agent timed: seconds ({d.train_s:g})")


class SleepEnv(gymnasium.Env[np.ndarray, np.ndarray]):
    """Each step sleeps ``step_s``; episodes of 200 steps."""

    def __init__(self, step_s: float) -> None:
        self.observation_space, self.action_space, self.step_s, self.t = OBS, ACT, step_s, 0

    def reset(self, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        time.sleep(self.step_s)
        self.t += 1
        return np.full(4, self.t, np.float32), 1.0, self.t >= 200, False, {}


class SmallActor(ActorModule):
    def __init__(self, observation_space: Any, action_space: Any) -> None:
        super().__init__(observation_space, action_space)
        self.net = torch.nn.Linear(4, 1)

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        with torch.no_grad():
            return torch.tanh(self.net(obs)).numpy()


class TimedAgent(TrainingAgent):
    """train() takes ``train_s`` (a stand-in for PPO's epochs) and changes the actor."""

    train_s = 0.2
    times: list[tuple[float, float]] = []

    def __init__(self, observation_space: Any, action_space: Any, device: str) -> None:
        super().__init__(observation_space, action_space, device)
        self.actor = SmallActor(observation_space, action_space)

    def get_actor(self) -> ActorModule:
        return self.actor

    def train(self, batch: Batch) -> dict[str, float]:
        start = time.monotonic()
        time.sleep(self.train_s)
        with torch.no_grad():
            self.actor.net.bias.add_(0.001)
        TimedAgent.times.append((start, time.monotonic()))
        return {"batch": float(len(batch.rew))}


class TimedPPO(PPOAgent):
    """netrl's PPO, its train() calls timed like TimedAgent's."""

    def train(self, batch: Batch) -> dict[str, float]:
        start = time.monotonic()
        metrics = super().train(batch)
        TimedAgent.times.append((start, time.monotonic()))
        return metrics


def run_worker(port: int, name: str, envs: int, step_s: float, ppo: bool, stop: Any) -> None:
    torch.set_num_threads(1)
    worker = RolloutWorker(partial(SleepEnv, step_s), PPOActor if ppo else SmallActor,
                           server_ip="127.0.0.1", server_port=port, network=NET,
                           min_samples_per_worker_packet=64, max_packet_delay_s=0.5,
                           worker_id=name, num_envs=envs, throttle=True, status_interval_s=0)
    ev = threading.Event()

    def relay_stop() -> None:  # the parent's multiprocessing event, as the worker's threading one
        stop.wait()
        ev.set()

    threading.Thread(target=relay_stop, daemon=True).start()
    worker.run(stop=ev)


def measure(workers: int, s: Settings) -> dict[str, Any]:
    TimedAgent.times, TimedAgent.train_s = [], s.train_s
    srv = Server(trainer_port=free_port(), worker_port=free_port(), network=NET,
                 spool_dir=tempfile.mkdtemp(prefix="bench_sync_"), min_samples_per_server_packet=1,
                 max_packet_delay_s=0.002)
    srv.open()
    stops = {"server": threading.Event(), "trainer": threading.Event()}
    threading.Thread(target=srv.run, args=(stops["server"],), daemon=True).start()
    frames = workers * s.envs * s.fragment
    agent = TimedPPO if s.agent == "ppo" else TimedAgent
    training_cls = partial(TrainingOffline, env_cls=(OBS, ACT), epochs=1, rounds=1,
                           steps=s.iterations + 2, memory_cls=RolloutMemory, collection="sync",
                           training_agent_cls=agent, frames_per_batch=frames,
                           rollout_fragment_length=s.fragment, sync_timeout_s=30.0, device="cpu")
    trainer = Trainer(training_cls, "127.0.0.1", server_port=srv.trainer_port, network=NET,
                      run_dir=Path(tempfile.mkdtemp(prefix="bench_sync_run_")),
                      wandb_mode="disabled", persist_samples=False)
    t_thread = threading.Thread(target=trainer.run, kwargs={"stop": stops["trainer"]}, daemon=True)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=run_worker, args=(srv.worker_port, f"w{i}", s.envs,
                                                  s.step_ms / 1000, s.agent == "ppo", stop))
             for i in range(workers)]
    for p in procs:
        p.start()
    t_thread.start()
    deadline = time.monotonic() + 60 + s.iterations * 10
    while len(TimedAgent.times) < s.iterations + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    reported = _reports(srv)
    stop.set()
    for p in procs:
        p.join(20)
    stops["trainer"].set()
    t_thread.join(20)
    stops["server"].set()
    times = TimedAgent.times[2:]  # the first iterations wait for the workers to start
    if len(times) < 2:
        raise SystemExit(f"only {len(TimedAgent.times)} iterations with {workers} workers before "
                         "the deadline")
    walls = [b[0] - a[0] for a, b in itertools.pairwise(times)]
    train = statistics.mean(end - start for start, end in times)
    collect = statistics.mean(r["collect_s"] / r["fragments"] for r in reported)
    wall = statistics.mean(walls)
    overhead = max(0.0, wall - train - collect)
    return {"workers": workers, "envs": s.envs, "fragment": s.fragment, "frames_per_batch": frames,
            "iterations": len(walls), "wall_s": round(wall, 4), "train_s": round(train, 4),
            "collect_s": round(collect, 4), "overhead_s": round(overhead, 4),
            "overhead_share": round(overhead / wall, 4)}


def _reports(srv: Server) -> list[dict[str, Any]]:
    """What the workers last said of their collection (in their heartbeats): waits a few heartbeats
    for the first, which a very short run may end before."""
    deadline = time.monotonic() + 4 * NET.heartbeat_interval_s
    while True:
        reported = [w["reported"] for w in srv.snapshot()["workers"]]
        done = [r for r in reported if r.get("fragments")]
        if done or time.monotonic() > deadline:
            if not done:
                raise SystemExit("no worker reported its collection time: run more --iterations")
            return done
        time.sleep(0.1)


def run(s: Settings) -> list[Row]:
    out = []
    for n in s.workers:
        row = measure(n, s)
        print(f"{n} workers: iteration {row['wall_s']:.3f} s = train {row['train_s']:.3f} + "
              f"collect {row['collect_s']:.3f} + waiting {row['overhead_s']:.3f} "
              f"({100 * row['overhead_share']:.1f}%)", flush=True)
        judged = n == 4
        where = f"{count_of(n, 'worker')} x {s.envs} envs, fragments of {s.fragment}"
        out.append(Row("sync", where,
                       "share of an iteration waiting", row["overhead_share"], "share",
                       target=f"<= {TARGET:.0%}" if judged else "",
                       met=row["overhead_share"] <= TARGET if judged else None,
                       params={**dataclasses.asdict(s), "workers": n}, detail=row))
    return out
