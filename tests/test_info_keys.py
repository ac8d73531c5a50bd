"""Env info to the trainer end to end: an env whose info carries known functions of each step, a real RolloutWorker
(one env, and a vector of three) that records the declared info keys, the real server and a Trainer whose agent keeps
the batches it trains on: every batch holds, for each transition, the info of the step that ended it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
import zmq

from netrl.actor import ActorModule
from netrl.agents.base import TrainingAgent
from netrl.memory.replay import ReplayMemory
from netrl.samples import Batch
from netrl.samples.info import InfoKey
from netrl.server.server import Server
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, Counter, TagActor, wait_until
from tests.recording import local_packets

OBS_SPACE = gymnasium.spaces.Box(-1e6, 1e6, (3,), np.float32)
ACT_SPACE = gymnasium.spaces.Box(-1e6, 1e6, (1,), np.float32)
KEYS = (InfoKey("code", "float32"), InfoKey("t_sq", "int32", (), -1), InfoKey("hit", "bool", (), False))


def code(obs: np.ndarray) -> np.ndarray:
    """What the env's info says of an observation [tag, episode, t]: distinct for every row of a run."""
    return (1000 * obs[..., 0] + 10 * obs[..., 1] + obs[..., 2]).astype(np.float32)


class InfoCounter(Counter):
    """tests.fakes.Counter with an info: ``code`` of the observation it came with, ``t_sq`` and ``hit`` only from
    step() (a reset's info lacks them: their defaults stand in)."""

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        obs, _ = super().reset(seed=seed, options=options)
        return obs, {"code": float(code(obs))}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, rew, term, trunc, _ = super().step(action)
        return obs, rew, term, trunc, {"code": float(code(obs)), "t_sq": self.t ** 2, "hit": self.t % 2 == 0,
                                       "unlisted": "stays on the worker"}


@pytest.fixture(autouse=True)
def fresh_counters() -> None:
    Counter.made = []


@pytest.mark.parametrize("num_envs", [1, 3])
def test_each_row_holds_the_info_of_the_call_that_returned_its_observation(num_envs: int) -> None:
    worker = RolloutWorker(InfoCounter, TagActor, min_samples_per_worker_packet=4, num_envs=num_envs, seed=0,
                           info_keys=KEYS)
    bufs = list(local_packets(worker, [False] * 4))
    rows = 0
    for buf in bufs:
        assert buf.info is not None
        obs = buf.obs
        np.testing.assert_array_equal(buf.info["code"], code(obs))  # the terminal rows' too: not the reset's
        step = ~buf.reset
        assert (buf.info["t_sq"][step] == obs[step, 2] ** 2).all() and (buf.info["t_sq"][buf.reset] == -1).all()
        assert (buf.info["hit"][step] == (obs[step, 2] % 2 == 0)).all() and not buf.info["hit"][buf.reset].any()
        assert buf.info["t_sq"].dtype == np.int32
        rows += int(np.count_nonzero(~buf.context))
    assert rows >= 10 and any((buf.terminated & ~buf.reset).any() for buf in bufs)


class NoCodeInSteps(InfoCounter):
    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, rew, term, trunc, info = super().step(action)
        del info["code"]
        return obs, rew, term, trunc, info


@pytest.mark.parametrize("env_cls", [Counter, NoCodeInSteps])
def test_a_declared_key_the_env_leaves_out_without_a_default_stops_the_worker_naming_it(env_cls: Any) -> None:
    worker = RolloutWorker(env_cls, TagActor, info_keys=KEYS, seed=0)
    call = "reset" if env_cls is Counter else "step"
    with pytest.raises(ValueError, match=rf"the env's {call}\(\) returned an info without 'code', an info key the "
                                         rf"pipeline declares .*declare a default, e.g. InfoKey\('code'"):
        list(local_packets(worker, [False]))
    Counter.made = []
    defaulted = RolloutWorker(env_cls, TagActor, info_keys=(InfoKey("code", "float32", (), 0.5),), seed=0)
    bufs = list(local_packets(defaulted, [False]))  # the default stands in
    assert bufs and all(buf.info is not None and (buf.info["code"][~buf.reset] == 0.5).all() for buf in bufs)


class KeepingAgent(TrainingAgent):
    """Keeps every batch it is given; trains nothing."""

    def __init__(self, observation_space: Any, action_space: Any, device: str) -> None:
        super().__init__(observation_space, action_space, device)
        self.actor = TagActor(observation_space, action_space)
        self.batches: list[Batch] = []

    def train(self, batch: Batch) -> dict[str, float]:
        self.batches.append(batch)
        return {}

    def get_actor(self) -> ActorModule:
        return self.actor


