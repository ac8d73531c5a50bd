"""SAC's update as a plain single-file script, in the structure of CleanRL's
``sac_continuous_action.py``: the baseline the trainer family (benchmarks/trainer.py) measures
netrl's trainer against, in the same run.

As CleanRL writes it: an actor and two separate ``SoftQNetwork`` critics with target copies, Adam
on the actor, on both critics together and on log alpha, the policy and alpha updated every step
(``policy_frequency`` 1), the targets every step (``target_network_frequency`` 1) with a Python
loop over the parameters, and each batch drawn from a NumPy replay buffer and copied to the device
as SB3's ``ReplayBuffer.sample`` does. No environment: the bench times gradient steps on a buffer
filled with random transitions of Pendulum's shapes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

LOG_STD_MAX, LOG_STD_MIN = 2, -5  # CleanRL's bounds


class SoftQNetwork(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(obs_dim + act_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x, a], 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        out: torch.Tensor = self.fc3(x)
        return out


class Actor(nn.Module):
    action_scale: torch.Tensor  # buffers, registered below
    action_bias: torch.Tensor

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, low: float, high: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc_mean = nn.Linear(hidden, act_dim)
        self.fc_logstd = nn.Linear(hidden, act_dim)
        self.register_buffer("action_scale", torch.full((act_dim,), (high - low) / 2.0))
        self.register_buffer("action_bias", torch.full((act_dim,), (high + low) / 2.0))

    def get_action(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        mean = self.fc_mean(x)
        log_std = torch.tanh(self.fc_logstd(x))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
        normal = torch.distributions.Normal(mean, log_std.exp())
        x_t = normal.rsample()
        y_t = torch.tanh(x_t)
        action = y_t * self.action_scale + self.action_bias
        log_prob = normal.log_prob(x_t)  # type: ignore[no-untyped-call]
        log_prob -= torch.log(self.action_scale * (1 - y_t.pow(2)) + 1e-6)
        mean_action = torch.tanh(mean) * self.action_scale + self.action_bias
        return action, log_prob.sum(1, keepdim=True), mean_action


def rounds(steps: int, batch_size: int = 256, hidden: int = 256, obs_dim: int = 3,
           act_dim: int = 1, buffer_size: int = 10_000, device: str = "cpu",
           seed: int = 1) -> Iterator[dict[str, float]]:
    """Rounds of ``steps`` gradient steps of CleanRL's SAC update, each yielding
    ``{"steps_per_s", "wall_s"}`` (the first is warm-up), so that a bench can interleave them with
    the rounds it compares them to."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    gamma, tau, lr_q, lr_pi = 0.99, 0.005, 1e-3, 1e-3
    actor = Actor(obs_dim, act_dim, hidden, -2.0, 2.0).to(device)
    qf1 = SoftQNetwork(obs_dim, act_dim, hidden).to(device)
    qf2 = SoftQNetwork(obs_dim, act_dim, hidden).to(device)
    qf1_target = SoftQNetwork(obs_dim, act_dim, hidden).to(device)
    qf2_target = SoftQNetwork(obs_dim, act_dim, hidden).to(device)
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_optimizer = optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=lr_q)
    actor_optimizer = optim.Adam(list(actor.parameters()), lr=lr_pi)
    target_entropy = -float(act_dim)
    log_alpha = torch.zeros(1, requires_grad=True, device=device)
    alpha = log_alpha.exp().item()
    a_optimizer = optim.Adam([log_alpha], lr=lr_q)

    # the replay buffer: NumPy arrays, as SB3's ReplayBuffer that CleanRL uses
    obs = rng.uniform(-1, 1, (buffer_size, obs_dim)).astype(np.float32)
    next_obs = rng.uniform(-1, 1, (buffer_size, obs_dim)).astype(np.float32)
    actions = rng.uniform(-2, 2, (buffer_size, act_dim)).astype(np.float32)
    rewards = rng.normal(size=(buffer_size, 1)).astype(np.float32)
    dones = (rng.random((buffer_size, 1)) < 0.005).astype(np.float32)

    def update() -> None:
        nonlocal alpha
        idx = rng.integers(0, buffer_size, batch_size)
        b_obs = torch.as_tensor(obs[idx], device=device)
        b_next = torch.as_tensor(next_obs[idx], device=device)
        b_act = torch.as_tensor(actions[idx], device=device)
        b_rew = torch.as_tensor(rewards[idx], device=device)
        b_done = torch.as_tensor(dones[idx], device=device)
        with torch.no_grad():
            next_state_actions, next_state_log_pi, _ = actor.get_action(b_next)
            qf1_next_target = qf1_target(b_next, next_state_actions)
            qf2_next_target = qf2_target(b_next, next_state_actions)
            min_qf_next_target = (torch.min(qf1_next_target, qf2_next_target)
                                  - alpha * next_state_log_pi)
            next_q_value = (b_rew.flatten()
                            + (1 - b_done.flatten()) * gamma * min_qf_next_target.view(-1))
        qf1_a_values = qf1(b_obs, b_act).view(-1)
        qf2_a_values = qf2(b_obs, b_act).view(-1)
        qf_loss = F.mse_loss(qf1_a_values, next_q_value) + F.mse_loss(qf2_a_values, next_q_value)
        q_optimizer.zero_grad()
        qf_loss.backward()  # type: ignore[no-untyped-call]  # torch's stubs leave it untyped
        q_optimizer.step()

        pi, log_pi, _ = actor.get_action(b_obs)
        min_qf_pi = torch.min(qf1(b_obs, pi), qf2(b_obs, pi))
        actor_loss = ((alpha * log_pi) - min_qf_pi).mean()
        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        with torch.no_grad():
            _, log_pi, _ = actor.get_action(b_obs)
        alpha_loss = (-log_alpha.exp() * (log_pi + target_entropy)).mean()
        a_optimizer.zero_grad()
        alpha_loss.backward()  # type: ignore[no-untyped-call]
        a_optimizer.step()
        alpha = log_alpha.exp().item()

        for param, target_param in zip(qf1.parameters(), qf1_target.parameters(), strict=True):
            target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)
        for param, target_param in zip(qf2.parameters(), qf2_target.parameters(), strict=True):
            target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)
        qf_loss.item()  # CleanRL logs its losses (every 100 steps): a read keeps the device in step

    while True:
        start = time.perf_counter()
        for _ in range(steps):
            update()
        wall = time.perf_counter() - start
        yield {"steps_per_s": steps / wall, "wall_s": wall}
