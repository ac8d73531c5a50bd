"""Declared views at act time: a real RolloutWorker builds the actor's views per env from the rows it records, and
the HistoryMemory the trainer's loop builds from the same declarations (the agent's default views() are its actor's)
gives, for every stored transition, bit-identical windows: ``extra[name]`` equals what the actor was given when it
chose the transition's action, ``extra["next_" + name]`` what it was given at the next step, and a view into the
observation replaces the leaf the same way on both sides."""

from __future__ import annotations

import time
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from netrl.actor import ActorModule
from netrl.agents.base import TrainingAgent
from netrl.memory.act_views import ActViews
from netrl.memory.history import HistoryMemory
from netrl.memory.views import View, declared_views, last_observations, prev_actions, prev_rewards
from netrl.protocol.wire import buffer_from_message, decode, encode, samples_message
from netrl.samples import Batch
from netrl.training.loop import TrainingOffline
from netrl.worker.worker import RolloutWorker

OBS_SPACE = gymnasium.spaces.Box(-1e6, 1e6, (2,), np.float32)
ACT_SPACE = gymnasium.spaces.Box(-1e6, 1e6, (1,), np.float32)
VIEWS = [prev_actions(3), prev_rewards(4), last_observations(2, into="extra"), last_observations(3)]


class Walk(gymnasium.Env):  # type: ignore[type-arg]
    """Episodes of 2 to 6 steps; every observation and reward differs (a float32 fraction in each), so a window
    that took a wrong row cannot match."""

    made = 0

    def __init__(self) -> None:
        self.observation_space, self.action_space = OBS_SPACE, ACT_SPACE
        self.rng = np.random.default_rng(Walk.made)
        Walk.made += 1
        self.t, self.length = 0, 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        self.t, self.length = 0, int(self.rng.integers(2, 7))
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.rng.random()], np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), float(self.rng.random()), self.t >= self.length, False, {}


class Recording(ActorModule):
    """Acts a number unique to each (call, env) and keeps, per env, what it was given for each action."""

    log: list[tuple[int, dict[str, np.ndarray]]] = []  # (env, inputs); the action is its index

    def __init__(self, observation_space: Any, action_space: Any) -> None:
        super().__init__(observation_space, action_space)
        self.p = torch.nn.Parameter(torch.zeros(1))

    def views(self) -> list[View]:
        return list(VIEWS)

    def act(self, obs: Any, test: bool = False, views: dict[str, torch.Tensor] | None = None) -> np.ndarray:
        assert views is not None and set(views) == {"prev_actions", "prev_rewards", "last_obs"}
        out = []
        for j in range(obs.shape[0]):
            given = {"obs": obs[j].numpy().copy(), **{k: v[j].numpy().copy() for k, v in views.items()}}
            out.append(len(Recording.log))
            Recording.log.append((j, given))
        return np.array(out, np.float32)[:, None]


class Holder(TrainingAgent):
    def __init__(self, observation_space: Any, action_space: Any, device: str = "cpu") -> None:
        super().__init__(observation_space, action_space, device)
        self.actor = Recording(observation_space, action_space)

    def train(self, batch: Batch) -> dict[str, float]:
        raise AssertionError("not trained")

    def get_actor(self) -> ActorModule:
        return self.actor


def identical(a: Any, b: np.ndarray, what: str) -> None:
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), (what, a, b)


