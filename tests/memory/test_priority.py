"""Prioritized replay: the numpy sum tree against a plain cumulative-sum reference, and ReplayMemory's priorities
(new rows at the maximum, importance weights, beta's annealing, updates that skip overwritten rows and NaN), through
the training loop with SAC from a real worker's packets."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from netrl.config.load import config_from_dict
from netrl.errors import ConfigError
from netrl.local import run_local
from netrl.memory.replay import ReplayMemory
from netrl.memory.sumtree import SumTree
from netrl.pipelines.make import make_pipeline
from netrl.samples import Buffer
from netrl.trainer.trainer import Trainer
from netrl.worker.worker import RolloutWorker


def test_the_sum_tree_finds_the_rows_a_cumulative_sum_finds_after_batched_updates() -> None:
    rng = np.random.default_rng(0)
    tree = SumTree(1000)  # not a power of two: the padding leaves stay 0
    reference = np.zeros(1000)
    for _ in range(20):
        idx = rng.integers(0, 1000, 300)  # with repeats: the last value of a row wins, as in numpy
        values = rng.random(300) * (rng.random(300) < 0.7)
        tree.update(idx, values)
        reference[idx] = values
        assert tree.total == pytest.approx(reference.sum(), rel=1e-12)
        assert np.array_equal(tree.get(np.arange(1000)), reference)
        cumsum = np.cumsum(reference)
        prefix = rng.random(500) * reference.sum()
        assert np.array_equal(tree.find(prefix), np.searchsorted(cumsum, prefix, side="right"))
    # slice edges: a prefix sum equal to the sum before a row is that row's, and empty rows are skipped
    edges = SumTree(8)
    edges.update(np.arange(8), np.array([0, 0, 3, 0, 0, 1, 0, 2.0]))
    assert edges.find(np.array([0.0, 2.999, 3.0, 3.5, 4.0, 5.999])).tolist() == [2, 2, 5, 5, 7, 7]


def test_the_sum_tree_samples_in_proportion_to_priority() -> None:
    rng = np.random.default_rng(1)
    p = np.zeros(64)
    p[rng.choice(64, 40, replace=False)] = rng.random(40) ** 2
    tree = SumTree(64)
    tree.update(np.arange(64), p)
    counts = np.bincount(np.concatenate([tree.sample(rng, 256) for _ in range(400)]), minlength=64)
    expected = p / p.sum() * counts.sum()
    assert counts[p == 0].sum() == 0  # a row of priority 0 is never drawn
    seen = expected > 50
    assert np.abs(counts[seen] - expected[seen]).max() < 5 * np.sqrt(expected[seen]).max()  # 5 sigma
    assert ((counts - expected) ** 2 / np.maximum(expected, 1e-9))[p > 0].sum() < 2 * 40  # chi-square, 40 dof


@pytest.mark.parametrize("values, message", [([np.nan], "finite"), ([-1.0], ">= 0")])
def test_the_sum_tree_refuses_priorities_that_would_poison_it(values: list[float], message: str) -> None:
    tree = SumTree(4)
    with pytest.raises(ValueError, match=message):
        tree.update(np.array([1]), np.array(values))
    with pytest.raises(ValueError, match="row 4 is outside the tree's 4 rows"):
        tree.update(np.array([4]), 1.0)
    with pytest.raises(RuntimeError, match="no row has a priority above 0"):
        tree.sample(np.random.default_rng(), 2)


def packet(n: int, start: int, reset_every: int = 10, weight: np.ndarray | None = None) -> Buffer:
    """One env's rows ``start..start+n-1``; the action says which row; a reset every ``reset_every`` rows."""
    rows = np.arange(start, start + n)
    return Buffer(act=rows.astype(np.float32)[:, None], obs=rows.astype(np.float32)[:, None],
                  rew=np.ones(n, np.float32), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                  reset=rows % reset_every == 0, context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64),
                  worker="w", weight=weight)


def prioritized(**kwargs: Any) -> ReplayMemory:
    return ReplayMemory(**{"memory_size": 100, "batch_size": 64, "prioritized": True, "seed": 0, **kwargs})


