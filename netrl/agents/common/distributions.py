"""Action distributions: SAC's squashed Gaussian, PPO's Gaussian clipped to the action space, and a
categorical per branch of a discrete action space (DQN and PPO), with its action mask.

A discrete action space is a list of *branches*, one per action dimension (Tavakoli et al., "Action
Branching Architectures", 2018): ``Discrete(n)`` is one branch of ``n`` choices, ``MultiDiscrete``
one per entry of ``nvec``, ``MultiBinary(k)`` k branches of 2. A network outputs ``sum(sizes)``
values per observation, split by branch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium
import numpy as np
import torch
import torch.nn.functional as F

from netrl.agents.common.masks import check_allows_an_action

__all__ = ["LOG_SQRT_2PI", "LOG_STD_MAX", "LOG_STD_MIN", "action_branches", "branch_log_probs",
           "categorical_entropy", "categorical_log_prob", "clipped_gaussian_log_prob",
           "squashed_gaussian"]

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def squashed_gaussian(mu: torch.Tensor, log_std: torch.Tensor, act_scale: torch.Tensor,
                      act_bias: torch.Tensor, test: bool = False, with_logprob: bool = True
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SAC's policy sample: ``tanh`` of a Gaussian (its mean when ``test``), scaled to the action
    bounds, and its log-probability (None unless ``with_logprob``)."""
    log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    std = log_std.exp()
    u = mu if test else mu + std * torch.randn_like(mu)  # reparameterisation trick
    logp = None
    if with_logprob:
        logp = (-0.5 * ((u - mu) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # Change of variables through tanh, in the numerically stable form (Spinning Up, eq. 21 of
        # the paper).
        logp = (logp - (2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)
                - torch.log(act_scale).sum())
    return torch.tanh(u) * act_scale + act_bias, logp


def clipped_gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, a: torch.Tensor,
                              low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Log-probability of actions ``a`` clipped to ``[low, high]`` under the clipped Gaussian,
    summed over dimensions: the density inside the bounds, the tail mass at a bound (Fujita and
    Maeda, "Clipped Action Policy Gradient", 2018)."""
    log_std = log_std.expand_as(mean)
    std = log_std.exp()
    inside = -0.5 * ((a - mean) / std) ** 2 - log_std - LOG_SQRT_2PI
    # A bound that is infinite is never hit; it is replaced by 0 so that no inf reaches a gradient
    # through where
    at_low = torch.isfinite(low) & (a <= low)
    at_high = torch.isfinite(high) & (a >= high)
    finite_low = torch.where(torch.isfinite(low), low, 0.0)
    finite_high = torch.where(torch.isfinite(high), high, 0.0)
    # P(sample <= low): all of it lands on the bound
    below = torch.special.log_ndtr((finite_low - mean) / std)
    above = torch.special.log_ndtr((mean - finite_high) / std)
    return torch.where(at_low, below, torch.where(at_high, above, inside)).sum(-1)


def action_branches(space: gymnasium.Space) -> tuple[list[int], np.ndarray]:
    """The number of choices of each branch of a discrete action space, and the value of each
    branch's first choice."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return [int(space.n)], np.array([int(space.start)], np.int64)
    if isinstance(space, gymnasium.spaces.MultiDiscrete):
        starts = np.asarray(space.start, np.int64).reshape(-1)
        return [int(n) for n in space.nvec.reshape(-1)], starts
    if isinstance(space, gymnasium.spaces.MultiBinary):
        return [2] * int(np.prod(space.shape)), np.zeros(int(np.prod(space.shape)), np.int64)
    raise ValueError(f"{space} has no branches: it is not a Discrete, MultiDiscrete or MultiBinary "
                     "space")


def branch_log_probs(logits: torch.Tensor, mask: torch.Tensor | None, sizes: Sequence[int]
                     ) -> list[torch.Tensor]:
    """Each branch's log-probabilities from ``(batch, sum(sizes))`` logits, masked choices at the
    float's lowest value (probability 0); ValueError where a mask allows no choice in a branch."""
    if mask is not None:
        check_allows_an_action(mask, sizes)
        logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    return [torch.log_softmax(part, -1) for part in torch.split(logits, list(sizes), -1)]


def categorical_log_prob(parts: Sequence[torch.Tensor], choice: torch.Tensor) -> torch.Tensor:
    """``(batch,)``: the log-probability of ``choice`` (``(batch, branches)``), summed over the
    branches."""
    return torch.stack([lp.gather(1, choice[:, b:b + 1]).squeeze(1) for b, lp in enumerate(parts)],
                       -1).sum(-1)


def categorical_entropy(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``(batch,)``: the entropy of the branches' categoricals together (the sum of theirs)."""
    return torch.stack([-(lp.exp() * lp).sum(-1) for lp in parts], -1).sum(-1)
