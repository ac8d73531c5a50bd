"""A pipeline: the classes a worker and a trainer must agree on; :func:`make_pipeline` builds the one config names.

A pipeline bundles what tmrl users pass to ``RolloutWorker`` and ``TrainingOffline``: the env class, the actor
class, the sample compressor, the memory class and the training agent class.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from netrl.config.sections import Config
from netrl.errors import ConfigError

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
    """The pipeline named by ``env.pipeline``: a built-in one, or ``module:function``'s (``function(cfg)``)."""
    if cfg.env.pipeline == "gym":
        from netrl.pipelines.gym import gym_pipeline

        return gym_pipeline(cfg)
    if cfg.env.pipeline == "drone":
        from netrl.pipelines.drone import drone_pipeline

        return drone_pipeline(cfg)
    if cfg.env.pipeline == "image":
        from netrl.pipelines.image import image_pipeline

        return image_pipeline(cfg)
    return _own_pipeline(cfg)


def _own_pipeline(cfg: Config) -> Pipeline:
    """``env.pipeline`` as "module:function": import the module and call ``function(cfg)``. ConfigError when that
    cannot be done or does not give a Pipeline; errors inside the function are the user's, and keep their traceback."""
    name = cfg.env.pipeline
    module_name, _, function_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name is not None and exc.name != module_name and not module_name.startswith(exc.name + "."):
            raise  # the module was found, but something it imports is missing: its own traceback says what
        raise ConfigError([f'env.pipeline "{name}": cannot import {module_name} ({exc}); start netrl from the '
                           "folder that holds it (netrl puts the folder it starts in on the import path), or "
                           "install it"]) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError([f'env.pipeline "{name}": {module.__name__} has no function {function_name}'])
    pipeline = function(cfg)
    if not isinstance(pipeline, Pipeline):
        raise ConfigError([f'env.pipeline "{name}": {function_name}(cfg) returned a {type(pipeline).__name__}, not a '
                           "netrl.pipelines.Pipeline"])
    return pipeline
