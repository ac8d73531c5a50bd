"""PPO: the actor's extras and distributions (clipped Gaussian, masked categoricals), the loss pieces on tiny batches
(clipped surrogate, value clipping, entropy, gradient clipping), checkpoints, and CartPole learning in seconds from
batches built as a RolloutMemory builds them (env-major fragments, traj_ids)."""

from __future__ import annotations

import io
import math
from collections.abc import Iterator

import gymnasium
import numpy as np
import pytest
import torch

from netrl.agents.common.masks import MASK_KEY
from netrl.agents.gae import gae, trajectory_ends
from netrl.agents.guard import find_state_tensors
from netrl.agents.ppo import PPOActor, PPOAgent
from netrl.samples import Batch

Box, Discrete, MultiDiscrete, MultiBinary, Dict = (gymnasium.spaces.Box, gymnasium.spaces.Discrete,
                                                   gymnasium.spaces.MultiDiscrete, gymnasium.spaces.MultiBinary,
                                                   gymnasium.spaces.Dict)
OBS = Box(-1, 1, (3,), np.float32)
ACT = Box(-1, 1, (2,), np.float32)
MASKED = Dict({"obs": OBS, MASK_KEY: MultiBinary(4)})


def make_agent(obs: gymnasium.Space = OBS, act: gymnasium.Space = ACT, **kw: object) -> PPOAgent:
    torch.manual_seed(0)
    return PPOAgent(obs, act, "cpu", hidden_sizes=(16, 16), **kw)  # type: ignore[arg-type]


def rollout(agent: PPOAgent, n: int = 12, pieces: int = 3) -> Batch:
    """``n`` transitions acted by the agent's own actor, in ``pieces`` trajectory pieces (each transition's next_obs is
    the next row's obs within a piece), the last row terminal, the others ending a fragment."""
    g = torch.Generator().manual_seed(1)
    obs = torch.rand(n, 3, generator=g) * 2 - 1
    traj_ids = torch.arange(n) * pieces // n
    next_obs = torch.rand(n, 3, generator=g) * 2 - 1
    same = torch.nonzero(traj_ids[1:] == traj_ids[:-1]).flatten()
    next_obs[same] = obs[same + 1]
    act, extras = agent.actor.act(obs)
    terminated = torch.zeros(n)
    terminated[-1] = 1.0
    return Batch(obs, torch.as_tensor(act), torch.randn(n, generator=g), next_obs, terminated, torch.zeros(n),
                 extra={**{k: torch.as_tensor(v) for k, v in extras.items()}, "traj_ids": traj_ids})


# -- the actor ----------------------------------------------------------------------------------------------------

