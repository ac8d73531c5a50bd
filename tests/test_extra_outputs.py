"""Extra actor outputs end to end: an actor declares a log-probability and a value, a real RolloutWorker records them
with each row's action, the real server relays them and a Trainer's ReplayMemory stores them, and every stored row
holds what the actor computed for that row's action; ``act_`` with and without extras."""

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
from netrl.samples import Batch, ExtraSpec
from netrl.server.server import Server
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, Counter, TagActor, wait_until

OBS_SPACE = gymnasium.spaces.Box(-1e6, 1e6, (3,), np.float32)
ACT_SPACE = gymnasium.spaces.Box(-1e6, 1e6, (1,), np.float32)


def log_prob(obs: np.ndarray) -> np.ndarray:
    """What the actor below computes from a Counter observation [tag, episode, t]: distinct for every row."""
    return -(obs[..., 0] + 0.5 * obs[..., 1] + 0.25 * obs[..., 2]).astype(np.float32)


def value(obs: np.ndarray) -> np.ndarray:
    return np.stack([obs[..., 0] * 100 + obs[..., 1], obs[..., 2]], -1).astype(np.float64)


class ExtrasActor(TagActor):
    """Acts each env's tag, and returns a log-probability (float32, one per row) and a 2-vector "state_value"
    (float64 declared as such) computed from the observation it acted on."""

    def extra_outputs(self) -> ExtraSpec:
        return {"action_log_prob": ((), "float32"), "state_value": ((2,), "float64")}

    def act(self, obs: Any, test: bool = False) -> Any:
        o = obs.numpy()
        return super().act(obs, test), {"action_log_prob": torch.as_tensor(log_prob(o)), "state_value": value(o)}


class ExtrasAgent(TrainingAgent):
    """Never trains (the test reads the memory): it only owns the actor whose extras the trainer's schema declares."""

    def __init__(self, observation_space: Any, action_space: Any, device: str) -> None:
        super().__init__(observation_space, action_space, device)
        self.actor = ExtrasActor(observation_space, action_space)

    def train(self, batch: Batch) -> dict[str, float]:
        raise AssertionError("start_training is never reached")

    def get_actor(self) -> ActorModule:
        return self.actor


@pytest.fixture(autouse=True)
def fresh_counters() -> None:
    Counter.made = []


