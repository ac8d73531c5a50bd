"""A RolloutWorker built in Python behaves as ``python -m netrl``'s: torch threads, and its files in the run folder
(where ``--plot`` finds its episodes)."""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from netrl.agents.sac import MLPActor
from netrl.envs.gym import GenericGymEnv
from netrl.monitor.plot import draw_run
from netrl.util import partial
from netrl.worker.worker import RolloutWorker

ENV = partial(GenericGymEnv, id="Pendulum-v1")


@pytest.fixture
def torch_threads() -> Any:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_worker_writes_its_episodes_and_policy_in_the_run_folder_by_default(
        torch_threads: None, caplog: pytest.LogCaptureFixture) -> None:
    torch.set_num_threads(2)
    worker = RolloutWorker(ENV, partial(MLPActor, hidden_sizes=(8,)), max_samples_per_episode=5, standalone=True,
                           worker_id="w1")
    assert torch.get_num_threads() == 2  # constructing does nothing to the process
    assert worker.model_path == str(Path("weights/run/worker_policy_w1.pt"))
    with caplog.at_level(logging.INFO):
        worker.run(nb_episodes=2)
    assert torch.get_num_threads() == 1
    assert "worker w1: torch uses 1 thread (torch_threads; torch had 2)" in caplog.text
    with Path("weights/run/episodes_w1.csv").open(newline="") as f:  # (the test runs in a folder of its own)
        rows = list(csv.DictReader(f))
    assert [(r["episode"], r["length"]) for r in rows] == [("1", "5"), ("2", "5")]
    with caplog.at_level(logging.INFO, logger="netrl.monitor.plot"):
        draw_run(Path("weights/run"))  # what --plot weights/run draws
    assert "returns from episodes_w1.csv (one point per episode)" in caplog.text


def test_a_worker_given_no_run_folder_writes_only_the_files_it_is_given(tmp_path: Path, torch_threads: None) -> None:
    torch.set_num_threads(2)
    worker = RolloutWorker(ENV, partial(MLPActor, hidden_sizes=(8,)), max_samples_per_episode=5, standalone=True,
                           worker_id="w1", run_dir=None, torch_threads=None,
                           episode_log=str(tmp_path / "mine.csv"))
    assert worker.model_path is None
    worker.run(nb_episodes=1)
    assert torch.get_num_threads() == 2  # None: torch's setting stays
    assert not Path("weights").exists() and (tmp_path / "mine.csv").exists()
    given = RolloutWorker(ENV, MLPActor, run_dir=tmp_path / "run", model_path=str(tmp_path / "policy.pt"),
                          worker_id="w2")
    assert given.model_path == str(tmp_path / "policy.pt")  # a path given is used as given
    assert given.episode_log is not None and given.episode_log.path == tmp_path / "run" / "episodes_w2.csv"
