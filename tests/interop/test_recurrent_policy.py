"""TorchRL's recurrent policies on netrl's workers: a TensorDictActor around an LSTMModule or
GRUModule acts step by step as TorchRL's own rollout of the same policy does, and the state the
worker held at each step is what the trainer's sequence batch holds."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")

from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import OneHot
from torchrl.envs import Compose, GymEnv, InitTracker, StepCounter, TransformedEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import EGreedyModule, GRUModule, QValueModule
from torchrl.objectives import DQNLoss, SoftUpdate

from netrl.envs.gym import GenericGymEnv
from netrl.interop.loss_agent import TorchRLAgent
from netrl.interop.policies import TensorDictActor
from netrl.interop.tensordicts import to_tensordict
from netrl.local import run_local
from netrl.memory.replay import ReplayMemory
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.recurrent import RecurrentStates
from netrl.worker.worker import RolloutWorker
from tests.interop.nets import lstm_q_policy
from tests.interop.rows import feed, vector_obs

CARTPOLE_OBS = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
TWO = gymnasium.spaces.Discrete(2)
OBS = gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)
FOUR = gymnasium.spaces.Discrete(4, start=1)
EPISODE = 7


def gru_q_policy(observation_space: Any, action_space: Any) -> nn.Module:
    gru = GRUModule(
        input_size=int(observation_space.shape[0]),
        hidden_size=6,
        num_layers=2,
        in_key="observation",
        out_key="embed",
    )
    head = TensorDictModule(nn.Linear(6, int(action_space.n)), ["embed"], ["action_value"])
    return TensorDictSequential(gru, head, QValueModule(action_space="one_hot"))


@pytest.mark.parametrize("make_policy", [lstm_q_policy, gru_q_policy], ids=["lstm", "gru"])
def test_a_worker_acts_step_by_step_as_torchrls_own_rollout_of_the_policy(make_policy: Any) -> None:
    torch.manual_seed(0)
    policy = make_policy(CARTPOLE_OBS, TWO)
    env = TransformedEnv(GymEnv("CartPole-v1"), Compose(InitTracker(), StepCounter()))
    env.append_transform(policy[0].make_tensordict_primer())
    env.set_seed(0)
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        rollout = env.rollout(60, policy, break_when_any_done=False)  # across episode ends
    env.close()
    assert rollout["is_init"][1:].any()  # the run crosses a reset
    actor = TensorDictActor(CARTPOLE_OBS, TWO, policy=policy, extra_keys=[])
    keys = [k for k in policy[0].in_keys[1:] if k != "is_init"]
    assert {k: s for k, (s, _) in actor.recurrent_state().items()} == {
        k: tuple(rollout[k].shape[1:]) for k in keys
    }
    states = RecurrentStates(actor, 1)  # the worker's, one env
    for t in range(rollout.shape[0]):
        if rollout["is_init"][t].item():  # the worker resets an env's state at its episode start
            states.reset(0)
        action, recorded = states.act(actor, rollout["observation"][t].numpy(), test=True)
        assert action == rollout["action"][t].argmax().item(), t
        for k in keys:  # the state entering the step, recorded with its row
            assert np.array_equal(recorded[k], rollout[k][t].numpy()), (t, k)
        for k in keys:  # and the state it carries on with, TorchRL's ("next", key)
            assert np.array_equal(states.values[k][0], rollout["next", k][t].numpy()), (t, k)


def test_the_state_in_the_trainers_batch_is_the_one_the_worker_held_at_each_step() -> None:
    torch.manual_seed(0)
    actor = TensorDictActor(OBS, FOUR, policy=lstm_q_policy, extra_keys=[])
    states = RecurrentStates(actor, 1)
    held: dict[int, dict[str, np.ndarray]] = {}  # row k -> the state its action was chosen with
    actions: dict[int, Any] = {}
    for k in range(120):
        if k % EPISODE == 0:  # a reset row: a new episode's first observation
            states.reset(0)
        else:
            actions[k], held[k] = states.act(actor, vector_obs(k - 1), test=False)
    spec = actor.recurrent_state()
    memory = feed(
        ReplayMemory(memory_size=200, batch_size=16, sequence_length=5, seed=0),
        rows=120,
        act=lambda k: actions.get(k, np.int64(1)),
        extra=spec,
        extras=lambda k: held.get(k, {n: np.zeros(s, np.float32) for n, (s, _) in spec.items()}),
    )
    td = to_tensordict(memory.sample(), OBS, FOUR)
    row = td["next", "observation"][..., 0].long()  # vector_obs(k)[0] == k
    live = td["mask"]
    assert live.sum() > 30
    for name in spec:
        assert td[name].shape == (16, 5, 1, 8)
        expected = torch.stack([torch.as_tensor(held[int(k)][name]) for k in row[live]])
        assert torch.equal(td[name][live], expected)


def test_a_cartpole_run_trains_a_recurrent_dqn_on_sequences_a_worker_collected_with_its_state() -> (
    None
):
    def make_loss(observation_space: Any, action_space: Any) -> DQNLoss:
        loss = DQNLoss(
            lstm_q_policy(observation_space, action_space), delay_value=True, action_space="one-hot"
        )
        loss.make_value_estimator(gamma=0.99)
        return loss

    def exploring(network: torch.nn.Module) -> torch.nn.Module:
        return TensorDictSequential(
            network, EGreedyModule(OneHot(2), eps_init=1.0, eps_end=0.1, annealing_num_steps=200)
        )

    env_cls = partial(GenericGymEnv, id="CartPole-v1")
    agent_cls = partial(
        TorchRLAgent,
        loss=make_loss,
        optimizer=lambda loss: torch.optim.Adam(loss.parameters(), 1e-3),
        updater=partial(SoftUpdate, tau=0.05),
        policy=lambda loss: exploring(loss.value_network),
        extra_keys=[],
        burn_in=2,
    )
    actor_cls = partial(
        TensorDictActor, policy=lambda o, a: exploring(lstm_q_policy(o, a)), extra_keys=[]
    )
    torch.manual_seed(0)
    training = TrainingOffline(
        env_cls=env_cls,
        memory_cls=partial(ReplayMemory, sequence_length=6, burn_in=2),
        training_agent_cls=agent_cls,
        epochs=1,
        rounds=4,
        steps=20,
        update_model_interval=10,
        update_buffer_interval=5,
        start_training=100,
        memory_size=2000,
        batch_size=16,
        seed=0,
        max_training_steps_per_env_step=1.0,
    )
    worker = RolloutWorker(env_cls, actor_cls, min_samples_per_worker_packet=4, seed=0)
    rounds: list[dict[str, Any]] = []
    run_local(training, worker, threading.Event(), rounds.append)
    trained = [r for r in rounds if "loss" in r]
    assert trained and all(np.isfinite(r["loss"]) for r in trained)
    assert worker.version > 1 and training.total_samples >= 100
    # the worker annealed by the env steps it acted for, and new versions did not reset it
    actor = worker.actor
    assert isinstance(actor, TensorDictActor) and actor.schedule_frames() > 100
    assert float(actor.module[1].eps) < 1.0
    # the trainer's sequences start from the state the worker held: zeros at an episode's
    # first step, the LSTM's own afterwards
    td = to_tensordict(training.memory.sample(), training.observation_space, TWO)
    h = td["recurrent_state_h"]
    assert h.shape == (16, 6, 1, 8) and h[td["mask"]].abs().sum() > 0
