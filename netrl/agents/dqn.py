"""Double DQN with a dueling head, for discrete actions, in one file.

Mnih et al., "Human-level control through deep reinforcement learning" (2015); van Hasselt et
al., "Deep Reinforcement Learning with Double Q-learning" (2016); Wang et al., "Dueling
Network Architectures" (2016). Read :meth:`DQNAgent.train` against Algorithm 1 of the DQN
paper with the double-DQN target::

    y = r + gamma * (1 - terminated) * Q_target(s', argmax_a' Q(s', a'))
                                                        (a' among the actions s' allows)

Actions: ``Discrete``, and ``MultiDiscrete`` / ``MultiBinary`` as independent branches (Tavakoli et
al., "Action Branching Architectures", 2018): one dueling advantage head per action dimension over a
shared value, each branch trained towards the same target, whose next-state value is the mean over
branches of each branch's double-DQN value. With one branch this is exactly double DQN.

Action masks (Gymnasium's and PettingZoo's convention, TorchRL's key): a ``Dict`` observation
with an ``"action_mask"`` entry, one 0/1 per choice (``n`` for ``Discrete(n)``, ``sum(nvec)`` for
``MultiDiscrete``). The actor never picks a masked action, exploring included (it samples among
the allowed ones), and the target's argmax runs over the *next* state's allowed actions. The
mask is not an input of the Q network.

Deviations, all common practice (SB3, CleanRL): Huber loss and gradients clipped to norm 10; a hard
target copy every ``target_update_interval`` training steps; epsilon decays linearly over *training*
steps (the agent sees no env steps). Epsilon is a buffer of the actor, so the workers get the
current one with each weight version; test episodes act greedily. ``truncated`` never stops
bootstrapping: a time limit is not a terminal state.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from netrl.actor import ActorModule
from netrl.agents.base import TrainingAgent
from netrl.agents.common.actors import check_action_space
from netrl.agents.common.distributions import action_branches
from netrl.agents.common.encoders import ObsEncoder
from netrl.agents.common.masks import action_mask, check_allows_an_action, check_mask_space
from netrl.agents.compiled import (
    CompileMode,
    check_compile,
    compile_fn,
    copy_params_,
    module_tensors,
    step_begin,
    to_floats,
)
from netrl.agents.registry import DQN
from netrl.samples.batch import Batch

__all__ = ["DQNActor", "DQNAgent", "DuelingQ"]

MAX_GRAD_NORM = 10.0  # SB3's DQN default


class DuelingQ(nn.Module):
    """``Q(s, .)`` for every choice of every branch, ``(batch, sum(sizes))``: a shared
    value plus each branch's advantages less their mean (Wang et al.'s choice over the
    max: it trains more stably)."""

    def __init__(self, observation_space: gymnasium.Space, sizes: Sequence[int], hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.encoder = ObsEncoder(observation_space, DQN.label)
        layers: list[nn.Module] = []
        width = self.encoder.dim
        for h in hidden_sizes:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.trunk = nn.Sequential(*layers)
        self.value = nn.Linear(width, 1)
        self.advantage = nn.Linear(width, sum(sizes))
        self.sizes = list(sizes)

    def forward(self, obs: Any) -> torch.Tensor:
        return self.head(self.features(obs))

    def features(self, obs: Any) -> torch.Tensor:
        """The last hidden layer's output, ``(batch, hidden_sizes[-1])``."""
        return self.trunk(self.encoder(obs))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """``Q(s, .)`` from :meth:`features`."""
        adv = self.advantage(h)
        if len(self.sizes) == 1:
            return self.value(h) + adv - adv.mean(-1, keepdim=True)
        parts = [a - a.mean(-1, keepdim=True) for a in torch.split(adv, self.sizes, -1)]
        return self.value(h) + torch.cat(parts, -1)


def greedy(q: torch.Tensor, mask: torch.Tensor | None, sizes: Sequence[int]) -> torch.Tensor:
    """Each branch's best allowed choice, ``(batch, branches)``."""
    if mask is not None:
        q = q.masked_fill(~mask, -torch.inf)  # a masked choice can never be the argmax
    return torch.stack([part.argmax(-1) for part in torch.split(q, list(sizes), -1)], -1)


