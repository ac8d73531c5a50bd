"""Recurrent SAC: the actor the worker steps and the unroll the agent trains agree; burn-in and padded steps leave
the losses alone; a memory that stores no state is refused; the gym pipeline builds it from the config and trains it
end to end (worker -> memory -> [B, L] batch -> train) on a partially observed Pendulum."""

from __future__ import annotations

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
from netrl.memory.replay import ReplayMemory
from netrl.pipelines.make import make_pipeline
from netrl.samples import Batch
from netrl.trainer.trainer import Trainer
from netrl.worker.worker import RolloutWorker

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


def test_the_recurrent_sac_trains_end_to_end_on_a_partially_observed_pendulum(tmp_path: Path) -> None:
    data: dict[str, Any] = {
        "run_name": "pomdp", "weights_folder": str(tmp_path), "seed": 0, "security": "none",
        "env": {"hide_obs": [2]}, "agent": {"recurrent": "gru", "hidden_sizes": [32, 32]},
        "memory": {"sequence_length": 8, "burn_in": 2, "batch_size": 16, "memory_size": 5000},
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
    assert all(np.isfinite(v) for v in agent.train(batch).values())