def test_rows_are_drawn_by_priority_with_importance_weights_and_new_rows_enter_at_the_maximum() -> None:
    memory = prioritized(alpha=1.0, beta=0.5, beta_steps=0, eps=1e-12)
    memory.append_buffer(packet(50, 0))
    batch = memory.sample()
    assert torch.equal(batch.weight, torch.ones(64))  # every row at the same (maximum) priority
    rows = batch.act[:, 0].numpy().astype(int)
    assert not np.isin(rows, np.arange(0, 50, 10)).any()  # reset rows end no transition: never drawn
    # give row 3 a priority 9 times the others' (alpha 1, eps 0): it is drawn 9/49 of the time...
    priority = np.where(rows == 3, 9.0, 1.0)
    touched = np.unique(rows)
    for _ in range(200):  # until every row has been in a batch once, so every row has its new priority
        memory.update_priority(priority)
        if np.isin(np.setdiff1d(np.arange(50), np.arange(0, 50, 10)), touched).all():
            break
        batch = memory.sample()
        rows = batch.act[:, 0].numpy().astype(int)
        touched = np.union1d(touched, rows)
        priority = np.where(rows == 3, 9.0, 1.0)
    draws = np.concatenate([memory.sample().act[:, 0].numpy() for _ in range(300)]).astype(int)
    assert np.mean(draws == 3) == pytest.approx(9 / (44 + 9), abs=0.02)
    # ...with importance weight (N P)^-beta / max: row 3's is (1/9)^0.5 of the others', beta being 1 (beta_steps 0)
    batch = memory.sample()
    weights = dict(zip(batch.act[:, 0].numpy().astype(int).tolist(), batch.weight.tolist(), strict=True))
    assert weights[3] == pytest.approx(1 / 9) and max(weights.values()) == 1.0
    # new rows enter at the highest priority given so far (9), so they are drawn at once
    memory.append_buffer(packet(5, 51, reset_every=1000))
    draws = np.concatenate([memory.sample().act[:, 0].numpy() for _ in range(100)]).astype(int)
    assert np.mean(draws >= 51) == pytest.approx(5 * 9 / (44 + 9 + 5 * 9), abs=0.03)


def test_beta_anneals_to_one_over_beta_steps_of_training() -> None:
    memory = prioritized(beta=0.4, beta_steps=100)
    memory.append_buffer(packet(30, 0))
    assert memory._priorities is not None
    assert memory._priorities.beta == 0.4
    memory.training_steps = 50
    assert memory._priorities.beta == pytest.approx(0.7)
    memory.sample()  # a batch without the training loop counts one step
    assert memory.training_steps == 51
    memory.training_steps = 10_000
    assert memory._priorities.beta == 1.0


def test_importance_weights_multiply_the_stale_sample_weight() -> None:
    memory = prioritized(alpha=1.0, beta_steps=0, eps=1e-12)
    memory.append_buffer(packet(20, 0, reset_every=1000, weight=np.where(np.arange(20) < 10, 0.5, 1.0)
                                .astype(np.float32)))
    batch = memory.sample()
    memory.update_priority(np.where(batch.act[:, 0].numpy() == 15, 4.0, 1.0))
    batch = memory.sample()
    rows = batch.act[:, 0].numpy().astype(int)
    expected = np.where(rows < 10, 0.5, 1.0) * np.where(rows == 15, 0.25, 1.0)
    assert batch.weight.numpy() == pytest.approx(expected)


def test_an_update_skips_rows_overwritten_since_their_batch_and_refuses_non_finite_priorities(
        caplog: pytest.LogCaptureFixture) -> None:
    memory = prioritized(memory_size=20, batch_size=8, alpha=1.0, eps=1e-12)
    memory.append_buffer(packet(20, 0, reset_every=1000))
    old = memory.sample()
    memory.append_buffer(packet(10, 20, reset_every=1000))  # overwrites rows 0..9
    overwritten = old.act[:, 0].numpy() < 10
    assert memory.update_priority(torch.full((8,), 5.0), old.extra["index"]) == int((~overwritten).sum())
    assert memory._priorities is not None
    priorities = memory._priorities.tree.get(np.arange(20)).round(6)
    assert np.isin(priorities, [0.0, 1.0, 5.0]).all() and priorities[10] == 0  # the ring's oldest row now
    assert sorted(np.flatnonzero(priorities == 5.0).tolist()) == sorted(
        {int(a) % 20 for a in old.act[:, 0].numpy()[~overwritten]})
    before = priorities.copy()
    memory.sample()
    assert memory.update_priority(np.full(8, np.nan)) == 0
    assert np.array_equal(memory._priorities.tree.get(np.arange(20)).round(6), before)
    assert "skipped a priority update: 8 of 8 priorities are not finite" in caplog.text
    with pytest.raises(ValueError, match="priority has 3 values for a batch of 8"):
        memory.update_priority(np.ones(3))


def test_the_oldest_row_of_a_full_ring_is_never_drawn() -> None:
    memory = prioritized(memory_size=16, batch_size=256)
    for start in range(0, 64, 8):
        memory.append_buffer(packet(8, start, reset_every=1000))
        oldest = memory._pos if memory._size == memory.memory_size else 0
        drawn = memory.sample_indices()
        assert oldest not in drawn and memory._valid(drawn).all()


