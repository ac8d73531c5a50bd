"""Ready-made pipelines: the classes a worker and a trainer must agree on, built from config.

A pipeline bundles what tmrl users pass to ``RolloutWorker`` and ``TrainingOffline``: the env class, the actor
class, the sample compressor, the memory class and the training agent class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from netrl.config import Config

__all__ = ["Pipeline", "make_pipeline"]


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


def make_pipeline(cfg: Config) -> Pipeline:
    """The pipeline named by ``env.pipeline``."""
    if cfg.env.pipeline == "gym":
        from netrl.pipelines.gym import gym_pipeline

        return gym_pipeline(cfg)
    if cfg.env.pipeline == "drone":
        from netrl.pipelines.drone import drone_pipeline

        return drone_pipeline(cfg)
    if cfg.env.pipeline == "image":
        from netrl.pipelines.image import image_pipeline

        return image_pipeline(cfg)
    raise ValueError(f'env.pipeline "{cfg.env.pipeline}" is not available in this netrl version')