@pytest.mark.parametrize("num_envs", [1, 3])
def test_the_trainers_batches_hold_each_transitions_env_info(server: tuple[Server, zmq.Context], tmp_path: Path,
                                                             num_envs: int) -> None:
    srv, _ = server
    training = partial(TrainingOffline, env_cls=(OBS_SPACE, ACT_SPACE), memory_cls=ReplayMemory,
                       training_agent_cls=KeepingAgent, epochs=1, rounds=1, steps=6, start_training=24,
                       max_training_steps_per_env_step=10.0, memory_size=10_000, batch_size=32, seed=0,
                       sleep_between_buffer_retrieval_attempts=0.01)
    trainer = Trainer(training, "127.0.0.1", server_port=srv.trainer_port, network=NET, run_dir=tmp_path / "run",
                      wandb_mode="disabled", info_keys=KEYS)
    stop = threading.Event()
    trainer_thread = threading.Thread(target=trainer.run, args=(stop,))
    trainer_thread.start()
    try:
        wait_until(lambda: srv.intake.schema is not None, 20, "the trainer's sample layout at the server", poll=0.05)
        assert srv.intake.schema is not None and srv.intake.schema.leaves["info/t_sq"] == ("<i4", ())
        worker = RolloutWorker(InfoCounter, TagActor, server_ip="127.0.0.1", server_port=srv.worker_port, network=NET,
                               min_samples_per_worker_packet=4, num_envs=num_envs, worker_id="w1", seed=0,
                               info_keys=KEYS)
        worker.run(0, nb_episodes=12 * num_envs)  # closes once every packet is acknowledged
        assert worker.samples_unacknowledged == 0
        trainer_thread.join(60)  # its one epoch of 6 steps, then it saves and ends
    finally:
        stop.set()
        trainer_thread.join(20)
    assert not trainer_thread.is_alive()
    assert trainer.net is not None and trainer.net.stats["rejected"] == 0
    agent = trainer.training.agent  # type: ignore[union-attr]
    assert isinstance(agent, KeepingAgent) and len(agent.batches) == 6
    for batch in agent.batches:
        o2 = batch.next_obs.numpy()
        assert set(batch.extra) == {"info/code", "info/t_sq", "info/hit", "traj", "episode"}
        np.testing.assert_array_equal(batch.extra["info/code"].numpy(), code(o2))  # the step that ended it
        np.testing.assert_array_equal(batch.extra["info/t_sq"].numpy(), o2[:, 2] ** 2)
        np.testing.assert_array_equal(batch.extra["info/hit"].numpy(), o2[:, 2] % 2 == 0)
        assert batch.extra["info/t_sq"].dtype == torch.int32


def test_a_worker_without_the_trainers_info_keys_has_its_packets_refused_naming_the_key(
        server: tuple[Server, zmq.Context], tmp_path: Path) -> None:
    srv, _ = server
    training = partial(TrainingOffline, env_cls=(OBS_SPACE, ACT_SPACE), memory_cls=ReplayMemory,
                       training_agent_cls=KeepingAgent, epochs=1, rounds=1, steps=1, start_training=10**9,
                       memory_size=1000, batch_size=8, seed=0, sleep_between_buffer_retrieval_attempts=0.01)
    trainer = Trainer(training, "127.0.0.1", server_port=srv.trainer_port, network=NET, run_dir=tmp_path / "run",
                      wandb_mode="disabled", info_keys=KEYS)
    stop = threading.Event()
    trainer_thread = threading.Thread(target=trainer.run, args=(stop,))
    trainer_thread.start()
    try:
        wait_until(lambda: srv.intake.schema is not None, 20, "the trainer's sample layout at the server", poll=0.05)
        worker = RolloutWorker(InfoCounter, TagActor, server_ip="127.0.0.1", server_port=srv.worker_port, network=NET,
                               min_samples_per_worker_packet=4, worker_id="w2", seed=0, flush_timeout_s=0.5,
                               info_keys=KEYS[:2])
        worker.run(0, nb_episodes=3)
        wait_until(lambda: srv.stats["layout_refusals"] > 0, 10, "a refusal of the worker's layout", poll=0.05)
        assert srv.stats["layout_refusals"] > 0 and trainer_thread.is_alive()  # refused, counted, all still up
    finally:
        stop.set()
        trainer_thread.join(20)
    assert not trainer_thread.is_alive()
    training_ = trainer.training
    assert training_ is not None and training_.memory is not None and len(training_.memory) == 0
