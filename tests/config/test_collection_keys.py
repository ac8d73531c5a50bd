"""The collection controls' keys (issue 31, item 6): worker.init_random_frames and trainer.total_frames."""

from __future__ import annotations

import pytest

from netrl.config.load import config_from_dict
from netrl.errors import ConfigError


def problems(data: dict, role: str | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "config.json", role=role)
    return info.value.problems


def test_the_collection_controls_are_off_by_default_and_bad_values_name_the_key() -> None:
    cfg = config_from_dict({})
    assert cfg.worker.init_random_frames == 0 and cfg.trainer.total_frames is None
    assert problems({"worker": {"init_random_frames": -1}, "trainer": {"total_frames": 0}}) == [
        "worker.init_random_frames must be >= 0 (got -1)",
        "trainer.total_frames must be >= 1 (got 0)",
    ]
    assert problems({"trainer": {"total_frames": 2.5}}) == ["trainer.total_frames must be an integer or null (got 2.5)"]


def test_a_total_frames_below_start_training_names_both_keys_for_the_trainer_only() -> None:
    data = {"trainer": {"total_frames": 500, "start_training": 1000}}
    assert problems(data) == ["trainer.total_frames (500) must be >= trainer.start_training (1000): training would "
                              "stop before it starts"]
    assert problems(data, role="trainer") == problems(data)
    assert config_from_dict(data, role="worker").trainer.total_frames == 500  # not the worker's concern
    assert config_from_dict({"trainer": {"total_frames": 1000, "start_training": 1000}}).trainer.total_frames == 1000
