"""Batches of every memory as TensorDicts in TorchRL's layout: keys, shapes, dtypes and values, for
vector, image, dict, discrete and sequence batches, from memories fed through the real
BufferBuilder (tests/interop/rows.py)."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")

from netrl.interop.tensordicts import decode_action, encode_action, to_tensordict
from netrl.memory.frames import FrameStackMemory
from netrl.memory.history import HistoryMemory
from netrl.memory.replay import ReplayMemory
from netrl.memory.rollout import RolloutMemory
from netrl.memory.views import prev_actions
from netrl.samples import Batch
from tests.interop.rows import box_act, feed

VECTOR = gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX_ACT = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
EXTRA = {"action_log_prob": ((), "float32"), "state_value": ((1,), "float32")}
INFO = {"hits": ((), "int64")}


def extras(k: int) -> dict[str, Any]:
    return {"action_log_prob": -k / 10, "state_value": [10.0 * k]}


def rows_of(td: Any) -> torch.Tensor:
    """Which stream row each transition ends at (its action says)."""
    return (td["action"][..., 0] * 100).round().long()


def check_transition_keys(td: Any, batch: Batch) -> None:
    size = batch.rew.shape
    assert td.batch_size == size
    assert td["next", "reward"].shape == (*size, 1) and td["next", "reward"].dtype == torch.float32
    for flag in ("done", "terminated", "truncated"):
        assert td["next", flag].shape == (*size, 1) and td["next", flag].dtype == torch.bool
    assert (td["next", "terminated"][..., 0] == batch.terminated.bool()).all()
    assert (td["next", "truncated"][..., 0] == batch.truncated.bool()).all()
    assert (td["next", "done"] == td["next", "terminated"] | td["next", "truncated"]).all()
    torch.testing.assert_close(td["next", "reward"][..., 0], batch.rew)
    assert (
        td["collector", "traj_ids"].dtype == torch.int64
        and td["collector", "traj_ids"].shape == size
    )
    if "episode" in batch.extra:  # a ring memory's: TorchRL's trajectories are its episodes
        assert (td["collector", "traj_ids"] == batch.extra["episode"]).all()
        assert (td["collector", "netrl_traj_ids"] == batch.extra["traj"]).all()


def test_a_vector_batch_has_torchrls_keys_and_shares_the_batchs_tensors() -> None:
    memory = feed(
        ReplayMemory(memory_size=60, batch_size=256, seed=0),
        extra=EXTRA,
        extras=extras,
        info=INFO,
        infos=lambda k: {"hits": k * 3},
    )
    batch = memory.sample()
    td = to_tensordict(batch, VECTOR, BOX_ACT)
    check_transition_keys(td, batch)
    assert (
        td["next", "truncated"].any() and td["next", "terminated"].any()
    )  # the feed ends episodes both ways
    assert set(td.keys()) == {
        "observation",
        "action",
        "next",
        "collector",
        "action_log_prob",
        "state_value",
    }
    assert set(td["next"].keys()) == {
        "observation",
        "reward",
        "done",
        "terminated",
        "truncated",
        "hits",
    }
    row = rows_of(td)
    torch.testing.assert_close(
        td["next", "observation"][:, 0], row.float()
    )  # obs of row k is [k, -k, k % 5]
    torch.testing.assert_close(td["observation"][:, 0], row.float() - 1)
    torch.testing.assert_close(td["next", "reward"][:, 0], row.float() / 8)
    torch.testing.assert_close(td["action_log_prob"], -row.float() / 10)
    assert td["state_value"].shape == (256, 1) and (td["next", "hits"] == row * 3).all()
    # a collector's trajectory ends where its episode does: equal ids, one episode
    traj = td["collector", "traj_ids"]
    episode = row.div(7, rounding_mode="floor")
    assert all(len(set(episode[traj == t].tolist())) == 1 for t in traj.unique())
    # placed, not copied: the tensors are the batch's (the reward a view of it)
    assert td["observation"].data_ptr() == batch.obs.data_ptr()
    assert td["next", "observation"].data_ptr() == batch.next_obs.data_ptr()
    assert td["action"].data_ptr() == batch.act.data_ptr()
    assert td["next", "reward"].data_ptr() == batch.rew.data_ptr()
    assert td["state_value"].data_ptr() == batch.extra["state_value"].data_ptr()
    assert "priority_weight" not in td.keys()


def test_an_image_batch_of_stacked_frames_keeps_its_stacks_and_dtype() -> None:
    memory = feed(
        FrameStackMemory(memory_size=60, batch_size=16, stack=3, seed=0),
        obs=lambda k: np.full((4, 4), k % 256, np.uint8),
        overlap=3,
    )
    batch = memory.sample()
    td = to_tensordict(batch, gymnasium.spaces.Box(0, 255, (4, 4), np.uint8), BOX_ACT)
    check_transition_keys(td, batch)
    assert td["observation"].shape == (16, 3, 4, 4) and td["observation"].dtype == torch.uint8
    assert td["next", "observation"].shape == (16, 3, 4, 4)
    row = rows_of(td)
    assert (
        td["next", "observation"][:, -1, 0, 0].long() == row % 256
    ).all()  # the newest frame is the row's


def test_a_dict_observation_is_nested_one_key_per_entry() -> None:
    space = gymnasium.spaces.Dict(
        {
            "pos": gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "camera": gymnasium.spaces.Box(0, 255, (2, 2), np.uint8),
        }
    )
    memory = feed(
        ReplayMemory(memory_size=60, batch_size=16, seed=0),
        obs=lambda k: {
            "pos": np.array([k, 2 * k], np.float32),
            "camera": np.full((2, 2), k, np.uint8),
        },
    )
    batch = memory.sample()
    td = to_tensordict(batch, space, BOX_ACT)
    check_transition_keys(td, batch)
    assert (
        set(td["observation"].keys()) == {"pos", "camera"} == set(td["next", "observation"].keys())
    )
    assert (
        td["observation", "pos"].shape == (16, 2)
        and td["observation", "camera"].dtype == torch.uint8
    )
    torch.testing.assert_close(td["next", "observation", "pos"][:, 1], 2 * rows_of(td).float())
    assert td["observation", "pos"].data_ptr() == batch.obs["pos"].data_ptr()


@pytest.mark.parametrize("discrete", ["one_hot", "categorical"])
def test_discrete_actions_are_one_hot_or_an_index_and_decode_back(discrete: Any) -> None:
    space = gymnasium.spaces.Discrete(4, start=1)
    memory = feed(
        ReplayMemory(memory_size=60, batch_size=32, seed=0), act=lambda k: np.int64(1 + k % 4)
    )
    batch = memory.sample()
    td = to_tensordict(batch, VECTOR, space, discrete=discrete)
    check_transition_keys(td, batch)
    index = batch.act.long() - 1
    if discrete == "one_hot":  # GymEnv's OneHot spec: int64 [B, n]
        assert td["action"].shape == (32, 4) and td["action"].dtype == torch.int64
        assert (td["action"].argmax(-1) == index).all() and (td["action"].sum(-1) == 1).all()
    else:
        assert (
            td["action"].shape == (32,)
            and td["action"].dtype == torch.int64
            and (td["action"] == index).all()
        )
    assert (decode_action(td["action"], space, discrete) == batch.act.long()).all()


@pytest.mark.parametrize("discrete", ["one_hot", "categorical"])
def test_multi_discrete_actions_encode_as_torchrls_multi_one_hot_or_indices(discrete: Any) -> None:
    space = gymnasium.spaces.MultiDiscrete([3, 2], start=[0, 5])
    act = torch.tensor([[2, 5], [0, 6]], dtype=torch.uint8)
    encoded = encode_action(act, space, discrete)
    if discrete == "one_hot":
        assert encoded.tolist() == [[0, 0, 1, 1, 0], [1, 0, 0, 0, 1]]
    else:
        assert encoded.tolist() == [[2, 0], [0, 1]]
    assert decode_action(encoded, space, discrete).tolist() == act.tolist()
    with pytest.raises(ValueError, match="discrete must be one of"):
        encode_action(act, space, "binary")  # type: ignore[arg-type]


def test_a_sequence_batch_is_b_by_t_with_its_mask_weights_indices_and_n_step_keys() -> None:
    memory = feed(
        ReplayMemory(
            memory_size=80,
            batch_size=8,
            sequence_length=4,
            prioritized=True,
            n_step=3,
            gamma=0.9,
            seed=0,
        ),
        extra=EXTRA,
        extras=extras,
    )
    batch = memory.sample()
    td = to_tensordict(batch, VECTOR, BOX_ACT)
    check_transition_keys(td, batch)
    assert td.batch_size == (8, 4) and td["observation"].shape == (8, 4, 3)
    assert td["mask"].dtype == torch.bool and td["mask"].shape == (8, 4)
    # also under SliceSampler's key, which TorchRL's losses reduce over: the same tensor
    assert td["collector", "mask"].data_ptr() == batch.extra["mask"].data_ptr()
    assert (
        td["priority_weight"].shape == (8, 4)
        and td["priority_weight"].data_ptr() == batch.weight.data_ptr()
    )
    assert td["index"].shape == (8, 4) and (td["index"] == batch.extra["index"]).all()
    # TorchRL's MultiStep's keys, shaped as it shapes them; "gamma" is gamma ** steps_to_next_obs
    assert td["steps_to_next_obs"].shape == td["gamma"].shape == (8, 4)
    torch.testing.assert_close(td["gamma"], 0.9 ** td["steps_to_next_obs"].float())
    assert td["state_value"].shape == (8, 4, 1)


def test_history_views_go_to_the_root_and_their_next_windows_under_next() -> None:
    memory = feed(HistoryMemory(memory_size=60, batch_size=16, views=[prev_actions(3)], seed=0))
    batch = memory.sample()
    td = to_tensordict(batch, VECTOR, BOX_ACT)
    check_transition_keys(td, batch)
    assert td["prev_actions"].shape == (16, 3, 1) == td["next", "prev_actions"].shape
    torch.testing.assert_close(
        td["next", "prev_actions"][:, -1], td["action"]
    )  # the next window ends at the action


def test_a_rollout_batch_carries_its_trajectory_ids_as_the_collectors() -> None:
    memory = feed(RolloutMemory(), rows=40, extra=EXTRA, extras=extras)
    batch = memory.sample()
    td = to_tensordict(batch, VECTOR, BOX_ACT)
    assert (
        td.batch_size == batch.rew.shape
        and (td["collector", "traj_ids"] == batch.extra["traj_ids"]).all()
    )
    assert set(td["collector"].keys()) == {"traj_ids"}


def test_an_extra_that_would_overwrite_a_transition_key_is_refused_by_name() -> None:
    memory = feed(
        ReplayMemory(memory_size=60, batch_size=8, seed=0),
        info={"reward": ((), "float32")},
        infos=lambda k: {"reward": 0.0},
    )
    with pytest.raises(
        ValueError, match=r"batch.extra\['info/reward'\] would land on the key \('next', 'reward'\)"
    ):
        to_tensordict(memory.sample(), VECTOR, BOX_ACT)
    assert box_act(100)[0] == 1.0  # rows_of reads actions as k / 100


def test_recurrent_state_goes_under_torchrls_names_with_each_step_of_a_sequence() -> None:
    state = {"recurrent_state_h": ((1, 4), "float32"), "recurrent_state_c": ((1, 4), "float32")}
    memory = feed(
        ReplayMemory(memory_size=80, batch_size=8, sequence_length=5, seed=0),
        extra=state,
        extras=lambda k: {name: np.full((1, 4), k, np.float32) for name in state},
    )
    batch = memory.sample()
    td = to_tensordict(batch, VECTOR, BOX_ACT)
    assert td.batch_size == (8, 5)
    for name in state:  # the state that entered each step, as TorchRL's LSTMModule reads it
        assert td[name].shape == (8, 5, 1, 4)
        live = td["mask"]
        assert (td[name][..., 0, 0][live] == rows_of(td)[live].float()).all()


def test_a_tuple_observation_is_nested_by_position() -> None:
    space = gymnasium.spaces.Tuple((VECTOR, gymnasium.spaces.Box(0, 255, (2,), np.uint8)))
    memory = feed(
        ReplayMemory(memory_size=60, batch_size=8, seed=0),
        obs=lambda k: (np.full(3, k, np.float32), np.full(2, k % 256, np.uint8)),
    )
    batch = memory.sample()
    td = to_tensordict(batch, space, BOX_ACT)
    assert set(td["observation"].keys()) == {"0", "1"} == set(td["next", "observation"].keys())
    assert td["observation", "1"].dtype == torch.uint8
    assert (td["next", "observation", "0"][:, 0].long() == rows_of(td)).all()
