"""The algorithm table drives the gym pipeline: each entry's builder makes the agent that declares
the entry, and make_pipeline checks any pipeline's declared agent against the config."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any

import pytest

from netrl.agents.registry import ALGORITHMS
from netrl.config.load import config_from_dict
from netrl.errors import ConfigError
from netrl.pipelines.algorithms import Parts
from netrl.pipelines.make import make_pipeline


def unwrapped(cls: Any) -> Any:
    while isinstance(cls, functools.partial):
        cls = cls.func
    return cls


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: f"{a.name}-{a.supports.label}")
def test_each_entrys_builder_makes_the_agent_that_declares_it(algorithm: Any) -> None:
    recurrent = algorithm.supports.recurrent
    cfg = config_from_dict({"agent": {"recurrent": "gru" if recurrent else None},
                            "memory": {"sequence_length": 8 if recurrent else 1}})
    module, _, function = algorithm.build.partition(":")
    parts = getattr(importlib.import_module(module), function)(cfg)
    assert isinstance(parts, Parts)
    assert unwrapped(parts.training_agent_cls).supports is algorithm.supports
    memory = unwrapped(parts.memory_cls).__name__
    assert memory == {"replay": "ReplayMemory", "sequences": "ReplayMemory",
                      "rollout": "RolloutMemory"}[algorithm.supports.memory]


def test_an_agent_that_cannot_train_with_the_collection_is_refused_in_any_pipeline() -> None:
    """auto picks SAC for Pendulum; the drone's SAC is fixed: neither learns from sync batches."""
    with pytest.raises(ConfigError, match=r'SACAgent \(env.pipeline "gym"\) needs '
                       r'trainer.collection "async" \(got "sync"\): SAC learns from a replay'):
        make_pipeline(config_from_dict({"trainer": {"collection": "sync"}}))
    with pytest.raises(ConfigError,
                       match=r'SACAgent \(env.pipeline "drone"\) needs trainer.collection'):
        make_pipeline(config_from_dict({"env": {"pipeline": "drone"},
                                        "trainer": {"collection": "sync"}}))


def test_auto_with_a_recurrent_actor_and_discrete_actions_is_refused_naming_its_agent() -> None:
    cfg = config_from_dict({"env": {"id": "CartPole-v1"}, "agent": {"recurrent": "gru"},
                            "memory": {"sequence_length": 8}})
    with pytest.raises(ConfigError, match=r'env.id "CartPole-v1" has Discrete actions, but the '
                       r"gym pipeline trains recurrent SAC for Box actions"):
        make_pipeline(cfg)
    named = dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, algorithm="sac"))
    with pytest.raises(ConfigError, match=r'agent.algorithm "sac" needs Box actions, but '
                       r'env.id "CartPole-v1" has Discrete\(2\)'):
        make_pipeline(named)
