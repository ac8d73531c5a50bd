"""RemoteCollector as TorchRL code uses it: real processes (a server, two workers) and the collector
in this process, iterated for TensorDicts that go straight into a TorchRL ReplayBuffer."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchrl")

import torch
from torchrl.data import LazyTensorStorage, ReplayBuffer

from netrl.config.load import load_config
from netrl.interop.collector import RemoteCollector
from netrl.launch import stop_processes
from tests.conftest import Procs
from tests.system.test_collector import policy_of, start


def test_a_sync_run_yields_tensordicts_of_frames_per_batch_that_extend_a_replay_buffer(
    tmp_path: Path, procs: Procs
) -> None:
    config, (server, *workers) = start(procs, tmp_path, episodes=100)
    cfg = load_config(config)
    buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    seen = []
    with RemoteCollector(
        cfg, policy_of(cfg), frames_per_batch=100, total_frames=300, rollout_fragment_length=50
    ) as collector:
        for data in collector:
            assert data.batch_size == torch.Size([100])
            for key in (
                "observation",
                "action",
                ("next", "observation"),
                ("next", "reward"),
                ("next", "done"),
                ("next", "terminated"),
                ("next", "truncated"),
                ("collector", "traj_ids"),
                "policy_version",
            ):
                assert key in data.keys(include_nested=True), key
            assert data["observation"].shape == (100, 3) and data["action"].shape == (100, 1)
            assert (
                data["next", "reward"].shape == (100, 1)
                and data["next", "done"].dtype == torch.bool
            )
            assert data["collector", "traj_ids"].dtype == torch.int64
            # frames are transitions: within a trajectory, each frame's next observation is the next
            # frame's
            traj = data["collector", "traj_ids"]
            same = traj[1:] == traj[:-1]
            assert same.any() and torch.equal(
                data["next", "observation"][:-1][same], data["observation"][1:][same]
            )
            seen.append(int(data["policy_version"].unique().item()))  # sync: one version per batch
            buffer.extend(data)
            collector.update_policy_weights_()
    assert len(seen) == 3 and seen == [seen[0], seen[0] + 1, seen[0] + 2]
    assert len(buffer) == 300
    sample = buffer.sample(32)
    assert sample["next", "observation"].shape == (32, 3) and sample[
        "collector", "traj_ids"
    ].shape == (32,)
    assert stop_processes(workers, then=[server]) == [0, 0, 0]