@pytest.mark.parametrize("kwargs, message", [
    ({"alpha": 1.5}, r"memory.priority_alpha must be within \[0, 1\] \(got 1.5\)"),
    ({"beta": -0.1}, r"memory.priority_beta must be within \[0, 1\] \(got -0.1\)"),
    ({"eps": 0.0}, r"memory.priority_eps must be > 0 \(got 0.0\)"),
])
def test_bad_priority_settings_are_refused_naming_the_key(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        prioritized(**kwargs)
    with pytest.raises(RuntimeError, match="update_priority needs ReplayMemory\\(prioritized=True\\)"):
        ReplayMemory().update_priority(np.ones(1))


def config(tmp_path: Path, **sections: dict[str, Any]) -> Any:
    data: dict[str, Any] = {"run_name": "t", "weights_folder": str(tmp_path), "seed": 0, "security": "none",
                            "wandb": {"mode": "disabled"}, "worker": {"test_episode_interval": 0, "worker_id": "w"}}
    data.update(sections)
    return config_from_dict(data)


def test_sac_trains_with_3_step_prioritized_replay_from_a_workers_packets(tmp_path: Path) -> None:
    """worker -> packets -> memory (config's n_step, priorities) -> batches -> SAC -> priorities -> memory."""
    cfg = config(tmp_path, memory={"memory_size": 2000, "batch_size": 32, "n_step": 3, "prioritized": True,
                                   "priority_beta_steps": 100},
                 agent={"hidden_sizes": [16, 16], "gamma": 0.9},
                 trainer={"epochs": 1, "rounds": 1, "steps": 60, "start_training": 100,
                          "max_training_steps_per_env_step": 0.5})
    pipeline = make_pipeline(cfg)
    worker = RolloutWorker.from_config(cfg, pipeline)
    training = Trainer.from_config(cfg, pipeline).training_cls()
    seen: list[Any] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        training.build()
        memory = training.memory
        assert isinstance(memory, ReplayMemory) and (memory.n_step, memory.gamma, memory.prioritized) == (3, 0.9, True)
        sample = memory.sample

        def watched() -> Any:
            batch = sample()
            seen.append(batch)
            return batch

        memory.sample = watched  # type: ignore[method-assign]
        run_local(training, worker, threading.Event())
    finally:
        torch.set_num_threads(threads)
    # with a core free, trainer.prefetch gathers one batch ahead: the 61st, never trained on
    assert training.total_updates == 60 and len(seen) in (60, 61)
    last = seen[59]
    assert set(last.extra) >= {"discount", "steps_to_next_obs", "index"} and last.weight is not None
    assert (last.extra["steps_to_next_obs"] == 3).any() and last.extra["discount"].max() <= 0.9
    assert memory.training_steps == 60
    assert memory._priorities is not None
    priorities = memory._priorities.tree.get(np.arange(memory._size))
    # SAC's |TD| replaced the initial priority (1) of the rows it trained on
    assert len(np.unique(priorities[priorities > 0])) > 100
    assert "priority" not in training._round_summary(0)  # never logged as a metric


class TmrlStyleMemory:
    """A memory ported from tmrl: not a ring memory, so it follows no trajectories."""


def own_pipeline(cfg: Any) -> Any:
    import dataclasses

    from netrl.pipelines.gym import gym_pipeline

    return dataclasses.replace(gym_pipeline(cfg), memory_cls=TmrlStyleMemory)


@pytest.mark.parametrize("sections, message", [
    ({"env": {"pipeline": "tests.memory.test_priority:own_pipeline"}, "memory": {"n_step": 3}},
     'memory.n_step needs a ring memory \\(ReplayMemory or HistoryMemory\\), but env.pipeline '
     '"tests.memory.test_priority:own_pipeline" trains with TmrlStyleMemory, which does not follow trajectories'),
    ({"env": {"pipeline": "tests.memory.test_priority:own_pipeline"}, "memory": {"n_step": 2, "prioritized": True}},
     "memory.n_step and memory.prioritized need a ring memory"),
])
def test_a_pipeline_whose_memory_cannot_take_the_keys_is_refused_naming_them(
        tmp_path: Path, sections: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_pipeline(config(tmp_path, **sections))


@pytest.mark.parametrize(("pipeline", "memory_name"), [("drone", "ActionBufferMemory"), ("image", "FrameStackMemory")])
def test_the_drone_and_image_pipelines_take_n_step_and_prioritized_replay(tmp_path: Path, pipeline: str,
                                                                           memory_name: str) -> None:
    # they were refused before: their HistoryMemory took neither
    pipe = make_pipeline(config(tmp_path, env={"pipeline": pipeline}, memory={"n_step": 3, "prioritized": True}))
    memory = pipe.memory_cls(memory_size=100, batch_size=8)
    assert type(memory).__name__ == memory_name
    assert (memory.n_step, memory.prioritized, memory.gamma) == (3, True, 0.99)


@pytest.mark.parametrize("memory, message", [
    ({"n_step": 0}, "memory.n_step must be >= 1"),
    ({"priority_alpha": 2}, "memory.priority_alpha must be between 0.0 and 1.0"),
])
def test_bad_replay_keys_in_config_are_refused(tmp_path: Path, memory: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(tmp_path, memory=memory)
