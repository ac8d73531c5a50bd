"""How the gym pipeline builds each algorithm of the table (:mod:`netrl.agents.registry`, which
names these functions): its actor, its memory and its agent, from the keys of its section of
config.json. The drone and image pipelines build their SAC with :func:`sac_agent`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from netrl.agents.dqn import DQNActor, DQNAgent
from netrl.agents.ppo import PPOActor, PPOAgent
from netrl.agents.recurrent_sac import RecurrentActor, RecurrentSACAgent
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.config.sections import Config
from netrl.memory.replay import ReplayMemory
from netrl.pipelines.base import rollout_memory
from netrl.util import partial

__all__ = ["Parts", "dqn", "ppo", "recurrent_sac", "sac", "sac_agent"]


class Parts(NamedTuple):
    """What an algorithm puts into a :class:`~netrl.pipelines.base.Pipeline`."""

    actor_module_cls: Callable[..., Any]
    memory_cls: Callable[..., Any]
    training_agent_cls: Callable[..., Any]


def _sac_keywords(cfg: Config) -> dict[str, Any]:
    """``agent.gamma``, ``agent.polyak`` and ``agent.sac``, as SAC's keyword arguments."""
    a, s = cfg.agent, cfg.agent.sac
    return {"gamma": a.gamma, "polyak": a.polyak, "alpha": s.entropy_coef, "lr_actor": s.lr_actor,
            "lr_critic": s.lr_critic, "lr_entropy": s.lr_entropy,
            "learn_entropy_coef": s.learn_entropy_coef, "target_entropy": s.target_entropy}


def sac_agent(cfg: Config, model_cls: Callable[..., Any]) -> Callable[..., Any]:
    """SACAgent with ``model_cls`` (an actor-critic) and the config's SAC keys."""
    return partial(SACAgent, model_cls=model_cls, **_sac_keywords(cfg))


def sac(cfg: Config) -> Parts:
    hidden = tuple(cfg.agent.hidden_sizes)
    return Parts(partial(MLPActor, hidden_sizes=hidden), ReplayMemory,
                 sac_agent(cfg, partial(MLPActorCritic, hidden_sizes=hidden)))


def recurrent_sac(cfg: Config) -> Parts:
    a, m = cfg.agent, cfg.memory
    hidden = tuple(a.hidden_sizes)
    return Parts(partial(RecurrentActor, hidden_sizes=hidden, cell=a.recurrent),
                 partial(ReplayMemory, sequence_length=m.sequence_length, burn_in=m.burn_in),
                 partial(RecurrentSACAgent, hidden_sizes=hidden, cell=a.recurrent,
                         burn_in=m.burn_in, **_sac_keywords(cfg)))


def dqn(cfg: Config) -> Parts:
    a, d = cfg.agent, cfg.agent.dqn
    hidden = tuple(a.hidden_sizes)
    return Parts(partial(DQNActor, hidden_sizes=hidden), ReplayMemory,
                 partial(DQNAgent, hidden_sizes=hidden, gamma=a.gamma, lr=d.lr,
                         target_update_interval=d.target_update_interval,
                         exploration_initial_eps=d.exploration_initial_eps,
                         exploration_final_eps=d.exploration_final_eps,
                         exploration_steps=d.exploration_steps))


def ppo(cfg: Config) -> Parts:
    a, p = cfg.agent, cfg.agent.ppo
    hidden = tuple(a.hidden_sizes)
    # the sync collection's memory: one batch, in the order it was stored
    return Parts(partial(PPOActor, hidden_sizes=hidden), rollout_memory(),
                 partial(PPOAgent, hidden_sizes=hidden, gamma=a.gamma, gae_lambda=p.gae_lambda,
                         lr=p.lr, n_epochs=p.epochs, minibatch_size=p.minibatch_size,
                         clip_range=p.clip_range, clip_range_vf=p.clip_range_vf,
                         ent_coef=p.ent_coef, vf_coef=p.vf_coef, max_grad_norm=p.max_grad_norm,
                         anneal_frames=p.anneal_frames))
