"""How the gym pipeline builds each algorithm of the table (:mod:`netrl.agents.registry`, which
names these functions): its actor, its memory and its agent, from the keys of its section of
config.json. The drone and image pipelines build their SAC with :func:`sac_agent`, and their
recurrent SAC (``agent.recurrent``) with :func:`recurrent_sac` on their own memory, which must
store sequences (:func:`sequence_memory`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

from netrl.agents.common.encoders import EncoderHead
from netrl.agents.dqn import DQNActor, DQNAgent
from netrl.agents.ppo import PPOActor, PPOAgent
from netrl.agents.recurrent_sac import Encoder, RecurrentActor, RecurrentSACAgent
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.config.sections import Config
from netrl.errors import ConfigError
from netrl.memory.replay import ReplayMemory
from netrl.pipelines.base import rollout_memory
from netrl.util import partial

__all__ = ["Parts", "dqn", "ppo", "recurrent_sac", "sac", "sac_agent", "sequence_memory"]


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


def recurrent_sac(cfg: Config, memory_cls: Callable[..., Any] = ReplayMemory, encoder: Encoder = "mlp",
                  head: EncoderHead = "keypoints") -> Parts:
    """The recurrent SAC (``agent.recurrent``) on ``memory_cls`` given ``memory.sequence_length``
    and ``memory.burn_in`` (:func:`sequence_memory`); ``encoder``, ``head``: the actor's."""
    a, m = cfg.agent, cfg.memory
    hidden = tuple(a.hidden_sizes)
    nets = {"hidden_sizes": hidden, "cell": a.recurrent, "encoder": encoder, "head": head}
    return Parts(partial(RecurrentActor, **nets), sequence_memory(cfg, memory_cls),
                 partial(RecurrentSACAgent, **nets, burn_in=m.burn_in, **_sac_keywords(cfg)))


def sequence_memory(cfg: Config, memory_cls: Callable[..., Any]) -> Callable[..., Any]:
    """``memory_cls`` given ``memory.sequence_length`` and ``memory.burn_in``. ConfigError naming
    the key and the class when no ``__init__`` of the class takes ``sequence_length``: it would
    refuse the keyword, or train a recurrent agent on single transitions."""
    m = cfg.memory
    cls: Any = memory_cls
    while isinstance(cls, functools.partial):
        cls = cls.func
    mro = cls.__mro__ if isinstance(cls, type) else (cls,)
    if not any("sequence_length" in inspect.signature(c).parameters for c in mro
               if c is not object and callable(c)):
        name = getattr(cls, "__name__", repr(cls))
        raise ConfigError([f'memory.sequence_length is {m.sequence_length} for agent.recurrent '
                           f'"{cfg.agent.recurrent}", but env.pipeline "{cfg.env.pipeline}" '
                           f"stores its rows in {name}, which does not sample sequences: set "
                           f"agent.recurrent to null (and memory.sequence_length to 1), or use "
                           f'env.pipeline "gym"'])
    return partial(memory_cls, sequence_length=m.sequence_length, burn_in=m.burn_in)


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
