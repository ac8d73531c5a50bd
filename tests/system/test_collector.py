"""netrl as a remote collector, with real processes on 127.0.0.1: a server and two workers (``python
-m netrl``), the RemoteCollector in the test process. Frames are counted per worker by their
packets' sequence numbers, against the workers' own summaries: nothing lost, nothing twice, across a
server kill -9 and a collector restarted from its state."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from netrl.config.load import load_config
from netrl.interop.collector import RemoteCollector
from netrl.launch import stop_processes
from netrl.pipelines.make import make_pipeline
from tests.conftest import Procs
from tests.fakes import small_config
from tests.reliability import worker_summary

EPISODE = 200  # Pendulum-v1's episodes: 200 steps each, so every run's frame count is known


def start(
    procs: Procs, tmp_path: Path, workers: int = 2, episodes: int = 4,
    env: dict[str, Any] | None = None, **worker: Any,
) -> tuple[Any, list[Any]]:
    """A server and ``workers`` worker processes (``worker`` settings over small_config's)."""
    sections: dict[str, Any] = {"env": env} if env else {}
    config = small_config(tmp_path, worker={"min_samples_per_worker_packet": 25, **worker}, **sections)
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    ws = [
        procs.spawn("worker", config, "--episodes", str(episodes), "--worker-id", f"w{i}")
        for i in range(workers)
    ]
    return config, [server, *ws]


def policy_of(cfg: Any) -> Any:
    """The workers' actor (the gym pipeline's, for Pendulum-v1): its weights are what the collector
    publishes."""
    pipeline = make_pipeline(cfg)
    env = pipeline.env_cls()
    return pipeline.actor_module_cls(env.observation_space, env.action_space)


def collect(collector: RemoteCollector, batches: int | None = None) -> Iterator[Any]:
    for i, batch in enumerate(collector.iter_batches()):
        yield batch
        if batches is not None and i + 1 >= batches:
            return


def test_sync_batches_hold_one_version_each_and_total_frames_ends_the_iteration(
    tmp_path: Path, procs: Procs
) -> None:
    config, (server, *workers) = start(procs, tmp_path, episodes=100)
    cfg = load_config(config)
    collector = RemoteCollector(
        cfg,
        policy_of(cfg),
        frames_per_batch=100,
        total_frames=300,
        sync=True,
        rollout_fragment_length=50,
    )
    seen = []
    with collector:
        for batch in collector.iter_batches():
            versions = batch.extra["policy_version"].numpy()
            seen.append(versions)
            assert (
                len(batch.rew) == 100
                and batch.obs.shape == (100, 3)
                and batch.next_obs.shape == (100, 3)
            )
            assert batch.extra["traj_ids"].shape == (100,)
            collector.update_policy_weights_()
    assert len(seen) == 3  # total_frames: 300 frames, then the iteration ends
    assert [set(v.tolist()) for v in seen] == [{seen[0][0]}, {seen[0][0] + 1}, {seen[0][0] + 2}]
    assert (
        collector.queue.frames_out == 300
        and set(collector.frames_by_worker)
        and len(collector.frames_by_worker) == 2
    )
    assert stop_processes(workers, then=[server]) == [0, 0, 0]


def check_exactly_once(got: dict[str, int], settled: dict[str, list[list[int]]], procs: Procs,
                       workers: list[Any]) -> None:
    """Every worker's frames yielded once: counted per worker stream against the workers' own summaries,
    and every packet sequence number 1..n settled."""
    for w in workers:
        assert w.wait(timeout=60) == 0, procs.log(w)[-3000:]
    for s in (worker_summary(procs.log(w)) for w in workers):
        assert s.produced == 4 * EPISODE and s.unacked == s.dropped == s.rejected == 0, s
        stream = next(k for k in got if k.endswith("/" + s.session))
        assert got[stream] == s.produced, f"{s.name}: {got[stream]} frames yielded, {s.produced} made"
        assert settled[stream] == [[1, s.packets]]


def async_collector(cfg: Any) -> RemoteCollector:
    return RemoteCollector(cfg, policy_of(cfg), frames_per_batch=100, total_frames=1600, sync=False)


@pytest.mark.timeout(150)  # about 20 s; a frame lost hangs the iteration
def test_a_server_kill9_mid_stream_loses_no_frame_and_repeats_none(tmp_path: Path, procs: Procs) -> None:
    """Async: 2 throttled workers x 4 episodes x 200 steps; the server is killed (SIGKILL) after 2
    batches and started again on its spool, the collector and the workers carry on."""
    config, (server, *workers) = start(procs, tmp_path, episodes=4, throttle=True, flush_timeout_s=60)
    cfg = load_config(config)
    with async_collector(cfg) as collector:
        for i, _ in enumerate(collector.iter_batches()):
            if i == 1:
                server.send_signal(signal.SIGKILL)
                server.wait()
                time.sleep(0.5)  # an outage: the workers keep what they cannot send
                server = procs.spawn("server", config)  # same spool folder
        assert collector.queue.frames_out == 1600
        check_exactly_once(dict(collector.frames_by_worker), collector.state_dict()["queue"]["settled"],
                           procs, workers)
    assert stop_processes([], then=[server]) == [0]


@pytest.mark.timeout(150)
def test_a_collector_restarted_from_its_state_loses_no_frame_and_repeats_none(tmp_path: Path,
                                                                                procs: Procs) -> None:
    """After 8 batches the collector shuts down with frames in hand (unacknowledged: the server and
    the workers keep them); a new one resumes from its state_dict and yields the rest, once."""
    config, (server, *workers) = start(procs, tmp_path, episodes=4, throttle=True, flush_timeout_s=60)
    cfg = load_config(config)
    collector = async_collector(cfg)
    for i, _ in enumerate(collector.iter_batches()):
        if i == 7:
            break
    state, first = collector.state_dict(), dict(collector.frames_by_worker)
    collector.shutdown()
    collector.shutdown()  # idempotent
    resumed = async_collector(cfg)
    resumed.load_state_dict(state)
    assert len(list(resumed.iter_batches())) == 8  # total_frames counts across the restart
    got = {k: first.get(k, 0) + resumed.frames_by_worker[k] for k in {*first, *resumed.frames_by_worker}}
    check_exactly_once(got, resumed.state_dict()["queue"]["settled"], procs, workers)
    resumed.shutdown()
    assert stop_processes([], then=[server]) == [0]


def pinned(policy: Any, action: float) -> Any:
    """The actor made to choose (almost exactly) ``action`` in every state: zero weights into its
    heads, the mean's bias far into tanh's saturation, the smallest std. Random actions (uniform on
    [-2, 2]) are told apart from it."""
    with torch.no_grad():
        for head in (policy.mu, policy.log_std):
            head.weight.zero_()
        policy.mu.bias.fill_(10.0 if action > 0 else -10.0)
        policy.log_std.bias.fill_(-20.0)
    return policy


def test_init_random_frames_random_actions_first_then_the_policy(
    tmp_path: Path, procs: Procs
) -> None:
    """The workers (worker.init_random_frames 300, as the collector's) act at random until the
    collector holds 300 frames, as the server tells them, then with the published policy: here one
    that always chooses +2."""
    config, (server, *workers) = start(
        procs, tmp_path, episodes=100, throttle=True, init_random_frames=300
    )
    cfg = load_config(config)
    collector = RemoteCollector(
        cfg,
        pinned(policy_of(cfg), 2.0),
        frames_per_batch=100,
        total_frames=1000,
        init_random_frames=300,
        sync=False,
    )
    with collector:
        actions = np.concatenate([b.act.numpy()[:, 0] for b in collector.iter_batches()])
    assert len(actions) == 1000
    policy = actions > 1.99
    assert policy[:300].mean() < 0.2  # random (0.25 % of uniform draws land there)
    assert policy[-300:].all()  # the policy's, once the workers heard the collector holds 300
    assert stop_processes(workers, then=[server]) == [0, 0, 0]
