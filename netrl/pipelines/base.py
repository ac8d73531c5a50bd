"""A pipeline: the classes a worker and a trainer must agree on
(:func:`netrl.pipelines.make.make_pipeline` builds the one config names).

A pipeline bundles what tmrl users pass to ``RolloutWorker`` and ``TrainingOffline``: the env class,
the actor class, the sample compressor, the memory class and the training agent class; and the env
``info`` entries the trainer's batches carry (``info_keys``, see :mod:`netrl.samples.info`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from netrl.samples.info import InfoKey, check_info_keys

__all__ = ["Pipeline", "rollout_memory"]


@dataclass(frozen=True)
class Pipeline:
    env_cls: Callable[[], Any]
    actor_module_cls: Callable[..., Any]
    memory_cls: Callable[..., Any]
    training_agent_cls: Callable[..., Any]
    sample_compressor: Callable[..., Any] | None = None
    obs_preprocessor: Callable[..., Any] | None = None
    overlap: int = 1  # rows of history a memory needs before a transition (see netrl.samples)
    realtime: bool = False  # a real-time env must never be paused by pacing
    # When an env call hangs or a thread of the env dies (netrl.envs.guard): "stop" the worker with
    # exit code 1, or "reset": start a new episode, on a new env if the old one is stuck (three
    # failures in a row still stop it).
    on_env_failure: Literal["stop", "reset"] = "stop"
    # info[name] of every env step, recorded by the workers as a column and carried by the trainer's
    # batches as batch.extra["info/<name>"]: InfoKeys (or tuples or dicts of their fields)
    info_keys: tuple[InfoKey, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "info_keys", check_info_keys(self.info_keys, "Pipeline.info_keys"))


def rollout_memory() -> Any:
    """netrl.memory.rollout.RolloutMemory, the memory an on-policy agent needs, imported when a
    pipeline needs it (it loads torch)."""
    from netrl.memory.rollout import RolloutMemory

    return RolloutMemory
