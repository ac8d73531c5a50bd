"""Recurrent SAC: a GRU or LSTM over an MLP encoder, trained on sequences,
for partially observed envs.

The actor reads each observation through an encoder (an MLP over every leaf, tuples too: the
drone's; or, with ``encoder="cnn"``, the CNN of :class:`~netrl.agents.common.encoders.ConvEncoder`
over stacked frames: the image pipeline's) and a recurrent core; its features ``z_t``
summarise every observation of the episode so far. The worker keeps the core's state per env
and records the state that entered each step (:mod:`netrl.actor`), so a sampled sequence starts
from the state the worker really had (R2D2, Kapturowski et al. 2019, "stored state"), and the
first ``burn_in`` steps run the core without gradient to refresh it, masked out of every loss.
Design, as in SAC-AE / DrQ for a shared encoder:

* the twin critics read ``(z_t, a_t)``: the critic loss trains the encoder and the core (the
  features must hold what Q needs, e.g. a velocity the observation leaves out);
* the policy head reads ``z_t`` detached: the actor loss trains the head only;
* target critics read the features of a target copy of the encoder and core (Polyak-averaged with
  the critics), unrolled from the same recorded state.

A batch is ``[B, L]`` (``memory.sequence_length`` L) with ``batch.extra["mask"]``. The core unrolls
over L + n consecutive observations: the L of ``obs``, then those past the sequence, which are the
``next_obs`` of its last steps (n = 1: ``next_obs[:, -1]``). With n-step returns
(``memory.n_step``) step j's ``next_obs`` is m steps on (``extra["steps_to_next_obs"]``, m <= n <=
L), so step j bootstraps from the features at j + m with ``extra["discount"]`` (gamma ** m) times
1 - terminated, as :class:`~netrl.agents.sac.SACAgent` per transition; ``truncated`` never stops
bootstrapping. Each step's loss is weighted by ``batch.weight`` (importance and stale weights),
averaged over the real steps after the burn-in. From a prioritized memory (``extra["index"]``)
``metrics["priority"]`` is each step's |TD error| ``[B, L]``, 0 at burn-in and padded steps; the
memory mixes them into its start's priority as R2D2 does.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any, Literal

import gymnasium
import numpy as np
import torch
from torch import nn

from netrl.actor import ActorModule
from netrl.agents.base import TrainingAgent
from netrl.agents.common.actors import add_gaussian_head, check_action_space
from netrl.agents.common.distributions import squashed_gaussian
from netrl.agents.common.encoders import ConvEncoder, EncoderHead, flat_obs, obs_dim
from netrl.agents.common.networks import TwinQ, mlp
from netrl.agents.registry import RECURRENT_SAC
from netrl.samples.batch import Batch
from netrl.samples.columns import ExtraSpec, tree_map

__all__ = ["RecurrentActor", "RecurrentSACAgent"]

Cell = Literal["gru", "lstm"]
Encoder = Literal["mlp", "cnn"]


class RecurrentActor(ActorModule):
    """Squashed Gaussian policy over a GRU or LSTM: encoder ``hidden_sizes[0]``, core of
    ``hidden_sizes[-1]`` units, head ``hidden_sizes[1:]``. Its state per env: ``recurrent_state``
    (GRU) or ``recurrent_state_h`` and ``recurrent_state_c`` (LSTM), each ``(1, hidden)``: TorchRL's
    names and (layers, hidden) layout. ``encoder``: ``"mlp"`` (every observation leaf flattened)
    or ``"cnn"`` (a :class:`~netrl.agents.common.encoders.ConvEncoder` of ``hidden_sizes[0]``
    features, ``head`` its head, over ``(stack, height, width)`` uint8 frames)."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space,
                 hidden_sizes: Sequence[int] = (256, 256), cell: Cell = "gru", encoder: Encoder = "mlp",
                 head: EncoderHead = "keypoints") -> None:
        super().__init__(observation_space, action_space)
        check_action_space(RECURRENT_SAC, action_space)
        if cell not in ("gru", "lstm"):
            raise ValueError(f'cell must be "gru" or "lstm" (got '
                             f'{cell!r}; config.json: agent.recurrent)')
        if encoder not in ("mlp", "cnn"):
            raise ValueError(f'encoder must be "mlp" or "cnn" (got {encoder!r})')
        self.cell, self.conv = cell, encoder == "cnn"
        width, self.hidden = hidden_sizes[0], hidden_sizes[-1]
        self.encoder: nn.Module = (ConvEncoder(observation_space, width, head=head) if self.conv else
                                   nn.Sequential(nn.Linear(obs_dim(observation_space), width), nn.ReLU()))
        self.core: nn.GRU | nn.LSTM = (nn.GRU if cell == "gru" else nn.LSTM)(width, self.hidden, batch_first=True)
        layers = list(hidden_sizes[1:]) or [self.hidden]
        self.head = mlp([self.hidden, *layers])
        self.head.append(nn.ReLU())
        self.mu: nn.Linear
        self.log_std: nn.Linear
        self.act_scale: torch.Tensor
        self.act_bias: torch.Tensor
        add_gaussian_head(self, layers[-1], action_space)

    def recurrent_state(self) -> ExtraSpec:
        names = ["recurrent_state"] if self.cell == "gru" else ["recurrent_state_h", "recurrent_state_c"]
        return {name: ((1, self.hidden), "float32") for name in names}

    def unroll(self, obs: Any, state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Features ``[B, T, hidden]`` for observations ``[B, T, ...]`` from ``state`` (leaves
        ``[B, 1, hidden]``), and the state after the last one."""
        b, t = _lead(obs)
        rows = tree_map(lambda o: o.reshape(b * t, *o.shape[2:]), obs)
        x = self.encoder(rows if self.conv else flat_obs(rows)).reshape(b, t, -1)
        if self.cell == "gru":
            z, h = self.core(x, state["recurrent_state"].transpose(0, 1).contiguous())
            return z, {"recurrent_state": h.transpose(0, 1)}
        hc = tuple(state[k].transpose(0, 1).contiguous() for k in ("recurrent_state_h", "recurrent_state_c"))
        z, (h, c) = self.core(x, hc)
        return z, {"recurrent_state_h": h.transpose(0, 1), "recurrent_state_c": c.transpose(0, 1)}

    def policy(self, z: torch.Tensor, test: bool = False, with_logprob: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Actions (and their log-probabilities) from features ``z`` of any leading shape."""
        h = self.head(z)
        return squashed_gaussian(self.mu(h), self.log_std(h), self.act_scale, self.act_bias, test, with_logprob)

    def initial(self, batch: int) -> dict[str, torch.Tensor]:
        return {k: torch.zeros(batch, *shape, device=self.device) for k, (shape, _) in self.recurrent_state().items()}

    def act(self, obs: Any, state: dict[str, torch.Tensor] | None = None,  # type: ignore[override]
            test: bool = False) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
        """One step for a batch of observations ``(B, ...)``: actions and the next
        state (None: from zeros)."""
        b = _lead(obs, 1)[0]
        z, new_state = self.unroll(tree_map(lambda o: o.unsqueeze(1), obs), state or self.initial(b))
        a, _ = self.policy(z[:, 0], test=test, with_logprob=False)
        return a.detach().cpu().numpy().reshape((-1, *(self.action_space.shape or ()))), new_state


class RecurrentSACAgent(TrainingAgent):
    """SAC v2 on sequences with a recurrent actor (see the module).
    ``burn_in``: ``memory.burn_in``; ``encoder``, ``head``: :class:`RecurrentActor`'s."""

    supports = RECURRENT_SAC

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space, device: str = "cpu",
                 hidden_sizes: Sequence[int] = (256, 256), cell: Cell = "gru", encoder: Encoder = "mlp",
                 head: EncoderHead = "keypoints", burn_in: int = 0, gamma: float = 0.99,
                 polyak: float = 0.995, alpha: float = 0.2, lr_actor: float = 1e-3, lr_critic: float = 1e-3,
                 lr_entropy: float = 1e-3, learn_entropy_coef: bool = True,
                 target_entropy: float | None = None) -> None:
        super().__init__(observation_space, action_space, device)
        self.actor = RecurrentActor(observation_space, action_space, hidden_sizes, cell, encoder, head).to(device)
        act_dim = int(np.prod(action_space.shape or ()))
        self.critic = TwinQ(self.actor.hidden + act_dim, hidden_sizes).to(device)
        # its encoder and core give target features
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.burn_in, self.gamma, self.polyak, self.learn_entropy_coef = burn_in, gamma, polyak, learn_entropy_coef
        shared = [*self.actor.encoder.parameters(), *self.actor.core.parameters()]
        policy = [*self.actor.head.parameters(), *self.actor.mu.parameters(), *self.actor.log_std.parameters()]
        self.q_optimizer = torch.optim.Adam([*self.critic.parameters(), *shared], lr=lr_critic)
        self.pi_optimizer = torch.optim.Adam(policy, lr=lr_actor)
        self.target_entropy = -float(act_dim) if target_entropy is None else float(target_entropy)
        self.log_alpha = torch.tensor([math.log(alpha)], device=device, requires_grad=learn_entropy_coef)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=lr_entropy)
        self._q_params = list(self.critic.parameters())
        self._online: list[torch.Tensor] = [*self.critic.parameters(), *self.actor.parameters()]
        self._targets: list[torch.Tensor] = [*self.critic_target.parameters(), *self.actor_target.parameters()]

    def get_actor(self) -> ActorModule:
        return self.actor

    def _check(self, batch: Batch) -> None:
        need = ["mask", *self.actor.recurrent_state()]
        missing = [k for k in need if k not in batch.extra]
        if missing:
            raise ValueError(f"{type(self).__name__} learns from sequences that carry "
                             f"the actor's recurrent state, but the batch's extras lack "
                             f"{missing}: use a ReplayMemory with sequence_length >= 2 "
                             f"(config.json: memory.sequence_length), which stores "
                             f"the state the workers record with each step; a memory "
                             f"that stores no state cannot train a recurrent actor")
        if batch.extra["mask"].shape[1] <= self.burn_in:
            raise ValueError(f"sequences of {batch.extra['mask'].shape[1]} steps "
                             f"leave none after the burn-in of {self.burn_in} "
                             f"(memory.burn_in must be < memory.sequence_length)")

    def train(self, batch: Batch) -> dict[str, Any]:
        self._check(batch)
        bi, mask = self.burn_in, batch.extra["mask"]
        length = mask.shape[1]
        steps = batch.extra.get("steps_to_next_obs")  # n-step: each step's window length m
        if steps is None:
            steps = torch.ones_like(mask, dtype=torch.int64)
        n = int(steps.max())
        if n > length:
            raise ValueError(f"n-step windows of {n} steps reach past sequences of {length}: the "
                             f"observations in between are in no step of the batch; use "
                             f"memory.n_step <= memory.sequence_length")
        # step j bootstraps from the observation at stream position j + m (next_obs[:, j])
        ends = torch.arange(length, device=steps.device) + steps
        seq = _stream(batch.obs, batch.next_obs, mask, ends, n)  # [B, L + n, ...]
        state = {k: batch.extra[k][:, 0] for k in self.actor.recurrent_state()}
        target_state = state
        # R2D2's burn-in: the recorded state is refreshed by the current networks, without gradient
        if bi:
            with torch.no_grad():
                warm = tree_map(lambda o: o[:, :bi], seq)
                _, state = self.actor.unroll(warm, state)
                _, target_state = self.actor_target.unroll(warm, target_state)
            seq = tree_map(lambda o: o[:, bi:], seq)
        real = mask[:, bi:].float()
        count = real.sum().clamp(min=1.0)
        # importance (and stale-row) weights scale each step's loss, as SACAgent's: a mean over the
        # real steps, not a weighted mean (that would undo the correction)
        weight = real if batch.weight is None else real * batch.weight[:, bi:]
        act, rew, term = batch.act[:, bi:], batch.rew[:, bi:], batch.terminated[:, bi:]
        discount: torch.Tensor | float = self.gamma  # gamma ** m per step in an n-step batch
        if "discount" in batch.extra:
            discount = batch.extra["discount"][:, bi:]
        alpha = self.log_alpha.detach().exp()
        nxt = ends[:, bi:] - bi  # each step's bootstrap position in the unroll

        # [B, L - burn_in + n, hidden]; gradient from the critic loss only
        z, _ = self.actor.unroll(seq, state)
        with torch.no_grad():
            z_target, _ = self.actor_target.unroll(seq, target_state)
            a2, logp_a2 = self.actor.policy(_take(z, nxt))
            assert logp_a2 is not None
            q_targ = self.critic_target(_pair(_take(z_target, nxt), a2)).min(0).values
            q_targ = q_targ.reshape(rew.shape)
            # CRUCIAL: only `terminated` stops bootstrapping; a truncated episode still has a
            # future. discount: gamma ** m for an n-step return over m rewards.
            backup = rew + discount * (1.0 - term) * (q_targ - alpha * logp_a2)

        features = z[:, :length - bi]
        q = self.critic(_pair(features, act))  # (2, B * T)
        td = ((q - backup.reshape(-1)) ** 2).sum(0)
        loss_q = (td * weight.reshape(-1)).sum() / count
        self.q_optimizer.zero_grad(set_to_none=True)
        loss_q.backward()
        self.q_optimizer.step()

        # the policy head learns on the features; they learn from the critic
        features = features.detach()
        for p in self._q_params:
            p.requires_grad_(False)
        pi, logp_pi = self.actor.policy(features)
        assert logp_pi is not None
        q_pi = self.critic(_pair(features, pi)).min(0).values.reshape(logp_pi.shape)
        loss_pi = ((alpha * logp_pi - q_pi) * weight).sum() / count
        self.pi_optimizer.zero_grad(set_to_none=True)
        loss_pi.backward()
        self.pi_optimizer.step()
        for p in self._q_params:
            p.requires_grad_(True)

        metrics: dict[str, Any] = {"loss_critic": loss_q.item(), "loss_actor": loss_pi.item(),
                                   "entropy_coef": alpha.item()}
        if self.learn_entropy_coef:
            entropy_gap = ((logp_pi.detach() + self.target_entropy) * real).sum() / count
            loss_alpha = -(self.log_alpha * entropy_gap).mean()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            # torch's stubs leave Tensor.backward untyped
            loss_alpha.backward()  # type: ignore[no-untyped-call]
            self.alpha_optimizer.step()
            metrics["loss_entropy_coef"] = loss_alpha.item()

        with torch.no_grad():  # target <- polyak * target + (1 - polyak) * online
            torch._foreach_lerp_(self._targets, self._online, 1.0 - self.polyak)
        if "index" in batch.extra:  # prioritized: each step's |td|, 0 at burn-in and padding
            per_step = (q.detach() - backup.reshape(-1)).abs().mean(0).reshape(real.shape) * real
            skipped = torch.zeros_like(mask[:, :bi], dtype=per_step.dtype)
            metrics["priority"] = torch.cat([skipped, per_step], 1)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
                "actor_target": self.actor_target.state_dict(), "critic_target": self.critic_target.state_dict(),
                "q_optimizer": self.q_optimizer.state_dict(), "pi_optimizer": self.pi_optimizer.state_dict(),
                "alpha_optimizer": self.alpha_optimizer.state_dict(), "log_alpha": self.log_alpha.detach().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("actor", "critic", "actor_target", "critic_target", "q_optimizer", "pi_optimizer",
                     "alpha_optimizer"):
            getattr(self, name).load_state_dict(state[name])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])


