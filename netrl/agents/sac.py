"""Soft Actor-Critic with twin Q networks and automatic entropy tuning, in one file.

Haarnoja et al., "Soft Actor-Critic Algorithms and Applications" (2018),
https://arxiv.org/abs/1812.05905. Read :meth:`SACAgent.eager_step` (what ``train`` runs) against
Algorithm 1 of the paper. Deviations, all common practice:

* both Q networks live in one module and run as one batched matmul (about 20% faster on a CPU), so
  the ensemble is one call, as LeanRL's ``torch.vmap`` over the critics;
* only the critics have target copies (as in SB3 and CleanRL), moved in place in one fused call;
* the policy, entropy coefficient and targets are updated every step; the policy and the
  entropy coefficient share one backward pass (their losses touch disjoint parameters, so the
  gradients are those of two passes).

``compile`` (``trainer.compile``, see :mod:`netrl.agents.compiled`) compiles the whole
update as one graph (:meth:`SACAgent.compiled_step`: the same two losses, their gradients by
:func:`torch.func.grad_and_value`, the Adam steps and the target update); the results match eager
mode within floating-point tolerance.

``truncated`` never stops bootstrapping: a time limit is not a terminal state.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Sequence
from typing import Any, cast

import gymnasium
import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value

from netrl.actor import ActorModule
from netrl.agents.base import TrainingAgent
from netrl.agents.common.actors import MLPActor
from netrl.agents.common.encoders import flat_obs, obs_dim
from netrl.agents.common.networks import TwinQ
from netrl.agents.compiled import (
    CompileMode,
    Reparametrized,
    adam_,
    adam_state,
    check_compile,
    compile_fn,
    polyak_,
    step_begin,
    to_floats,
)
from netrl.agents.registry import SAC
from netrl.samples.batch import Batch

log = logging.getLogger(__name__)

# MLPActor lives in netrl.agents.common.actors; this is its tmrl path
__all__ = ["MLPActor", "MLPActorCritic", "SACAgent"]


class MLPActorCritic(nn.Module):
    """Actor plus twin critic; ``q(obs, act)`` returns both Q estimates, shape (2, batch)."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space,
                 hidden_sizes: Sequence[int] = (256, 256)) -> None:
        super().__init__()
        self.actor = MLPActor(observation_space, action_space, hidden_sizes)
        act_dim = int(np.prod(action_space.shape or ()))
        self.critic = TwinQ(obs_dim(observation_space) + act_dim, hidden_sizes)

    def q(self, obs: Any, act: torch.Tensor, critic: nn.Module | None = None) -> torch.Tensor:
        pairs = torch.cat([flat_obs(obs), act.reshape(act.shape[0], -1)], -1)
        return (critic or self.critic)(pairs)


