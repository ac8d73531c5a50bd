"""Synchronous collection end to end, with the roles as threads on loopback: RolloutWorker -> Server -> Trainer ->
RolloutMemory -> a recording agent. Every batch holds one weight version; late, joining and lost workers."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
import zmq

from netrl.actor import ActorModule
from netrl.agents.base import TrainingAgent
from netrl.memory.rollout import RolloutMemory
from netrl.samples import Batch
from netrl.server.server import Server
from netrl.trainer.trainer import Trainer
from netrl.training import TrainingOffline
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, wait_until

OBS = gymnasium.spaces.Box(-1e6, 1e6, (2,), np.float32)
ACT = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)


class Steps(gymnasium.Env):  # type: ignore[type-arg]
    """obs = [t, episode]; episodes of ``length`` steps; each step sleeps ``delay`` seconds (a slow worker)."""

    def __init__(self, length: int = 7, delay: float = 0.0) -> None:
        self.observation_space, self.action_space = OBS, ACT
        self.length, self.delay = length, delay
        self.t, self.ep = 0, -1

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t, self.ep = 0, self.ep + 1
        return np.array([0, self.ep], np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.delay:
            time.sleep(self.delay)
        self.t += 1
        return np.array([self.t, self.ep], np.float32), 1.0, self.t >= self.length, False, {}


class ZeroActor(ActorModule):
    def __init__(self, observation_space: Any, action_space: Any) -> None:
        super().__init__(observation_space, action_space)
        self.p = torch.nn.Parameter(torch.zeros(1))

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        return np.zeros((obs.shape[0], 1), np.float32)


class Recording(RolloutMemory):
    """Keeps, for every batch sampled, its transitions' weight versions, workers and traj_ids."""

    batches: list[dict[str, Any]] = []

    def sample(self) -> Batch:
        batch = super().sample()
        Recording.batches.append({"versions": self.policy_versions(), "workers": self.workers(),
                                  "traj_ids": self.last_extra["traj_ids"].numpy(), "obs": batch.obs.numpy(),
                                  "next_obs": batch.next_obs.numpy(), "truncated": batch.truncated.numpy(),
                                  "terminated": batch.terminated.numpy()})
        return batch


class SlowAgent(TrainingAgent):
    """train() takes ``train_s`` seconds and changes the actor (so every version differs)."""

    train_s = 0.05

    def __init__(self, observation_space: Any, action_space: Any, device: str) -> None:
        super().__init__(observation_space, action_space, device)
        self.actor = ZeroActor(observation_space, action_space)

    def get_actor(self) -> ActorModule:
        return self.actor

    def train(self, batch: Batch) -> dict[str, float]:
        time.sleep(self.train_s)
        with torch.no_grad():
            self.actor.p += 1
        return {"batch_len": float(len(batch.rew))}


def sync_trainer(run_dir: Path, port: int, **sync: Any) -> Trainer:
    training_cls = partial(TrainingOffline, env_cls=(OBS, ACT), epochs=1, rounds=1, steps=10_000,
                           memory_cls=Recording, training_agent_cls=SlowAgent, collection="sync",
                           **{"frames_per_batch": 40, "rollout_fragment_length": 20, "sync_timeout_s": 5.0, **sync})
    return Trainer(training_cls, "127.0.0.1", server_port=port, run_dir=run_dir, wandb_mode="disabled", network=NET,
                   persist_samples=False)


class Roles:
    """Starts a server, a trainer and workers in threads; stops them all."""

    def __init__(self, tmp_path: Path, server: tuple[Server, zmq.Context]) -> None:
        self.srv, _ = server
        self.tmp = tmp_path
        self.threads: list[tuple[threading.Thread, threading.Event, Any]] = []

    def run(self, role: Any) -> threading.Event:
        stop = threading.Event()
        thread = threading.Thread(target=role.run, kwargs={"stop": stop}, daemon=True)
        thread.start()
        self.threads.append((thread, stop, role))
        return stop

    def trainer(self, **sync: Any) -> Trainer:
        trainer = sync_trainer(self.tmp / "run", self.srv.trainer_port, **sync)
        self.run(trainer)
        return trainer

    def worker(self, name: str, delay: float = 0.0, num_envs: int = 2, length: int = 7) -> RolloutWorker:
        worker = RolloutWorker(partial(Steps, length, delay), ZeroActor, server_ip="127.0.0.1",
                               server_port=self.srv.worker_port, network=NET, min_samples_per_worker_packet=8,
                               worker_id=name, num_envs=num_envs, throttle=True, flush_timeout_s=0.5)
        self.run(worker)
        return worker

    def close(self) -> None:
        for thread, stop, _ in reversed(self.threads):
            stop.set()
        for thread, _, role in reversed(self.threads):
            thread.join(15)
            assert not thread.is_alive(), f"{role} did not stop"


@pytest.fixture
def roles(tmp_path: Path, server: tuple[Server, zmq.Context]) -> Iterator[Roles]:
    Recording.batches = []
    r = Roles(tmp_path, server)
    try:
        yield r
    finally:
        r.close()


def test_every_sync_batch_holds_one_version_and_a_slow_workers_stale_fragment_is_counted_late(roles: Roles) -> None:
    # frames_per_batch 40 = one fragment of 2 envs x 20 steps: the fast worker fills each batch; the slow one's
    # fragment of v arrives after batch v was trained
    trainer = roles.trainer()
    roles.worker("fast")
    slow = roles.worker("slow", delay=0.02)
    wait_until(lambda: len(Recording.batches) >= 6 and slow.sync.fragments >= 2, 30, "6 batches and 2 slow fragments")
    training = trainer.training
    assert training is not None and training.sync is not None
    late = training.sync.late_by_worker
    wait_until(lambda: sum(n for w, n in late.items() if w.startswith("slow/")) > 0, 20, "late samples of slow")
    seen = []
    for b in Recording.batches:
        versions = np.unique(b["versions"])
        assert len(versions) == 1, versions  # no sample of another version in a batch
        seen.append(int(versions[0]))
    assert seen == sorted(set(seen))  # one batch per version, in order
    assert training.total_updates >= 6
    live = training.live()
    assert live["late_samples"] == training.sync.late_samples > 0
    assert live["frames_per_batch"] == 40 and live["collection"] == "sync"