@pytest.mark.parametrize("num_envs", [1, 4])
def test_every_stored_row_holds_the_extras_its_actor_computed_for_that_rows_action(
        server: tuple[Server, zmq.Context], tmp_path: Path, num_envs: int) -> None:
    srv, _ = server
    training = partial(TrainingOffline, env_cls=(OBS_SPACE, ACT_SPACE), memory_cls=ReplayMemory,
                       training_agent_cls=ExtrasAgent, epochs=1, rounds=1, steps=1, start_training=10**9,
                       memory_size=10_000, batch_size=64, seed=0, sleep_between_buffer_retrieval_attempts=0.01)
    trainer = Trainer(training, "127.0.0.1", server_port=srv.trainer_port, network=NET, run_dir=tmp_path / "run",
                      wandb_mode="disabled")
    stop = threading.Event()
    trainer_thread = threading.Thread(target=trainer.run, args=(stop,))
    trainer_thread.start()
    try:
        wait_until(lambda: srv.intake.schema is not None, 20, "the trainer's sample layout at the server", poll=0.05)
        assert srv.intake.schema is not None and srv.intake.schema.leaves["extra/state_value"] == ("<f8", (2,))
        # packets of 4 rows: most transitions' previous row is a context row copied from the packet before
        worker = RolloutWorker(Counter, ExtrasActor, server_ip="127.0.0.1", server_port=srv.worker_port, network=NET,
                               min_samples_per_worker_packet=4, num_envs=num_envs, worker_id="w1", seed=0)
        worker.run(0, nb_episodes=12 * num_envs)  # closes once every packet is acknowledged
        assert worker.samples_unacknowledged == 0 and worker.seq >= 6
        training_ = trainer.training
        wait_until(lambda: training_ is not None and training_.memory is not None
                   and len(training_.memory) == worker.produced, 20, "every transition in the trainer's memory")
    finally:
        stop.set()
        trainer_thread.join(20)
    assert not trainer_thread.is_alive()
    assert trainer.net is not None and trainer.net.stats["rejected"] == 0
    memory = trainer.training.memory  # type: ignore[union-attr]
    assert isinstance(memory, ReplayMemory)
    for k in range(len(memory)):  # every transition: its extras are the actor's for the observation it acted on
        o, a, _r, o2, _term, _trunc, info = memory.get_transition(k)
        assert o[0] == o2[0] == a[0] and o2[2] == o[2] + 1, (o, a, o2)  # one env's step: no env segments joined
        np.testing.assert_array_equal(info["extra"]["action_log_prob"], log_prob(o))
        np.testing.assert_array_equal(info["extra"]["state_value"], value(o))
    rows = memory._size
    obs, ends = memory._cols["obs"][:rows], memory._cols["end"][:rows]
    lp, sv = memory._cols["extra/action_log_prob"][:rows], memory._cols["extra/state_value"][:rows]
    assert lp.dtype == np.float32 and sv.dtype == np.float64
    first = obs[:, 2] == 0  # an episode's first observation: its reset row, or a context row repeating it
    assert first.any() and not lp[first].any() and not sv[first].any()  # reset rows hold zeros
    acted_on = obs[~first] - np.array([0, 0, 1], np.float32)  # every other row's action came from the step before
    np.testing.assert_array_equal(lp[~first], log_prob(acted_on))  # context rows too: they carry the extras
    np.testing.assert_array_equal(sv[~first], value(acted_on))
    assert (~ends & ~first).any()  # there were such context rows: packets cut mid-episode
    assert len(set(memory._cols["env"][:rows].tolist())) == num_envs
    batch = memory.sample()  # the agent's view: batch.extra, the actor's outputs for batch.obs
    assert set(batch.extra) == {"action_log_prob", "state_value", "traj", "episode"}  # and the trajectory ids
    np.testing.assert_array_equal(batch.extra["action_log_prob"].numpy(), log_prob(batch.obs.numpy()))
    np.testing.assert_array_equal(batch.extra["state_value"].numpy(), value(batch.obs.numpy()))
    assert batch.extra["state_value"].shape == (64, 2)


def test_act_returns_actions_alone_or_with_the_declared_extras_shaped_per_observation() -> None:
    plain, extras = TagActor(OBS_SPACE, ACT_SPACE), ExtrasActor(OBS_SPACE, ACT_SPACE)
    one = np.array([2, 1, 3], np.float32)
    batch = np.array([[0, 0, 1], [1, 2, 3]], np.float32)
    assert plain.act_(one).shape == (1,) and plain.act_(batch, batch=True).shape == (2, 1)  # unchanged
    act, extra = extras.act_(one)
    assert act.shape == (1,) and act[0] == 2
    assert extra["action_log_prob"].shape == () and extra["action_log_prob"] == log_prob(one)
    assert extra["state_value"].dtype == np.float64 and (extra["state_value"] == value(one)).all()
    acts, extra = extras.act_(batch, batch=True)
    assert acts.shape == (2, 1) and extra["action_log_prob"].dtype == np.float32
    np.testing.assert_array_equal(extra["state_value"], value(batch))


class Misbehaving(ExtrasActor):
    def __init__(self, observation_space: Any, action_space: Any, change: Any) -> None:
        super().__init__(observation_space, action_space)
        self.change = change

    def act(self, obs: Any, test: bool = False) -> Any:
        acts, extra = super().act(obs, test)
        return self.change(acts, extra)


