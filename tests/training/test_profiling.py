"""``profiling=True`` (tmrl's): each epoch's training steps profiled, sync collection included."""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pytest
import torch

from netrl.memory.rollout import RolloutMemory
from netrl.samples import Buffer
from netrl.training.loop import TrainingOffline
from netrl.training.profiling import EpochProfile
from tests.fakes import ACT, OBS, ListSource


class SyncSource(ListSource):
    """A source that announces sync collection and hands over, after each version, one packet of
    16 transitions of that version (as the workers of a sync batch would)."""

    def __init__(self) -> None:
        super().__init__([])
        self.version = -1

    def announce(self, collect: dict[str, Any]) -> None:
        pass

    def progress(self, *args: Any, **kwargs: Any) -> None:
        pass

    def publish(self, actor: torch.nn.Module, version: int, trained_steps: int, model: str = "policy") -> None:
        self.version = version

    def fetch(self) -> list[Buffer]:
        if self.version < 0:
            return []
        n, rng = 17, np.random.default_rng(self.version)
        buf = Buffer(act=rng.uniform(0, 1, (n, 2)).astype(np.float32),
                     obs=rng.uniform(-1, 1, (n, 3)).astype(np.float32), rew=np.zeros(n, np.float32),
                     terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), reset=np.arange(n) == 0,
                     context=np.zeros(n, bool), policy_version=np.full(n, self.version, np.int64),
                     worker="w", seq=self.version)
        self.version = -1  # one packet per version
        return [buf]


def test_a_sync_collection_epoch_is_profiled_rather_than_crashing_at_its_end(
        caplog: pytest.LogCaptureFixture) -> None:
    # the steps of a sync epoch were trained outside the profiled ones, and pstats refused the
    # empty profile at the epoch's end: "Cannot create or construct a Stats object"
    training = TrainingOffline(env_cls=(OBS, ACT), collection="sync", memory_cls=RolloutMemory, device="cpu",
                               frames_per_batch=16, rollout_fragment_length=16, epochs=1, rounds=1, steps=3,
                               profiling=True, batch_size=16)
    source = SyncSource()
    training.start(source)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, "netrl.training.loop"):
        rounds = list(training.run_epoch(source, threading.Event()))  # type: ignore[arg-type]
    assert len(rounds) == 1 and training.epoch == 1 and training.total_updates == 3
    report = [r.getMessage() for r in caplog.records if r.getMessage().startswith("profile of epoch")]
    assert len(report) == 1 and report[0].startswith("profile of epoch 1 (3 training steps):")
    assert "cumulative" in report[0] and "train" in report[0]  # pstats' table of the steps


def test_an_epoch_that_trained_nothing_says_so() -> None:
    assert EpochProfile().report(4) == "profile of epoch 4: no training step ran in it, so nothing was profiled"
    profile = EpochProfile()
    profile.enable()
    sorted(range(10))
    profile.disable()
    assert profile.report(2).startswith("profile of epoch 2 (1 training steps):")