def test_box_actions_stay_in_the_space_and_their_recorded_log_prob_is_the_one_the_trainer_computes() -> None:
    torch.manual_seed(0)
    actor = PPOActor(OBS, ACT, (16, 16), log_std_init=1.0)  # wide: many samples land beyond a bound
    obs = torch.rand(500, 3) * 2 - 1
    actions, extras = actor.act(obs)
    assert actions.shape == (500, 2) and actions.dtype == np.float32
    assert actor.extra_outputs() == {"action_log_prob": ((), "float32"), "state_value": ((), "float32")}
    assert {k: (v.shape, v.dtype) for k, v in extras.items()} == {"action_log_prob": ((500,), np.float32),
                                                                 "state_value": ((500,), np.float32)}
    assert actions.min() == -1.0 and actions.max() == 1.0  # clipped on the worker, to the space's bounds exactly
    at_bound = np.abs(actions) == 1.0
    assert 0.2 < at_bound.mean() < 0.8
    logp, _ = actor.log_prob_entropy(obs, torch.as_tensor(actions))
    # the ratio of a fresh batch is 1, clipped rows included: the trainer sees the same log-prob the worker recorded
    np.testing.assert_allclose(logp.detach().numpy(), extras["action_log_prob"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(actor.value(obs).detach().numpy(), extras["state_value"], rtol=1e-6)
    test_actions, _ = actor.act(obs, test=True)  # test episodes: the mean, clipped
    mean = torch.clamp(actor.pi(actor.encoder(obs)), -1, 1).detach().numpy()
    np.testing.assert_allclose(test_actions, mean, rtol=1e-6)


def test_the_clipped_gaussian_is_a_distribution_its_density_inside_and_its_tails_at_the_bounds_sum_to_one() -> None:
    torch.manual_seed(0)
    actor = PPOActor(OBS, Box(-1, 1, (1,), np.float32), (8,), log_std_init=-0.3)
    obs = torch.rand(1, 3)
    grid = torch.linspace(-1, 1, 20001)[1:-1]  # strictly inside: the density
    with torch.no_grad():
        inside, _ = actor.log_prob_entropy(obs.expand(len(grid), 3), grid[:, None])
        bounds, _ = actor.log_prob_entropy(obs.expand(2, 3), torch.tensor([[-1.0], [1.0]]))
    total = float(torch.trapezoid(inside.exp(), grid)) + float(bounds.exp().sum())
    assert total == pytest.approx(1.0, abs=1e-3)
    assert float(bounds.exp().sum()) > 0.05  # the bounds do carry mass: a density there would be wrong


def test_unbounded_box_dimensions_never_count_as_clipped_and_give_finite_gradients() -> None:
    space = Box(np.array([-np.inf, -1.0], np.float32), np.array([np.inf, 1.0], np.float32))
    agent = make_agent(act=space)
    batch = rollout(agent)
    metrics = agent.train(batch)
    assert all(math.isfinite(v) for v in metrics.values())
    assert all(torch.isfinite(p.grad).all() for p in agent.actor.parameters() if p.grad is not None)


def test_masked_choices_are_never_sampled_and_have_probability_zero() -> None:
    torch.manual_seed(0)
    actor = PPOActor(MASKED, Discrete(4), (16,))
    mask = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1]] * 200, dtype=torch.uint8)
    obs = {"obs": torch.rand(400, 3), MASK_KEY: mask}
    actions, extras = actor.act(obs)
    assert actions.shape == (400,) and actions.dtype == np.int64
    assert bool(mask[torch.arange(400), torch.as_tensor(actions)].all())
    assert set(actions[::2].tolist()) == {0, 2}  # both allowed choices of the first mask do occur
    np.testing.assert_allclose(extras["action_log_prob"][1::2], 0.0, atol=1e-6)  # one allowed choice: certain
    logp, entropy = actor.log_prob_entropy(obs, torch.full((400,), 1))  # a masked choice
    assert bool((logp < -1e30).all())
    # a near-uniform first policy over the allowed choices only: log 2 for two of them, 0 for one
    np.testing.assert_allclose(entropy[:2].detach().numpy(), [math.log(2), 0.0], atol=1e-3)
    test_actions, _ = actor.act(obs, test=True)
    assert bool(mask[torch.arange(400), torch.as_tensor(test_actions)].all())
    with pytest.raises(ValueError, match=r'"action_mask" of observation 1 allows no action in action dimension 0'):
        actor.act({"obs": torch.rand(2, 3), MASK_KEY: torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]])})


def test_multi_discrete_actions_are_one_categorical_per_branch_from_each_start() -> None:
    torch.manual_seed(0)
    space = MultiDiscrete([3, 2], start=[5, -1])
    actor = PPOActor(OBS, space, (16,))
    actions, _ = actor.act(torch.rand(300, 3))
    assert actions.shape == (300, 2)
    assert set(actions[:, 0].tolist()) == {5, 6, 7} and set(actions[:, 1].tolist()) == {-1, 0}
    _, entropy = actor.log_prob_entropy(torch.rand(1, 3), torch.tensor([[5, -1]]))
    assert float(entropy[0].detach()) == pytest.approx(math.log(3) + math.log(2), abs=1e-3)
    with pytest.raises(ValueError, match="PPO needs Box, Discrete"):
        PPOActor(OBS, gymnasium.spaces.Text(5))


# -- the losses ---------------------------------------------------------------------------------------------------

