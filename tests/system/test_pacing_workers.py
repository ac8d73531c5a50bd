"""The policy-lag bound of paced workers holds for several of them: three throttled workers (one of
them a vector worker of 4 envs) beside a trainer whose training step sleeps, with the roles as
threads on loopback. Every sample's lag is recorded as it reaches the replay memory.

Before a paced worker sent its rows when a new version arrived, the slow worker's rows waited for its
packet to fill while the trainer trained on the others' samples: 16 of 1,510 samples arrived up to
5 versions old with ``max_policy_lag`` 2."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from netrl.memory.replay import ReplayMemory
from netrl.samples import Buffer
from netrl.server.server import Server
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, wait_until
from tests.system.test_sync import ACT, OBS, SlowAgent, Steps, ZeroActor

MAX_POLICY_LAG = 2
UPDATE_MODEL_INTERVAL = 5


class LagRecording(ReplayMemory):
    """Records the policy lag of every env step it stores: the trainer's version when its packet
    arrived less the version that produced it."""

    lags: list[int] = []
    lock = threading.Lock()

    def append_buffer(self, buffer: Buffer) -> None:
        ends = ~(buffer.reset | buffer.context)
        lag = buffer.recv_version - np.maximum(buffer.policy_version, 0)
        with LagRecording.lock:
            LagRecording.lags.extend(int(x) for x in lag[ends])
        super().append_buffer(buffer)


class Roles:
    """A trainer and paced workers as threads beside the test's server; stops them all."""

    def __init__(self, tmp_path: Path, server: tuple[Server, zmq.Context]) -> None:
        self.srv, _ = server
        self.tmp = tmp_path
        self.threads: list[tuple[threading.Thread, threading.Event, Any]] = []
        self.errors: list[BaseException] = []

    def run(self, role: Any) -> None:
        stop = threading.Event()
        thread = threading.Thread(target=self._run, args=(role, stop), daemon=True)
        thread.start()
        self.threads.append((thread, stop, role))

    def _run(self, role: Any, stop: threading.Event) -> None:
        try:
            role.run(stop=stop)
        except BaseException as exc:  # the test asserts there were none
            self.errors.append(exc)
            raise

    def trainer(self) -> Trainer:
        training_cls = partial(TrainingOffline, env_cls=(OBS, ACT), epochs=1, rounds=1,
                               steps=100_000, memory_cls=partial(LagRecording, batch_size=16,
                                                                 memory_size=100_000),
                               training_agent_cls=SlowAgent, start_training=40, worker_lead=200,
                               update_model_interval=UPDATE_MODEL_INTERVAL,
                               update_buffer_interval=5, max_policy_lag=MAX_POLICY_LAG)
        trainer = Trainer(training_cls, "127.0.0.1", server_port=self.srv.trainer_port,
                          run_dir=self.tmp / "run", wandb_mode="disabled", network=NET,
                          persist_samples=False)
        self.run(trainer)
        return trainer

    def worker(self, name: str, num_envs: int, delay: float) -> RolloutWorker:
        worker = RolloutWorker(partial(Steps, 7, delay), ZeroActor, server_ip="127.0.0.1",
                               server_port=self.srv.worker_port, network=NET,
                               min_samples_per_worker_packet=40, worker_id=name, num_envs=num_envs,
                               throttle=True, flush_timeout_s=5.0)
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
    LagRecording.lags = []
    r = Roles(tmp_path, server)
    try:
        yield r
    finally:
        r.close()


def test_three_paced_workers_one_of_4_envs_deliver_every_sample_within_max_policy_lag(
        roles: Roles, monkeypatch: pytest.MonkeyPatch) -> None:
    # a training step of 10 ms, and a version every 5 steps: two workers (a 1 ms env step) wait for
    # PACE most of the time, while the slow one (20 ms) fills a packet of 40 rows in 0.8 s, in which
    # the trainer, fed by the others, publishes about 16 versions
    monkeypatch.setattr(SlowAgent, "train_s", 0.01)
    roles.trainer()
    workers = [roles.worker("slow", 1, 0.02), roles.worker("w1", 1, 0.001), roles.worker("w4", 4, 0.001)]
    wait_until(lambda: len(LagRecording.lags) >= 1500, 120, "1500 samples at the trainer")
    lags = np.array(LagRecording.lags)
    over = lags[lags > MAX_POLICY_LAG]
    assert not len(over), (f"{len(over)} of {len(lags)} samples beyond max_policy_lag "
                           f"{MAX_POLICY_LAG}: lags up to {lags.max()} "
                           f"({np.bincount(lags).tolist()} samples per lag)")
    # every worker took its part (nobody starved)
    assert all(w.produced > 100 for w in workers), [w.produced for w in workers]

    # a clean stop: everything each worker made is acknowledged
    for thread, stop, role in roles.threads[1:]:
        stop.set()
        thread.join(15)
        assert not thread.is_alive(), f"{role} did not stop"
    for w in workers:
        assert w.samples_unacknowledged == 0, (w.worker_id, w.samples_unacknowledged)
    assert not roles.errors, roles.errors
