"""Keys with a new name: each algorithm's keys in its own section, the priority keys prefixed. The
old names still load, with one deprecation message naming the new keys; both at once are refused."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from netrl.config.load import config_from_dict
from netrl.config.renamed import RENAMED
from netrl.config.sections import Config
from netrl.errors import ConfigError

OLD = {"agent": {"alpha": 0.3, "lr_critic": 2e-3, "lr_ppo": 1e-4, "ppo_epochs": 4,
                 "exploration_steps": 9, "ppo_anneal_frames": 500},
       "memory": {"alpha": 0.7, "beta": 0.5, "beta_steps": 10, "eps": 1e-3}}


def test_old_keys_load_into_their_new_places_with_one_message_naming_each_new_key(
        caplog: pytest.LogCaptureFixture) -> None:
    data = copy.deepcopy(OLD)
    with caplog.at_level(logging.WARNING, "netrl.config.load"):
        cfg = config_from_dict(data, "config.json")
    a, m = cfg.agent, cfg.memory
    assert (a.sac.entropy_coef, a.sac.lr_critic, a.ppo.lr, a.ppo.epochs, a.ppo.anneal_frames) == (
        0.3, 2e-3, 1e-4, 4, 500)
    # agent.lr_critic was DQN's learning rate too
    assert (a.dqn.lr, a.dqn.exploration_steps) == (2e-3, 9)
    assert (m.priority_alpha, m.priority_beta, m.priority_beta_steps, m.priority_eps) == (
        0.7, 0.5, 10, 1e-3)
    assert data == OLD  # the caller's data is left as it was
    assert [r.getMessage() for r in caplog.records] == [
        "config.json uses 10 old key names, which still work: rename them\n"
        "  agent.alpha is now agent.sac.entropy_coef\n"
        "  agent.lr_critic is now agent.sac.lr_critic and agent.dqn.lr\n"
        "  agent.exploration_steps is now agent.dqn.exploration_steps\n"
        "  agent.lr_ppo is now agent.ppo.lr\n"
        "  agent.ppo_epochs is now agent.ppo.epochs\n"
        "  agent.ppo_anneal_frames is now agent.ppo.anneal_frames\n"
        "  memory.alpha is now memory.priority_alpha\n"
        "  memory.beta is now memory.priority_beta\n"
        "  memory.beta_steps is now memory.priority_beta_steps\n"
        "  memory.eps is now memory.priority_eps"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, "netrl.config.load"):
        config_from_dict({"agent": {"sac": {"entropy_coef": 0.3}}})
    assert caplog.records == []  # the new names say nothing


def value_at(node: Any, key: str) -> Any:
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_every_old_key_is_read() -> None:
    unset = {"target_entropy": -1.0, "clip_range_vf": 0.3, "anneal_frames": 100}  # null by default
    for old, new_keys in RENAMED.items():
        default = value_at(Config(), new_keys[0])
        leaf = new_keys[0].rsplit(".", 1)[1]
        value = (unset[leaf] if default is None else not default if isinstance(default, bool)
                 else default + 1 if isinstance(default, int) else default / 2)
        section, old_leaf = old.split(".")
        cfg = config_from_dict({section: {old_leaf: value}})
        assert [value_at(cfg, new) for new in new_keys] == [value] * len(new_keys), old


def test_an_old_key_and_its_new_one_together_are_refused_naming_both() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"agent": {"alpha": 0.3, "sac": {"entropy_coef": 0.3}},
                          "memory": {"eps": 1e-3, "priority_eps": 1e-3}})
    assert err.value.problems == [
        "agent.alpha and agent.sac.entropy_coef are one setting (agent.alpha is its old name): "
        "keep agent.sac.entropy_coef only",
        "memory.eps and memory.priority_eps are one setting (memory.eps is its old name): keep "
        "memory.priority_eps only"]
    with pytest.raises(ConfigError, match=r"agent\.lr_critic and agent\.dqn\.lr are one setting"):
        config_from_dict({"agent": {"lr_critic": 1e-3, "dqn": {"lr": 1e-3}}})


def test_a_bad_value_under_an_old_name_is_refused_under_that_name() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"agent": {"alpha": -1}, "memory": {"alpha": 2}})
    assert err.value.problems == [
        "agent.alpha (now agent.sac.entropy_coef) must be > 0 (got -1)",
        "memory.alpha (now memory.priority_alpha) must be between 0.0 and 1.0 (got 2)"]


def test_code_that_reads_the_old_attributes_gets_the_new_keys_values_and_a_warning() -> None:
    cfg = config_from_dict({"agent": {"sac": {"lr_actor": 5e-4}, "ppo": {"epochs": 3}},
                            "memory": {"priority_beta": 0.6}})
    with pytest.warns(FutureWarning,
                      match=r"agent\.lr_actor is deprecated: read agent\.sac\.lr_actor"):
        assert cfg.agent.lr_actor == 5e-4
    with pytest.warns(FutureWarning,
                      match=r"memory\.beta is deprecated: read memory\.priority_beta"):
        assert cfg.memory.beta == 0.6
    with pytest.warns(FutureWarning):
        assert cfg.agent.ppo_epochs == 3
    with pytest.raises(AttributeError, match="'AgentConfig' object has no attribute 'lr_actr'"):
        _ = cfg.agent.lr_actr
    assert copy.deepcopy(cfg) == cfg  # copy's probes for __deepcopy__ are no old names
