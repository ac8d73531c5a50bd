"""Recurrent SAC: the actor the worker steps and the unroll the agent trains agree; burn-in and padded steps leave
the losses alone; a memory that stores no state is refused; the gym pipeline builds it from the config and trains it
end to end (worker -> memory -> [B, L] batch -> train) on a partially observed Pendulum."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from netrl.agents.recurrent_sac import RecurrentActor, RecurrentSACAgent
from netrl.config.load import config_from_dict
from netrl.errors import ConfigError
from netrl.local import run_local
from netrl.memory.priority import pop_priority, update_from_metrics
from netrl.memory.replay import ReplayMemory
from netrl.pipelines.make import make_pipeline
from netrl.samples import Batch
from netrl.trainer.trainer import Trainer
from netrl.worker.worker import RolloutWorker
from tests.recording import local_packets, over_the_wire

OBS = gymnasium.spaces.Box(-1, 1, (2,), np.float32)
ACT = gymnasium.spaces.Box(-2, 2, (1,), np.float32)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_stepping_the_actor_as_the_worker_does_matches_the_unroll_the_agent_trains_on(cell: str) -> None:
    torch.manual_seed(0)
    actor = RecurrentActor(OBS, ACT, (16, 8), cell)  # type: ignore[arg-type]
    obs = torch.randn(3, 5, 2)
    start = {k: torch.randn(3, *shape) for k, (shape, _) in actor.recurrent_state().items()}
    z, end = actor.unroll(obs, start)
    state = {k: v.numpy() for k, v in start.items()}
    for t in range(5):
        acts, state = actor.act_(obs[:, t].numpy(), test=True, batch=True, state=state)
        want, _ = actor.policy(z[:, t], test=True, with_logprob=False)
        np.testing.assert_allclose(acts, want.detach().numpy(), rtol=1e-5, atol=1e-5)
    for k in end:
        np.testing.assert_allclose(state[k], end[k].detach().numpy(), rtol=1e-5, atol=1e-6)


def sequences(b: int = 8, length: int = 6, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, length, dtype=torch.bool)
    mask[: b // 2, 4:] = False  # half the sequences stop after 4 steps
    state = torch.randn(b, length, 1, 8, generator=g)
    return Batch(torch.randn(b, length, 2, generator=g), torch.rand(b, length, 1, generator=g) * 4 - 2,
                 torch.randn(b, length, generator=g), torch.randn(b, length, 2, generator=g), torch.zeros(b, length),
                 torch.zeros(b, length), None, extra={"recurrent_state": state, "mask": mask})


def losses(batch: Batch) -> dict[str, float]:
    torch.manual_seed(0)
    agent = RecurrentSACAgent(OBS, ACT, hidden_sizes=(16, 8), cell="gru", burn_in=2)
    torch.manual_seed(1)
    return agent.train(batch)


def test_burn_in_and_padded_steps_are_masked_out_of_every_loss() -> None:
    batch = sequences()
    base = losses(batch)
    assert all(np.isfinite(v) for v in base.values())
    rew, act = batch.rew.clone(), batch.act.clone()
    rew[:, :2] += 100.0  # burn-in steps
    act[:, :2] = -act[:, :2]
    rew[: 4, 4:] -= 50.0  # padded steps
    act[: 4, 4:] = 2.0
    assert losses(batch._replace(rew=rew, act=act)) == base
    rew = batch.rew.clone()
    rew[:, 3] += 1.0  # a step that counts
    assert losses(batch._replace(rew=rew))["loss_critic"] != base["loss_critic"]
    state = batch.extra["recurrent_state"].clone()
    state[:, 0] += 1.0  # the recorded state a sequence starts from
    assert losses(batch._replace(extra={**batch.extra, "recurrent_state": state}))["loss_critic"] != base["loss_critic"]


def test_a_batch_without_the_recorded_state_is_refused_naming_what_is_missing() -> None:
    batch = sequences()
    agent = RecurrentSACAgent(OBS, ACT, hidden_sizes=(16, 8), burn_in=2)
    with pytest.raises(ValueError, match=r"the batch's extras lack \['recurrent_state'\]: use a ReplayMemory with "
                                         r"sequence_length >= 2 .*a memory that stores no state cannot train"):
        agent.train(batch._replace(extra={"mask": batch.extra["mask"]}))
    with pytest.raises(ValueError, match=r"lack \['mask', 'recurrent_state'\]"):
        agent.train(batch._replace(extra={}))


def test_the_gym_pipeline_builds_the_recurrent_sac_and_refuses_sequences_it_cannot_use() -> None:
    cfg = config_from_dict({"env": {"hide_obs": [2]}, "agent": {"recurrent": "lstm", "hidden_sizes": [32, 16]},
                            "memory": {"sequence_length": 8, "burn_in": 3}})
    pipeline = make_pipeline(cfg)
    env = pipeline.env_cls()
    try:
        assert env.observation_space.shape == (2,)  # cos and sin of the angle: the velocity is hidden
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2,) and abs(float(obs[0] ** 2 + obs[1] ** 2) - 1) < 1e-5
        agent = pipeline.training_agent_cls(env.observation_space, env.action_space, "cpu")
    finally:
        env.close()
    assert isinstance(agent, RecurrentSACAgent) and agent.burn_in == 3 and agent.actor.cell == "lstm"
    memory = pipeline.memory_cls(memory_size=100, batch_size=4)
    assert isinstance(memory, ReplayMemory) and (memory.sequence_length, memory.burn_in) == (8, 3)
    with pytest.raises(ConfigError, match=r"memory.sequence_length is 8, but the gym pipeline's agents learn from "
                                          r"single transitions unless agent.recurrent is set"):
        make_pipeline(config_from_dict({"memory": {"sequence_length": 8}}))
    with pytest.raises(ConfigError, match=r'memory.sequence_length is 8, but env.pipeline "drone" builds its memory '
                                          r"with sequence_length 1"):
        make_pipeline(config_from_dict({"env": {"pipeline": "drone"}, "memory": {"sequence_length": 8}}))
    with pytest.raises(ConfigError, match=r"env.hide_obs \[3\] must name distinct entries of the 3 this env"):
        make_pipeline(config_from_dict({"env": {"hide_obs": [3]}}))


@pytest.mark.parametrize("replay", [{}, {"n_step": 3, "prioritized": True}])
def test_the_recurrent_sac_trains_end_to_end_on_a_partially_observed_pendulum(
        tmp_path: Path, replay: dict[str, Any]) -> None:
    data: dict[str, Any] = {
        "run_name": "pomdp", "weights_folder": str(tmp_path), "seed": 0, "security": "none",
        "env": {"hide_obs": [2]}, "agent": {"recurrent": "gru", "hidden_sizes": [32, 32]},
        "memory": {"sequence_length": 8, "burn_in": 2, "batch_size": 16, "memory_size": 5000,
                   **replay},
        "worker": {"test_episode_interval": 0, "min_samples_per_worker_packet": 50, "max_samples_per_episode": 60},
        "trainer": {"epochs": 1, "rounds": 1, "steps": 10, "start_training": 100, "update_buffer_interval": 10,
                    "worker_lead": 100}, "wandb": {"mode": "disabled"}}
    cfg = config_from_dict(data)
    pipeline = make_pipeline(cfg)
    worker = RolloutWorker.from_config(cfg, pipeline)
    training = Trainer.from_config(cfg, pipeline).training_cls()
    run_local(training, worker, threading.Event())
    memory, agent = training.memory, training.agent
    assert isinstance(memory, ReplayMemory) and isinstance(agent, RecurrentSACAgent)
    assert training.total_updates == 10
    batch = memory.sample()
    assert batch.obs.shape == (16, 8, 2) and batch.extra["recurrent_state"].shape == (16, 8, 1, 32)
    assert batch.extra["recurrent_state"][:, 1:].abs().sum() > 0  # the worker's real states, not zeros
    metrics = agent.train(batch)
    assert all(np.isfinite(v) for k, v in metrics.items() if k != "priority")
    if replay:  # the loop gave the sum tree the agent's priorities: not only 0 and the first (1)
        assert memory.prioritized and memory._priorities is not None
        tree = memory._priorities.tree.get(np.arange(len(memory)))
        assert ((tree != 0) & (tree != 1)).any()


# n-step sequences by hand: 4 sequences of L = 5 steps with n = 3 and gamma 0.9 over trajectories
# of L + n observations: one that runs on, one that terminates at step 2, one truncated at step 3,
# one whose trajectory's newest row is step 3 (the ring's write head). Built the way nstep.py and
# sequences.py define a batch, from plain lists: step j's window takes rows j.. while the last one
# neither ended nor was the newest.
L_SEQ, N_STEP, GAMMA, BURN_IN = 5, 3, 0.9, 1
# (terminated, truncated, newest row)
CASES = [(None, None, None), (2, None, None), (None, 3, None), (None, None, 3)]


def nstep_sequences(seed: int = 0) -> tuple[Batch, torch.Tensor, list[list[int]]]:
    """The batch, the observations of each trajectory ``[B, L + n, 2]`` and each real step's
    bootstrap position (j + m)."""
    g = torch.Generator().manual_seed(seed)
    b = len(CASES)
    traj = torch.randn(b, L_SEQ + N_STEP, 2, generator=g)
    rows_rew = torch.randn(b, L_SEQ + N_STEP, generator=g)
    act = torch.rand(b, L_SEQ, 1, generator=g) * 4 - 2
    obs, next_obs = torch.zeros(b, L_SEQ, 2), torch.zeros(b, L_SEQ, 2)
    rew, term, trunc = torch.zeros(b, L_SEQ), torch.zeros(b, L_SEQ), torch.zeros(b, L_SEQ)
    mask, steps = torch.zeros(b, L_SEQ, dtype=torch.bool), torch.zeros(b, L_SEQ, dtype=torch.int64)
    ends: list[list[int]] = []
    for i, (t_row, tr_row, newest) in enumerate(CASES):
        stop = min(r for r in (t_row, tr_row, newest, L_SEQ + N_STEP - 1) if r is not None)
        real = min(stop + 1, L_SEQ)
        ends.append([])
        for j in range(L_SEQ):
            k = min(j, real - 1)  # padded steps repeat the last real one
            m = min(N_STEP, stop - k + 1)
            obs[i, j], next_obs[i, j] = traj[i, k], traj[i, k + m]
            rew[i, j] = sum(GAMMA ** s * rows_rew[i, k + s] for s in range(m))
            term[i, j], trunc[i, j] = float(k + m - 1 == t_row), float(k + m - 1 == tr_row)
            steps[i, j], mask[i, j] = m, j < real
            if j < real:
                ends[i].append(j + m)
        act[i, real:] = act[i, real - 1]
    state = torch.randn(b, L_SEQ, 1, 8, generator=g)
    extra = {"recurrent_state": state, "mask": mask, "steps_to_next_obs": steps,
             "discount": GAMMA ** steps.float(), "index": torch.arange(b * L_SEQ).reshape(b, L_SEQ)}
    return Batch(obs, act, rew, next_obs, term, trunc, None, extra=extra), traj, ends


def test_n_step_targets_equal_a_brute_force_unroll_over_each_trajectory() -> None:
    batch, traj, ends = nstep_sequences()
    assert ends == [[3, 4, 5, 6, 7], [3, 3, 3], [3, 4, 4, 4], [3, 4, 4, 4]]
    torch.manual_seed(0)
    # gamma 0.5: the batch's own discounts (0.9 ** m) must rule
    agent = RecurrentSACAgent(OBS, ACT, hidden_sizes=(16, 8), burn_in=BURN_IN, gamma=0.5)
    before = copy.deepcopy(agent)
    torch.manual_seed(1)
    metrics = agent.train(batch)
    # brute force: each feature by stepping the actor one observation at a time from the
    # recorded state
    b, t = len(CASES), L_SEQ - BURN_IN
    alpha = before.log_alpha.exp()

    def feature(actor: RecurrentActor, i: int, position: int) -> torch.Tensor:
        state = {"recurrent_state": batch.extra["recurrent_state"][i:i + 1, 0]}
        for p in range(position + 1):
            z, state = actor.unroll(traj[i:i + 1, p:p + 1], state)
        return z[0, 0]

    with torch.no_grad():
        z_next, z_next_target = torch.zeros(b, t, 8), torch.zeros(b, t, 8)
        for i in range(b):
            for j, end in enumerate(ends[i][BURN_IN:]):
                z_next[i, j] = feature(before.actor, i, end)
                z_next_target[i, j] = feature(before.actor_target, i, end)
        torch.manual_seed(1)  # the same noise for the next actions as the agent's one draw
        a2, logp = before.actor.policy(z_next)
        assert logp is not None
        loss, count = torch.zeros(()), 0
        priority = torch.zeros(b, L_SEQ)
        for i in range(b):
            for j, end in enumerate(ends[i][BURN_IN:]):
                s = j + BURN_IN
                pair = torch.cat([z_next_target[i, j], a2[i, j]])[None]
                q_targ = before.critic_target(pair).min()
                want = batch.rew[i, s] + GAMMA ** (end - s) * (1 - batch.terminated[i, s]) * (
                    q_targ - alpha[0] * logp[i, j])
                pair = torch.cat([feature(before.actor, i, s), batch.act[i, s]])[None]
                q = before.critic(pair)[:, 0]
                loss += ((q - want) ** 2).sum()
                priority[i, s] = (q - want).abs().mean()
                count += 1
    assert metrics["loss_critic"] == pytest.approx(float(loss / count), rel=1e-5)
    torch.testing.assert_close(metrics["priority"], priority, rtol=1e-4, atol=1e-6)
    assert (metrics["priority"][:, :BURN_IN] == 0).all() and (metrics["priority"][1, 3:] == 0).all()


def test_importance_weights_scale_each_steps_critic_loss_and_leave_masked_steps_out() -> None:
    batch = sequences()
    base = losses(batch)
    half = losses(batch._replace(weight=torch.full(batch.rew.shape, 0.5)))
    # a mean of weighted losses, not a weighted mean
    assert half["loss_critic"] == pytest.approx(base["loss_critic"] / 2, rel=1e-5)
    assert half["loss_actor"] == pytest.approx(base["loss_actor"] / 2, rel=1e-5)
    weight = torch.ones(batch.rew.shape)
    weight[:, 3] = 0.0  # one step weighs nothing
    assert losses(batch._replace(weight=weight))["loss_critic"] != base["loss_critic"]
    weight = torch.ones(batch.rew.shape)
    weight[:, :2] = 7.0  # burn-in and padded steps weigh nothing whatever their weight
    weight[:4, 4:] = 7.0
    assert losses(batch._replace(weight=weight)) == base


def test_a_training_step_sets_the_priorities_of_the_sampled_sequence_starts() -> None:
    cfg = config_from_dict({"env": {"hide_obs": [2]},
                            "agent": {"recurrent": "gru", "hidden_sizes": [16, 8]},
                            "memory": {"sequence_length": 8, "burn_in": 2, "n_step": 3,
                                       "prioritized": True, "priority_alpha": 1.0,
                                       "priority_eps": 1e-9}})
    pipeline = make_pipeline(cfg)
    env = pipeline.env_cls()
    torch.manual_seed(0)
    agent = pipeline.training_agent_cls(env.observation_space, env.action_space, "cpu")
    env.close()
    assert isinstance(agent, RecurrentSACAgent)
    worker = RolloutWorker(pipeline.env_cls, pipeline.actor_module_cls, pipeline.sample_compressor,
                           min_samples_per_worker_packet=10, overlap=pipeline.overlap, seed=0)
    memory = pipeline.memory_cls(memory_size=1000, batch_size=16, seed=0)
    assert isinstance(memory, ReplayMemory)
    assert (memory.n_step, memory.sequence_length, memory.prioritized) == (3, 8, True)
    for buf in local_packets(worker, [False]):
        memory.append_buffer(over_the_wire(buf))
    batch = memory.sample()
    assert batch.extra["discount"].shape == (16, 8)
    assert int(batch.extra["steps_to_next_obs"].max()) == 3
    starts = batch.extra["index"][:, 0].numpy() % 1000
    assert memory._priorities is not None
    before = memory._priorities.tree.get(starts).copy()
    metrics = agent.train(batch)
    priority = pop_priority(metrics)
    assert priority.shape == (16, 8) and (priority[:, :2] == 0).all()  # burn-in steps: no priority
    update_from_metrics(memory, batch, priority, 1)
    after = memory._priorities.tree.get(starts)
    assert not np.allclose(after, before)
    # each start's priority: R2D2's mixture of its |td| after the burn-in (alpha 1: the value)
    td, real = priority[:, 2:].numpy(), batch.extra["mask"][:, 2:].numpy()
    td = np.where(real, td, 0)
    mixed = 0.9 * td.max(1) + 0.1 * td.sum(1) / np.maximum(real.sum(1), 1)
    once = np.unique(starts, return_counts=True)[1][np.unique(starts, return_inverse=True)[1]] == 1
    assert once.sum() >= 8  # a start drawn twice holds one of its two updates
    np.testing.assert_allclose(after[once], mixed[once] + 1e-9, rtol=1e-5)


def test_windows_longer_than_the_sequences_are_refused_naming_the_keys() -> None:
    batch, _, _ = nstep_sequences()
    steps = batch.extra["steps_to_next_obs"].clone()
    steps[0, 0] = L_SEQ + 1  # a window that ends past the n observations after the sequence
    agent = RecurrentSACAgent(OBS, ACT, hidden_sizes=(16, 8), burn_in=BURN_IN)
    with pytest.raises(ValueError, match=r"n-step windows of 6 steps reach past sequences of 5: .*use "
                                         r"memory.n_step <= memory.sequence_length"):
        agent.train(batch._replace(extra={**batch.extra, "steps_to_next_obs": steps}))
