"""Proximal Policy Optimization with a clipped surrogate, in one file.

Schulman et al., "Proximal Policy Optimization Algorithms" (2017), https://arxiv.org/abs/1707.06347.
Read :meth:`PPOAgent.train` against Algorithm 1 of the paper, with the details of Stable-Baselines3
and CleanRL (Huang et al., "The 37 Implementation Details of PPO", 2022): advantages normalised per
minibatch, value loss optionally clipped around the value recorded at action time, an entropy bonus,
gradients clipped by global norm, Adam with eps 1e-5, orthogonal initialisation, separate tanh
MLPs for the policy and the value.

On-policy: PPO trains on one batch collected under one weight version (``trainer.collection``
"sync" and a RolloutMemory), calling ``train(batch)`` once per batch and running ``n_epochs`` of
minibatches inside. The :class:`PPOActor` the workers run returns two extra outputs with each action
(TorchRL's keys), recorded per row and handed back in ``batch.extra``::

    action_log_prob   log pi_old(a|s) of the action taken -> the ratio pi / pi_old
    state_value       V_old(s) of the observation it was chosen from -> GAE, and the value
                      clipping's anchor
    traj_ids          (added by the memory) rows with equal ids are one piece of one env's
                      trajectory

Actions: ``Box`` (a Gaussian with a state-independent log std) and ``Discrete``, ``MultiDiscrete``,
``MultiBinary`` (a categorical per branch, as DQN's branches; an ``"action_mask"`` entry of a
Dict observation is respected: a masked choice has probability 0, in sampling and in the
log-probabilities the loss sees). A Gaussian sample is clipped to the space on the worker, and the
packet stores the clipped action, as the trainer's value limits require; its log-probability is
therefore that of the *clipped* action under the clipped Gaussian (Fujita and Maeda, "Clipped Action
Policy Gradient", 2018: the density inside the bounds, the tail mass at a bound), which the trainer
recomputes exactly, so the ratio compares like with like.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
from torch import nn

from netrl.actor import ActorModule
from netrl.agents.base import TrainingAgent
from netrl.agents.common.actors import check_action_space
from netrl.agents.common.distributions import (
    LOG_SQRT_2PI,
    action_branches,
    branch_log_probs,
    categorical_entropy,
    categorical_log_prob,
    clipped_gaussian_log_prob,
)
from netrl.agents.common.encoders import ObsEncoder
from netrl.agents.common.masks import action_mask, check_mask_space
from netrl.agents.common.networks import tanh_mlp
from netrl.agents.compiled import CompileMode, check_compile, compile_fn, step_begin
from netrl.agents.gae import gae, trajectory_ends
from netrl.agents.registry import PPO
from netrl.samples.batch import Batch
from netrl.samples.columns import tree_map

__all__ = ["EXTRAS", "PPOActor", "PPOAgent"]

# what PPOActor records per row; the memory adds "traj_ids"
EXTRAS = ("action_log_prob", "state_value")


class PPOActor(ActorModule):
    """Policy and value of PPO; the workers run it and record its extra outputs
    (module docstring)."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space,
                 hidden_sizes: Sequence[int] = (64, 64), log_std_init: float = 0.0) -> None:
        super().__init__(observation_space, action_space)
        check_action_space(PPO, action_space)
        self.continuous = isinstance(action_space, gymnasium.spaces.Box)
        if self.continuous:
            box = action_space
            assert isinstance(box, gymnasium.spaces.Box)
            n_out = int(np.prod(box.shape))
            low, high = (torch.as_tensor(np.asarray(b, np.float32).reshape(-1)) for b in (box.low, box.high))
            self.log_std = nn.Parameter(torch.full((n_out,), float(log_std_init)))
            self.low: torch.Tensor
            self.high: torch.Tensor
            self.register_buffer("low", low)
            self.register_buffer("high", high)
            self._shape: tuple[int, ...] = tuple(box.shape)
        else:
            self.sizes, starts = action_branches(action_space)
            n_out = sum(self.sizes)
            self.starts: torch.Tensor
            self.register_buffer("starts", torch.as_tensor(starts))
            self._shape = tuple(action_space.shape or ())
            check_mask_space(observation_space, n_out)
        self._dtype = action_space.dtype
        self.encoder = ObsEncoder(observation_space, PPO.label)  # the action mask is not an input
        self.pi = tanh_mlp(self.encoder.dim, hidden_sizes, n_out, 0.01)  # near-uniform first policy
        self.vf = tanh_mlp(self.encoder.dim, hidden_sizes, 1, 1.0)

    def extra_outputs(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {name: ((), "float32") for name in EXTRAS}

    def value(self, obs: Any) -> torch.Tensor:
        """``V(obs)``, shaped ``(B,)``."""
        return self.vf(self.encoder(obs)).squeeze(-1)

    # -- distributions -----------------------------------------------------------------------------
    def _logits(self, obs: Any, h: torch.Tensor) -> list[torch.Tensor]:
        """Each branch's log-probabilities, masked choices at probability 0."""
        return branch_log_probs(self.pi(h), action_mask(obs), self.sizes)

    def _box_log_prob(self, mean: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Log-probability of (clipped) actions ``a``, summed over dimensions."""
        return clipped_gaussian_log_prob(mean, self.log_std, a, self.low, self.high)

    def log_prob_entropy(self, obs: Any, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log pi(act|obs), entropy of pi(.|obs))``, each ``(B,)``; ``act`` as
        the packets store it."""
        h = self.encoder(obs)
        n = h.shape[0]
        if self.continuous:
            mean = self.pi(h)
            # the Gaussian's (the clip's is lower)
            entropy = (self.log_std + 0.5 + LOG_SQRT_2PI).sum().expand(n)
            return self._box_log_prob(mean, act.reshape(n, -1).float()), entropy
        choice = act.reshape(n, -1).long() - self.starts
        parts = self._logits(obs, h)
        return categorical_log_prob(parts, choice), categorical_entropy(parts)

    def act(self, obs: Any, test: bool = False) -> Any:
        """``(actions, extras)``: ``B`` actions shaped ``(B, *action_space.shape)``, and
        ``{"action_log_prob", "state_value"}``, each ``(B,)`` float32. Test episodes take the mean
        (Box) or the likeliest allowed choice."""
        with torch.no_grad():
            h = self.encoder(obs)
            value = self.vf(h).squeeze(-1)
            if self.continuous:
                mean = self.pi(h)
                u = mean if test else mean + self.log_std.exp() * torch.randn_like(mean)
                # the space's bounds; log-prob of the clipped action
                a = torch.clamp(u, self.low, self.high)
                logp = self._box_log_prob(mean, a)
                actions = a.cpu().numpy().reshape(h.shape[0], *self._shape).astype(self._dtype)
            else:
                parts = self._logits(obs, h)
                if test:
                    choice = torch.stack([lp.argmax(-1) for lp in parts], -1)
                else:
                    choice = torch.stack([torch.multinomial(lp.exp(), 1).squeeze(-1) for lp in parts], -1)
                logp = categorical_log_prob(parts, choice)
                actions = (choice + self.starts).cpu().numpy().reshape(h.shape[0], *self._shape).astype(self._dtype)
        extras = {"action_log_prob": logp.float().cpu().numpy(), "state_value": value.float().cpu().numpy()}
        return actions, extras


def _take(tree: Any, idx: torch.Tensor) -> Any:
    """Rows ``idx`` of every leaf of a batch of observations."""
    return tree_map(lambda x: x[idx], tree)


def _mean(x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    return x.mean() if w is None else (x * w).sum() / w.sum().clamp_min(1e-8)


class PPOAgent(TrainingAgent):
    """PPO-clip; the arguments a pipeline sets come from ``config.json``'s ``agent.ppo`` section
    (and ``agent.gamma``, ``agent.hidden_sizes``).

    Args:
        n_epochs: passes over each batch; minibatch_size: transitions per gradient step (the last
            one of a pass takes what is left).
        clip_range: the surrogate's epsilon; clip_range_vf: None (no value clipping) or the
            epsilon of the value around the one recorded at action time.
        anneal_frames: None, or the number of trained transitions over which the learning rate and
            clip_range fall linearly to 0 (RL Zoo's ``lin_`` schedules over ``n_timesteps``).
    """

    supports = PPO  # on-policy: RolloutMemory batches only (netrl.pipelines.make refuses others)

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space, device: str = "cpu",
                 hidden_sizes: Sequence[int] = (64, 64), gamma: float = 0.99, gae_lambda: float = 0.95,
                 lr: float = 3e-4, n_epochs: int = 10, minibatch_size: int = 64, clip_range: float = 0.2,
                 clip_range_vf: float | None = None, ent_coef: float = 0.0, vf_coef: float = 0.5,
                 max_grad_norm: float = 0.5, normalize_advantage: bool = True, anneal_frames: int | None = None,
                 log_std_init: float = 0.0, compile: CompileMode = "none") -> None:
        check_compile(compile, device, f"{type(self).__name__}(compile=...)")
        super().__init__(observation_space, action_space, device)
        self.actor = PPOActor(observation_space, action_space, hidden_sizes, log_std_init).to(device)
        self.optimizer = torch.optim.Adam(self.actor.parameters(), lr=lr, eps=1e-5)
        self.gamma, self.gae_lambda, self.lr, self.n_epochs = gamma, gae_lambda, lr, n_epochs
        self.minibatch_size, self.clip_range, self.clip_range_vf = minibatch_size, clip_range, clip_range_vf
        self.ent_coef, self.vf_coef, self.max_grad_norm = ent_coef, vf_coef, max_grad_norm
        self.normalize_advantage, self.anneal_frames = normalize_advantage, anneal_frames
        # tensors: a step that goes non-finite undoes them too
        self.frames = torch.zeros((), dtype=torch.int64)
        self.updates = torch.zeros((), dtype=torch.int64)
        self.compile = compile
        self._minibatch_loss = compile_fn(self.minibatch_loss, compile)

    def get_actor(self) -> ActorModule:
        return self.actor

    def _extras(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        missing = [k for k in (*EXTRAS, "traj_ids") if k not in batch.extra]
        if missing:
            raise ValueError(f"PPOAgent.train needs batch.extra {missing} (it has "
                             f"{sorted(batch.extra)}): PPO trains on a RolloutMemory's batches "
                             f'(trainer.collection "{PPO.collection}") of a PPOActor\'s samples')
        return (batch.extra["action_log_prob"].float(), batch.extra["state_value"].float(),
                batch.extra["traj_ids"])

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE ``(advantage, value_target)`` of every transition of ``batch``
        (see :mod:`netrl.agents.gae`)."""
        _, value, traj_ids = self._extras(batch)
        ends = trajectory_ends(batch.terminated, batch.truncated, traj_ids)
        next_value = torch.zeros_like(value)
        # within a piece, next_obs is the next row's obs: its value was recorded
        next_value[:-1] = value[1:]
        # Where a piece ends but the episode goes on (a truncation, a fragment's end), bootstrap
        # with the critic. The weights are still the version that collected the batch, so this is
        # the value a worker would record.
        boot = torch.nonzero(ends & (batch.terminated == 0)).flatten()
        if len(boot):
            with torch.no_grad():
                next_value[boot] = self.actor.value(_take(batch.next_obs, boot)).float()
        return gae(batch.rew.float(), value, next_value, batch.terminated.float(), ends, self.gamma, self.gae_lambda)

    def minibatch_loss(self, obs: Any, act: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                       old_value: torch.Tensor, value_target: torch.Tensor, w: torch.Tensor | None,
                       clip: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, [loss_pi, loss_v, entropy, approx_kl, clip_fraction])`` of one minibatch
        (what ``compile`` compiles). ``clip`` is a tensor, so that an annealed clip range does
        not recompile each batch."""
        logp, entropy = self.actor.log_prob_entropy(obs, act)
        if self.normalize_advantage and adv.shape[0] > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        log_ratio = logp - old_logp
        ratio = log_ratio.exp()
        # The clipped surrogate: the pessimistic one of the two, so no step gains by
        # moving ratio past 1 +- clip
        loss_pi = -_mean(torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv), w)
        value = self.actor.value(obs)
        # SB3's: the new value stays near the one recorded at action time
        if self.clip_range_vf is not None:
            value = old_value + torch.clamp(value - old_value, -self.clip_range_vf, self.clip_range_vf)
        loss_v = _mean((value_target - value) ** 2, w)
        loss_ent = _mean(entropy, w)
        loss = loss_pi + self.vf_coef * loss_v - self.ent_coef * loss_ent
        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean()  # Schulman's low-variance estimator
            clip_fraction = ((ratio - 1).abs() > clip).float().mean()
            stats = torch.stack([loss_pi, loss_v, loss_ent, approx_kl, clip_fraction]).detach()
        return loss, stats

    def train(self, batch: Batch) -> dict[str, float]:
        old_logp, old_value, _ = self._extras(batch)
        advantage, value_target = self.advantages(batch)
        n = int(batch.rew.shape[0])
        self.frames += n
        remaining = 1.0 if self.anneal_frames is None else max(0.0, 1.0 - int(self.frames) / self.anneal_frames)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr * remaining
        clip = self.clip_range * remaining
        clip_t = torch.tensor(clip, device=batch.rew.device)
        weight = batch.weight.float() if batch.weight is not None else None
        # read once, after the last minibatch
        sums = torch.zeros(5, dtype=torch.float64, device=batch.rew.device)
        steps = 0
        for _ in range(self.n_epochs):
            order = torch.randperm(n, device=batch.rew.device)
            for start in range(0, n, self.minibatch_size):
                idx = order[start:start + self.minibatch_size]
                # each minibatch replays the graph: the last one's outputs are done with
                step_begin(self.compile)
                loss, stats = self._minibatch_loss(
                    _take(batch.obs, idx), batch.act[idx], old_logp[idx], advantage[idx], old_value[idx],
                    value_target[idx], weight[idx] if weight is not None else None, clip_t)
                self.optimizer.zero_grad(set_to_none=True)
                torch.autograd.backward(loss)
                nn.utils.clip_grad_norm_(self.actor.parameters(), self.max_grad_norm)
                self.optimizer.step()
                sums += stats
                steps += 1
        self.updates += 1
        names = ("loss_pi", "loss_v", "entropy", "approx_kl", "clip_fraction")
        metrics = {k: v / max(steps, 1) for k, v in zip(names, sums.tolist(), strict=True)}
        with torch.no_grad():
            var = value_target.var()
            explained = 1.0 - (value_target - old_value).var() / var if var > 0 else torch.tensor(0.0)
        return {**metrics, "minibatch_steps": float(steps), "explained_variance": float(explained),
                "lr": self.lr * remaining}

    def state_dict(self) -> dict[str, Any]:
        return {"actor": self.actor.state_dict(), "optimizer": self.optimizer.state_dict(),
                "frames": self.frames.clone(), "updates": self.updates.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.frames.copy_(state["frames"])
        self.updates.copy_(state["updates"])
