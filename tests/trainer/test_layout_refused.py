"""A trainer without the workers' sample compressor: it hears why the server refuses their packets, once, with the
fix, and once a trainer with the compressor connects it gets every packet the workers kept meanwhile.

Real roles over 127.0.0.1, in threads of this process: a Server, a RolloutWorker, then two Trainers.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import zmq

from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.envs.gym import GenericGymEnv
from netrl.server.server import Server
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, wait_until
from tests.reliability import delivered, worker_summary

FIX = "Trainer(..., sample_compressor=...)"


def first_two(act: Any, obs: Any, rew: float, terminated: bool, truncated: bool,
              info: dict[str, Any]) -> tuple[Any, Any, float, bool, bool, dict[str, Any]]:
    """The workers' compressor: they send the first two of Pendulum's three observations."""
    return act, obs[:2], rew, terminated, truncated, info


class SlowPendulum(GenericGymEnv):
    """Pendulum at a few hundred steps/s: tens of packets a second, not thousands."""

    def step(self, action: Any) -> Any:
        time.sleep(0.002)
        return super().step(action)


def trainer(run_dir: Path, port: int, compressor: Any) -> Trainer:
    """A trainer that only collects (it would train from 10**9 samples), on Pendulum's spaces."""
    spaces = (gymnasium.spaces.Box(-8, 8, (3,), np.float32), gymnasium.spaces.Box(-2, 2, (1,), np.float32))
    training = partial(TrainingOffline, env_cls=spaces, epochs=1000, rounds=1, steps=10, start_training=10**9,
                       memory_size=100_000, batch_size=8, seed=0, sleep_between_buffer_retrieval_attempts=0.01,
                       training_agent_cls=partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(8,))))
    return Trainer(training, "127.0.0.1", server_port=port, network=NET, run_dir=run_dir, wandb_mode="disabled",
                   sample_compressor=compressor)


def told_trainer(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """What the trainers logged of the server's refusals."""
    return [r for r in caplog.records if r.name == "netrl.trainer.link" and "sample layout" in r.getMessage()]


class Running:
    """A role's run(stop) in a thread."""

    def __init__(self, role: Any) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=role.run, kwargs={"stop": self.stop})
        self.thread.start()

    def end(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


def test_a_trainer_without_the_workers_compressor_hears_why_once_and_the_next_one_gets_every_kept_packet(
        server: tuple[Server, zmq.Context], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    srv, _ = server
    caplog.set_level(logging.INFO)
    wrong = Running(trainer(tmp_path / "wrong", srv.trainer_port, None))
    roles = [wrong]
    try:
        wait_until(lambda: srv.schema is not None, 30, "the first trainer's layout at the server", poll=0.02)
        worker = RolloutWorker(partial(SlowPendulum, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                               first_two, server_ip="127.0.0.1", server_port=srv.worker_port, network=NET,
                               min_samples_per_worker_packet=10, worker_id="w1", seed=0, throttle=False)
        working = Running(worker)
        roles.append(working)
        wait_until(lambda: worker.net is not None and len(worker.net.held) >= 20, 30, "20 packets held", poll=0.02)
        told = wait_until(lambda: told_trainer(caplog), 10, "the trainer's log line", poll=0.02)
        assert len(told) == 1 and told[0].levelno == logging.ERROR, [r.getMessage() for r in told]
        message = told[0].getMessage()
        assert "field 'obs' has dtype <f4 and row shape (2,); the trainer expects <f4 and (3,)" in message
        assert FIX in message and "the workers keep them" in message
        assert srv.stats["layout_refusals"] >= 20 and srv.stats["samples_in"] == 0
        wrong.end()
        roles.remove(wrong)
        assert delivered(tmp_path / "wrong") == {}
        held = len(worker.net.held)
        assert held >= 20  # kept while no trainer takes them

        fixed = Running(trainer(tmp_path / "fixed", srv.trainer_port, first_two))
        roles.append(fixed)
        net = worker.net
        wait_until(lambda: not net.held and net.counts["acked_packets"] >= held, 30,
                   "the held packets acknowledged", poll=0.02)
        working.end()  # stops the env, then hands over and flushes its last packets
        roles.remove(working)
        fixed.end()
        roles.remove(fixed)
    finally:
        for role in reversed(roles):
            role.end()
    summary = worker_summary(caplog.text)
    assert summary.dropped == summary.rejected == summary.unacked == 0, summary
    assert summary.acked == summary.produced
    got = delivered(tmp_path / "fixed")  # what entered the memory: a duplicate fails here
    assert sorted(seq for _, seq in got) == list(range(1, summary.packets + 1))  # none lost
    assert sum(got.values()) == summary.produced
    assert len(told_trainer(caplog)) == 1  # the fixed trainer was told nothing
