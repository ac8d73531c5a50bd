"""Env info entries in the memories: every memory stores a packet's ``info/<name>`` columns as it stores extra outputs,
and each batch carries them as ``batch.extra["info/<name>"]``, the values of the row its transition ends at."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from netrl.memory.dataset import save_dataset
from netrl.memory.frames import FrameStackMemory
from netrl.memory.history import HistoryMemory
from netrl.memory.replay import ReplayMemory
from netrl.memory.rollout import RolloutMemory
from netrl.memory.views import prev_actions
from netrl.samples import Buffer
from netrl.util import partial


def packet(n: int, start: int, info: bool = True, worker: str = "w/s") -> Buffer:
    """Rows numbered from ``start``, episodes of 7 rows (a reset row first): frames and actions say which row they
    are, the info entries are known functions of it."""
    rows = np.arange(start, start + n)
    reset = rows % 7 == 0
    return Buffer(act=rows.astype(np.float32)[:, None], obs=(rows % 256).astype(np.uint8)[:, None, None]
                  * np.ones((1, 2, 2), np.uint8), rew=np.ones(n, np.float32), terminated=rows % 7 == 6,
                  truncated=np.zeros(n, bool), reset=reset, context=np.zeros(n, bool),
                  policy_version=np.zeros(n, np.int64), worker=worker,
                  info={"t_sq": rows.astype(np.int64) ** 2, "hit": rows % 3 == 0,
                        "pair": np.stack([rows, -rows], 1).astype(np.float32)} if info else None)


MEMORIES = {
    "replay": partial(ReplayMemory, memory_size=40),
    "frames": partial(FrameStackMemory, memory_size=40, stack=3),
    "history": partial(HistoryMemory, memory_size=40, views=[prev_actions(2)]),
    "sequences": partial(ReplayMemory, memory_size=60, sequence_length=4),
    "n_step": partial(ReplayMemory, memory_size=40, n_step=3, gamma=0.9),
    "prioritized": partial(ReplayMemory, memory_size=40, prioritized=True),
}


@pytest.mark.parametrize("name", list(MEMORIES))
def test_each_memory_hands_every_transition_the_info_of_the_row_it_ends_at(name: str) -> None:
    memory = MEMORIES[name](batch_size=64, seed=0)
    for start in range(0, 100, 10):  # the ring wraps
        memory.append_buffer(packet(10, start))
    batch = memory.sample()
    assert {"info/t_sq", "info/hit", "info/pair"} <= set(batch.extra)
    row = batch.act[..., 0].long()  # the row the transition ends at
    live = batch.extra["mask"] if "mask" in batch.extra else torch.ones_like(row, dtype=torch.bool)
    assert batch.extra["info/t_sq"].dtype == torch.int64 and batch.extra["info/hit"].dtype == torch.bool
    assert (batch.extra["info/t_sq"] == row ** 2)[live].all()
    assert (batch.extra["info/hit"] == (row % 3 == 0))[live].all()
    torch.testing.assert_close(batch.extra["info/pair"][live], torch.stack([row, -row], -1).float()[live])
    assert batch.extra["info/pair"].shape == (*row.shape, 2)


def test_the_rollout_memory_hands_over_each_transitions_info() -> None:
    memory = RolloutMemory()
    memory.append_buffer(packet(10, 0))
    batch = memory.sample()
    row = batch.act[:, 0].long()
    assert (batch.extra["info/t_sq"] == row ** 2).all() and (batch.extra["info/hit"] == (row % 3 == 0)).all()
    assert "traj_ids" in batch.extra


@pytest.mark.parametrize("memory_cls", [ReplayMemory, partial(HistoryMemory, views=[prev_actions(2)]),
                                        RolloutMemory])
def test_a_packet_whose_info_keys_differ_from_the_memorys_is_refused_and_leaves_it_as_it_was(
        memory_cls: Any) -> None:
    memory = memory_cls(memory_size=40, batch_size=8, seed=0)
    memory.append_buffer(packet(10, 0))
    before = len(memory)
    with pytest.raises(ValueError, match=r"packet 0 of worker robot-1/s carries the info keys \[\]; the memory "
                                         r"stores \['hit', 'pair', 't_sq'\]: every worker must run the same "
                                         r"pipeline" if memory_cls is not RolloutMemory else
                                         r"its columns \['info/hit', 'info/pair', 'info/t_sq'\] differ"):
        memory.append_buffer(packet(7, 14, info=False, worker="robot-1/s"))  # (it starts an episode)
    assert len(memory) == before


def test_a_dataset_keeps_the_info(tmp_path: Path) -> None:
    save_dataset(tmp_path / "d.npz", packet(10, 0))
    memory = ReplayMemory(memory_size=40, batch_size=16, seed=0, dataset_path=str(tmp_path / "d.npz"))
    batch = memory.sample()
    assert (batch.extra["info/t_sq"] == batch.act[:, 0].long() ** 2).all()


@pytest.mark.parametrize("name", ["replay", "frames", "history", "rollout"])
def test_get_transition_hands_over_the_info_of_the_row_it_ends_at(name: str) -> None:
    memory = RolloutMemory() if name == "rollout" else MEMORIES[name](batch_size=8, seed=0)
    memory.append_buffer(packet(10, 0))
    assert len(memory) > 3
    for k in range(len(memory)):
        _o, a, _r, _o2, _term, _trunc, info = memory.get_transition(k)
        row = int(np.asarray(a).ravel()[0])  # the row the transition ends at
        assert set(info["info"]) == {"t_sq", "hit", "pair"}
        assert info["info"]["t_sq"] == row ** 2 and bool(info["info"]["hit"]) == (row % 3 == 0)
        np.testing.assert_array_equal(info["info"]["pair"], np.array([row, -row], np.float32))
