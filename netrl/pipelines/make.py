"""The pipeline config.json names (``env.pipeline``): a built-in one, imported only when chosen, or the user's own
``module:function``."""

from __future__ import annotations

import importlib

from netrl.config.sections import Config
from netrl.errors import ConfigError
from netrl.pipelines.base import Pipeline

__all__ = ["make_pipeline"]


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
