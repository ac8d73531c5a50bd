"""The squashed Gaussian MLP actor: SAC's policy for Box actions, and the base of the CNN actor.

``MLPActor`` keeps its tmrl path, ``netrl.agents.sac.MLPActor``; it lives here because the CNN
actor (:mod:`netrl.agents.cnn`) builds on it, and no agent imports another agent's module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
from torch import nn

from netrl.actor import ActorModule
from netrl.agents.common.distributions import squashed_gaussian
from netrl.agents.common.encoders import flat_obs, obs_dim
from netrl.agents.common.networks import mlp
from netrl.agents.registry import SAC, Supports

__all__ = ["MLPActor", "add_gaussian_head", "check_action_space"]


def check_action_space(supports: Supports, space: gymnasium.Space) -> None:
    """ValueError unless the algorithm that declares ``supports`` takes actions ``space``."""
    problem = supports.action_space_problem(space)
    if problem:
        raise ValueError(problem)


def add_gaussian_head(module: nn.Module, width: int, space: gymnasium.Space) -> None:
    """What :func:`squashed_gaussian` reads, on ``module``: linear layers ``mu`` and ``log_std``
    from ``width`` features, and buffers ``act_scale`` and ``act_bias`` of a Box ``space`` (``tanh``
    output in [-1, 1] times the scale plus the bias is an action within its bounds)."""
    if not isinstance(space, gymnasium.spaces.Box):
        raise ValueError(f"a squashed Gaussian acts in a Box action space (got {space})")
    act_dim = int(np.prod(space.shape))
    module.mu = nn.Linear(width, act_dim)
    module.log_std = nn.Linear(width, act_dim)
    low, high = (torch.as_tensor(x, dtype=torch.float32).reshape(-1)
                 for x in (space.low, space.high))
    module.register_buffer("act_scale", (high - low) / 2)
    module.register_buffer("act_bias", (high + low) / 2)


class MLPActor(ActorModule):
    """Squashed Gaussian policy: ``a = low + (tanh(u) + 1) / 2 * (high - low)``,
    ``u ~ N(mu(s), sigma(s))``."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space,
                 hidden_sizes: Sequence[int] = (256, 256)) -> None:
        super().__init__(observation_space, action_space)
        check_action_space(SAC, action_space)
        self.net = mlp([obs_dim(observation_space), *hidden_sizes])
        self.net.append(nn.ReLU())
        self.mu: nn.Linear
        self.log_std: nn.Linear
        self.act_scale: torch.Tensor
        self.act_bias: torch.Tensor
        add_gaussian_head(self, hidden_sizes[-1], action_space)

    def features(self, obs: Any) -> torch.Tensor:
        """Observation encoder; image actors override this with a CNN."""
        return self.net(flat_obs(obs))

    def forward(self, obs: Any, test: bool = False, with_logprob: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.features(obs)
        return squashed_gaussian(self.mu(h), self.log_std(h), self.act_scale, self.act_bias, test,
                                 with_logprob)

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        a, _ = self.forward(obs, test=test, with_logprob=False)
        # one action per observation
        return a.detach().cpu().numpy().reshape((-1, *(self.action_space.shape or ())))
