"""A trainer whose replay memory is on disk (memory.storage disk) resumes it exactly from the
sample log."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from netrl.agents.sac import MLPActorCritic, SACAgent
from netrl.errors import FolderInUse
from netrl.memory.disk import DiskRing
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from tests.trainer.test_trainer import ACT, OBS, FakeLink


@pytest.fixture
def links(monkeypatch: pytest.MonkeyPatch) -> type[FakeLink]:
    class Link(FakeLink):
        at: dict[int, Callable[[FakeLink], None]] = {}

    monkeypatch.setattr("netrl.trainer.trainer.TrainerLink", Link)
    return Link


def trainer(run_dir: Path, epochs: int, **memory: Any) -> Trainer:
    training_cls = partial(
        TrainingOffline,
        env_cls=(OBS, ACT),
        epochs=epochs,
        rounds=2,
        steps=10,
        training_agent_cls=partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(16,))),
        update_model_interval=5,
        update_buffer_interval=2,
        start_training=10,
        worker_lead=10,
        memory_size=50,
        batch_size=8,
        seed=0,
        sleep_between_buffer_retrieval_attempts=0.01,
        **memory,
    )
    return Trainer(training_cls, "127.0.0.1", run_dir=run_dir, wandb_mode="disabled")


def snapshot(memory: Any) -> list[list[torch.Tensor]]:
    """Five batches drawn with one rng state, copied out of the memory's reused buffers."""
    memory.rng = np.random.default_rng(11)
    return [[t.clone() for t in memory.sample()[:6]] for _ in range(5)]


def test_a_resumed_memory_on_disk_samples_the_batches_of_the_uninterrupted_one(
    tmp_path: Path, links: type[FakeLink]
) -> None:
    folder = tmp_path / "replay"
    first = trainer(tmp_path / "run", epochs=1, memory_storage="disk", memory_folder=str(folder))
    first.run()
    assert first.training is not None and first.training.memory is not None
    uninterrupted = first.training.memory
    assert uninterrupted.total_appended > 50  # the 50-row ring wrapped
    assert not list(folder.glob("*.ring"))  # the trainer's close removed the files...
    expected = snapshot(uninterrupted)  # ...and the maps still read them (this test's reference)
    DiskRing(folder).close()  # ...and let the folder go

    resumed: list[list[list[torch.Tensor]]] = []

    def at_first_fetch(
        link: FakeLink,
    ) -> None:  # the memory rebuilt from the sample log, nothing new yet
        assert second.training is not None
        resumed.append(snapshot(second.training.memory))

    links.at = {1: at_first_fetch}
    second = trainer(tmp_path / "run", epochs=2, memory_storage="disk", memory_folder=str(folder))
    second.run()
    assert second.training is not None and second.training.memory is not None
    assert second.training.memory.ring_storage is not None  # on disk again
    assert len(resumed) == 1
    for want, got in zip(expected, resumed[0], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_a_second_trainer_on_the_same_storage_folder_is_refused_naming_it(
    tmp_path: Path, links: type[FakeLink]
) -> None:
    held = DiskRing(tmp_path / "shared")  # another trainer's memory, with another run folder
    try:
        with pytest.raises(FolderInUse, match=r"replay memory folder .*shared is in use"):
            trainer(
                tmp_path / "run",
                epochs=1,
                memory_storage="disk",
                memory_folder=str(tmp_path / "shared"),
            ).run()
    finally:
        held.close()
