"""The generic pipeline: any Gymnasium env and an MLP actor, with the agent ``agent.algorithm`` names, by default
(auto) the one its action space needs: SAC for Box actions (Pendulum-v1, the default), double DQN for Discrete,
MultiDiscrete and MultiBinary ones (CartPole-v1). ``ppo`` takes either, with a RolloutMemory (sync collection)."""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium

from netrl.agents.dqn import DQNActor, DQNAgent
from netrl.agents.ppo import PPOActor, PPOAgent
from netrl.agents.recurrent_sac import RecurrentActor, RecurrentSACAgent
from netrl.agents.registry import ALGORITHMS, Algorithm, choose, either, entries
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.config.sections import Config
from netrl.envs.gym import GenericGymEnv
from netrl.envs.pomdp import partially_observed
from netrl.errors import ConfigError
from netrl.memory.replay import ReplayMemory
from netrl.pipelines.base import Pipeline, rollout_memory
from netrl.util import partial

__all__ = ["gym_pipeline"]


def gym_pipeline(cfg: Config) -> Pipeline:
    """Raises ConfigError when ``env.id`` names no registered Gymnasium env, or one whose actions the agent cannot
    take."""
    module, _, name = cfg.env.id.rpartition(":")  # "module:EnvId" imports the module, as gymnasium.make does
    try:
        if module:
            importlib.import_module(module)
        gymnasium.spec(name)
    except ImportError as exc:
        raise ConfigError([f'env.id "{cfg.env.id}" names the module "{module}" to import first, which does not import '
                           f"({exc})"]) from None
    except gymnasium.error.Error as exc:  # NameNotFound, VersionNotFound, ...
        raise ConfigError([f'env.id "{cfg.env.id}" is not a Gymnasium env this machine has ({exc}); install the '
                           'package that registers it, or write "module:EnvId" to import it first']) from None
    env_cls: Any = partial(GenericGymEnv, id=cfg.env.id, gym_kwargs=dict(cfg.env.kwargs))
    if cfg.env.hide_obs:  # a partially observed env (netrl.envs.pomdp)
        env_cls = partial(partially_observed, id=cfg.env.id, gym_kwargs=dict(cfg.env.kwargs),
                          hide=list(cfg.env.hide_obs))
    try:
        env = env_cls()  # once, to see its action space (and that its kwargs and hide_obs work)
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    try:
        actions = env.action_space
    finally:
        env.close()
    a, m = cfg.agent, cfg.memory
    hidden = tuple(a.hidden_sizes)
    algorithm = _algorithm(cfg, actions).name
    if m.sequence_length > 1 and a.recurrent is None:
        raise ConfigError([f"memory.sequence_length is {m.sequence_length}, but the gym pipeline's agents learn from "
                           "single transitions unless agent.recurrent is set: set agent.recurrent (\"gru\" or "
                           "\"lstm\") for the recurrent SAC, or memory.sequence_length to 1"])
    if a.recurrent is not None:
        return Pipeline(
            env_cls=env_cls,
            actor_module_cls=partial(RecurrentActor, hidden_sizes=hidden, cell=a.recurrent),
            memory_cls=partial(ReplayMemory, sequence_length=m.sequence_length, burn_in=m.burn_in),
            training_agent_cls=partial(
                RecurrentSACAgent, hidden_sizes=hidden, cell=a.recurrent, burn_in=m.burn_in, gamma=a.gamma,
                polyak=a.polyak, alpha=a.sac.entropy_coef, lr_actor=a.sac.lr_actor, lr_critic=a.sac.lr_critic,
                lr_entropy=a.sac.lr_entropy,
                learn_entropy_coef=a.sac.learn_entropy_coef, target_entropy=a.sac.target_entropy),
        )
    if algorithm == "ppo":
        return Pipeline(
            env_cls=env_cls,
            actor_module_cls=partial(PPOActor, hidden_sizes=hidden),
            memory_cls=rollout_memory(),  # the sync collection's: one batch, in stored order
            training_agent_cls=partial(
                PPOAgent, hidden_sizes=hidden, gamma=a.gamma, gae_lambda=a.ppo.gae_lambda, lr=a.ppo.lr,
                n_epochs=a.ppo.epochs, minibatch_size=a.ppo.minibatch_size, clip_range=a.ppo.clip_range,
                clip_range_vf=a.ppo.clip_range_vf, ent_coef=a.ppo.ent_coef, vf_coef=a.ppo.vf_coef,
                max_grad_norm=a.ppo.max_grad_norm,
                anneal_frames=a.ppo.anneal_frames),
        )
    if algorithm == "dqn":
        return Pipeline(
            env_cls=env_cls,
            actor_module_cls=partial(DQNActor, hidden_sizes=hidden),
            memory_cls=ReplayMemory,
            training_agent_cls=partial(
                DQNAgent, hidden_sizes=hidden, gamma=a.gamma, lr=a.dqn.lr,
                target_update_interval=a.dqn.target_update_interval,
                exploration_initial_eps=a.dqn.exploration_initial_eps,
                exploration_final_eps=a.dqn.exploration_final_eps, exploration_steps=a.dqn.exploration_steps),
        )
    return Pipeline(
        env_cls=env_cls,
        actor_module_cls=partial(MLPActor, hidden_sizes=hidden),
        memory_cls=ReplayMemory,
        training_agent_cls=partial(
            SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=hidden), gamma=a.gamma, polyak=a.polyak,
            alpha=a.sac.entropy_coef, lr_actor=a.sac.lr_actor, lr_critic=a.sac.lr_critic, lr_entropy=a.sac.lr_entropy,
            learn_entropy_coef=a.sac.learn_entropy_coef, target_entropy=a.sac.target_entropy),
    )


def _algorithm(cfg: Config, actions: gymnasium.Space) -> Algorithm:
    """What ``agent.algorithm`` runs for ``actions`` (auto: the first of the registry's ``auto``
    algorithms that takes them); ConfigError when it cannot take them."""
    name, recurrent = cfg.agent.algorithm, cfg.agent.recurrent is not None
    chosen = choose(name, recurrent, actions)
    if chosen is not None:
        return chosen
    if name == "auto":
        picks = [f"{a.supports.label} for {a.supports.spaces_text('and')} actions"
                 for a in entries("auto", recurrent)]
        others = [f'agent.algorithm "{a.name}": {a.supports.label} for '
                  f'{a.supports.spaces_text("and")} ones'
                  for a in ALGORITHMS if not a.auto and a.supports.recurrent == recurrent]
        more = f" ({'; '.join(others)})" if others else ""
        kind = type(actions).__name__
        raise ConfigError([f'env.id "{cfg.env.id}" has {kind} actions, but the gym pipeline trains '
                           f"{either(picks, 'and')}{more}: flatten the action space with a "
                           "wrapper, or build a pipeline with an agent for these actions"])
    takes = either([a.supports.spaces_text() for a in entries(name, recurrent)])
    raise ConfigError([f'agent.algorithm "{name}" needs {takes} actions, but env.id '
                       f'"{cfg.env.id}" has {actions}: choose another agent.algorithm ("auto" '
                       "picks one that fits), or another env"])