def pick(q: torch.Tensor, choice: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``q`` of each branch's ``choice``, ``(batch, branches)``."""
    return q.gather(1, choice + offsets)


class DQNActor(ActorModule):
    """Epsilon-greedy over a dueling Q network; ``epsilon`` is a buffer, so it
    travels with the weights."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space,
                 hidden_sizes: Sequence[int] = (256, 256)) -> None:
        super().__init__(observation_space, action_space)
        check_action_space(DQN, action_space)
        self.sizes, starts = action_branches(action_space)
        check_mask_space(observation_space, sum(self.sizes))
        self.q = DuelingQ(observation_space, self.sizes, hidden_sizes)
        self.epsilon: torch.Tensor
        self.register_buffer("epsilon", torch.tensor(1.0))
        self._starts = starts
        self._shape = action_space.shape or ()
        self._dtype = action_space.dtype

    def explore(self, mask: torch.Tensor | None, batch: int) -> torch.Tensor:
        """A uniformly random allowed choice per branch, ``(batch, branches)``."""
        if mask is None:
            return torch.stack([torch.randint(n, (batch,), device=self.epsilon.device) for n in self.sizes], -1)
        parts = torch.split(mask, self.sizes, -1)
        return torch.stack([torch.multinomial(part.float(), 1).squeeze(-1) for part in parts], -1)

    def act_batch(self, obs: Any, test: bool = False) -> np.ndarray:
        """Actions for a batch of observations, ``(batch, *action_space.shape)``."""
        q = self.q(obs)
        mask = action_mask(obs)
        if mask is not None:
            check_allows_an_action(mask, self.sizes)
        choice = greedy(q, mask, self.sizes)
        if not test:
            # each env explores on its own
            explore = torch.rand(q.shape[0], device=q.device) < self.epsilon
            if bool(explore.any()):
                choice = torch.where(explore[:, None], self.explore(mask, q.shape[0]), choice)
        actions = choice.cpu().numpy() + self._starts
        return actions.reshape(q.shape[0], *self._shape).astype(self._dtype)

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        # one action per observation: act_ unwraps a batch of one (netrl.actor)
        return self.act_batch(obs, test)


class DQNAgent(TrainingAgent):
    """Double DQN with a dueling head; the arguments a pipeline sets come from ``config.json``'s
    ``agent.dqn`` (and ``agent.gamma``, ``agent.hidden_sizes``)."""

    supports = DQN

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space, device: str = "cpu",
                 hidden_sizes: Sequence[int] = (256, 256), gamma: float = 0.99, lr: float = 1e-3,
                 target_update_interval: int = 128, exploration_initial_eps: float = 1.0,
                 exploration_final_eps: float = 0.04, exploration_steps: int = 4000,
                 compile: CompileMode = "none") -> None:
        check_compile(compile, device, f"{type(self).__name__}(compile=...)")
        super().__init__(observation_space, action_space, device)
        self.actor = DQNActor(observation_space, action_space, hidden_sizes).to(device)
        self.q_target = copy.deepcopy(self.actor.q).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.actor.q.parameters(), lr=lr)
        self.gamma, self.target_update_interval = gamma, target_update_interval
        self.eps_initial, self.eps_final = exploration_initial_eps, exploration_final_eps
        self.eps_steps = exploration_steps
        self.lr = lr
        self.sizes = self.actor.sizes
        self.hidden = bool(hidden_sizes)  # (no hidden layer: no units to die)
        self.starts = torch.as_tensor(self.actor._starts, device=device)
        self.offsets = torch.as_tensor(np.cumsum([0, *self.sizes[:-1]]), device=device)
        # a tensor: a training step that goes non-finite undoes it
        self.steps = torch.zeros((), dtype=torch.int64)
        self.actor.epsilon.fill_(exploration_initial_eps)
        self._online_tensors, self._target_tensors = module_tensors(self.actor.q), module_tensors(self.q_target)
        self.compile = compile
        self._loss = compile_fn(self.loss, compile)

    def get_actor(self) -> ActorModule:
        return self.actor

    def loss(self, o: Any, a: torch.Tensor, r: torch.Tensor, o2: Any, terminated: torch.Tensor,
             weight: torch.Tensor | None, discount: torch.Tensor | float
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(Huber loss, mean Q of the actions taken, |TD error| per sample, share of dead
        units)`` on one batch (what ``compile`` compiles). ``discount``: gamma, or each sample's
        own gamma ** (steps to next_obs) in an n-step batch. A dead unit of the last hidden
        layer is zero for every sample of the batch: when all are, Q no longer depends on the
        observation and no gradient can revive them (a ReLU at zero passes none)."""
        n = r.shape[0]
        # stored actions are values; the heads index choices
        choice = a.reshape(n, -1).long() - self.starts
        with torch.no_grad():
            # Double DQN: the online network picks the next action among those the NEXT state
            # allows, the target network values it. The pick is allowed, so no -inf from
            # the mask reaches the target.
            a2 = greedy(self.actor.q(o2), action_mask(o2), self.sizes)
            q2 = pick(self.q_target(o2), a2, self.offsets).mean(-1)
            # CRUCIAL: only `terminated` stops bootstrapping; a truncated episode
            # still has a future.
            y = r + discount * (1.0 - terminated) * q2
        h = self.actor.q.features(o)
        q = pick(self.actor.q.head(h), choice, self.offsets)  # (batch, branches)
        per_sample = F.smooth_l1_loss(q, y[:, None].expand_as(q), reduction="none").mean(-1)
        loss = (per_sample * weight).mean() if weight is not None else per_sample.mean()
        dead = (h.detach() <= 0).all(0).float().mean() if self.hidden else torch.zeros(())
        return loss, q.detach().mean(), (q.detach() - y[:, None]).abs().mean(-1), dead

    def train(self, batch: Batch) -> dict[str, Any]:
        step_begin(self.compile)
        loss, q_mean, priority, dead = self._loss(
            batch.obs, batch.act, batch.rew, batch.next_obs, batch.terminated, batch.weight,
            batch.extra.get("discount", self.gamma))
        self.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        grad_norm = nn.utils.clip_grad_norm_(self.actor.q.parameters(), MAX_GRAD_NORM)
        self.optimizer.step()

        self.steps += 1
        steps = int(self.steps)
        if steps % self.target_update_interval == 0:
            copy_params_(self._target_tensors, self._online_tensors)
        # Linear decay over training steps; the workers see it with the next weight version.
        fraction = min(1.0, steps / self.eps_steps) if self.eps_steps > 0 else 1.0
        self.actor.epsilon.fill_(self.eps_initial + fraction * (self.eps_final - self.eps_initial))
        # one device synchronisation for all four (to_floats)
        metrics: dict[str, Any] = {**to_floats({"loss_q": loss, "q": q_mean, "grad_norm": grad_norm,
                                                "dead_units": dead}),
                                   "epsilon": float(self.actor.epsilon)}
        # from a prioritized memory: the new priorities (|TD|) of its samples
        if "index" in batch.extra:
            metrics["priority"] = priority
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"actor": self.actor.state_dict(), "q_target": self.q_target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "steps": self.steps.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.q_target.load_state_dict(state["q_target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps.copy_(state["steps"])
        # the learning rate configured now wins over the checkpoint's
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
