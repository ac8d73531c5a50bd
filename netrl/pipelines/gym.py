"""The generic pipeline: any Gymnasium env and an MLP actor, with the agent ``agent.algorithm``
names, by default (auto) the one its action space needs: SAC for Box actions (Pendulum-v1, the
default), double DQN for Discrete, MultiDiscrete and MultiBinary ones (CartPole-v1). ``ppo`` takes
either, with a RolloutMemory (sync collection). The algorithm table (:mod:`netrl.agents.registry`)
says which takes what, and names the function of :mod:`netrl.pipelines.algorithms` that builds it.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium

from netrl.agents.registry import ALGORITHMS, Algorithm, choose, either, entries
from netrl.config.sections import Config
from netrl.envs.gym import GenericGymEnv
from netrl.envs.pomdp import partially_observed
from netrl.errors import ConfigError
from netrl.pipelines.algorithms import Parts
from netrl.pipelines.base import Pipeline
from netrl.util import partial

__all__ = ["gym_pipeline"]


def gym_pipeline(cfg: Config) -> Pipeline:
    """Raises ConfigError when ``env.id`` names no registered Gymnasium env, or one whose
    actions the agent cannot take."""
    # "module:EnvId" imports the module, as gymnasium.make does
    module, _, name = cfg.env.id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        gymnasium.spec(name)
    except ImportError as exc:
        raise ConfigError([f'env.id "{cfg.env.id}" names the module "{module}" to '
                           f"import first, which does not import ({exc})"]) from None
    except gymnasium.error.Error as exc:  # NameNotFound, VersionNotFound, ...
        raise ConfigError([f'env.id "{cfg.env.id}" is not a Gymnasium env this machine '
                           f'has ({exc}); install the package that registers it, or '
                           f'write "module:EnvId" to import it first']) from None
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
    algorithm = _algorithm(cfg, actions)
    m = cfg.memory
    if m.sequence_length > 1 and algorithm.supports.memory != "sequences":
        raise ConfigError([f"memory.sequence_length is {m.sequence_length}, but the gym "
                           f"pipeline's agents learn from single transitions unless "
                           f"agent.recurrent is set: set agent.recurrent (\"gru\" or "
                           f"\"lstm\") for the recurrent SAC, or memory.sequence_length to 1"])
    module_name, _, function = algorithm.build.partition(":")
    parts: Parts = getattr(importlib.import_module(module_name), function)(cfg)
    return Pipeline(env_cls=env_cls, **parts._asdict())


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
