"""The replay keys of config.json (``memory.n_step``, ``memory.prioritized`` and its
``priority_alpha``, ``priority_beta``, ``priority_beta_steps``, ``priority_eps``) applied to any
pipeline's memory: a :class:`~netrl.memory.replay.ReplayMemory` gets them, with ``agent.gamma`` for
the n-step returns; a pipeline whose memory cannot take them is refused, naming the key."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from netrl.config.sections import Config
from netrl.errors import ConfigError
from netrl.memory.replay import ReplayMemory
from netrl.pipelines.base import Pipeline

__all__ = ["apply_replay_options"]


def apply_replay_options(cfg: Config, pipeline: Pipeline) -> Pipeline:
    """``pipeline`` with its memory class given the replay keys, unchanged when they
    are at their defaults."""
    m = cfg.memory
    keys = [k for k, on in (("memory.n_step", m.n_step != 1), ("memory.prioritized", m.prioritized)) if on]
    if not keys:
        return pipeline
    memory: Any = pipeline.memory_cls
    while isinstance(memory, functools.partial):
        memory = memory.func
    if not (isinstance(memory, type) and issubclass(memory, ReplayMemory)):
        name = getattr(memory, "__name__", repr(memory))
        named = " and ".join(keys)
        raise ConfigError([f'{named} {"need" if len(keys) > 1 else "needs"} a ReplayMemory, '
                           f'but env.pipeline "{cfg.env.pipeline}" trains with {name}, which '
                           f"does not compute n-step returns or priorities: set {named} back to "
                           f"the default (memory.n_step 1, memory.prioritized false), or use a "
                           f'pipeline with a ReplayMemory (env.pipeline "gym" with SAC or DQN)'])
    options: dict[str, Any] = {"n_step": m.n_step, "gamma": cfg.agent.gamma, "prioritized": m.prioritized}
    if m.prioritized:
        options.update(alpha=m.priority_alpha, beta=m.priority_beta,
                       beta_steps=m.priority_beta_steps, eps=m.priority_eps)
    return dataclasses.replace(pipeline, memory_cls=functools.partial(pipeline.memory_cls, **options))