class SACAgent(TrainingAgent):
    """SAC v2 (automatic entropy tuning) with tmrl's constructor arguments."""

    supports = SAC

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space, device: str = "cpu",
                 model_cls: Any = MLPActorCritic, gamma: float = 0.99, polyak: float = 0.995, alpha: float = 0.2,
                 lr_actor: float = 1e-3, lr_critic: float = 1e-3, lr_entropy: float = 1e-3,
                 learn_entropy_coef: bool = True, target_entropy: float | None = None,
                 compile: CompileMode = "none") -> None:
        check_compile(compile, device, f"{type(self).__name__}(compile=...)")
        super().__init__(observation_space, action_space, device)
        self.model = model_cls(observation_space, action_space).to(device)
        self.critic_target = copy.deepcopy(self.model.critic).requires_grad_(False)
        self.gamma, self.polyak, self.learn_entropy_coef = gamma, polyak, learn_entropy_coef
        # fused Adam: a few % faster
        fused = True if str(device).startswith(("cpu", "cuda")) else None
        self.pi_optimizer = torch.optim.Adam(self.model.actor.parameters(), lr=lr_actor, fused=fused)
        self.q_optimizer = torch.optim.Adam(self.model.critic.parameters(), lr=lr_critic, fused=fused)
        # Target entropy -dim(A) is the paper's heuristic.
        act_dim = int(np.prod(action_space.shape or ()))
        self.target_entropy = -float(act_dim) if target_entropy is None else float(target_entropy)
        self.log_alpha = torch.tensor([math.log(alpha)], device=device, requires_grad=learn_entropy_coef)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=lr_entropy)
        self._configured = {"lr_actor": lr_actor, "lr_critic": lr_critic, "lr_entropy": lr_entropy, "alpha": alpha}
        self._q_params = list(self.model.critic.parameters())
        self._target_params = list(self.critic_target.parameters())
        self.compile = compile
        # in a tuple: the modules are the model's, which state_dict and the training
        # loop's safeguards hold already
        self._losses = (Reparametrized(self.critic_loss, critic=self.model.critic),
                        Reparametrized(self.actor_loss, actor=self.model.actor))
        # The policy's gradient reaches only parameters that are not also the critics' (an
        # encoder both share is frozen with the critics in eager mode's policy step, so only
        # the critic loss trains it).
        critic_ids = {id(p) for p in self._q_params}
        self._pi_params = {f"actor.{name}": p for name, p in self.model.actor.named_parameters()
                           if id(p) not in critic_ids}
        self._compiled_step = compile_fn(self.compiled_step, compile)
        # the optimisers' state exists before the first trace, which would otherwise make it
        if compile != "none":
            adam_state(self.q_optimizer)
            adam_state(self.pi_optimizer, list(self._pi_params.values()))
            adam_state(self.alpha_optimizer)

    def get_actor(self) -> ActorModule:
        return self.model.actor

    def critic_loss(self, o: Any, a: torch.Tensor, r: torch.Tensor, o2: Any, terminated: torch.Tensor,
                    weight: torch.Tensor | None, discount: torch.Tensor | float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, |TD error| per sample)``: the twin critics' soft Bellman error on
        one batch (what ``compile`` compiles, with its backward), and the priorities a
        prioritized memory takes. ``discount``: gamma, or each sample's own gamma ** (steps to
        next_obs) in an n-step batch."""
        alpha = self.log_alpha.detach().exp()
        # Critic target: soft value of the next state from the *current* policy
        # and the *target* critics.
        with torch.no_grad():
            a2, logp_a2 = self.model.actor(o2)
            q_targ = self.model.q(o2, a2, self.critic_target).min(0).values
            # CRUCIAL: only `terminated` stops bootstrapping; a truncated episode
            # still has a future.
            backup = r + discount * (1.0 - terminated) * (q_targ - alpha * logp_a2)
        q = self.model.q(o, a)  # (2, batch): both critics in one call
        td = ((q - backup) ** 2).sum(0)
        loss = (td * weight).mean() if weight is not None else td.mean()
        return loss, (q.detach() - backup).abs().mean(0)

    def actor_loss(self, o: Any, weight: torch.Tensor | None, log_alpha: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(policy loss, entropy coefficient loss, alpha)``: maximise min Q - alpha * log pi,
        and move alpha towards the target entropy. The entropy loss is 0 when the coefficient is
        fixed. ``log_alpha``: the agent's own unless given (as the tensor a functional gradient is
        taken with respect to)."""
        log_alpha = self.log_alpha if log_alpha is None else log_alpha
        alpha = log_alpha.detach().exp()
        pi, logp_pi = self.model.actor(o)
        q_pi = self.model.q(o, pi).min(0).values
        per_sample = alpha * logp_pi - q_pi
        loss_pi = (per_sample * weight).mean() if weight is not None else per_sample.mean()
        if not self.learn_entropy_coef:
            return loss_pi, torch.zeros_like(loss_pi), alpha.reshape(())
        # log pi from before this step's policy update, detached: only alpha moves by this loss.
        loss_alpha = -(log_alpha * (logp_pi.detach() + self.target_entropy)).mean()
        return loss_pi, loss_alpha, alpha.reshape(())

    def compiled_step(self, o: Any, a: torch.Tensor, r: torch.Tensor, o2: Any, terminated: torch.Tensor,
                      weight: torch.Tensor | None, discount: torch.Tensor | float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """What :meth:`train` does, written functionally so that ``compile`` makes one
        graph of it (no autograd graph, no ``.grad``, no optimiser ``step()`` to break it):
        ``(loss_q, priority, loss_pi, loss_alpha, alpha)``. Run under ``torch.no_grad()``;
        the updates are in place."""
        critic_loss, actor_loss = self._losses
        q_state = adam_state(self.q_optimizer)
        pi_state = adam_state(self.pi_optimizer, list(self._pi_params.values()))
        q_names = [f"critic.{name}" for name, _ in self.model.critic.named_parameters()]
        pi_names = list(self._pi_params)

        def loss_q_of(params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            return cast(tuple[torch.Tensor, torch.Tensor], functional_call(
                critic_loss, params, (o, a, r, o2, terminated, weight, discount)))

        grads, (loss_q, priority) = grad_and_value(loss_q_of, has_aux=True)(dict(zip(q_names, q_state.params,
                                                                                     strict=True)))
        adam_(self.q_optimizer, q_state, [grads[name] for name in q_names])

        # The policy's loss reads the critics just updated, as a constant: only the actor
        # and alpha get gradients.
        def loss_pi_of(params: dict[str, torch.Tensor], log_alpha: torch.Tensor
                       ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
            losses = cast(tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                          functional_call(actor_loss, params, (o, weight, log_alpha)))
            # disjoint parameters: each gets its own loss's gradient
            return losses[0] + losses[1], losses

        (grads, grad_alpha), (_, (loss_pi, loss_alpha, alpha)) = grad_and_value(
            loss_pi_of, argnums=(0, 1), has_aux=True)(dict(zip(pi_names, pi_state.params, strict=True)),
                                                       self.log_alpha)
        adam_(self.pi_optimizer, pi_state, [grads[name] for name in pi_names])
        if self.learn_entropy_coef:
            adam_(self.alpha_optimizer, adam_state(self.alpha_optimizer), [grad_alpha])
        polyak_(self._target_params, self._q_params, self.polyak)
        return loss_q, priority, loss_pi, loss_alpha, alpha

    def train(self, batch: Batch) -> dict[str, Any]:
        discount = batch.extra.get("discount", self.gamma)
        if self.compile != "none":
            step_begin(self.compile)
            with torch.no_grad():
                loss_q, priority, loss_pi, loss_alpha, alpha = self._compiled_step(
                    batch.obs, batch.act, batch.rew, batch.next_obs, batch.terminated, batch.weight, discount)
        else:
            loss_q, priority, loss_pi, loss_alpha, alpha = self.eager_step(batch, discount)
        metrics = {"loss_critic": loss_q, "loss_actor": loss_pi, "entropy_coef": alpha}
        if self.learn_entropy_coef:
            metrics["loss_entropy_coef"] = loss_alpha
        out: dict[str, Any] = to_floats(metrics)
        if "index" in batch.extra:  # from a prioritized memory: the new priorities of its samples
            out["priority"] = priority
        return out

    def eager_step(self, batch: Batch, discount: torch.Tensor | float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One update with autograd and the optimisers' own ``step()``:
        ``(loss_q, priority, loss_pi, loss_alpha, alpha)``. Without ``compile``, :meth:`train` runs
        this; :meth:`compiled_step` does the same."""
        loss_q, priority = self.critic_loss(batch.obs, batch.act, batch.rew, batch.next_obs, batch.terminated,
                                            batch.weight, discount)
        self.q_optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss_q)
        self.q_optimizer.step()

        # Freeze the critics so the policy's backward computes no gradient for them.
        for p in self._q_params:
            p.requires_grad_(False)
        loss_pi, loss_alpha, alpha = self.actor_loss(batch.obs, batch.weight)
        self.pi_optimizer.zero_grad(set_to_none=True)
        self.alpha_optimizer.zero_grad(set_to_none=True)
        # disjoint parameters: each gets its own loss's gradient
        torch.autograd.backward(loss_pi + loss_alpha)
        self.pi_optimizer.step()
        if self.learn_entropy_coef:
            self.alpha_optimizer.step()
        for p in self._q_params:
            p.requires_grad_(True)

        polyak_(self._target_params, self._q_params, self.polyak)
        return loss_q, priority, loss_pi, loss_alpha, alpha

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "pi_optimizer": self.pi_optimizer.state_dict(),
            "q_optimizer": self.q_optimizer.state_dict(),
            "alpha_optimizer": self.alpha_optimizer.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.pi_optimizer.load_state_dict(state["pi_optimizer"])
        self.q_optimizer.load_state_dict(state["q_optimizer"])
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        # The optimizers' states carry the learning rates they were saved with, and log_alpha a
        # fixed alpha: the values configured now win, so that a run resumed with a lower learning
        # rate trains at that rate.
        changed = []
        for name, optimizer in (("lr_actor", self.pi_optimizer), ("lr_critic", self.q_optimizer),
                                ("lr_entropy", self.alpha_optimizer)):
            saved = optimizer.param_groups[0]["lr"]
            for group in optimizer.param_groups:
                group["lr"] = self._configured[name]
            if saved != self._configured[name]:
                changed.append(f"{name} {saved:g} -> {self._configured[name]:g}")
        if not self.learn_entropy_coef:
            saved_alpha = float(self.log_alpha.exp().item())
            with torch.no_grad():
                self.log_alpha.fill_(math.log(self._configured["alpha"]))
            if not math.isclose(saved_alpha, self._configured["alpha"], rel_tol=1e-6):
                changed.append(f"alpha {saved_alpha:g} -> {self._configured['alpha']:g}")
        if changed:
            log.info("resumed with the configured %s (the checkpoint had the others)",
                     ", ".join(changed))