def _lead(obs: Any, dims: int = 2) -> tuple[int, ...]:
    """The first ``dims`` dimensions of a batch's first observation leaf."""
    found: list[tuple[int, ...]] = []
    tree_map(lambda o: found.append(tuple(o.shape[:dims])) if not found else None, obs)
    return found[0]


def _stream(obs: Any, next_obs: Any, mask: torch.Tensor, ends: torch.Tensor, n: int) -> Any:
    """The L + n consecutive observations a sequence's core unrolls over, from trees ``[B, L]``:
    position j < L is ``obs[:, j]``, and each real step j puts its ``next_obs`` at position
    ``ends[:, j]`` (j + m, m its window's length). That overrides the padding after a sequence's end
    (its last next_obs), and fills the n positions past L: when n <= L, each of them the core
    reaches is the end of some real step's full window. Positions no real step ends at and the
    core never needs hold the last step's next_obs."""
    b, length = mask.shape
    rows = torch.arange(b, device=mask.device)[:, None].expand(b, length)
    slot = torch.where(mask, ends, length + n)  # padded steps write to a spare position, cut below

    def build(o: torch.Tensor, o2: torch.Tensor) -> torch.Tensor:
        tail = o2[:, -1:].expand(b, n + 1, *o2.shape[2:])
        out = torch.cat([o, tail], 1)
        out[rows, slot] = o2  # real steps with the same end hold the same observation
        return out[:, :length + n]

    return _zip_map(build, obs, next_obs)


def _zip_map(fn: Any, a: Any, b: Any) -> Any:
    """``fn`` over the paired leaves of two trees of tensors."""
    if isinstance(a, (tuple, list)):
        return type(a)(_zip_map(fn, x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return {k: _zip_map(fn, a[k], b[k]) for k in a}
    return fn(a, b)


def _take(z: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """Features ``z[b, at[b, t]]``: ``[B, T, H]`` from ``z [B, T', H]`` and positions ``[B, T]``."""
    return z.gather(1, at[..., None].expand(*at.shape, z.shape[-1]))


def _pair(z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Critic input rows ``(z, a)`` for features ``[B, T, H]`` and actions
    ``[B, T, ...]``: ``[B * T, H + A]``."""
    return torch.cat([z.reshape(-1, z.shape[-1]), a.reshape(z.shape[0] * z.shape[1], -1).float()], -1)