@pytest.mark.parametrize(("num_envs", "overlap"), [(1, 4), (3, 4), (1, 1), (3, 1)])
def test_the_actor_is_given_bit_for_bit_what_the_batch_holds_for_its_row(num_envs: int, overlap: int) -> None:
    """With the pipeline's overlap short of the views' reach (1), the worker widens its packets' context by itself."""
    Recording.log, Walk.made = [], 0
    worker = RolloutWorker(Walk, Recording, num_envs=num_envs, seed=0, min_samples_per_worker_packet=5,
                           overlap=overlap, worker_id="w")
    worker.local_packets = []
    worker.run(0, nb_episodes=12 * num_envs)
    worker.sink.send()
    # the trainer's loop builds the memory and adds the agent's views (its default views(): its actor's)
    training = TrainingOffline(env_cls=(OBS_SPACE, ACT_SPACE), memory_cls=HistoryMemory, training_agent_cls=Holder,
                               epochs=1, rounds=1, steps=1, start_training=10**9, memory_size=10_000, batch_size=32,
                               seed=0, device="cpu")
    training.build()
    memory = training.memory
    assert isinstance(memory, HistoryMemory) and [v.name for v in memory.views] == [v.name for v in VIEWS]
    for buf in worker.local_packets:  # through the wire, as the trainer gets them
        training.add(buffer_from_message(decode(encode(samples_message(buf, "w", "s", 1, 0)))))
    # every transition is sampleable (overlap covers the views' reach) and is compared
    assert len(memory) == worker.produced > 30
    # per env, its calls in order: the next step's inputs of call c are those of the env's next call
    calls = [[c for c, (env, _) in enumerate(Recording.log) if env == i] for i in range(num_envs)]
    after = {c: row[k + 1] for row in calls for k, c in enumerate(row[:-1])}
    nexts = 0
    for k in range(len(memory)):
        o, a, _r, o2, term, trunc, info = memory.get_transition(k)
        c = int(a[0])
        given = Recording.log[c][1]
        identical(o, given["obs"], "obs")  # the view into the observation
        for name in ("prev_actions", "prev_rewards", "last_obs"):
            identical(info["extra"][name], given[name], name)
        # the actor saw the next observation's windows at its next step (unless the run stopped first)
        if not (term or trunc) and c in after:
            nexts += 1
            later = Recording.log[after[c]][1]
            identical(o2, later["obs"], "next obs")
            for name in ("prev_actions", "prev_rewards", "last_obs"):
                identical(info["extra"]["next_" + name], later[name], "next_" + name)
    assert nexts > 10
    batch = memory.sample()  # the batched path gathers the same windows
    for b in range(len(batch.act)):
        given = Recording.log[int(batch.act[b, 0])][1]
        identical(batch.obs[b], given["obs"], "batch obs")
        for name in ("prev_actions", "prev_rewards", "last_obs"):
            identical(batch.extra[name][b], given[name], name)


def test_an_episode_start_pads_with_the_reset_row_as_the_memory_does() -> None:
    views = ActViews([prev_actions(3), prev_rewards(2)], 2, OBS_SPACE, ACT_SPACE, "A")
    views.start(1, np.zeros(1, np.float32), np.zeros(2, np.float32))
    views.push(1, np.array([7.0], np.float32), np.zeros(2, np.float32), 0.5)
    extra = views.extra(np.array([1]))
    assert extra is not None
    np.testing.assert_array_equal(extra["prev_actions"][0, :, 0], [0, 0, 7])
    np.testing.assert_array_equal(extra["prev_rewards"][0], [0, 0.5])
    assert extra["prev_rewards"].dtype == np.float32


def test_views_the_worker_cannot_build_as_the_memory_does_are_refused_naming_the_view() -> None:
    def rule(segment: Any, length: int) -> np.ndarray:
        return np.zeros((len(segment), length), np.int64)

    with pytest.raises(ValueError, match="'carried' has a rule of its own"):
        ActViews([View("carried", "act", 2, rule=rule)], 1, OBS_SPACE, ACT_SPACE, "A")
    with pytest.raises(ValueError, match="'state' reads 'extra/h'"):
        ActViews([View("state", "extra/h", 2)], 1, OBS_SPACE, ACT_SPACE, "A")
    with pytest.raises(ValueError, match=r"'last_obs' reads the observation leaf 'obs'.*compressor"):
        ActViews([last_observations(2, into="extra")], 1, OBS_SPACE, ACT_SPACE, "A", compressed=True)
    ActViews([prev_actions(2)], 1, OBS_SPACE, ACT_SPACE, "A", compressed=True)  # actions pass unchanged


def test_an_agent_that_leaves_out_its_actors_views_is_refused() -> None:
    class Narrow(Holder):
        def views(self) -> list[View]:
            return [prev_actions(3)]

    with pytest.raises(ValueError, match="leaves out Recording's view 'prev_rewards'"):
        declared_views(Narrow(OBS_SPACE, ACT_SPACE))

    class TmrlStyle:  # an agent of its own, without views(): its actor's are its batches' too
        def get_actor(self) -> ActorModule:
            return Recording(OBS_SPACE, ACT_SPACE)

    assert declared_views(TmrlStyle()) == VIEWS


def test_building_the_views_costs_the_control_loop_little() -> None:
    """The per-step work views add (push the row, gather the windows) against an MLP actor's act_: a few tens of
    microseconds, far below a 20 Hz step's 50 ms."""
    views = ActViews(VIEWS, 1, OBS_SPACE, ACT_SPACE, "A")
    act, obs = np.zeros(1, np.float32), np.zeros(2, np.float32)
    views.start(0, act, obs)
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        views.push(0, act, obs, 0.5)
        views.observe(obs)
        views.extra()
    per_step = (time.perf_counter() - t0) / n
    assert per_step < 500e-6, per_step  # generous: the machine is shared
