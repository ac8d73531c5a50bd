"""agent.algorithm in the gym pipeline: auto, sac and dqn as before, ppo for either action space with a RolloutMemory,
and the combinations no agent can train (the wrong action space; PPO with a replay memory) refused, naming the keys."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from netrl.agents.dqn import DQNAgent
from netrl.agents.ppo import PPOActor, PPOAgent
from netrl.agents.sac import SACAgent
from netrl.config.load import config_from_dict
from netrl.config.sections import Config
from netrl.errors import ConfigError
from netrl.pipelines.base import Pipeline
from netrl.pipelines.make import make_pipeline


def with_agent(cfg: Config, **agent: Any) -> Config:
    """``cfg`` with agent keys set past the checks between keys (which refuse ppo without trainer.collection sync:
    tests/config/test_algorithm_keys.py); the pipeline's own checks are what is tested here."""
    return dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, **agent))


def built(pipeline: Pipeline) -> tuple[Any, Any]:
    env = pipeline.env_cls()
    try:
        return (pipeline.training_agent_cls(env.observation_space, env.action_space, "cpu"),
                pipeline.actor_module_cls(env.observation_space, env.action_space))
    finally:
        env.close()


def test_sac_and_dqn_may_be_named_and_are_refused_for_actions_they_cannot_take() -> None:
    pendulum, cartpole = config_from_dict({}), config_from_dict({"env": {"id": "CartPole-v1"}})
    assert isinstance(built(make_pipeline(with_agent(pendulum, algorithm="sac")))[0], SACAgent)
    assert isinstance(built(make_pipeline(with_agent(cartpole, algorithm="dqn")))[0], DQNAgent)
    with pytest.raises(ConfigError, match=r'agent.algorithm "dqn" needs Discrete, MultiDiscrete or MultiBinary '
                                          r'actions, but env.id "Pendulum-v1" has Box\(-2.0, 2.0, \(1,\), float32\)'):
        make_pipeline(with_agent(pendulum, algorithm="dqn"))
    with pytest.raises(ConfigError, match=r'agent.algorithm "sac" needs Box actions, but env.id "CartPole-v1" has '
                                          r"Discrete\(2\)"):
        make_pipeline(with_agent(cartpole, algorithm="sac"))


def test_ppo_is_built_with_the_agent_section_and_a_rollout_memory_for_box_and_discrete_actions() -> None:
    rollout = pytest.importorskip("netrl.memory.rollout", reason="RolloutMemory comes with the sync collection")
    ppo = {"gae_lambda": 0.8, "lr": 1e-3, "epochs": 20, "minibatch_size": 256, "clip_range": 0.3,
           "clip_range_vf": 0.5, "ent_coef": 0.01, "vf_coef": 0.7, "max_grad_norm": 0.9,
           "anneal_frames": 100_000}
    keys = {"algorithm": "ppo", "hidden_sizes": [32], "gamma": 0.98, "ppo": ppo}
    for env_id in ("Pendulum-v1", "CartPole-v1"):
        pipeline = make_pipeline(config_from_dict({"env": {"id": env_id}, "agent": keys,
                                                   "trainer": {"collection": "sync"}}))
        assert pipeline.memory_cls is rollout.RolloutMemory
        agent, actor = built(pipeline)
        assert isinstance(agent, PPOAgent) and isinstance(actor, PPOActor) and actor.pi[0].out_features == 32
        assert (agent.gamma, agent.gae_lambda, agent.lr, agent.n_epochs, agent.minibatch_size, agent.clip_range,
                agent.clip_range_vf, agent.ent_coef, agent.vf_coef, agent.max_grad_norm, agent.anneal_frames) == (
            0.98, 0.8, 1e-3, 20, 256, 0.3, 0.5, 0.01, 0.7, 0.9, 100_000)
        assert actor.continuous == (env_id == "Pendulum-v1")


OWN_PIPELINE = '''
from netrl.agents.ppo import PPOActor, PPOAgent
from netrl.envs.gym import GenericGymEnv
from netrl.memory.replay import ReplayMemory
from netrl.pipelines.base import Pipeline
from netrl.util import partial


def build(cfg):
    return Pipeline(env_cls=partial(GenericGymEnv, id="CartPole-v1"), actor_module_cls=PPOActor,
                    memory_cls=partial(ReplayMemory, memory_size=100), training_agent_cls=partial(PPOAgent, lr=1e-3))
'''


def test_ppo_with_a_replay_memory_is_refused_naming_the_algorithm_and_the_pipeline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("netrl.memory.rollout", reason="RolloutMemory comes with the sync collection")
    (tmp_path / "ppo_replay.py").write_text(OWN_PIPELINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = config_from_dict({"env": {"pipeline": "ppo_replay:build"}})  # agent.algorithm auto: the agent class tells
    message = (r'PPOAgent is on-policy \(agent.algorithm "{}"\) and needs a RolloutMemory, but env.pipeline '
               r'"ppo_replay:build" gives it ReplayMemory, which is not one: build the pipeline with '
               r"memory_cls=netrl.memory.rollout.RolloutMemory")
    with pytest.raises(ConfigError, match=message.format("auto")):
        make_pipeline(cfg)
    with pytest.raises(ConfigError, match=message.format("ppo")):
        make_pipeline(with_agent(cfg, algorithm="ppo"))
    # a built-in pipeline of another agent (drone's SAC) is refused for agent.algorithm ppo too
    with pytest.raises(ConfigError, match=r'agent.algorithm "ppo" needs PPO with a RolloutMemory, but env.pipeline '
                                          r'"drone" gives SACAgent with ActionBufferMemory: use env.pipeline "gym"'):
        make_pipeline(with_agent(config_from_dict({"env": {"pipeline": "drone"}}), algorithm="ppo"))
