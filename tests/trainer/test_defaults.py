"""A Trainer built in Python behaves as ``python -m netrl``'s: torch threads, status lines, and a policy that never
overwrites another run's."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from netrl.agents.sac import MLPActorCritic, SACAgent
from netrl.config.sections import Config
from netrl.errors import CheckpointError
from netrl.storage.weight_files import read_weights_file
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.settings import WorkerSettings
from netrl.worker.worker import RolloutWorker

OBS = gymnasium.spaces.Box(-1, 1, (3,), np.float32)
ACT = gymnasium.spaces.Box(-2, 2, (1,), np.float32)
TRAINING = partial(TrainingOffline, env_cls=(OBS, ACT), epochs=1, rounds=1, steps=10, memory_size=100, batch_size=8,
                   training_agent_cls=partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(8,))))


@pytest.fixture
def torch_threads() -> Any:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_classes_default_to_the_clis_torch_threads_status_lines_and_run_folder() -> None:
    cfg = Config()
    trainer = {name: p.default for name, p in inspect.signature(Trainer).parameters.items()}
    worker = {f.name: f.default for f in dataclasses.fields(WorkerSettings)}  # RolloutWorker's keywords
    for role, defaults in (("Trainer", trainer), ("RolloutWorker", worker)):
        assert defaults["torch_threads"] == cfg.torch_threads == 1, role
        assert defaults["status_interval_s"] == cfg.status_interval_s == 10.0, role
    # a worker's episodes and the trainer's metrics meet in one folder, which --plot reads
    assert trainer["run_dir"] == worker["run_dir"] == RolloutWorker(None, None).settings.run_dir == "weights/run"


def test_the_trainer_sets_torch_threads_as_its_run_starts_and_logs_it(
        tmp_path: Path, torch_threads: None, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[int] = []

    def training_cls() -> TrainingOffline:
        seen.append(torch.get_num_threads())  # what the agent and the memory are built with
        raise RuntimeError("enough")

    torch.set_num_threads(2)  # torch's own default on a 2-core machine
    trainer = Trainer(training_cls, run_dir=tmp_path, wandb_mode="disabled")
    assert torch.get_num_threads() == 2  # constructing does nothing to the process
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError, match="enough"):
        trainer.run()
    assert seen == [1]
    assert "trainer: torch uses 1 thread (torch_threads; torch had 2)" in caplog.text
    torch.set_num_threads(2)
    with pytest.raises(RuntimeError, match="enough"):
        Trainer(training_cls, run_dir=tmp_path, wandb_mode="disabled", torch_threads=None).run()
    assert seen == [1, 2]  # None: torch's setting stays
    with pytest.raises(ValueError, match=r"torch_threads must be between 1 and 1024, or None .* \(got 0\)"):
        Trainer(training_cls, torch_threads=0)


def saved_policy(run_dir: Path, model_path: Path) -> None:
    """Trainer ``run_dir`` saves its (untrained) actor to ``model_path``, as it does after each epoch."""
    trainer = Trainer(TRAINING, run_dir=run_dir, model_path=str(model_path), wandb_mode="disabled")
    trainer.training = TRAINING()
    trainer.training.build()
    trainer.save_policy()


def test_a_trainer_refuses_a_model_path_that_holds_another_runs_policy(tmp_path: Path) -> None:
    shared = tmp_path / "tutorial_t.pt"  # docs/tmrl.md's model_path, outside every run folder
    saved_policy(tmp_path / "run-a", shared)
    state, meta = read_weights_file(shared)
    assert meta["run_dir"] == str((tmp_path / "run-a").resolve())
    later = Trainer(TRAINING, run_dir=tmp_path / "run-b", model_path=str(shared), wandb_mode="disabled")
    with pytest.raises(CheckpointError) as refused:
        later.run()
    assert str(refused.value) == (
        f"model_path {shared} holds a policy saved by the run in {(tmp_path / 'run-a').resolve()}, and this trainer "
        f"(run folder {tmp_path / 'run-b'}) would overwrite it with its own: leave model_path out to save under the "
        f"run folder ({tmp_path / 'run-b' / 'policy.pt'}), give another path, or move that file away first")
    assert all(torch.equal(state[k], v) for k, v in read_weights_file(shared)[0].items())  # run A's, untouched
    assert not (tmp_path / "run-b" / "checkpoint").exists()  # refused before anything was trained
    # the run that saved it continues to use it; a file no trainer labelled (tmrl's, a worker's) is refused too
    stopped = threading.Event()
    stopped.set()  # the check is done before the trainer connects: stop there
    Trainer(TRAINING, run_dir=tmp_path / "run-a", model_path=str(shared), wandb_mode="disabled").run(stopped)
    (tmp_path / "tutorial_t.pt.json").unlink()
    with pytest.raises(CheckpointError, match="saved by another run or program"):
        Trainer(TRAINING, run_dir=tmp_path / "run-a", model_path=str(shared), wandb_mode="disabled").run(stopped)
    # inside its run folder, the policy is the run's own: no check
    saved_policy(tmp_path / "run-c", tmp_path / "run-c" / "mine.pt")
    (tmp_path / "run-c" / "mine.pt.json").unlink()
    Trainer(TRAINING, run_dir=tmp_path / "run-c", model_path=str(tmp_path / "run-c" / "mine.pt"),
            wandb_mode="disabled").run(stopped)
