"""A recurrent actor's state end to end: a real RolloutWorker keeps one state per env, resets it at each episode
start and records the state that entered each step; the real server relays it and a Trainer's ReplayMemory with
sequences stores it, so that a sampled sequence's first recorded state, run forward through the actor's own
recurrence over the sequence's observations, gives the state recorded at every later step."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
import zmq

from netrl.actor import ActorModule, declared_extras
from netrl.agents.base import TrainingAgent
from netrl.memory.replay import ReplayMemory
from netrl.samples import Batch, ExtraSpec
from netrl.server.server import Server
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, Counter, TagActor, wait_until

OBS_SPACE = gymnasium.spaces.Box(-1e6, 1e6, (3,), np.float32)
ACT_SPACE = gymnasium.spaces.Box(-1e6, 1e6, (1,), np.float32)


def advance(state: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """The recurrence of the actor below: it counts the steps of its episode and sums the step numbers it saw
    (Counter's obs = [tag, episode, t])."""
    return state + np.stack([np.ones_like(obs[..., 2]), obs[..., 2]], -1)


def entering(t: np.ndarray) -> np.ndarray:
    """The state that enters the step taken from an observation with step number t, if the state is reset to zeros
    at each episode start: t steps counted, 0 + 1 + ... + (t - 1) summed."""
    return np.stack([t, t * (t - 1) / 2], -1).astype(np.float32)


class CountingActor(TagActor):
    """Acts each env's tag; its state is advance(state, obs)."""

    def recurrent_state(self) -> ExtraSpec:
        return {"recurrent_state": ((2,), "float32")}

    def act(self, obs: Any, state: Any = None, test: bool = False) -> Any:  # type: ignore[override]
        actions = super().act(obs, test)
        return actions, {"recurrent_state": torch.as_tensor(advance(state["recurrent_state"].numpy(), obs.numpy()))}


class CountingActorWithExtras(CountingActor):
    def extra_outputs(self) -> ExtraSpec:
        return {"action_log_prob": ((), "float32")}

    def act(self, obs: Any, state: Any = None, test: bool = False) -> Any:  # type: ignore[override]
        actions, new_state = super().act(obs, state, test)
        return actions, new_state, {"action_log_prob": -obs[:, 2]}


class Holder(TrainingAgent):
    """Never trains (the test reads the memory): it owns the actor whose state the trainer's schema declares."""

    def __init__(self, observation_space: Any, action_space: Any, device: str) -> None:
        super().__init__(observation_space, action_space, device)
        self.actor = CountingActor(observation_space, action_space)

    def train(self, batch: Batch) -> dict[str, float]:
        raise AssertionError("start_training is never reached")

    def get_actor(self) -> ActorModule:
        return self.actor


@pytest.fixture(autouse=True)
def fresh_counters() -> None:
    Counter.made = []


@pytest.mark.parametrize("num_envs", [1, 3])
def test_the_state_that_entered_each_step_is_recorded_reset_per_episode_and_restores_a_sequence(
        server: tuple[Server, zmq.Context], tmp_path: Path, num_envs: int) -> None:
    srv, _ = server
    memory_cls = partial(ReplayMemory, sequence_length=4, burn_in=1)
    training = partial(TrainingOffline, env_cls=(OBS_SPACE, ACT_SPACE), memory_cls=memory_cls,
                       training_agent_cls=Holder, epochs=1, rounds=1, steps=1, start_training=10**9,
                       memory_size=10_000, batch_size=64, seed=0, sleep_between_buffer_retrieval_attempts=0.01)
    trainer = Trainer(training, "127.0.0.1", server_port=srv.trainer_port, network=NET, run_dir=tmp_path / "run",
                      wandb_mode="disabled")
    stop = threading.Event()
    trainer_thread = threading.Thread(target=trainer.run, args=(stop,))
    trainer_thread.start()
    try:
        wait_until(lambda: srv.intake.schema is not None, 20, "the trainer's sample layout at the server", poll=0.05)
        assert srv.intake.schema is not None and srv.intake.schema.leaves["extra/recurrent_state"] == ("<f4", (2,))
        worker = RolloutWorker(Counter, CountingActor, server_ip="127.0.0.1", server_port=srv.worker_port,
                               network=NET, min_samples_per_worker_packet=7, num_envs=num_envs, worker_id="w1", seed=0)
        worker.run(0, nb_episodes=10 * num_envs)
        assert worker.samples_unacknowledged == 0
        training_ = trainer.training
        wait_until(lambda: training_ is not None and training_.memory is not None
                   and len(training_.memory) == worker.produced, 20, "every transition in the trainer's memory")
    finally:
        stop.set()
        trainer_thread.join(20)
    assert not trainer_thread.is_alive()
    memory = trainer.training.memory  # type: ignore[union-attr]
    assert isinstance(memory, ReplayMemory)
    for k in range(len(memory)):  # every transition: the state that entered its step, counted from its episode start
        o, a, _r, o2, _term, _trunc, info = memory.get_transition(k)
        assert o[0] == a[0] and o2[2] == o[2] + 1
        np.testing.assert_array_equal(info["extra"]["recurrent_state"], entering(o[2]))
    rows = memory._size
    first = memory._cols["obs"][:rows, 2] == 0  # reset rows (and context rows repeating them): zeros
    assert first.any() and not memory._cols["extra/recurrent_state"][:rows][first].any()
    batch = memory.sample()
    obs, mask = batch.obs.numpy(), batch.extra["mask"].numpy()
    recorded = batch.extra["recurrent_state"].numpy()
    assert recorded.shape == (64, 4, 2) and (mask.sum(1) > 1).any()
    state = recorded[:, 0]  # where a recurrent agent starts each sequence: the state the worker really had
    for j in range(4):
        np.testing.assert_array_equal(state[mask[:, j]], recorded[:, j][mask[:, j]])
        state = advance(state, obs[:, j])


class AnyAction(Counter):
    """A Counter that takes any action (random ones too)."""

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}


