"""RolloutMemory: every transition of a batch in arrival order, trajectory pieces contiguous, traj_ids."""

from __future__ import annotations

import numpy as np
import pytest

from netrl.memory.rollout import RolloutMemory
from netrl.samples import Buffer, BufferBuilder, concat_segments


class Env:
    """Rows of one env: obs = [env, t]; episodes of ``length`` steps."""

    def __init__(self, env: int, length: int, version: int = 3) -> None:
        self.env, self.length, self.version = env, length, version
        self.builder = BufferBuilder(64, overlap=1)
        self.t = 0
        self.builder.add(np.zeros(1, np.float32), np.array([env, 0], np.float32), 0.0, False, False, True, version)

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.t += 1
            end = self.t % self.length == 0
            self.builder.add(np.ones(1, np.float32), np.array([self.env, self.t], np.float32), 1.0, end, False, False,
                             self.version)
            if end:
                self.builder.add(np.zeros(1, np.float32), np.array([self.env, self.t], np.float32), 0.0, False, False,
                                 True, self.version)


def packet(envs: list[Env], worker: str, seq: int) -> Buffer:
    buf = concat_segments([(e.env, b) for e in envs if (b := e.builder.cut()) is not None])
    buf.worker, buf.seq = worker, seq
    return buf


def test_a_batch_is_every_transition_in_arrival_order_with_continued_pieces_joined_and_traj_ids() -> None:
    memory = RolloutMemory(memory_size=10, batch_size=2)
    a = [Env(0, 5), Env(1, 100)]
    b = [Env(0, 100)]
    for e in a:
        e.steps(3)
    memory.append_buffer(packet(a, "a", 1))  # env 0: t 1-3; env 1: t 1-3
    for e in b:
        e.steps(2)
    memory.append_buffer(packet(b, "b", 7))  # another worker between a's packets
    for e in a:
        e.steps(4)
    memory.append_buffer(packet(a, "a", 2))  # env 0: t 4, 5 (episode ends), then a new episode t 6, 7; env 1: t 4-7
    assert len(memory) == 3 + 3 + 2 + 4 + 4
    batch = memory.sample()
    ids = batch.extra["traj_ids"].numpy()
    obs, nxt = batch.obs.numpy(), batch.next_obs.numpy()
    pieces = [(int(nxt[i, 0]), nxt[ids == k][:, 1].astype(int).tolist()) for k in np.unique(ids)
              for i in [int(np.flatnonzero(ids == k)[0])]]
    assert pieces == [(0, [1, 2, 3, 4, 5]), (1, [1, 2, 3, 4, 5, 6, 7]), (0, [1, 2]), (0, [6, 7])]
    assert (np.diff(ids) >= 0).all() and ids.dtype == np.int64  # each piece contiguous, in order of its first row
    assert (obs[:, 1] == nxt[:, 1] - 1)[nxt[:, 1] != 6].all()  # obs is the row before (t 6 follows a reset row)
    assert batch.terminated.numpy()[(nxt[:, 0] == 0) & (nxt[:, 1] == 5)].tolist() == [1.0]
    assert memory.workers() == ["a", "b"]
    memory.clear()
    assert len(memory) == 0
    with pytest.raises(ValueError, match="holds no transition"):
        memory.sample()


def test_a_gap_in_a_workers_packets_or_a_left_out_row_starts_a_new_piece() -> None:
    memory = RolloutMemory()
    env = Env(0, 100)
    env.steps(3)
    memory.append_buffer(packet([env], "a", 1))
    env.steps(3)
    memory.append_buffer(packet([env], "a", 3))  # packet 2 never arrived
    env.steps(3)
    late = packet([env], "a", 4)
    late.weight = np.array([1, 1, 0, 1], np.float32)  # its second transition is late: left out
    memory.append_buffer(late)
    batch = memory.sample()
    ids = batch.extra["traj_ids"].numpy()
    assert np.bincount(ids).tolist() == [3, 4, 1]  # packet 1 | packet 3 and t 7 of packet 4 | t 9


def test_a_packet_of_another_layout_is_refused_whole() -> None:
    memory = RolloutMemory()
    env = Env(0, 100)
    env.steps(2)
    memory.append_buffer(packet([env], "a", 1))
    other = Env(0, 100)
    other.steps(2)
    buf = packet([other], "a", 2)
    buf.extra = {"state_value": np.zeros(len(buf), np.float32)}  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"packet 2 of worker a: its columns \['extra/state_value'\] differ"):
        memory.append_buffer(buf)
    assert len(memory) == 2
