"""agent.algorithm and the PPO keys: combinations PPO cannot train with are refused, naming both keys."""

from __future__ import annotations

import pytest

from netrl.config.load import config_from_dict
from netrl.config.sections import TrainerConfig
from netrl.errors import ConfigError

SYNC = hasattr(TrainerConfig, "collection")  # trainer.collection comes with the sync collection (issue 33)


def problems(data: dict, role: str | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "config.json", role=role)
    return info.value.problems


def test_the_default_is_auto_and_the_ppo_keys_have_sb3s_defaults() -> None:
    a = config_from_dict({}).agent
    assert a.algorithm == "auto"
    assert (a.lr_ppo, a.ppo_epochs, a.minibatch_size, a.clip_range, a.clip_range_vf, a.gae_lambda, a.ent_coef,
            a.vf_coef, a.max_grad_norm, a.ppo_anneal_frames) == (3e-4, 10, 64, 0.2, None, 0.95, 0.0, 0.5, 0.5, None)


def test_bad_ppo_values_are_all_named_at_once() -> None:
    assert sorted(problems({"agent": {"algorithm": "a2c", "ppo_epochs": 0, "clip_range": 0, "gae_lambda": 1.5,
                                      "clip_range_vf": -1.0, "ppo_anneal_frames": 0}})) == [
        'agent.algorithm must be "auto" or "sac" or "dqn" or "ppo" (got "a2c")',
        "agent.clip_range must be > 0 (got 0)",
        "agent.clip_range_vf must be > 0 (got -1.0)",
        "agent.gae_lambda must be between 0.0 and 1.0 (got 1.5)",
        "agent.ppo_anneal_frames must be >= 1 (got 0)",
        "agent.ppo_epochs must be >= 1 (got 0)"]


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
    cfg = config_from_dict({"agent": {"algorithm": "ppo", "minibatch_size": 256}, "trainer": sync})
    assert cfg.agent.algorithm == "ppo"
    assert problems({"agent": {"algorithm": "ppo", "minibatch_size": 512}, "trainer": sync}) == [
        "agent.minibatch_size (512) must be <= trainer.frames_per_batch (256): a PPO minibatch is drawn from one batch"]
