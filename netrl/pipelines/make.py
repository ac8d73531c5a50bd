"""The pipeline config.json names (``env.pipeline``): a built-in one, imported only when chosen, or
the user's own ``module:function``."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any

from netrl.agents.registry import ALGORITHMS, Supports
from netrl.config.algorithms import supports_problems
from netrl.config.sections import Config
from netrl.envs.transforms import (
    CatFrames,
    FrameSkipTransform,
    GrayScale,
    ObservationNorm,
    PermuteTransform,
    Resize,
    applies_transforms,
    compose_from_config,
    transformed,
)
from netrl.errors import ConfigError
from netrl.memory.action_buffer import ActionBufferCompressor
from netrl.pipelines.base import Pipeline, rollout_memory
from netrl.pipelines.replay_options import apply_replay_options
from netrl.samples.info import InfoKey

__all__ = ["make_pipeline"]


def make_pipeline(cfg: Config) -> Pipeline:
    """The pipeline named by ``env.pipeline``: a built-in one, or
    ``module:function``'s (``function(cfg)``).

    Raises ConfigError also when the pipeline's agent class declares what it trains with
    (:mod:`netrl.agents.registry`) and the config does not give it that (``trainer.collection``,
    ``worker.init_random_frames``), when an on-policy agent (``agent.algorithm`` "ppo", or an agent
    class that declares a rollout memory) comes with a memory that is not a RolloutMemory, and when
    ``memory.n_step`` or ``memory.prioritized`` is set for a memory that is not a ring memory
    (ReplayMemory, HistoryMemory)."""
    if cfg.env.pipeline == "gym":
        from netrl.pipelines.gym import gym_pipeline

        pipeline = gym_pipeline(cfg)
    elif cfg.env.pipeline == "drone":
        from netrl.pipelines.drone import drone_pipeline

        pipeline = drone_pipeline(cfg)
    elif cfg.env.pipeline == "image":
        from netrl.pipelines.image import image_pipeline

        pipeline = image_pipeline(cfg)
    else:
        pipeline = _own_pipeline(cfg)
    _check_agent(cfg, pipeline)
    _check_sequences(cfg, pipeline)
    return apply_replay_options(cfg, _with_info_keys(cfg, with_transforms(cfg, pipeline)))


def with_transforms(cfg: Config, pipeline: Pipeline) -> Pipeline:
    """``pipeline`` with its envs seen through ``env.transforms``: the worker, the trainer (the
    spaces its memory and agent are built for) and --check-env all build the transformed env."""
    transform = compose_from_config(cfg.env.transforms)
    if transform is None or applies_transforms(pipeline.env_cls):
        return pipeline  # (the image pipeline applies them itself, to size its memory's frames)
    if isinstance(pipeline.sample_compressor, ActionBufferCompressor):
        # the memory rebuilds rtgym's action buffer from one recorded action per row: repeated
        # actions, or changed observation leaves, would make it rebuild what the actor never saw
        bad = [repr(t) for t in transform.transforms
               if isinstance(t, (Resize, PermuteTransform, GrayScale, CatFrames, ObservationNorm))
               or (isinstance(t, FrameSkipTransform) and t.frame_skip > 1)]
        if bad:
            raise ConfigError([f"env.transforms holds {', '.join(bad)}, but env.pipeline "
                               f'"{cfg.env.pipeline}" drops rtgym\'s action buffer on the worker '
                               f"and rebuilds it in the memory from one action per row: keep "
                               f"the reward transforms and StepCounter, or set rtgym's "
                               f"act_buf_len to 0 in a pipeline of your own"])
    return dataclasses.replace(pipeline, env_cls=transformed(pipeline.env_cls, transform))


def _with_info_keys(cfg: Config, pipeline: Pipeline) -> Pipeline:
    """``env.info_keys`` added to the pipeline's own (any pipeline's: the key is read here)."""
    if not cfg.env.info_keys:
        return pipeline
    try:
        keys = (*pipeline.info_keys, *(InfoKey(**k) for k in cfg.env.info_keys))  # (checked)
        return dataclasses.replace(pipeline, info_keys=keys)
    except ValueError as exc:  # a name the pipeline declares already
        raise ConfigError([f'env.info_keys: {exc} (env.pipeline "{cfg.env.pipeline}" declares '
                           f"{[k.name for k in pipeline.info_keys]})"]) from None


def _unwrapped(cls: Any) -> Any:
    while isinstance(cls, functools.partial):
        cls = cls.func
    return cls


def _check_agent(cfg: Config, pipeline: Pipeline) -> None:
    """The pipeline's agent against the config: what its class declares it trains with
    (:mod:`netrl.agents.registry`), and the memory an on-policy agent needs."""
    agent = _unwrapped(pipeline.training_agent_cls)
    declared = getattr(agent, "supports", None)
    problems = _on_policy_problems(cfg, pipeline, declared)
    if isinstance(declared, Supports):
        name = getattr(agent, "__name__", repr(agent))
        who = f'{name} (env.pipeline "{cfg.env.pipeline}")'
        problems += [message for _, message in supports_problems(
            declared, cfg, who, "env.pipeline", "give the pipeline an agent that trains this way")]
    if problems:
        raise ConfigError(problems)


def _on_policy_problems(cfg: Config, pipeline: Pipeline, declared: Any) -> list[str]:
    """An on-policy agent (one that declares a rollout memory) trains each batch once, on samples of
    one weight version: a replay memory would hand it older ones, sampled at random, without the
    trajectory ids its advantages need."""
    on_policy = isinstance(declared, Supports) and declared.memory == "rollout"
    named = [a for a in ALGORITHMS
             if a.name == cfg.agent.algorithm and a.supports.memory == "rollout"]
    if not (named or on_policy):
        return []
    memory = _unwrapped(pipeline.memory_cls)
    if isinstance(memory, type) and issubclass(memory, rollout_memory()):
        return []
    agent = _unwrapped(pipeline.training_agent_cls)
    name, memory_name = (getattr(c, "__name__", repr(c)) for c in (agent, memory))
    if isinstance(declared, Supports) and on_policy:
        return [f'{name} is on-policy (agent.algorithm "{cfg.agent.algorithm}") and needs a '
                f'RolloutMemory, but env.pipeline "{cfg.env.pipeline}" gives it {memory_name}, '
                "which is not one: build the pipeline with "
                "memory_cls=netrl.memory.rollout.RolloutMemory (and trainer.collection "
                f'"{declared.collection}")']
    label = named[0].supports.label
    return [f'agent.algorithm "{cfg.agent.algorithm}" needs {label} with a RolloutMemory, but '
            f'env.pipeline "{cfg.env.pipeline}" gives {name} with {memory_name}: use '
            f'env.pipeline "gym" (or a pipeline of your own that builds {label} with '
            "RolloutMemory), or choose another agent.algorithm"]


def _check_sequences(cfg: Config, pipeline: Pipeline) -> None:
    """memory.sequence_length reaches a pipeline's memory only through its partial:
    one built without it would hand single transitions to an agent configured for
    sequences, without a word."""
    want = cfg.memory.sequence_length
    if want == 1:
        return
    got = (getattr(pipeline.memory_cls, "keywords", None) or {}).get("sequence_length", 1)
    if got != want:
        raise ConfigError([f"memory.sequence_length is {want}, but env.pipeline "
                           f'"{cfg.env.pipeline}" builds its memory with sequence_length '
                           f"{got}: pass memory_cls=partial(ReplayMemory, "
                           f"sequence_length=..., burn_in=...) from the config in "
                           f"the pipeline, or set memory.sequence_length to 1"])


def _own_pipeline(cfg: Config) -> Pipeline:
    """``env.pipeline`` as "module:function": import the module and call ``function(cfg)``.
    ConfigError when that cannot be done or does not give a Pipeline; errors inside the function are
    the user's, and keep their traceback."""
    name = cfg.env.pipeline
    module_name, _, function_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name is not None and exc.name != module_name and not module_name.startswith(exc.name + "."):
            # the module was found, but something it imports is missing: its own traceback says what
            raise
        raise ConfigError([f'env.pipeline "{name}": cannot import {module_name} ({exc}); '
                           f"start netrl from the folder that holds it (netrl puts the "
                           f"folder it starts in on the import path), or install it"]) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError([f'env.pipeline "{name}": {module.__name__} has no '
                           f'function {function_name}'])
    pipeline = function(cfg)
    if not isinstance(pipeline, Pipeline):
        raise ConfigError([f'env.pipeline "{name}": {function_name}(cfg) returned a '
                           f"{type(pipeline).__name__}, not a netrl.pipelines.Pipeline"])
    return pipeline
