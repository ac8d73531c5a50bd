"""Sync collection's settings: config errors name the key and the value; the loop refuses what cannot work."""

from __future__ import annotations

import pytest

from netrl.config.load import config_from_dict
from netrl.errors import ConfigError
from netrl.memory.replay import ReplayMemory
from netrl.memory.rollout import RolloutMemory
from netrl.training.loop import TrainingOffline
from tests.fakes import ACT, OBS, ListSource


def test_bad_sync_settings_are_each_named_with_their_value() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"trainer": {"collection": "on", "frames_per_batch": 0, "rollout_fragment_length": -1,
                                      "batch_mode": "whole", "sync_timeout_s": 0}})
    text = str(err.value)
    for line in ('trainer.collection must be "async" or "sync" (got "on")',
                 "trainer.frames_per_batch must be >= 1 (got 0)",
                 "trainer.rollout_fragment_length must be >= 1 (got -1)",
                 'trainer.batch_mode must be "truncate_episodes" or "complete_episodes" (got "whole")',
                 "trainer.sync_timeout_s must be > 0 (got 0)"):
        assert line in text


def test_the_default_is_async_and_sync_settings_reach_the_loop() -> None:
    cfg = config_from_dict({"trainer": {"collection": "sync", "frames_per_batch": 64,
                                        "batch_mode": "complete_episodes"}})
    assert config_from_dict({}).trainer.collection == "async"
    assert (cfg.trainer.collection, cfg.trainer.frames_per_batch, cfg.trainer.rollout_fragment_length,
            cfg.trainer.batch_mode, cfg.trainer.sync_timeout_s) == ("sync", 64, 256, "complete_episodes", 30.0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"collection": "sometimes"}, 'collection must be "async" or "sync"'),
    ({"collection": "sync", "frames_per_batch": 0}, r"frames_per_batch must be an integer >= 1 \(got 0\)"),
    ({"collection": "sync", "batch_mode": "whole"}, "batch_mode must be one of truncate_episodes, complete_episodes"),
    ({"collection": "sync", "sync_timeout_s": -1.0}, r"sync_timeout_s must be > 0 \(got -1.0\)"),
])
def test_the_loop_refuses_bad_sync_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainingOffline(env_cls=(OBS, ACT), **kwargs)


def test_sync_collection_needs_a_memory_it_can_clear_and_a_source_that_announces_it() -> None:
    with pytest.raises(ValueError, match="the memory ReplayMemory has no clear"):
        TrainingOffline(env_cls=(OBS, ACT), collection="sync", memory_cls=ReplayMemory, device="cpu").build()
    training = TrainingOffline(env_cls=(OBS, ACT), collection="sync", memory_cls=RolloutMemory, device="cpu")
    with pytest.raises(ValueError, match="sample source ListSource cannot tell the workers"):
        training.start(ListSource([]))  # type: ignore[arg-type]
