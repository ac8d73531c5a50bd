"""SAC: one step gives finite losses; truncation bootstraps; checkpoints round-trip; actions respect bounds."""

from __future__ import annotations

import io
import logging
import math

import gymnasium
import numpy as np
import pytest
import torch

from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.samples import Batch
from netrl.util import partial
from tests.fakes import ACT, OBS


def make_agent(**kw: object) -> SACAgent:
    torch.manual_seed(0)
    return SACAgent(OBS, ACT, "cpu", model_cls=partial(MLPActorCritic, hidden_sizes=(16, 16)), **kw)  # type: ignore[arg-type]


def batch(n: int = 8, terminated: float = 0.0, truncated: float = 0.0) -> Batch:
    g = torch.Generator().manual_seed(1)
    return Batch(torch.randn(n, 3, generator=g), torch.rand(n, 2, generator=g), torch.randn(n, generator=g),
                 torch.randn(n, 3, generator=g), torch.full((n,), terminated), torch.full((n,), truncated))


def test_one_training_step_gives_finite_losses_and_moves_the_weights() -> None:
    agent = make_agent()
    before = {k: v.clone() for k, v in agent.model.state_dict().items()}
    metrics = agent.train(batch())
    assert set(metrics) == {"loss_actor", "loss_critic", "entropy_coef", "loss_entropy_coef"}
    assert all(np.isfinite(v) for v in metrics.values())
    after = agent.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_truncation_bootstraps_but_termination_does_not() -> None:
    def critic_target_loss(**flags: float) -> float:
        agent = make_agent()
        return agent.train(batch(**flags))["loss_critic"]

    # truncated transitions use the same target as ordinary ones; terminated ones drop the bootstrap term
    assert critic_target_loss(truncated=1.0) == critic_target_loss()
    assert critic_target_loss(terminated=1.0) != critic_target_loss()


def test_state_dict_round_trip_resumes_identically() -> None:
    a = make_agent()
    a.train(batch())
    saved = io.BytesIO()
    torch.save(a.state_dict(), saved)  # what a checkpoint does: tensors only
    saved.seek(0)
    b = make_agent()
    b.load_state_dict(torch.load(saved, weights_only=True))
    torch.manual_seed(5)
    ma = a.train(batch())
    torch.manual_seed(5)
    mb = b.train(batch())
    assert ma == mb


def test_a_resume_trains_at_the_learning_rates_and_fixed_alpha_configured_now(
        caplog: pytest.LogCaptureFixture) -> None:
    # The optimizers' states carry their learning rates: loaded as they are, a run resumed with a lower one would
    # keep training at the old.
    a = make_agent(lr_actor=1e-3, lr_critic=1e-3, alpha=0.2, learn_entropy_coef=False)
    a.train(batch())
    b = make_agent(lr_actor=1e-5, lr_critic=2e-5, alpha=0.05, learn_entropy_coef=False)
    with caplog.at_level(logging.INFO, logger="netrl.agents.sac"):
        b.load_state_dict(a.state_dict())
    assert b.pi_optimizer.param_groups[0]["lr"] == 1e-5 and b.q_optimizer.param_groups[0]["lr"] == 2e-5
    assert math.isclose(b.log_alpha.exp().item(), 0.05, rel_tol=1e-6)
    assert b.pi_optimizer.state_dict()["state"]  # Adam's moments still come from the checkpoint
    assert "resumed with the configured lr_actor 0.001 -> 1e-05, lr_critic 0.001 -> 2e-05, alpha 0.2 -> 0.05" in (
        caplog.text)
    learned = make_agent()  # a learned alpha is the checkpoint's, not the configured start value
    learned.train(batch())
    c = make_agent(alpha=0.5)
    c.load_state_dict(learned.state_dict())
    assert torch.equal(c.log_alpha, learned.log_alpha)


def test_actions_stay_inside_the_action_space() -> None:
    actor = MLPActor(OBS, ACT, hidden_sizes=(8,))
    for _ in range(50):
        a = actor.act_(OBS.sample(), test=False)
        assert a.shape == (2,) and ACT.contains(a.astype(np.float32))
    assert np.array_equal(actor.act_(np.zeros(3, np.float32), test=True),
                          actor.act_(np.zeros(3, np.float32), test=True))


def test_tuple_observations_are_flattened() -> None:
    space = gymnasium.spaces.Tuple((gymnasium.spaces.Box(-1, 1, (2,)), gymnasium.spaces.Box(-1, 1, (2, 2))))
    agent = SACAgent(space, ACT, "cpu", model_cls=partial(MLPActorCritic, hidden_sizes=(8,)))
    o = (torch.randn(4, 2), torch.randn(4, 2, 2))
    m = agent.train(Batch(o, torch.rand(4, 2), torch.randn(4), o, torch.zeros(4), torch.zeros(4)))
    assert np.isfinite(m["loss_critic"])
