"""Collection controls in the training loop and a worker (issue 31, item 6): ``init_random_frames`` and
``total_frames``, in single-process mode, where every row's source can be counted."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium
import numpy as np
import pytest

from netrl.actor import ActorModule
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.envs.gym import GenericGymEnv
from netrl.local import run_local
from netrl.memory.replay import ReplayMemory
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker


class CountingActor(MLPActor):
    """SAC's actor that counts the actions it chose (class-wide: the worker swaps in copies when weights arrive)."""

    calls = 0

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        CountingActor.calls += len(obs)  # one per observation of the batch
        return super().act(obs, test)


def training_and_worker(total_frames: int | None, init_random_frames: int,
                        num_envs: int = 1) -> tuple[TrainingOffline, RolloutWorker]:
    env_cls = partial(GenericGymEnv, id="Pendulum-v1")
    training = TrainingOffline(env_cls=env_cls, memory_cls=ReplayMemory,
                               training_agent_cls=partial(SACAgent, model_cls=partial(MLPActorCritic,
                                                                                      hidden_sizes=(16,))),
                               epochs=1000, rounds=1, steps=60, update_model_interval=10, update_buffer_interval=5,
                               start_training=100, worker_lead=50, memory_size=2000, batch_size=16, seed=0,
                               max_training_steps_per_env_step=0.25,
                               total_frames=total_frames)
    worker = RolloutWorker(env_cls, partial(CountingActor, hidden_sizes=(16,)), min_samples_per_worker_packet=4,
                           max_samples_per_episode=30, seed=0, init_random_frames=init_random_frames,
                           num_envs=num_envs)
    CountingActor.calls = 0
    return training, worker


def test_training_stops_at_total_frames_and_the_worker_acts_at_random_until_the_trainer_holds_its_frames() -> None:
    training, worker = training_and_worker(total_frames=400, init_random_frames=150)
    rounds: list[dict[str, Any]] = []
    run_local(training, worker, threading.Event(), rounds.append)
    assert training.frames_done() and training.epoch < training.epochs  # total_frames ended it, not the epochs
    # the pacing asks for no sample beyond total_frames, and every one of them reached the memory
    assert training.total_samples == worker.produced == 400
    assert rounds[-1]["samples"] == 400  # the round cut short is reported
    # the first wish (start_training + worker_lead = 150 samples) came while the trainer held none: all random;
    # every later action is the actor's
    assert CountingActor.calls == 400 - 150
    assert worker.random_frames is not None and worker.random_frames.done


def test_a_vector_worker_acts_at_random_in_all_its_envs_until_the_trainer_holds_its_frames() -> None:
    training, worker = training_and_worker(total_frames=400, init_random_frames=150, num_envs=4)
    run_local(training, worker, threading.Event())
    assert training.frames_done() and training.total_samples == worker.produced == 400
    # the first wish of 150 samples took 38 vector steps of 4 envs, all at random; then one batch of 4 per step
    assert CountingActor.calls == 400 - 152


def test_without_the_controls_the_actor_chooses_every_action_and_the_epochs_end_training() -> None:
    training, worker = training_and_worker(total_frames=None, init_random_frames=0)
    training.epochs = 2
    run_local(training, worker, threading.Event())
    assert training.epoch == 2 and not training.frames_done()
    assert CountingActor.calls == worker.produced > 0


@pytest.mark.parametrize("standalone", [False, True])
def test_test_episodes_and_standalone_workers_never_act_at_random(standalone: bool) -> None:
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(CountingActor, hidden_sizes=(8,)),
                           standalone=standalone, init_random_frames=10**6, max_samples_per_episode=20, seed=1)
    worker.local_packets = []  # no network: the trainer's count stays unknown
    CountingActor.calls = 0
    try:
        stats = worker.run_episode(test=True)
        assert stats is not None and CountingActor.calls == stats.length == 20
        stats = worker.run_episode(test=False)  # a training episode: at random, unless standalone (no trainer)
        assert stats is not None and CountingActor.calls == (40 if standalone else 20)
    finally:
        worker.close()


