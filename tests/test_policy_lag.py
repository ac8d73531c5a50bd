"""The training loop's wish (``wanted()``) keeps the policy lag of arriving samples within trainer.max_policy_lag: a
paced vector worker behind a slow link, as a sample source, never delivers a sample the trainer published more
than max_policy_lag versions past."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from netrl.actor import ActorModule
from netrl.agents.base import TrainingAgent
from netrl.memory.replay import ReplayMemory
from netrl.samples import Batch, Buffer
from netrl.training.loop import TrainingOffline

OBS = gymnasium.spaces.Box(-1e6, 1e6, (1,), np.float32)
ACT = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
ENVS = 8


class Still(ActorModule):
    def __init__(self, observation_space: Any, action_space: Any) -> None:
        super().__init__(observation_space, action_space)
        self.p = torch.nn.Parameter(torch.zeros(1))

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        return np.zeros(1, np.float32)


class Quick(TrainingAgent):
    """Trains nothing, at once: the trainer is as fast as it may be, the worst case for lag."""

    def __init__(self, observation_space: Any, action_space: Any, device: str) -> None:
        super().__init__(observation_space, action_space, device)
        self.actor = Still(observation_space, action_space)

    def get_actor(self) -> ActorModule:
        return self.actor

    def train(self, batch: Batch) -> dict[str, float]:
        return {}


class SlowLink:
    """A throttled worker of ENVS envs behind a slow link, as the server paces it: whenever the trainer's wish is
    above what it made, it takes vector steps (the server grants whole steps: a row of every env) with the weights
    before the newest (one version is always on its way). Its packets arrive only when the trainer has nothing
    left to train on and waits for them: the longest a link may take."""

    def __init__(self) -> None:
        self.made = 0
        self.versions = [0, 0]  # the trainer's last two: the worker acts with the older one
        self.on_the_way: list[Buffer] = []
        self.arrived: list[Buffer] = []

    def progress(self, trained_steps: int, samples: int, wanted: int) -> None:
        while self.made < wanted:
            self.made += ENVS
            rows = ENVS + 1  # a reset row, then the envs' rows as one trajectory (enough for the memory)
            self.on_the_way.append(Buffer(
                act=np.zeros((rows, 1), np.float32), obs=np.arange(rows, dtype=np.float32)[:, None],
                rew=np.zeros(rows, np.float32), terminated=np.arange(rows) == rows - 1,
                truncated=np.zeros(rows, bool), reset=np.arange(rows) == 0, context=np.zeros(rows, bool),
                policy_version=np.full(rows, self.versions[0], np.int64), worker="w"))

    def wait(self, timeout: float) -> None:
        """The trainer waits: everything on the way arrives now, under the trainer's newest version."""
        for buf in self.on_the_way:
            buf.recv_version = self.versions[1]
        self.arrived += self.on_the_way
        self.on_the_way = []

    def fetch(self) -> list[Buffer]:
        out, self.arrived = self.arrived, []
        return out

    def publish(self, actor: torch.nn.Module, version: int, trained_steps: int) -> None:
        self.versions = [self.versions[1], version]

    def taken_version(self) -> int:
        return -1


def max_lag(max_policy_lag: int | None, worker_lead: int) -> int:
    """The largest policy lag of the samples that arrived while the trainer trained 600 steps."""
    source = SlowLink()
    training = TrainingOffline(env_cls=(OBS, ACT), memory_cls=ReplayMemory, training_agent_cls=Quick, epochs=1,
                               rounds=1, steps=600, update_model_interval=10, update_buffer_interval=1,
                               start_training=16, worker_lead=worker_lead, memory_size=10_000, batch_size=4,
                               device="cpu", max_policy_lag=max_policy_lag, stale_sample_weight=1.0)
    training.start(source)  # type: ignore[arg-type]
    rounds = list(training.run_epoch(source, threading.Event()))  # type: ignore[arg-type]
    assert training.total_updates == 600  # it trained on: the wish never stalled it
    assert rounds[0]["stale_samples"] == 0 or max_policy_lag is None
    return int(rounds[0]["lag_max"])


@pytest.mark.parametrize("max_policy_lag", [2, 3, 5])
def test_samples_of_a_paced_vector_worker_arrive_within_max_policy_lag_however_slow_its_link(
        max_policy_lag: int) -> None:
    assert max_lag(max_policy_lag, worker_lead=200) <= max_policy_lag


def test_without_max_policy_lag_the_lead_alone_paces_and_the_same_link_delivers_stale_samples() -> None:
    # what the bound above prevents: 200 samples ahead are 20 versions of training while a packet is on its way
    assert max_lag(None, worker_lead=200) > 10
