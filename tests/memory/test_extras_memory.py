"""Extra actor outputs in the row model and the memories: BufferBuilder stores them per row (zeros where the actor
gave none) and carries them in context rows, concat_segments keeps them per env, ReplayMemory and HistoryMemory
store them as columns and hand them over in Batch.extra, which keeps the seven fields as they were."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from netrl.memory.dataset import save_dataset
from netrl.memory.frames import FrameStackMemory
from netrl.memory.replay import ReplayMemory
from netrl.samples import Batch, Buffer, BufferBuilder, concat_segments

SPEC = {"action_log_prob": ((), "float32"), "state_value": ((), "float32")}


def test_a_batch_unpacks_into_seven_and_keeps_its_extras_through_replace_and_make() -> None:
    t = [torch.full((4,), float(i)) for i in range(6)]
    batch = Batch(*t, extra={"state_value": torch.ones(4)})
    o, a, r, o2, term, trunc, weight = batch  # a tmrl-style agent's train() unpacks seven
    assert weight is None and r is t[2] and len(batch) == 7
    assert set(batch.extra) == {"state_value"} and Batch(*t).extra == {}
    replaced = batch._replace(rew=torch.zeros(4))
    assert isinstance(replaced, Batch) and replaced.extra is batch.extra and (replaced.rew == 0).all()
    assert batch._replace(extra={"x": torch.zeros(4)}).extra.keys() == {"x"}
    assert Batch._make(list(batch)).extra == {} and Batch(obs=o, act=a, rew=r, next_obs=o2, terminated=term,
                                                          truncated=trunc).weight is None
    assert "extra=['state_value']" in repr(batch)


def test_builder_rows_hold_the_given_extras_zeros_for_reset_rows_and_context_rows_carry_them() -> None:
    builder = BufferBuilder(capacity=6, overlap=1, extra=SPEC)
    act, obs = np.zeros(1, np.float32), np.zeros(2, np.float32)
    builder.add(act, obs, 0.0, False, False, True, 0)  # a reset row: no extras given
    for k in (1, 2):
        builder.add(act, obs + k, 1.0, False, False, False, 0, {"action_log_prob": -k, "state_value": 10 * k})
    first = builder.cut()
    assert first is not None and first.extra is not None
    assert first.extra["action_log_prob"].tolist() == [0, -1, -2] and first.extra["state_value"].dtype == np.float32
    builder.add(act, obs + 3, 1.0, False, False, False, 0, {"action_log_prob": -3, "state_value": 30})
    second = builder.cut()
    assert second is not None and second.extra is not None
    assert second.context.tolist() == [True, False]
    assert second.extra["state_value"].tolist() == [20, 30]  # the context row repeats row 2, extras included
    with pytest.raises(ValueError, match=r"missing \['state_value'\], undeclared \['entropy'\]"):
        builder.add(act, obs, 0.0, False, False, False, 0, {"action_log_prob": 0, "entropy": 1})
    with pytest.raises(ValueError, match=r"extra output 'state_value' has the shape \(2,\) in a row; the actor "
                                         r"declares \(\)"):
        builder.add(act, obs, 0.0, False, False, False, 0, {"action_log_prob": 0, "state_value": [1, 2]})
    plain = BufferBuilder(capacity=4)
    plain.add(act, obs, 0.0, False, False, False, 0)
    assert plain.cut().extra is None  # type: ignore[union-attr]


def packet(n: int, start: int, extra: bool = True, worker: str = "w/s") -> Buffer:
    """Rows numbered from ``start``: frames, actions and extras all say which row they are (extras 10x)."""
    rows = np.arange(start, start + n)
    reset = rows == 0
    return Buffer(act=rows.astype(np.float32)[:, None], obs=(rows % 256).astype(np.uint8)[:, None, None]
                  * np.ones((1, 2, 2), np.uint8), rew=np.zeros(n, np.float32), terminated=np.zeros(n, bool),
                  truncated=np.zeros(n, bool), reset=reset, context=np.zeros(n, bool),
                  policy_version=np.zeros(n, np.int64), worker=worker,
                  extra={"state_value": (10.0 * rows).astype(np.float32),
                         "action_log_prob": (-1.0 * rows).astype(np.float32)} if extra else None)


def test_concat_segments_keeps_each_envs_extras_in_its_segment() -> None:
    both = concat_segments([(1, packet(3, 10)), (0, packet(2, 0))])
    assert both.env.tolist() == [0, 0, 1, 1, 1]  # type: ignore[union-attr]
    assert both.extra is not None and both.extra["state_value"].tolist() == [0, 10, 100, 110, 120]


@pytest.mark.parametrize("memory_cls", [ReplayMemory, FrameStackMemory])
def test_memories_hand_each_transition_the_extras_of_its_own_action(memory_cls: Any) -> None:
    kwargs = {"stack": 3} if memory_cls is FrameStackMemory else {}
    memory = memory_cls(memory_size=40, batch_size=128, seed=0, **kwargs)
    for start in range(0, 100, 10):  # the ring wraps twice
        memory.append_buffer(packet(10, start))
    assert len(memory) > 20
    for k in range(len(memory)):
        _o, a, *_, info = memory.get_transition(k)
        assert info["extra"] == {"state_value": 10 * a[0], "action_log_prob": -a[0]}
    batch = memory.sample()
    assert set(batch.extra) == {"state_value", "action_log_prob", "traj", "episode"}
    torch.testing.assert_close(batch.extra["state_value"], 10 * batch.act[:, 0])
    torch.testing.assert_close(batch.extra["action_log_prob"], -batch.act[:, 0])
    if memory_cls is FrameStackMemory:  # and the stacks are the ones before the action
        assert (batch.obs[:, -1, 0, 0].float() == (batch.act[:, 0] - 1) % 256).all()


@pytest.mark.parametrize("memory_cls", [ReplayMemory, FrameStackMemory])
def test_a_packet_whose_extras_differ_from_the_memorys_is_refused_and_leaves_it_as_it_was(memory_cls: Any) -> None:
    kwargs = {"stack": 3} if memory_cls is FrameStackMemory else {}
    memory = memory_cls(memory_size=40, batch_size=8, seed=0, **kwargs)
    memory.append_buffer(packet(10, 0))
    before = len(memory)
    with pytest.raises(ValueError, match=r"packet 0 of worker robot-1/s carries the extra outputs \[\]; the memory "
                                         r"stores \['action_log_prob', 'state_value'\]"):
        memory.append_buffer(packet(10, 10, extra=False, worker="robot-1/s"))
    assert len(memory) == before and memory.sample().extra["state_value"].abs().max() <= 90
    plain = memory_cls(memory_size=40, batch_size=8, seed=0, **kwargs)
    plain.append_buffer(packet(10, 0, extra=False))
    assert set(plain.sample().extra) == {"traj", "episode"}  # the trajectory ids only
    with pytest.raises(ValueError, match=r"carries the extra outputs \['action_log_prob', 'state_value'\]; the memory "
                                         r"stores \[\]"):
        plain.append_buffer(packet(10, 10))


def test_a_dataset_keeps_the_extras(tmp_path: Path) -> None:
    save_dataset(tmp_path / "d.npz", packet(10, 0))
    memory = ReplayMemory(memory_size=40, batch_size=16, seed=0, dataset_path=str(tmp_path / "d.npz"))
    batch = memory.sample()
    torch.testing.assert_close(batch.extra["state_value"], 10 * batch.act[:, 0])