def test_random_actions_are_reproducible_per_seed_and_within_the_action_space() -> None:
    def actions(seed: int) -> np.ndarray:
        worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                               init_random_frames=100, max_samples_per_episode=25, seed=seed)
        worker.local_packets = []
        try:
            worker.run_episode()
            worker.sink.send()
            assert worker.local_packets
            return np.concatenate([b.act[~(b.reset | b.context)] for b in worker.local_packets])
        finally:
            worker.close()

    first = actions(7)
    assert first.shape == (25, 1) and np.all(np.abs(first) <= 2.0)
    np.testing.assert_array_equal(first, actions(7))
    assert not np.array_equal(first, actions(8))
    assert np.std(first) > 0.5  # uniform on [-2, 2] (std 1.15), not the untrained actor's narrow spread


def test_a_negative_init_random_frames_is_refused() -> None:
    with pytest.raises(ValueError, match=r"init_random_frames must be >= 0 \(got -5\)"):
        RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), MLPActor, init_random_frames=-5)


class MaskedEnv(gymnasium.Env):
    """Actions of ``action_space`` with an action mask that allows a different few each step."""

    def __init__(self, action_space: gymnasium.Space) -> None:
        self.action_space = action_space
        width = int(action_space.n) if isinstance(action_space, gymnasium.spaces.Discrete) \
            else int(np.sum(action_space.nvec))
        self.observation_space = gymnasium.spaces.Dict({
            "x": gymnasium.spaces.Box(-1, 1, (2,), np.float32), "action_mask": gymnasium.spaces.MultiBinary(width)})
        self.rng = np.random.default_rng(0)
        self.taken: list[tuple[Any, np.ndarray]] = []  # (action, the mask it was chosen under)

    def _obs(self) -> dict[str, np.ndarray]:
        mask = np.zeros(self.observation_space["action_mask"].n, np.int8)
        start = 0
        sizes = [self.action_space.n] if isinstance(self.action_space, gymnasium.spaces.Discrete) \
            else list(self.action_space.nvec)
        for n in sizes:  # one or two allowed choices per dimension
            mask[start + self.rng.choice(int(n), size=self.rng.integers(1, 3), replace=False)] = 1
            start += int(n)
        self.mask = mask
        return {"x": np.zeros(2, np.float32), "action_mask": mask}

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.taken.append((np.array(action), self.mask))
        return self._obs(), 0.0, False, len(self.taken) % 25 == 0, {}


class FirstAllowed(ActorModule):
    def act(self, obs: Any, test: bool = False) -> Any:
        return np.zeros((len(obs["x"]), *self.action_space.shape), self.action_space.dtype)


@pytest.mark.parametrize("space", [gymnasium.spaces.Discrete(6, start=2), gymnasium.spaces.MultiDiscrete([4, 3])])
def test_random_actions_keep_to_the_action_mask(space: gymnasium.Space) -> None:
    env = MaskedEnv(space)
    worker = RolloutWorker(lambda: env, FirstAllowed, init_random_frames=10**6, seed=4, env_timeout_factor=0)
    worker.local_packets = []
    try:
        for _ in range(4):
            worker.run_episode()
    finally:
        worker.close()
    assert len(env.taken) == 100
    starts = np.ravel(np.asarray(space.start))
    sizes = [space.n] if isinstance(space, gymnasium.spaces.Discrete) else list(space.nvec)
    for action, mask in env.taken:
        offsets = np.cumsum([0, *sizes[:-1]]) + (np.ravel(action) - starts)  # each dimension's entry in the mask
        assert mask[offsets].all(), (action, mask)
    assert len({tuple(np.ravel(a)) for a, _ in env.taken}) > 3  # random, not one fixed allowed action


def test_a_mask_that_allows_no_action_stops_random_actions_with_the_reason() -> None:
    from netrl.worker.random_frames import RandomFrames

    frames = RandomFrames(10, gymnasium.spaces.MultiDiscrete([2, 3]), 0, "w1")
    assert frames.actions({"action_mask": np.array([1, 0, 0, 1, 0])}).tolist() in ([0, 1],)
    with pytest.raises(ValueError, match=r'worker w1: the observation\'s "action_mask" allows no action in action '
                                         r"dimension 1, so no random action \(worker.init_random_frames\)"):
        frames.actions({"action_mask": np.array([1, 1, 0, 0, 0])})
