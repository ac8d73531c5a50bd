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
from netrl.monitor.status import format_status
from netrl.samples import Batch
from netrl.server.server import Server
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
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
                                  "traj_ids": batch.extra["traj_ids"].numpy(), "obs": batch.obs.numpy(),
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
        for _thread, stop, _ in reversed(self.threads):
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


def test_a_worker_joining_mid_batch_starts_with_the_next_version(roles: Roles) -> None:
    # one worker delivers 40 of the 200 steps a batch asks for: each batch waits its timeout, long enough to join in
    training = roles.trainer(frames_per_batch=200, sync_timeout_s=2.0).training
    roles.worker("first")
    wait_until(lambda: training is not None and training.sync is not None and training.sync.steps > 0, 20,
               "a batch holding samples")
    assert training is not None and training.sync is not None
    open_version = training.sync.version
    joiner = roles.worker("joiner")
    wait_until(lambda: joiner.sync.fragments >= 1, 20, "the joiner's first fragment")
    assert joiner.sync.first is not None and joiner.sync.first > open_version
    wait_until(lambda: any(any(w.startswith("joiner/") for w in b["workers"]) for b in Recording.batches), 20,
               "a batch with the joiner's samples")
    assert not any(w.startswith("joiner/") for w in training.sync.late_by_worker)  # it wasted no fragment


def test_a_worker_lost_mid_batch_stalls_the_trainer_only_until_sync_timeout_s(
        roles: Roles, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "netrl.training.sync")
    training = roles.trainer(frames_per_batch=80, sync_timeout_s=1.0).training
    roles.worker("stays")
    worker = roles.worker("leaves", delay=0.01)
    # With both workers, batches fill; on a loaded machine one may still be trained short after the
    # 1 s timeout (a worker starved of CPU is a late worker): wait for 3 full ones, rather than take
    # the first 3 to be full.
    def full() -> int:
        return sum(len(b["versions"]) == 80 for b in Recording.batches)

    wait_until(lambda: full() >= 3, 60, "3 full batches")
    assert full() >= 3
    stop = next(stop for _, stop, role in roles.threads if role is worker)
    stop.set()  # lost: it leaves mid-batch
    before = len(Recording.batches)
    started = time.monotonic()
    wait_until(lambda: len(Recording.batches) >= before + 3, 30, "3 batches without it")
    assert time.monotonic() - started < 3 * 1.0 + 10  # each waited about sync_timeout_s, not for ever
    short = [b for b in Recording.batches[before:] if len(b["versions"]) == 40]
    assert short and all(w.startswith("stays/") for b in short for w in b["workers"])
    assert training is not None and training.sync is not None and training.sync.shortfalls >= 1
    text = caplog.text
    assert "is trained with 40 of trainer.frames_per_batch 80 env steps after trainer.sync_timeout_s" in text
    assert "no samples from leaves/" in text


@pytest.mark.parametrize("batch_mode", ["truncate_episodes", "complete_episodes"])
def test_fragments_are_cut_at_the_fragment_length_or_at_the_end_of_each_episode(roles: Roles, batch_mode: str) -> None:
    # 2 envs, episodes of 7 steps, fragments of 10: truncated after 10 steps, or run on to the episode's end at 14
    per_env = 10 if batch_mode == "truncate_episodes" else 14
    roles.trainer(frames_per_batch=2 * per_env, rollout_fragment_length=10, batch_mode=batch_mode)
    roles.worker("w")
    wait_until(lambda: len(Recording.batches) >= 4, 20, "4 batches")
    for b in Recording.batches[1:4]:  # (the first may hold rows from before the announcement arrived)
        assert len(b["versions"]) == 2 * per_env
        ids = b["traj_ids"]
        assert (np.diff(ids) >= 0).all()  # each piece contiguous
        last_rows = np.r_[np.flatnonzero(np.diff(ids)), len(ids) - 1]
        t = b["next_obs"][:, 0]
        assert (np.diff(t)[np.diff(ids) == 0] == 1).all()  # time order within a piece
        if batch_mode == "complete_episodes":
            assert b["terminated"][last_rows].all()  # every env's fragment ends with an episode
        else:
            assert not b["terminated"][last_rows].all()  # fragments of 10 cut episodes of 7


def test_the_batch_under_way_and_the_waits_show_in_the_status_and_the_metrics(roles: Roles) -> None:
    trainer = roles.trainer(frames_per_batch=40)
    roles.worker("w")
    wait_until(lambda: len(Recording.batches) >= 3, 20, "3 batches")
    training = trainer.training
    assert training is not None
    live = training.live()
    assert training.publisher is not None
    assert live["batch_version"] == training.publisher.version and 0 <= live["batch_steps"] <= 40
    assert live["frames_per_batch"] == 40 and isinstance(live["waiting_for"], list)
    assert live["trainer_wait_s"] > 0 and live["worker_wait_s"] > 0
    summary = training._round_summary(0)
    for key in ("late_samples", "trainer_wait_s", "worker_wait_s", "batch_steps", "short_batches"):
        assert key in summary
    srv = roles.srv
    # The server holds what the worker's latest heartbeat said, a heartbeat (more on a loaded
    # machine) behind: the first that carries waits may say 0 (a first version already there, a wait
    # rounded to 0.000 s) and 0 fragments. Wait for the report to say so, not take the first one.
    def waits() -> list[dict[str, Any]]:
        return [r for w in srv.snapshot()["workers"]
                if (r := w["reported"]).get("worker_wait_s", 0) > 0 and r.get("fragments", 0) >= 1]

    reported = wait_until(waits, 30, "the worker's waits in its heartbeats")
    assert reported[0]["worker_wait_s"] > 0 and reported[0]["fragments"] >= 1
    text = format_status(srv.snapshot())
    assert "sync batch v" in text and "workers' waits for weights: w " in text