@pytest.mark.parametrize(("change", "message"), [
    (lambda a, e: a, r"Misbehaving declares extra outputs \['action_log_prob', 'state_value'\], so its act\(\) must "
                     r"return \(actions, \{name: array\}\); it returned a ndarray"),
    (lambda a, e: (a, {"action_log_prob": e["action_log_prob"]}),
     r"returned the extra outputs \['action_log_prob'\], but extra_outputs\(\) declares \['action_log_prob', "
     r"'state_value'\]"),
    (lambda a, e: (a, {**e, "state_value": e["state_value"][:, :1]}),
     r"returned the extra output 'state_value' as float64 of shape \(2, 1\) for 2 observations; extra_outputs\(\) "
     r"declares float64 of shape \(2,\) per observation, so it must be shaped \(2, 2\)"),
])
def test_an_actor_whose_extras_are_not_the_declared_ones_is_told_which(change: Any, message: str) -> None:
    actor = Misbehaving(OBS_SPACE, ACT_SPACE, change)
    with pytest.raises(ValueError, match=message):
        actor.act_(np.zeros((2, 3), np.float32), batch=True)


@pytest.mark.parametrize(("spec", "message"), [
    ({"Value": ((), "float32")}, r"names an output 'Value': use a lowercase identifier of at most 32 characters"),
    ({"v" * 33: ((), "float32")}, "use a lowercase identifier of at most 32 characters"),
    ({"value": "float32"}, r"\['value'\] is 'float32', not \(per-row shape, numpy dtype\)"),
    ({"value": ((), "U4")}, r"the dtype a number or bool of at most 8 bytes"),
    ({"value": ((-1,), "float32")}, r"the shape must be at most 8 non-negative ints"),
])
def test_a_bad_declaration_is_refused_naming_the_actor_and_the_entry(spec: Any, message: str) -> None:
    class Declares(TagActor):
        def extra_outputs(self) -> Any:
            return spec

    worker = RolloutWorker(Counter, Declares, seed=0)
    worker.local_packets = []
    with pytest.raises(ValueError, match=rf"Declares\.extra_outputs\(\).*{message}"):
        worker.run_episode()


class AnyAction(Counter):
    """A Counter that takes any action (random ones too)."""

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}


def test_random_actions_hold_zeros_and_test_episodes_leave_the_rows_of_the_others_intact() -> None:
    # 2 envs, a test episode after each training episode (act_ called per group when they mix), random actions first
    worker = RolloutWorker(AnyAction, ExtrasActor, seed=0, num_envs=2, min_samples_per_worker_packet=5,
                           init_random_frames=10)
    worker.local_packets = []
    worker.trainer_samples = 0  # the single-process mode's count: random actions until it reaches 10
    original, calls = worker.policy.random_actions, [0]

    def random_then_policy(obs: Any, n: int | None = None) -> Any:
        calls[0] += 1
        if calls[0] > 3:
            worker.trainer_samples = 10
        return original(obs, n)

    worker.policy.random_actions = random_then_policy  # type: ignore[method-assign]
    worker.run(1, nb_episodes=8)
    worker.sink.send()
    rows = [(o, b.extra["action_log_prob"][i], b.reset[i] or b.context[i], b.act[i])
            for b in worker.local_packets for i, o in enumerate(b.obs) if b.extra is not None]
    assert len(rows) == sum(len(b) for b in worker.local_packets)
    acted = [(o, lp) for o, lp, skip, a in rows if not skip and a[0] == o[0]]  # the actor acts each env's tag
    randomly = [(o, lp) for o, lp, skip, a in rows if not skip and a[0] != o[0]]
    assert len(acted) > 10 and len(randomly) >= 4 and all(lp == 0 for _, lp in randomly)
    assert all(lp == log_prob(o - np.array([0, 0, 1], np.float32)) for o, lp in acted)
    assert any(test for _, test in worker.actor.calls) and any(n < 2 for n, _ in worker.actor.calls)