@pytest.mark.parametrize("num_envs", [1, 2])
def test_the_state_advances_under_random_actions_and_test_episodes_and_rides_with_extra_outputs(
        num_envs: int) -> None:
    worker = RolloutWorker(AnyAction, CountingActorWithExtras, seed=0, num_envs=num_envs,
                           min_samples_per_worker_packet=5, init_random_frames=10)
    worker.local_packets = []
    worker.trainer_samples = 0  # the single-process mode's count: random actions until it reaches 10
    original, calls = worker.policy.random_actions, [0]

    def random_then_policy(obs: Any, n: int | None = None) -> Any:
        calls[0] += 1
        if calls[0] > 4:
            worker.trainer_samples = 10
        return original(obs, n)

    worker.policy.random_actions = random_then_policy  # type: ignore[method-assign]
    worker.run(1 if num_envs > 1 else 0, nb_episodes=8)
    worker.sink.send()
    assert set(declared_extras(worker.actor)) == {"action_log_prob", "recurrent_state"}
    randomly = acted = 0
    for b in worker.local_packets:
        assert b.extra is not None
        for i in np.flatnonzero(~(b.reset | b.context)):
            prev_t = b.obs[i, 2] - 1
            np.testing.assert_array_equal(b.extra["recurrent_state"][i], entering(prev_t))
            if b.act[i, 0] == b.obs[i, 0]:  # the actor's action: its log-probability of the step it acted on
                acted += 1
                assert b.extra["action_log_prob"][i] == -prev_t
            else:
                randomly += 1
                assert b.extra["action_log_prob"][i] == 0  # a random action has none
    assert acted > 10 and randomly >= 4


def test_act_takes_and_returns_the_state_for_one_observation_or_a_batch() -> None:
    actor = CountingActor(OBS_SPACE, ACT_SPACE)
    act, state = actor.act_(np.array([2, 0, 3], np.float32))  # no state: the initial one
    assert act.shape == (1,) and state["recurrent_state"].tolist() == [1, 3]
    acts, state = actor.act_(np.array([[0, 0, 1], [1, 0, 2]], np.float32), batch=True,
                             state={"recurrent_state": np.ones((2, 2), np.float32)})
    assert acts.shape == (2, 1) and state["recurrent_state"].tolist() == [[2, 2], [2, 3]]


class Forgetful(CountingActor):
    def act(self, obs: Any, state: Any = None, test: bool = False) -> Any:  # type: ignore[override]
        return super().act(obs, state, test)[0]


class Reshaped(CountingActor):
    def act(self, obs: Any, state: Any = None, test: bool = False) -> Any:  # type: ignore[override]
        actions, new = super().act(obs, state, test)
        return actions, {"recurrent_state": new["recurrent_state"][:, :1]}


@pytest.mark.parametrize(("cls", "message"), [
    (Forgetful, r"Forgetful declares a recurrent state \['recurrent_state'\], so its act\(obs, state, test\) must "
                r"return \(actions, new_state\); it returned a ndarray"),
    (Reshaped, r"Reshaped.act\(\) returned the state 'recurrent_state' of shape \(2, 1\) for 2 observations; "
               r"recurrent_state\(\) declares \(2,\) per env, so it must be shaped \(2, 2\)"),
])
def test_an_actor_whose_state_is_not_the_declared_one_is_told_which(cls: type[CountingActor], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls(OBS_SPACE, ACT_SPACE).act_(np.zeros((2, 3), np.float32), batch=True)


def test_a_name_declared_both_as_extra_output_and_as_state_is_refused() -> None:
    class Twice(CountingActorWithExtras):
        def extra_outputs(self) -> ExtraSpec:
            return {"recurrent_state": ((2,), "float32")}

    with pytest.raises(ValueError, match=r"Twice declares \['recurrent_state'\] both as extra outputs and as "
                                         "recurrent state"):
        declared_extras(Twice(OBS_SPACE, ACT_SPACE))
