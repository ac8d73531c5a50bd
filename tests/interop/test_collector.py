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


MY_POLICY = '''
import dataclasses

from torchrl.data import OneHot
from torchrl.modules import MLP, QValueActor

from netrl.interop.policies import TensorDictActor
from netrl.pipelines import gym_pipeline
from netrl.util import partial


def make_policy(observation_space, action_space):
    n = int(action_space.n)
    return QValueActor(MLP(in_features=observation_space.shape[0], out_features=n, num_cells=[64, 64]),
                       in_keys=["observation"], spec=OneHot(n))


def build(cfg):
    return dataclasses.replace(gym_pipeline(cfg), actor_module_cls=partial(TensorDictActor, policy=make_policy))
'''


def test_the_docs_script_trains_a_torchrl_policy_that_the_workers_run(
    tmp_path: Path, procs: Procs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/torchrl.md's netrl script, shortened: a TorchRL QValueActor given to the collector as to TorchRL's own,
    the workers running it as a TensorDictActor (my_policy.py's pipeline), DQNLoss on a ReplayBuffer, and each
    update_policy_weights_() loaded by the workers (their frames carry the new versions)."""
    import gymnasium
    from torchrl.objectives import DQNLoss

    (Path.cwd() / "my_policy.py").write_text(MY_POLICY)  # the workers run in this folder too
    monkeypatch.syspath_prepend(str(Path.cwd()))
    from my_policy import make_policy  # type: ignore[import-not-found]

    config, (server, *workers) = start(
        procs, tmp_path, episodes=1000, env={"pipeline": "my_policy:build", "id": "CartPole-v1"}
    )
    spaces = gymnasium.make("CartPole-v1")
    policy = make_policy(spaces.observation_space, spaces.action_space)
    collector = RemoteCollector(
        load_config(config), policy, frames_per_batch=64, total_frames=256, rollout_fragment_length=32
    )
    loss = DQNLoss(policy, action_space="one-hot", delay_value=False)
    loss.make_value_estimator(gamma=0.99)
    optim = torch.optim.Adam(loss.parameters(), 1e-3)
    buffer = ReplayBuffer(storage=LazyTensorStorage(10_000))
    versions = []
    for data in collector:
        assert data["action"].shape == (64, 2) and data["action"].sum(-1).eq(1).all()  # one-hot
        versions.append(int(data["policy_version"].unique().item()))
        buffer.extend(data)
        for _ in range(2):
            loss(buffer.sample(32))["loss"].backward()
            optim.step()
            optim.zero_grad()
        collector.update_policy_weights_()
    collector.shutdown()
    assert versions == [versions[0] + k for k in range(4)]
    assert stop_processes(workers, then=[server]) == [0, 0, 0]
