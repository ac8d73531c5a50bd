"""TorchRLAgent on sequence batches ([B, T], padded after a sequence's end): a loss over
transitions trains on the real steps only; a recurrent loss keeps [B, T] with TorchRL's masking
keys, starts from the stored state, and learns nothing from padding or burn-in."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")

from torchrl.objectives import DQNLoss, SoftUpdate

from netrl.interop.loss_agent import TorchRLAgent
from netrl.memory.replay import ReplayMemory
from netrl.samples import Batch
from netrl.samples.columns import tree_map
from tests.interop.nets import dqn_loss, lstm_q_policy, sac_loss
from tests.interop.rows import feed

OBS = gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
DISCRETE = gymnasium.spaces.Discrete(4, start=1)
STATE = {"recurrent_state_h": ((1, 8), "float32"), "recurrent_state_c": ((1, 8), "float32")}


def discrete_act(k: int) -> np.int64:
    return np.int64(1 + k % 4)


def stored_state(k: int) -> dict[str, Any]:
    """A state per row that differs from row to row (as a worker's does)."""
    return {name: np.full((1, 8), np.sin(k + i), np.float32) for i, name in enumerate(STATE)}


def real_steps(batch: Batch) -> Batch:
    """The batch's real steps alone, flat: what the padded batch should train on."""
    mask = batch.extra["mask"]
    return Batch(
        tree_map(lambda t: t[mask], batch.obs),
        batch.act[mask],
        batch.rew[mask],
        tree_map(lambda t: t[mask], batch.next_obs),
        batch.terminated[mask],
        batch.truncated[mask],
        None if batch.weight is None else batch.weight[mask],
        extra={k: v[mask] for k, v in batch.extra.items() if k != "mask"},
    )


def two_agents(make: Any) -> tuple[TorchRLAgent, TorchRLAgent]:
    torch.manual_seed(0)
    first = make()
    torch.manual_seed(0)
    return first, make()


def sac_agent() -> TorchRLAgent:
    return TorchRLAgent(
        OBS,
        BOX,
        "cpu",
        loss=sac_loss,
        updater=lambda loss: SoftUpdate(loss, tau=0.05),
        optimizer=lambda loss: torch.optim.Adam(loss.parameters(), 1e-3),
    )


def dqn_agent() -> TorchRLAgent:
    return TorchRLAgent(
        OBS,
        DISCRETE,
        "cpu",
        loss=dqn_loss,
        updater=lambda loss: SoftUpdate(loss, tau=0.05),
        optimizer=lambda loss: torch.optim.Adam(loss.parameters(), 1e-3),
    )


def test_a_transition_loss_on_a_padded_batch_equals_it_on_the_real_steps_alone() -> None:
    memory = feed(ReplayMemory(memory_size=200, batch_size=16, sequence_length=5, seed=0))
    batch = memory.sample()
    assert not batch.extra["mask"].all()  # some sequences are padded
    padded, flat = two_agents(sac_agent)
    torch.manual_seed(1)
    on_padded = padded.train(batch)
    torch.manual_seed(1)
    on_real = flat.train(real_steps(batch))
    for term in ("loss_actor", "loss_qvalue", "loss_alpha", "entropy"):
        assert on_padded[term] == on_real[term], term
    after = flat.loss.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in padded.loss.state_dict().items())


def test_a_prioritized_sequence_batch_gets_each_real_steps_td_error_back_and_zero_padding() -> (
    None
):
    memory = feed(
        ReplayMemory(memory_size=200, batch_size=16, sequence_length=5, prioritized=True, seed=0),
        act=discrete_act,
    )
    batch = memory.sample()
    mask = batch.extra["mask"]
    assert not mask.all()
    padded, flat = two_agents(dqn_agent)
    priority = padded.train(batch)["priority"]
    real = flat.train(real_steps(batch))["priority"]
    assert priority.shape == mask.shape
    assert torch.equal(priority[mask], real) and (priority[~mask] == 0).all()


