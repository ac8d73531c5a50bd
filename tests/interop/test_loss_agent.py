"""TorchRL losses on netrl's batches: the same loss values as on TorchRL's own replay buffer, and
TorchRLAgent, a loss as a netrl agent: its steps, priorities, checkpoints that resume bit for bit,
and a real training run whose published weights a worker's TensorDictActor loads."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")

from tensordict import TensorDict
from tensordict.nn import TensorDictSequential
from torchrl.data import LazyTensorStorage, OneHot, ReplayBuffer
from torchrl.data.postprocs import MultiStep
from torchrl.modules import EGreedyModule
from torchrl.objectives import HardUpdate, SoftUpdate

from netrl.agents.guard import StateGuard
from netrl.envs.gym import GenericGymEnv
from netrl.interop.loss_agent import TorchRLAgent
from netrl.interop.policies import TensorDictActor
from netrl.interop.tensordicts import DiscreteEncoding, to_tensordict
from netrl.local import run_local
from netrl.memory.priority import pop_priority, update_from_metrics
from netrl.memory.replay import ReplayMemory
from netrl.protocol.weights import load_weights, state_arrays
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.interop.nets import dqn_loss, sac_loss, tanh_normal_policy
from tests.interop.rows import box_act, feed, vector_obs

OBS = gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
DISCRETE = gymnasium.spaces.Discrete(4, start=1)
EPISODE = 7


def discrete_act(k: int) -> np.int64:
    return np.int64(1 + k % 4)


def collected(
    rows: int, act: Any, action_space: Any, multi_step: Any = None, discrete: str = "one_hot"
) -> ReplayBuffer:
    """The feed's transitions in TorchRL's own replay buffer, laid out as its collectors lay out a
    rollout (``[T]`` steps of one env per episode, with ``("collector", "traj_ids")``), extended
    episode by episode; through ``multi_step`` (TorchRL's ``MultiStep``) first if given."""
    rb = ReplayBuffer(storage=LazyTensorStorage(rows))
    post = (lambda td: td) if multi_step is None else (lambda td: multi_step(td[None])[0])
    for start in range(0, rows, EPISODE):
        ks = range(
            start + 1, min(start + EPISODE, rows)
        )  # the episode's reset row starts no transition
        end = torch.tensor([k % EPISODE == EPISODE - 1 for k in ks]).unsqueeze(-1)
        trunc = end & ((start // EPISODE) % 3 == 2)
        action = torch.stack([torch.as_tensor(act(k)) for k in ks])
        if isinstance(action_space, gymnasium.spaces.Discrete):  # GymEnv's OneHot or Categorical
            action = action.long() - action_space.start
            if discrete == "one_hot":
                action = torch.nn.functional.one_hot(action, int(action_space.n))
        rb.extend(
            post(
                TensorDict(
                    {
                        "observation": torch.stack(
                            [torch.as_tensor(vector_obs(k - 1)) for k in ks]
                        ),
                        "action": action,
                        "next": {
                            "observation": torch.stack(
                                [torch.as_tensor(vector_obs(k)) for k in ks]
                            ),
                            "reward": torch.tensor([[k / 8] for k in ks], dtype=torch.float32),
                            "done": end,
                            "terminated": end & ~trunc,
                            "truncated": trunc,
                        },
                        "collector": {"traj_ids": torch.full((len(ks),), start // EPISODE)},
                    },
                    batch_size=[len(ks)],
                )
            )
        )
    return rb


def stream_row(batch: Any, discrete: bool) -> torch.Tensor:
    """Which row of the feed each transition of a netrl batch ends at (its action says)."""
    return (batch.act.long() - 1) if discrete else (batch.act[:, 0] * 100).round().long()


@pytest.mark.parametrize("algorithm", ["sac", "dqn", "dqn categorical"])
def test_a_torchrl_loss_gives_the_same_values_on_a_netrl_batch_as_on_torchrls_replay_buffer(
    algorithm: str,
) -> None:
    discrete = algorithm.startswith("dqn")
    encoding: DiscreteEncoding = "categorical" if algorithm.endswith("categorical") else "one_hot"
    space, act, make_loss = (
        (DISCRETE, discrete_act, partial(dqn_loss, categorical=encoding == "categorical"))
        if discrete
        else (BOX, box_act, sac_loss)
    )
    rows = 140  # 20 episodes: the ring holds them all
    memory = feed(
        ReplayMemory(memory_size=200, batch_size=64, seed=3), rows=rows, act=act, episode=EPISODE
    )
    rb = collected(rows, act, space, discrete=encoding)
    batch = memory.sample()
    # each transition's row: its next observation is [k, -k, k % 5]
    k = batch.next_obs[:, 0].long()
    index = k - k // EPISODE - 1  # the buffer holds 6 transitions per 7 rows
    theirs = rb[index]
    ours = to_tensordict(batch, OBS, space, discrete=encoding)
    for key in (
        "observation",
        "action",
        ("next", "observation"),
        ("next", "reward"),
        ("next", "done"),
        ("next", "terminated"),
        ("next", "truncated"),
        ("collector", "traj_ids"),
    ):
        if key == (
            "collector",
            "traj_ids",
        ):  # netrl numbers trajectories its own way: compare the partition
            same = ours[key][:, None] == ours[key][None, :]
            assert (same == (theirs[key][:, None] == theirs[key][None, :])).all()
            continue
        assert ours[key].dtype == theirs[key].dtype and ours[key].shape == theirs[key].shape, key
        assert torch.equal(ours[key], theirs[key]), key
    torch.manual_seed(0)
    loss = make_loss(OBS, space)
    values = []
    for td in (ours, theirs):
        torch.manual_seed(1)  # SAC samples actions: the same draws for both
        values.append(loss(td.clone()))
    assert set(values[0].keys()) == set(values[1].keys()) and any(
        k.startswith("loss") for k in values[0].keys()
    )
    for key in values[0].keys():
        torch.testing.assert_close(values[0][key], values[1][key], rtol=0, atol=0)


def test_n_step_windows_are_torchrls_multistep_ones_and_give_the_same_loss_where_flags_agree() -> (
    None
):
    rows = 140
    memory = feed(
        ReplayMemory(memory_size=200, batch_size=128, n_step=3, gamma=0.9, seed=3), rows=rows
    )
    rb = collected(rows, box_act, BOX, multi_step=MultiStep(gamma=0.9, n_steps=3))
    batch = memory.sample()
    k = stream_row(batch, False)
    theirs, ours = rb[k - k // EPISODE - 1], to_tensordict(batch, OBS, BOX)
    for key in ("observation", "action", ("next", "observation"), "steps_to_next_obs"):
        assert ours[key].shape == theirs[key].shape and torch.equal(ours[key], theirs[key]), key
    assert (ours["steps_to_next_obs"] > 1).any() and (ours["steps_to_next_obs"] < 3).any()
    torch.testing.assert_close(ours["gamma"], theirs["gamma"])  # gamma ** steps_to_next_obs
    torch.testing.assert_close(
        ours["next", "reward"], theirs["next", "reward"]
    )  # netrl sums in float64
    # TorchRL 0.14's MultiStep keeps each first step's flags; netrl's window takes those of its last
    # row, so that a window ending in a termination does not bootstrap past it
    agree = (ours["next", "terminated"] == theirs["next", "terminated"])[:, 0]
    assert not agree.all() and agree.sum() > 64
    assert (ours["next", "terminated"][~agree]).all()  # the windows that end in a termination
    loss = sac_loss(OBS, BOX)
    values = []
    for td in (ours[agree], theirs[agree]):
        torch.manual_seed(1)
        values.append(loss(td.clone()))
    for key in values[0].keys():
        torch.testing.assert_close(values[0][key], values[1][key])


def sac_agent(**kwargs: Any) -> TorchRLAgent:
    return TorchRLAgent(
        OBS,
        BOX,
        "cpu",
        loss=sac_loss,
        updater=lambda loss: SoftUpdate(loss, tau=0.05),
        optimizer=lambda loss: {
            "loss_actor": torch.optim.Adam(loss.actor_network_params.flatten_keys().values(), 1e-3),
            "loss_qvalue": torch.optim.Adam(
                loss.qvalue_network_params.flatten_keys().values(), 1e-3
            ),
            "loss_alpha": torch.optim.Adam([loss.log_alpha], 1e-3),
        },
        **kwargs,
    )


def test_the_agent_trains_steps_its_optimisers_and_target_and_reports_the_loss_terms() -> None:
    torch.manual_seed(0)
    agent = sac_agent()
    memory = feed(ReplayMemory(memory_size=200, batch_size=32, seed=0))
    actor_before = {k: v.clone() for k, v in agent.get_actor().state_dict().items()}
    target_before = agent.loss.target_qvalue_network_params.clone()
    for _ in range(3):
        metrics = agent.train(memory.sample())
    assert {"loss_actor", "loss_qvalue", "loss_alpha", "alpha", "entropy"} <= set(metrics)
    assert all(isinstance(v, float) and np.isfinite(v) for v in metrics.values())
    assert "priority" not in metrics  # a uniform memory's batch: no priorities to return
    after = agent.get_actor().state_dict()
    assert all(not torch.equal(actor_before[k], after[k]) for k in after if k.endswith("weight"))
    assert (
        agent.loss.target_qvalue_network_params != target_before
    ).any()  # the soft update moved the targets


def test_a_prioritized_memorys_batch_gets_its_td_errors_back_as_priorities() -> None:
    torch.manual_seed(0)
    agent = sac_agent()
    memory = feed(ReplayMemory(memory_size=200, batch_size=16, prioritized=True, seed=0))
    batch = memory.sample()
    metrics = agent.train(batch)
    priority = pop_priority(metrics)
    assert priority is not None and priority.shape == (16,) and torch.isfinite(priority).all()
    assert "priority" not in metrics and all(np.isfinite(v) for v in metrics.values())
    wrong = sac_agent(priority_key="no_such_key")
    with pytest.raises(ValueError, match="wrote no 'no_such_key' for a prioritized memory's batch"):
        wrong.train(batch)


def test_a_parameter_no_optimiser_steps_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"no optimiser steps the parameters log_alpha of SACLoss"):
        TorchRLAgent(
            OBS,
            BOX,
            "cpu",
            loss=sac_loss,
            optimizer=lambda loss: {
                "loss_actor": torch.optim.Adam(loss.actor_network_params.flatten_keys().values()),
                "loss_qvalue": torch.optim.Adam(loss.qvalue_network_params.flatten_keys().values()),
            },
        )


def test_optimisers_keyed_by_a_term_the_loss_does_not_return_are_refused_by_name() -> None:
    agent = TorchRLAgent(
        OBS,
        BOX,
        "cpu",
        loss=sac_loss,
        optimizer=lambda loss: {"loss_critic": torch.optim.Adam(loss.parameters())},
    )
    with pytest.raises(
        ValueError, match=r"the optimisers \['loss_critic'\] name no loss term of SACLoss"
    ):
        agent.train(feed(ReplayMemory(memory_size=200, batch_size=8, seed=0)).sample())


@pytest.mark.parametrize("algorithm", ["sac", "dqn"])
def test_a_checkpoint_resumes_bit_for_bit(algorithm: str, tmp_path: Any) -> None:
    def make() -> TorchRLAgent:
        if algorithm == "sac":
            return sac_agent()
        return TorchRLAgent(
            OBS,
            DISCRETE,
            "cpu",
            loss=dqn_loss,
            optimizer=lambda loss: torch.optim.Adam(loss.parameters(), 1e-3),
            updater=lambda loss: HardUpdate(loss, value_network_update_interval=5),
        )

    act = discrete_act if algorithm == "dqn" else box_act
    memory = feed(ReplayMemory(memory_size=200, batch_size=16, seed=0), act=act)
    batches = [memory.sample() for _ in range(8)]
    batches = [
        b._replace(
            **{
                f: getattr(b, f).clone()
                for f in ("obs", "act", "rew", "next_obs", "terminated", "truncated")
            }
        )
        for b in batches
    ]
    torch.manual_seed(0)
    straight = make()
    for b in batches:
        straight.train(b)
    torch.manual_seed(0)
    first = make()
    for b in batches[:4]:
        first.train(b)
    torch.save(first.state_dict(), tmp_path / "agent.pt")
    for b in batches[
        4:
    ]:  # what happens to the first agent after the checkpoint does not reach the second
        first.train(b)
    torch.manual_seed(123)  # a fresh process: other weights, another random state
    resumed = make()
    resumed.load_state_dict(torch.load(tmp_path / "agent.pt", weights_only=True))
    for b in batches[4:]:
        resumed.train(b)
    a, b = straight.state_dict(), resumed.state_dict()
    for key, value in a["loss"].items():
        assert torch.equal(value, b["loss"][key]), key
    assert str(a["optimizers"]) == str(b["optimizers"]) and torch.equal(a["rng"], b["rng"])
    if algorithm == "dqn":
        assert (
            a["updater"] == b["updater"] == {"initialized": True, "counter": 2}
        )  # updated at step 6


def test_a_pendulum_run_trains_a_torchrl_sac_loss_and_a_workers_actor_loads_its_weights() -> None:
    env_cls = partial(GenericGymEnv, id="Pendulum-v1")
    sac_pendulum = partial(
        TorchRLAgent,
        loss=sac_loss,
        updater=partial(SoftUpdate, tau=0.01),
        optimizer=lambda loss: torch.optim.Adam(loss.parameters(), 3e-4),
    )
    actor_cls = partial(TensorDictActor, policy=tanh_normal_policy)
    torch.manual_seed(0)
    training = TrainingOffline(
        env_cls=env_cls,
        memory_cls=ReplayMemory,
        training_agent_cls=sac_pendulum,
        epochs=1,
        rounds=8,
        steps=40,
        update_model_interval=20,
        update_buffer_interval=5,
        start_training=100,
        worker_lead=50,
        memory_size=2000,
        batch_size=32,
        seed=0,
        max_training_steps_per_env_step=1.0,
    )
    worker = RolloutWorker(
        env_cls, actor_cls, min_samples_per_worker_packet=4, max_samples_per_episode=100, seed=0
    )
    worker.start()  # builds its env and actor
    initial = {k: v.clone() for k, v in worker.actor.state_dict().items()}
    rounds: list[dict[str, Any]] = []
    run_local(training, worker, threading.Event(), rounds.append)
    agent = training.agent
    assert isinstance(agent, TorchRLAgent) and training.total_samples >= 300
    losses = [r for r in rounds if "loss_qvalue" in r]
    assert losses and all(
        np.isfinite(r[k]) for r in losses for k in ("loss_actor", "loss_qvalue", "loss_alpha")
    )
    # the worker acted with published versions: its actor holds weights it did not start with
    assert rounds[-1]["trained_steps"] == 320 and worker.version > 1
    assert isinstance(worker.actor, TensorDictActor)
    assert any(not torch.equal(initial[k], v) for k, v in worker.actor.state_dict().items())
    # and the newest weights load into a fresh worker-side actor, which then acts as the trainer's
    fresh = actor_cls(agent.observation_space, agent.action_space)
    load_weights(fresh, state_arrays(agent.get_actor()), assign=True)
    obs = np.zeros((2, 3), np.float32)
    np.testing.assert_array_equal(
        fresh.act_(obs, test=True, batch=True)[0],
        agent.get_actor().act_(obs, test=True, batch=True)[0],
    )


def test_a_step_that_goes_non_finite_is_undone_by_the_loops_guard() -> None:
    torch.manual_seed(0)
    agent = sac_agent()
    batch = feed(ReplayMemory(memory_size=200, batch_size=16, seed=0)).sample()
    guard = StateGuard(agent)
    guard.begin()
    assert guard.accept(agent.train(batch))
    kept = {k: v.clone() for k, v in agent.loss.state_dict().items()}
    assert any(k.startswith("target_") for k in kept) and guard.tensors > len(
        kept
    )  # + optimiser state
    metrics = agent.train(batch._replace(rew=torch.full_like(batch.rew, float("nan"))))
    assert not guard.accept(metrics)
    after = agent.loss.state_dict()
    assert all(torch.equal(kept[k], after[k]) for k in kept)


def test_a_sequence_batch_trains_and_its_priorities_come_back_per_step() -> None:
    torch.manual_seed(0)
    agent = sac_agent()
    memory = feed(
        ReplayMemory(memory_size=200, batch_size=8, sequence_length=4, prioritized=True, seed=0)
    )
    batch = memory.sample()
    metrics = agent.train(batch)
    priority = pop_priority(metrics)
    assert priority.shape == (8, 4) and all(np.isfinite(v) for v in metrics.values())
    tree = memory._priorities.tree
    total = tree.total
    update_from_metrics(memory, batch, priority, training_steps=1)  # as the loop gives them back
    assert (
        memory._priorities.refused == 0 and tree.total != total
    )  # the sequences' priorities moved


def test_an_exploration_policy_around_the_loss_network_is_what_the_workers_run() -> None:
    torch.manual_seed(0)
    greedy_then_random = partial(
        TorchRLAgent,
        loss=dqn_loss,
        optimizer=lambda loss: torch.optim.Adam(loss.parameters(), 1e-3),
        policy=lambda loss: TensorDictSequential(
            loss.value_network, EGreedyModule(OneHot(4), eps_init=1.0)
        ),
    )
    agent = greedy_then_random(observation_space=OBS, action_space=DISCRETE, device="cpu")
    actor = agent.get_actor()
    obs = np.zeros((64, 3), np.float32)
    explored, _ = actor.act_(obs, test=False, batch=True)
    greedy, _ = actor.act_(obs, test=True, batch=True)
    assert len(set(explored.tolist())) > 1 and len(set(greedy.tolist())) == 1  # eps 1 explores
    # what is published holds the Q network's own tensors (the annealed eps stays the worker's)
    q = {p.data_ptr() for p in agent.loss.value_network.parameters()}
    assert q and q <= {t.data_ptr() for t in actor.state_dict().values()}
