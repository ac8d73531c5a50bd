"""The replay keys of config.json (``memory.n_step``, ``memory.prioritized`` and its
``priority_alpha``, ``priority_beta``, ``priority_beta_steps``, ``priority_eps``) applied to any
pipeline's memory: both ring
memory families (:class:`~netrl.memory.replay.ReplayMemory`, and
:class:`~netrl.memory.history.HistoryMemory` with the drone pipeline's ActionBufferMemory and the
image pipeline's FrameStackMemory) take every combination, with ``agent.gamma`` for the n-step
returns; a pipeline whose memory is neither is refused, naming the keys and the reason. The
sequence keys are the pipeline's to pass with its agent (a pipeline's MLP agent would get
``[B, L]`` batches); make.py refuses a memory built without them."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from netrl.config.sections import Config
from netrl.errors import ConfigError
from netrl.memory.history import HistoryMemory
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
    if not (isinstance(memory, type) and issubclass(memory, (ReplayMemory, HistoryMemory))):
        name = getattr(memory, "__name__", repr(memory))
        named = " and ".join(keys)
        raise ConfigError([f'{named} {"need" if len(keys) > 1 else "needs"} a ring memory (ReplayMemory '
                           f'or HistoryMemory), but env.pipeline "{cfg.env.pipeline}" trains with {name}, '
                           f"which does not follow trajectories to compute n-step returns or priorities: "
                           f"set {named} back to the default, or build the pipeline's memory on "
                           f"netrl.memory.ReplayMemory or HistoryMemory"])
    options: dict[str, Any] = {}
    if m.n_step != 1:
        options.update(n_step=m.n_step, gamma=cfg.agent.gamma)
    if m.prioritized:
        options.update(prioritized=True, alpha=m.priority_alpha, beta=m.priority_beta,
                       beta_steps=m.priority_beta_steps, eps=m.priority_eps)
    return dataclasses.replace(pipeline, memory_cls=functools.partial(pipeline.memory_cls, **options))
