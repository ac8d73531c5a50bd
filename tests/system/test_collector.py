"""netrl as a remote collector, with real processes on 127.0.0.1: a server and two workers (``python -m
netrl``), the RemoteCollector in the test process. Frames are counted per worker by their packets' sequence
numbers, against the workers' own summaries: nothing lost, nothing twice, across a server kill -9 and a collector
restarted from its state."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from netrl.config.load import load_config
from netrl.interop.collector import RemoteCollector
from netrl.launch import stop_processes
from netrl.pipelines.make import make_pipeline
from tests.conftest import Procs
from tests.fakes import small_config
from tests.reliability import worker_summary

EPISODE = 200  # Pendulum-v1's episodes: 200 steps each, so every run's frame count is known


def start(procs: Procs, tmp_path: Path, workers: int = 2, episodes: int = 4, **worker: Any) -> tuple[Any, list[Any]]:
    config = small_config(tmp_path, worker={"min_samples_per_worker_packet": 25, **worker})
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    ws = [procs.spawn("worker", config, "--episodes", str(episodes), "--worker-id", f"w{i}") for i in range(workers)]
    return config, [server, *ws]


def policy_of(cfg: Any) -> Any:
    """The workers' actor (the gym pipeline's, for Pendulum-v1): its weights are what the collector publishes."""
    pipeline = make_pipeline(cfg)
    env = pipeline.env_cls()
    return pipeline.actor_module_cls(env.observation_space, env.action_space)


def collect(collector: RemoteCollector, batches: int | None = None) -> Iterator[Any]:
    for i, batch in enumerate(collector.iter_batches()):
        yield batch
        if batches is not None and i + 1 >= batches:
            return


def test_sync_batches_hold_one_version_each_and_total_frames_ends_the_iteration(tmp_path: Path,
                                                                                 procs: Procs) -> None:
    config, (server, *workers) = start(procs, tmp_path, episodes=100)
    cfg = load_config(config)
    collector = RemoteCollector(cfg, policy_of(cfg), frames_per_batch=100, total_frames=300, sync=True,
                                rollout_fragment_length=50)
    seen = []
    with collector:
        for batch in collector.iter_batches():
            versions = batch.extra["policy_version"].numpy()
            seen.append(versions)
            assert len(batch.rew) == 100 and batch.obs.shape == (100, 3) and batch.next_obs.shape == (100, 3)
            assert batch.extra["traj_ids"].shape == (100,)
            collector.update_policy_weights_()
    assert len(seen) == 3  # total_frames: 300 frames, then the iteration ends
    assert [set(v.tolist()) for v in seen] == [{seen[0][0]}, {seen[0][0] + 1}, {seen[0][0] + 2}]
    assert collector.queue.frames_out == 300 and set(collector.frames_by_worker) and len(collector.frames_by_worker) == 2
    assert stop_processes(workers, then=[server]) == [0, 0, 0]