def test_advantages_use_the_recorded_values_and_bootstrap_from_the_critic_where_a_piece_ends_unterminated() -> None:
    agent = make_agent(gamma=0.9, gae_lambda=0.8)
    batch = rollout(agent, n=12, pieces=3)  # pieces end at rows 3 and 7 (fragment ends) and 11 (terminated)
    adv, target = agent.advantages(batch)
    with torch.no_grad():  # the reference: V(next_obs) from the critic for every row, a fragment's end included
        next_value = agent.actor.value(batch.next_obs)
    ends = trajectory_ends(batch.terminated, batch.truncated, batch.extra["traj_ids"])
    want_adv, want_target = gae(batch.rew, batch.extra["state_value"], next_value, batch.terminated, ends, 0.9, 0.8)
    np.testing.assert_allclose(adv.numpy(), want_adv.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(target.numpy(), want_target.numpy(), rtol=1e-5, atol=1e-6)
    assert ends.nonzero().flatten().tolist() == [3, 7, 11]


# -- the training step ------------------------------------------------------------------------------------------

def test_train_runs_epochs_of_minibatches_and_returns_finite_metrics() -> None:
    agent = make_agent(n_epochs=3, minibatch_size=5)
    before = {k: v.clone() for k, v in agent.actor.state_dict().items()}
    metrics = agent.train(rollout(agent, n=12))
    assert {"loss_pi", "loss_v", "entropy", "approx_kl", "clip_fraction", "minibatch_steps"} <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["minibatch_steps"] == 3 * 3  # 12 rows in minibatches of 5, 5 and 2, three times
    after = agent.actor.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert {"frames", "updates"} <= {name for name, _ in find_state_tensors(agent)}  # undone with a bad step


def test_the_surrogate_takes_the_clipped_ratio_where_it_is_the_pessimistic_one() -> None:
    agent = make_agent(n_epochs=1, minibatch_size=64, clip_range=0.2, lr=1e-9)
    batch = rollout(agent, n=12)
    batch.extra["action_log_prob"] = batch.extra["action_log_prob"] - math.log(1.5)  # every ratio is 1.5
    adv, _ = agent.advantages(batch)
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    metrics = agent.train(batch)
    # positive advantages gain only up to 1.2; negative ones count in full at 1.5
    want = -float(torch.min(1.5 * adv, 1.2 * adv).mean())
    assert metrics["loss_pi"] == pytest.approx(want, rel=1e-4)
    assert metrics["clip_fraction"] == 1.0
    assert metrics["approx_kl"] == pytest.approx(0.5 - math.log(1.5), rel=1e-4)


def test_value_loss_against_gae_targets_with_and_without_clipping_around_the_recorded_value() -> None:
    for clip_vf in (None, 0.1):
        agent = make_agent(n_epochs=1, minibatch_size=64, lr=1e-9, clip_range_vf=clip_vf)
        batch = rollout(agent, n=12)
        batch.extra["state_value"] = batch.extra["state_value"] + 3.0  # recorded far from today's critic
        _, target = agent.advantages(batch)
        value = agent.actor.value(batch.obs).detach()
        if clip_vf is not None:
            value = batch.extra["state_value"] - clip_vf  # today's value is 3 below: clipped to 0.1 below
        assert agent.train(batch)["loss_v"] == pytest.approx(float(((target - value) ** 2).mean()), rel=1e-4)


def test_the_entropy_bonus_widens_the_gaussian_and_its_metric_is_the_gaussians_entropy() -> None:
    agent = make_agent(n_epochs=1, minibatch_size=64, ent_coef=10.0, lr=1e-2)
    metrics = agent.train(rollout(agent))
    assert metrics["entropy"] == pytest.approx(2 * (0.5 + 0.5 * math.log(2 * math.pi)), rel=1e-5)
    assert bool((agent.actor.log_std > 0).all())


def test_gradients_are_clipped_to_max_grad_norm() -> None:
    agent = make_agent(n_epochs=1, minibatch_size=64, max_grad_norm=0.05, vf_coef=100.0)
    agent.optimizer = torch.optim.SGD(agent.actor.parameters(), lr=1.0)  # a step is the gradient itself
    agent.lr = 1.0
    before = torch.cat([p.detach().flatten().clone() for p in agent.actor.parameters()])
    agent.train(rollout(agent))
    moved = torch.cat([p.detach().flatten() for p in agent.actor.parameters()]) - before
    assert float(moved.norm()) == pytest.approx(0.05, rel=1e-3)


def test_annealing_lowers_the_learning_rate_linearly_with_the_frames_trained() -> None:
    agent = make_agent(lr=1e-3, anneal_frames=48)
    lrs = [agent.train(rollout(agent))["lr"] for _ in range(5)]
    assert lrs == pytest.approx([7.5e-4, 5e-4, 2.5e-4, 0.0, 0.0])


def test_a_batch_without_the_extras_is_refused_naming_what_is_missing() -> None:
    agent = make_agent()
    batch = rollout(agent)
    batch.extra.pop("traj_ids")
    with pytest.raises(ValueError, match=r"needs batch.extra \['traj_ids'\].*RolloutMemory"):
        agent.train(batch)


def test_a_checkpoint_restores_the_actor_optimiser_and_counters() -> None:
    agent = make_agent()
    agent.train(rollout(agent))
    restored = make_agent()
    saved = io.BytesIO()
    torch.save(agent.state_dict(), saved)  # as a checkpoint does: tensors only, loaded with weights_only
    saved.seek(0)
    restored.load_state_dict(torch.load(saved, weights_only=True))
    batch = rollout(agent)
    torch.manual_seed(5)
    a = agent.train(batch)
    torch.manual_seed(5)
    b = restored.train(batch)
    assert a == b and int(restored.frames) == 24


# -- learning -----------------------------------------------------------------------------------------------------

def collect(actor: PPOActor, envs: gymnasium.vector.VectorEnv, obs: np.ndarray, steps: int,
            returns: list[float], running: np.ndarray) -> tuple[Batch, np.ndarray]:
    """One fragment of ``steps`` vector steps as a RolloutMemory stores a packet: env-major, each env's rows in time
    order, a new traj_id at each env's segment and after each episode's end; extras recorded at action time."""
    n = envs.num_envs
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "act", "rew", "next", "term", "trunc", "logp", "v")}
    for _ in range(steps):
        act, extras = actor.act(torch.as_tensor(obs))
        nxt, rew, term, trunc, info = envs.step(act)
        done = term | trunc
        real_next = nxt.copy()
        for i in np.flatnonzero(done):  # same-step autoreset: the episode's last observation is in info
            real_next[i] = info["final_obs"][i]
        for key, value in (("obs", obs), ("act", act), ("rew", rew), ("next", real_next), ("term", term),
                           ("trunc", trunc), ("logp", extras["action_log_prob"]), ("v", extras["state_value"])):
            cols[key].append(np.asarray(value))
        running += rew
        for i in np.flatnonzero(done):
            returns.append(float(running[i]))
            running[i] = 0.0
        obs = nxt
    em = {k: np.swapaxes(np.stack(v), 0, 1).reshape(n * steps, *np.shape(v[0])[1:]) for k, v in cols.items()}
    starts = np.zeros(n * steps, bool)
    starts[::steps] = True
    starts[1:] |= em["term"][:-1] | em["trunc"][:-1]
    f = lambda x: torch.as_tensor(x, dtype=torch.float32)  # noqa: E731
    batch = Batch(f(em["obs"]), torch.as_tensor(em["act"]), f(em["rew"]), f(em["next"]), f(em["term"]),
                  f(em["trunc"]), extra={"action_log_prob": f(em["logp"]), "state_value": f(em["v"]),
                                         "traj_ids": torch.as_tensor(np.cumsum(starts) - 1)})
    return batch, obs


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Small matmuls: more threads only contend on a loaded machine (many times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_ppo_learns_cartpole_within_seconds(one_thread: None) -> None:
    """RL Zoo's CartPole-v1 settings; random actions score about 22."""
    torch.manual_seed(0)
    envs = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 8,
                                          autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)
    agent = PPOAgent(envs.single_observation_space, envs.single_action_space, "cpu", hidden_sizes=(64, 64),
                     gamma=0.98, gae_lambda=0.8, lr=1e-3, n_epochs=20, minibatch_size=256, anneal_frames=100_000)
    obs, _ = envs.reset(seed=0)
    returns: list[float] = []
    running = np.zeros(8)
    try:
        for _ in range(40):  # at most 10,240 env steps
            batch, obs = collect(agent.actor, envs, obs, 32, returns, running)
            agent.train(batch)
            if len(returns) >= 20 and np.mean(returns[-20:]) >= 100:
                break
    finally:
        envs.close()
    assert len(returns) >= 20 and np.mean(returns[-20:]) >= 100, returns[-20:]
