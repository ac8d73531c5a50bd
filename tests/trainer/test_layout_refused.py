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
from tests.fakes import NET, running_server, wait_until
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


def last_line(caplog: pytest.LogCaptureFixture, start: str) -> str:
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith(start)]
    return line


def test_packets_spooled_while_no_trainer_ran_reach_the_trainer_of_their_layout_across_a_restart(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The outside check: packets spooled while no trainer was connected went to a trainer of another
    # layout, which refused them, and were lost, while the server said "relayed (the trainer has
    # them)". Here the first trainer takes w3's packets and refuses w2's; the server keeps those on
    # disk, across its restart, for the second trainer, of their layout. Each stop line says so.
    caplog.set_level(logging.INFO)
    settings = {"spool_dir": tmp_path / "spool", "network": NET, "max_packet_delay_s": 0.01}
    summaries = {}
    with running_server(**settings) as (srv, _):
        for name, compressor in (("w3", None), ("w2", first_two)):  # no trainer: all spooled
            worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"),
                                   partial(MLPActor, hidden_sizes=(8,)), compressor,
                                   server_ip="127.0.0.1", server_port=srv.worker_port, network=NET,
                                   min_samples_per_worker_packet=50, worker_id=name, seed=0,
                                   throttle=False)
            worker.run(nb_episodes=2)
            line = last_line(caplog, f"worker {name} session")
            summaries[name] = worker_summary(line)
            assert f"{summaries[name].produced} of the acknowledged samples are spooled" in line
        w3, w2 = summaries["w3"], summaries["w2"]
        assert w3.produced == w2.produced == 400 and w3.acked == w3.produced and w2.unacked == 0
        first = Running(trainer(tmp_path / "first", srv.trainer_port, None))
        try:
            wait_until(lambda: srv.stats["samples_held"] == w2.produced and not srv.spool.packets,
                       60, "w2's packets held", poll=0.05)
        finally:
            first.end()
    assert sum(delivered(tmp_path / "first").values()) == w3.produced  # w3's, once each
    assert last_line(caplog, "trainer stopped").endswith(
        f"; {w2.packets} packets refused for their sample layout (the server keeps them for a "
        f"trainer with theirs where it can: its last line says where each is)")
    assert last_line(caplog, "server stopped").startswith(
        f"server stopped: {w3.produced} samples delivered to the trainer; 0 spooled for it (0 "
        f"packets); {w2.produced} held for another sample layout ({w2.packets} packets in 1 layout")

    caplog.clear()
    with running_server(**settings) as (srv, _):  # restarted: the held packets are still there
        second = Running(trainer(tmp_path / "second", srv.trainer_port, first_two))
        try:
            wait_until(lambda: sum(delivered(tmp_path / "second").values()) >= w2.produced, 60,
                       "w2's packets at the trainer of their layout", poll=0.05)
            wait_until(lambda: srv.stats["samples_out"] == w2.produced, 10, "their ACK", poll=0.05)
        finally:
            second.end()
    got = delivered(tmp_path / "second")  # fails on a duplicate
    assert sorted(got) == [(w2.session, seq) for seq in range(1, w2.packets + 1)]
    assert last_line(caplog, "trainer stopped").endswith(
        "; 0 packets refused for their sample layout (the server keeps them for a trainer with "
        "theirs where it can: its last line says where each is)")
    assert last_line(caplog, "server stopped").startswith(
        f"server stopped: {w2.produced} samples delivered to the trainer; 0 spooled for it (0 "
        f"packets); 0 held for another sample layout (0 packets in 0 layouts")
