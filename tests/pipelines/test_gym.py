"""The gym pipeline picks its agent from the env's action space: SAC for Box actions, DQN for discrete ones."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest

from netrl.agents.dqn import DQNActor, DQNAgent
from netrl.agents.sac import MLPActor, SACAgent
from netrl.config.load import config_from_dict
from netrl.errors import ConfigError
from netrl.pipelines.make import make_pipeline


class TextActions(gymnasium.Env[np.ndarray, str]):
    observation_space = gymnasium.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gymnasium.spaces.Text(4)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        return np.zeros(2, np.float32), {}

    def step(self, action: str) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(2, np.float32), 0.0, True, False, {}


def test_cartpole_gets_dqn_with_the_agent_section_and_pendulum_keeps_sac() -> None:
    dqn = {"lr": 2e-3, "target_update_interval": 7, "exploration_initial_eps": 0.5,
           "exploration_final_eps": 0.1, "exploration_steps": 9}
    cfg = config_from_dict({"env": {"id": "CartPole-v1"},
                            "agent": {"gamma": 0.9, "hidden_sizes": [32], "dqn": dqn}})
    pipeline = make_pipeline(cfg)
    env = pipeline.env_cls()
    try:
        agent = pipeline.training_agent_cls(env.observation_space, env.action_space, "cpu")
        actor = pipeline.actor_module_cls(env.observation_space, env.action_space)
    finally:
        env.close()
    assert isinstance(agent, DQNAgent) and isinstance(actor, DQNActor)
    assert (agent.gamma, agent.target_update_interval, agent.eps_initial, agent.eps_final, agent.eps_steps) == (
        0.9, 7, 0.5, 0.1, 9)
    assert agent.optimizer.param_groups[0]["lr"] == 2e-3 and agent.actor.epsilon.item() == 0.5
    assert actor.q.advantage.in_features == 32
    pendulum = make_pipeline(config_from_dict({}))
    env = pendulum.env_cls()
    try:
        assert isinstance(pendulum.training_agent_cls(env.observation_space, env.action_space, "cpu"), SACAgent)
        assert isinstance(pendulum.actor_module_cls(env.observation_space, env.action_space), MLPActor)
    finally:
        env.close()


def test_actions_neither_agent_takes_are_refused_naming_the_env_and_the_space() -> None:
    gymnasium.register("NetrlTestTextActions-v0", entry_point=TextActions)
    try:
        with pytest.raises(ConfigError, match=r'env\.id "NetrlTestTextActions-v0" has Text actions, but the gym '
                                              r"pipeline trains SAC for Box actions and DQN for Discrete"):
            make_pipeline(config_from_dict({"env": {"id": "NetrlTestTextActions-v0"}}))
    finally:
        gymnasium.registry.pop("NetrlTestTextActions-v0")


def test_bad_dqn_settings_are_all_named_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"agent": {"dqn": {
            "target_update_interval": 0, "exploration_final_eps": 1.5, "exploration_steps": -1,
            "exploration_initial_eps": "x"}}})
    assert sorted(err.value.problems) == [
        'agent.dqn.exploration_final_eps must be between 0.0 and 1.0 (got 1.5)',
        'agent.dqn.exploration_initial_eps must be a finite number (got "x")',
        "agent.dqn.exploration_steps must be >= 0 (got -1)",
        "agent.dqn.target_update_interval must be >= 1 (got 0)"]
