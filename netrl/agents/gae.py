"""Generalised advantage estimation (Schulman et al., "High-Dimensional Continuous Control
Using Generalized Advantage Estimation", 2016) over the flat rows of an on-policy batch, in the
order a RolloutMemory stores them.

A batch holds pieces of many envs' trajectories one after another; ``traj_ids`` (TorchRL's
collectors' key) says which rows are one contiguous piece of one env's trajectory. For
each row ``t`` (one transition)::

    delta_t = r_t + gamma * (1 - terminated_t) * V(next_obs_t) - V(obs_t)
    A_t     = delta_t + gamma * lambda * (1 - end_t) * A_{t+1}
    end_t   = terminated_t or truncated_t or traj_ids[t+1] != traj_ids[t] or t is the last row
    value_target_t = A_t + V(obs_t)

So an advantage never reaches across an episode or into another env's rows. ``V(next_obs_t)``
bootstraps at a truncation (a time limit) and at a fragment's end, where the episode goes
on; a termination never bootstraps.
"""

from __future__ import annotations

import torch

__all__ = ["gae", "trajectory_ends"]


def trajectory_ends(terminated: torch.Tensor, truncated: torch.Tensor, traj_ids: torch.Tensor) -> torch.Tensor:
    """True at rows after which the next row does not continue the same trajectory
    (``end_t`` above)."""
    ends = (terminated != 0) | (truncated != 0)
    ends[-1:] = True
    ends[:-1] |= traj_ids[1:] != traj_ids[:-1]
    return ends


def gae(rew: torch.Tensor, value: torch.Tensor, next_value: torch.Tensor, terminated: torch.Tensor,
        traj_end: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantage, value_target)`` for every row, each shaped like ``rew``
    (1-D), on its device, float32.

    Args:
        rew: the reward of each row's transition.
        value: ``V(obs_t)``, the critic's value of the row's observation (PPO: recorded
            when its action was chosen).
        next_value: ``V(next_obs_t)``; only read where it counts, so rows that terminate
            may hold anything finite.
        terminated: 1 where the transition ends the episode in a terminal state (no bootstrap).
        traj_end: ``end_t`` (see :func:`trajectory_ends`): the recursion restarts after these rows.

    The backward recursion runs on the CPU in float64, one Python step per row (about a microsecond
    each: 4 ms for a batch of 4,096); the deltas are computed vectorised.
    """
    cont = 1.0 - terminated.double()
    delta = (rew.double() + gamma * cont * next_value.double() - value.double()).tolist()
    carry = (gamma * lam * (1.0 - traj_end.double())).tolist()
    adv = [0.0] * len(delta)
    running = 0.0
    for t in range(len(delta) - 1, -1, -1):
        # carry is 0 at a trajectory's end: the sum restarts there
        running = delta[t] + carry[t] * running
        adv[t] = running
    advantage = torch.tensor(adv, dtype=torch.float64, device=rew.device)
    return advantage.float(), (advantage + value.double()).float()