def recurrent_dqn(burn_in: int = 0) -> TorchRLAgent:
    def make_loss(observation_space: Any, action_space: Any) -> DQNLoss:
        loss = DQNLoss(
            lstm_q_policy(observation_space, action_space), delay_value=True, action_space="one-hot"
        )
        loss.make_value_estimator(gamma=0.9)
        return loss

    return TorchRLAgent(
        OBS,
        DISCRETE,
        "cpu",
        loss=make_loss,
        updater=lambda loss: SoftUpdate(loss, tau=0.05),
        optimizer=lambda loss: torch.optim.Adam(loss.parameters(), 1e-3),
        extra_keys=[],
        burn_in=burn_in,
    )


def state_batch(batch_size: int = 16) -> Batch:
    memory = feed(
        ReplayMemory(memory_size=200, batch_size=batch_size, sequence_length=5, seed=0),
        act=discrete_act,
        extra=STATE,
        extras=stored_state,
    )
    batch: Batch = memory.sample()
    return batch


def loss_of(make: Any, batch: Batch) -> dict[str, Any]:
    torch.manual_seed(0)
    agent = make()
    return agent.train(batch)


def where(batch: Batch, steps: torch.Tensor, rew: float) -> Batch:
    """The batch with other rewards and observations at ``steps`` ([B, T] bool)."""
    obs = batch.obs.clone()
    obs[steps] = 1e3
    rewards = torch.where(steps, torch.full_like(batch.rew, rew), batch.rew)
    return batch._replace(rew=rewards, obs=obs)


def test_a_recurrent_loss_learns_nothing_from_padding_and_starts_from_the_stored_state() -> None:
    batch = state_batch()
    mask = batch.extra["mask"]
    assert not mask.all()
    agent = recurrent_dqn
    base = loss_of(agent, batch)
    assert np.isfinite(base["loss"]) and base["recurrent_steps_left_out"] == float(
        mask[~mask[:, 1]].sum()
    )
    assert loss_of(agent, where(batch, ~mask, 1e3))["loss"] == base["loss"]  # padding
    started = dict(batch.extra)
    started["recurrent_state_h"] = started["recurrent_state_h"] + 1.0
    assert loss_of(agent, batch._replace(extra=started))["loss"] != base["loss"]


def test_a_recurrent_loss_learns_nothing_from_burn_in_steps_but_runs_through_them() -> None:
    batch = state_batch()
    burn_in = torch.zeros_like(batch.extra["mask"])
    burn_in[:, :2] = True

    def agent() -> TorchRLAgent:
        return recurrent_dqn(burn_in=2)

    base = loss_of(agent, batch)
    changed = batch._replace(
        rew=torch.where(burn_in, torch.full_like(batch.rew, 1e3), batch.rew)
    )
    assert loss_of(agent, changed)["loss"] == base["loss"]  # no loss term from a burn-in step
    assert loss_of(agent, where(batch, burn_in, 0.0))["loss"] != base["loss"]  # its inputs count


def test_a_recurrent_losss_priorities_come_only_from_the_steps_it_learned_from() -> None:
    memory = feed(
        ReplayMemory(memory_size=200, batch_size=16, sequence_length=5, prioritized=True, seed=0),
        act=discrete_act,
        extra=STATE,
        extras=stored_state,
    )
    batch = memory.sample()
    mask = batch.extra["mask"]
    torch.manual_seed(0)
    priority = recurrent_dqn(burn_in=1).train(batch)["priority"]
    learned = mask.clone()
    learned[:, :1] = False
    learned[~mask[:, 1]] = False  # one-step sequences: no stored next state
    assert priority.shape == mask.shape
    assert (priority[~learned] == 0).all() and (priority[learned] != 0).all()


def test_a_recurrent_loss_refuses_a_batch_of_single_transitions() -> None:
    memory = feed(
        ReplayMemory(memory_size=200, batch_size=8, seed=0),
        act=discrete_act,
        extra=STATE,
        extras=stored_state,
    )
    with pytest.raises(ValueError, match=r"memory.sequence_length > 1"):
        recurrent_dqn().train(memory.sample())
