"""Samplers that compose (netrl.memory.sampling): R2D2's priority of a sequence, prioritized sequences in a
ReplayMemory, and the config keys that no longer refuse each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from netrl.config.load import config_from_dict
from netrl.errors import ConfigError
from netrl.memory.priority import sequence_priority
from netrl.memory.replay import ReplayMemory
from tests.memory.streams import record


def test_a_sequences_priority_mixes_the_max_and_mean_of_its_real_steps() -> None:
    index = np.array([[10, 11, 12, 12], [20, 21, 22, 23]])  # the first sequence stopped after 3 steps
    td = np.array([[1.0, -3.0, 2.0, 100.0], [1.0, 1.0, 1.0, 5.0]])  # the padded step's value is ignored
    starts, mixed = sequence_priority(td, index, 0.9)
    assert starts.tolist() == [10, 20]
    np.testing.assert_allclose(mixed, [0.9 * 3 + 0.1 * 2, 0.9 * 5 + 0.1 * 2])
    assert sequence_priority(np.array([4.0, 5.0]), index, 0.9)[1].tolist() == [4.0, 5.0]  # one per sequence: as is
    with pytest.raises(ValueError, match=r"priority has shape \(3,\) for a batch of sequences \(2, 4\)"):
        sequence_priority(np.ones(3), index, 0.9)
    # burn-in steps train nothing: they leave the mixture; with no real step after them, 0
    td[0, 0], td[1, 0] = 50.0, 50.0
    mixed = sequence_priority(td, index, 0.9, burn_in=1)[1]
    np.testing.assert_allclose(mixed, [0.9 * 3 + 0.1 * 2.5, 0.9 * 5 + 0.1 * 7 / 3])
    short = np.array([[10, 10, 10, 10]])
    assert sequence_priority(np.full((1, 4), 9.0), short, 0.9, burn_in=2)[1].tolist() == [0.0]


def test_prioritized_sequences_are_drawn_by_their_start_rows_priority() -> None:
    rec = record(3, rounds=60, rows_max=5)
    memory = ReplayMemory(memory_size=5000, batch_size=32, sequence_length=6, prioritized=True, alpha=1.0,
                          beta_steps=0, eps=1e-9, seed=0)
    for buf in rec.packets:
        memory.append_buffer(buf)
    batch = memory.sample()
    index = batch.extra["index"].numpy()
    favourite = int(index[0, 0])
    # every sequence but the first gets a tiny priority per step; the first a large one
    td = np.full(index.shape, 1e-6)
    td[0] = 1000.0
    memory.update_priority(td, index)
    assert memory._priorities is not None
    assert memory._priorities.tree.get(np.array([favourite % 5000]))[0] == pytest.approx(1000.0)
    share = 1000.0 / memory._priorities.tree.total  # the rows never updated keep their first priority (1)
    starts = np.concatenate([memory.sample().extra["index"].numpy()[:, 0] for _ in range(5)])
    assert share > 0.5 and abs((starts == favourite).mean() - share) < 0.15


def config(tmp_path: Path, memory: dict[str, Any], agent: dict[str, Any] | None = None) -> Any:
    return config_from_dict({"run_name": "t", "weights_folder": str(tmp_path), "security": "none",
                             "agent": agent or {}, "memory": memory})


def test_sequences_take_n_step_and_prioritized_replay_in_config(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"sequence_length": 8, "burn_in": 2, "n_step": 3, "prioritized": True})
    assert (cfg.memory.sequence_length, cfg.memory.n_step, cfg.memory.prioritized) == (8, 3, True)
    with pytest.raises(ConfigError, match=r'memory.sequence_length \(8\) cannot be combined with memory.device '
                                          r'\("cuda"\): sequences follow links kept in host memory'):
        config(tmp_path, {"sequence_length": 8, "device": "cuda"})
    # the recurrent SAC takes both: n-step discounts per step, priorities per step
    cfg = config(tmp_path, {"sequence_length": 8, "burn_in": 2, "n_step": 3, "prioritized": True},
                 {"recurrent": "gru"})
    assert (cfg.agent.recurrent, cfg.memory.n_step, cfg.memory.prioritized) == ("gru", 3, True)
    short = {"sequence_length": 3, "n_step": 3}
    assert config(tmp_path, short, {"recurrent": "gru"}).memory.n_step == 3
    # windows longer than the sequences: the observations in between are in no step of the batch
    with pytest.raises(ConfigError, match=r"memory.n_step \(4\) must be <= memory.sequence_length "
                                          r'\(3\) with agent.recurrent \("gru"\)'):
        config(tmp_path, {**short, "n_step": 4}, {"recurrent": "gru"})
    # no recurrent agent to mind
    assert config(tmp_path, {**short, "n_step": 4}).memory.n_step == 4
