"""The sequence and recurrent keys: each bad combination is refused naming both keys and their values."""

from __future__ import annotations

from typing import Any

import pytest

from netrl.config.load import config_from_dict
from netrl.errors import ConfigError


@pytest.mark.parametrize(("data", "message"), [
    ({"agent": {"recurrent": "gru"}},
     r'agent.recurrent "gru" needs memory.sequence_length >= 2 \(got 1\)'),
    ({"memory": {"memory_size": 100, "batch_size": 10, "sequence_length": 101}},
     r"memory.sequence_length \(101\) must be <= memory.memory_size \(100\)"),
    ({"memory": {"sequence_length": 8, "burn_in": 8}}, r"memory.burn_in \(8\) must be < memory.sequence_length \(8\)"),
    ({"memory": {"sequence_length": 0}}, r"memory.sequence_length must be >= 1 \(got 0\)"),
    ({"agent": {"recurrent": "rnn"}}, r'agent.recurrent must be "gru" or "lstm" or null'),
    ({"agent": {"recurrent": "lstm", "algorithm": "dqn"}, "memory": {"sequence_length": 8}},
     r'agent.recurrent "lstm" is for SAC, not agent.algorithm "dqn"'),
    ({"env": {"hide_obs": [2, 2]}}, r"env.hide_obs must list distinct indices >= 0"),
])
def test_bad_sequence_settings_are_refused_naming_the_keys(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


def test_a_recurrent_config_loads() -> None:
    cfg = config_from_dict({"agent": {"recurrent": "lstm"}, "memory": {"sequence_length": 16, "burn_in": 4},
                            "env": {"hide_obs": [2]}})
    assert (cfg.agent.recurrent, cfg.memory.sequence_length, cfg.memory.burn_in) == ("lstm", 16, 4)
