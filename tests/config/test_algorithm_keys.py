"""agent.algorithm and the PPO keys: combinations PPO cannot train with are refused, naming both keys."""

from __future__ import annotations

import typing

import pytest

from netrl.agents.registry import NAMES
from netrl.config.load import config_from_dict
from netrl.config.sections import AgentConfig, TrainerConfig
from netrl.errors import ConfigError

SYNC = hasattr(TrainerConfig, "collection")  # trainer.collection comes with the sync collection (issue 33)


def problems(data: dict, role: str | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "config.json", role=role)
    return info.value.problems


def test_the_default_is_auto_and_the_ppo_keys_have_sb3s_defaults() -> None:
    a = config_from_dict({}).agent
    assert a.algorithm == "auto"
    p = a.ppo
    assert (p.lr, p.epochs, p.minibatch_size, p.clip_range, p.clip_range_vf, p.gae_lambda,
            p.ent_coef, p.vf_coef, p.max_grad_norm, p.anneal_frames) == (
        3e-4, 10, 64, 0.2, None, 0.95, 0.0, 0.5, 0.5, None)


def test_agent_algorithm_takes_the_names_of_the_algorithm_table() -> None:
    assert typing.get_args(typing.get_type_hints(AgentConfig)["algorithm"]) == ("auto", *NAMES)


def test_bad_ppo_values_are_all_named_at_once() -> None:
    ppo = {"epochs": 0, "clip_range": 0, "gae_lambda": 1.5, "clip_range_vf": -1.0,
           "anneal_frames": 0}
    assert sorted(problems({"agent": {"algorithm": "a2c", "ppo": ppo}})) == [
        'agent.algorithm must be "auto" or "sac" or "dqn" or "ppo" (got "a2c")',
        "agent.ppo.anneal_frames must be >= 1 (got 0)",
        "agent.ppo.clip_range must be > 0 (got 0)",
        "agent.ppo.clip_range_vf must be > 0 (got -1.0)",
        "agent.ppo.epochs must be >= 1 (got 0)",
        "agent.ppo.gae_lambda must be between 0.0 and 1.0 (got 1.5)"]


def test_ppo_with_async_collection_is_refused_naming_both_keys() -> None:
    data: dict = {"agent": {"algorithm": "ppo"}}
    if SYNC:
        data["trainer"] = {"collection": "async"}
    assert problems(data) == [
        'agent.algorithm "ppo" needs trainer.collection "sync" (got "async"): PPO trains each batch on samples of one '
        'weight version; set trainer.collection to "sync", or choose another agent.algorithm']
    assert problems(data, role="trainer") == problems(data, role="worker") == problems(data)
    assert config_from_dict(data, role="server").agent.algorithm == "ppo"  # the server relays whatever it is


def test_ppo_with_random_first_actions_is_refused_naming_both_keys() -> None:
    data: dict = {"agent": {"algorithm": "ppo"}, "worker": {"init_random_frames": 1000}}
    found = problems(data)
    assert ('worker.init_random_frames (1000) must be 0 with agent.algorithm "ppo": PPO learns from the actions its '
            "own policy chose, with their log-probabilities, and a random action has none") in found
    assert config_from_dict({"worker": {"init_random_frames": 1000}}).worker.init_random_frames == 1000  # SAC: fine


@pytest.mark.skipif(not SYNC, reason="trainer.collection and trainer.frames_per_batch come with the sync collection")
def test_ppo_with_sync_collection_loads_and_a_minibatch_beyond_the_batch_is_refused() -> None:
    sync = {"collection": "sync", "frames_per_batch": 256}
    cfg = config_from_dict({"agent": {"algorithm": "ppo", "ppo": {"minibatch_size": 256}},
                            "trainer": sync})
    assert cfg.agent.algorithm == "ppo"
    assert problems({"agent": {"algorithm": "ppo", "ppo": {"minibatch_size": 512}},
                     "trainer": sync}) == [
        "agent.ppo.minibatch_size (512) must be <= trainer.frames_per_batch (256): a PPO "
        "minibatch is drawn from one batch"]


def test_sac_and_dqn_named_with_sync_collection_are_refused_naming_both_keys() -> None:
    """The table says what each algorithm needs: SAC and DQN learn from a replay memory."""
    for name, label in (("sac", "SAC"), ("dqn", "DQN")):
        assert problems({"agent": {"algorithm": name}, "trainer": {"collection": "sync"}}) == [
            f'agent.algorithm "{name}" needs trainer.collection "async" (got "sync"): {label} '
            "learns from a replay memory that the workers fill as they go; set "
            'trainer.collection to "async", or choose another agent.algorithm']
    # auto: decided by the env's actions, in the gym pipeline
    assert config_from_dict({"trainer": {"collection": "sync"}}).trainer.collection == "sync"
