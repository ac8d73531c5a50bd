"""Each row's worker (netrl.memory.owners): rows per worker, a worker's rows dropped or quarantined,
in every memory kind netrl ships."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from netrl.memory.base import MemoryDataloading
from netrl.memory.history import HistoryMemory
from netrl.memory.replay import ReplayMemory
from netrl.memory.rollout import RolloutMemory
from netrl.samples import Buffer

BASE = {"a": 0.0, "b": 1000.0, "c": 2000.0}  # each worker's observations start here: obs tells whose


def packet(worker: str, n: int, start: int) -> Buffer:
    """One ``n``-row episode piece of ``worker``: a reset row, then transitions; obs = base + t."""
    t = np.arange(start, start + n, dtype=np.float32) + np.float32(BASE[worker])
    return Buffer(act=t[:, None].copy(), obs=np.repeat(t[:, None], 2, 1), rew=np.ones(n, np.float32),
                  terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), reset=np.arange(n) == 0,
                  context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64), worker=worker)


RING: dict[str, Callable[[int], Any]] = {
    "replay": lambda size: ReplayMemory(memory_size=size, batch_size=64, seed=0),
    "prioritized": lambda size: ReplayMemory(memory_size=size, batch_size=64, seed=0, prioritized=True),
    "nstep": lambda size: ReplayMemory(memory_size=size, batch_size=64, seed=0, n_step=3, gamma=0.9),
    "sequences": lambda size: ReplayMemory(memory_size=size, batch_size=16, seed=0, sequence_length=2),
    "history": lambda size: HistoryMemory(memory_size=size, batch_size=64, seed=0),
}


def owners(memory: MemoryDataloading, draws: int = 20) -> set[str]:
    """The workers whose observations were in ``draws`` batches."""
    seen: set[str] = set()
    for _ in range(draws):
        obs = memory.sample().obs.numpy().reshape(-1, 2)[:, 0]
        seen |= {w for w, base in BASE.items() if ((obs >= base) & (obs < base + 1000)).any()}
    return seen


def transitions(memory: MemoryDataloading) -> int:
    return len(memory)


@pytest.mark.parametrize("kind", RING)
def test_rows_are_counted_per_worker_and_leave_the_count_as_the_ring_overwrites_them(kind: str) -> None:
    memory = RING[kind](100)
    assert memory.rows_of("a") == 0
    for k in range(6):  # 60 rows of a, then 60 of b: b overwrites 20 of a's
        memory.append_buffer(packet("a", 10, 10 * k))
    assert memory.rows_of("a") == 60 and memory.rows_of("b") == 0
    assert memory.rows_after("a", 10) == 70  # empty slots: nothing of a's is overwritten
    for k in range(6):
        memory.append_buffer(packet("b", 10, 10 * k))
    assert (memory.rows_of("a"), memory.rows_of("b")) == (40, 60)
    assert memory.worker_rows() == {"a": 40, "b": 60}
    # the ring is full: a's next 10 rows overwrite 10 of its own oldest
    assert memory.rows_after("a", 10) == 40
    memory.append_buffer(packet("b", 10, 60))  # over 10 more of a's
    assert memory.rows_of("a") == 30
    assert memory.rows_after("a", 10) == 30 and memory.rows_after("b", 10) == 80


@pytest.mark.parametrize("kind", RING)
def test_a_quarantined_worker_is_never_sampled_and_comes_back_when_lifted(kind: str) -> None:
    memory = RING[kind](200)
    for k in range(5):
        memory.append_buffer(packet("a", 10, 10 * k))
        memory.append_buffer(packet("b", 10, 10 * k))
    both = transitions(memory)
    assert owners(memory) == {"a", "b"}
    assert memory.set_quarantined("b", True) == 50
    assert memory.set_quarantined("b", True) == 0  # already
    assert transitions(memory) == both // 2 and owners(memory) == {"a"}
    memory.append_buffer(packet("b", 10, 50))  # sent while quarantined: kept aside too
    memory.append_buffer(packet("a", 10, 50))
    assert owners(memory) == {"a"} and memory.rows_of("b") == 60
    assert memory.set_quarantined("b", False) == 60
    assert transitions(memory) == both + both // 5 and owners(memory) == {"a", "b"}


@pytest.mark.parametrize("kind", RING)
def test_a_dropped_worker_is_never_sampled_again_and_its_rows_count_for_no_one(kind: str) -> None:
    memory = RING[kind](100)
    for k in range(4):
        memory.append_buffer(packet("a", 10, 10 * k))
        memory.append_buffer(packet("b", 10, 10 * k))
    memory.set_quarantined("b", True)
    assert memory.drop_worker("b") == 40
    assert memory.drop_worker("b") == 0 and memory.drop_worker("never seen") == 0
    assert memory.rows_of("b") == 0 and memory.worker_rows() == {"a": 40}
    memory.set_quarantined("b", False)  # lifting a quarantine does not bring dropped rows back
    assert owners(memory) == {"a"} and transitions(memory) == 4 * 9
    for k in range(4, 8):  # the ring overwrites the dropped rows: no count goes negative
        memory.append_buffer(packet("a", 10, 10 * k))
        memory.append_buffer(packet("c", 10, 10 * k))
    assert memory.worker_rows() == {"a": 50, "c": 40}  # + 10 dropped
    assert owners(memory) == {"a", "c"}


@pytest.mark.parametrize("kind", RING)
def test_every_session_of_a_worker_is_that_worker(kind: str) -> None:
    # The trainer sees each packet's worker as name/session, and a restarted worker starts a new
    # session: a worker that reconnected must neither get a second share nor escape a drop.
    memory = RING[kind](100)
    memory.append_buffer(packet("a", 10, 0))
    memory.append_buffer(dataclasses.replace(packet("a", 10, 10), worker="a/s1"))
    memory.append_buffer(dataclasses.replace(packet("a", 10, 20), worker="a/s2"))
    memory.append_buffer(dataclasses.replace(packet("b", 10, 0), worker="b/s1"))
    assert memory.rows_of("a") == memory.rows_of("a/s9") == 30 and memory.worker_rows() == {"a": 30, "b": 10}
    assert memory.set_quarantined("a/s2", True) == 30 and owners(memory) == {"b"}
    assert memory.quarantined() == ["a"] and memory.drop_worker("a") == 30 and memory.rows_of("a/s1") == 0


def test_quarantine_and_drop_keep_prioritized_draws_off_the_rows() -> None:
    memory = ReplayMemory(memory_size=100, batch_size=64, seed=0, prioritized=True)
    for k in range(4):
        memory.append_buffer(packet("a", 10, 10 * k))
        memory.append_buffer(packet("b", 10, 10 * k))
    memory.set_quarantined("a", True)
    assert memory._priorities is not None and memory._priorities.tree.total == pytest.approx(36)
    memory.set_quarantined("a", False)
    memory.drop_worker("b")
    assert memory._priorities.tree.total == pytest.approx(36) and owners(memory) == {"a"}


def test_the_rollout_memory_keeps_a_quarantined_workers_transitions_out_of_its_batch() -> None:
    memory = RolloutMemory()
    memory.append_buffer(packet("a", 10, 0))
    memory.append_buffer(dataclasses.replace(packet("b", 10, 0), worker="b/s1"))
    assert (memory.rows_of("a"), memory.rows_of("b"), len(memory)) == (9, 9, 18)
    assert memory.set_quarantined("b/s2", True) == 9
    assert len(memory) == 9 and memory.workers() == ["a"] and owners(memory, 1) == {"a"}
    memory.set_quarantined("b", False)
    assert memory.drop_worker("b") == 9 and len(memory) == 9 and owners(memory, 1) == {"a"}
    memory.set_quarantined("a", True)
    with pytest.raises(ValueError, match="no transition outside quarantine"):
        memory.sample()


def test_a_memory_that_keeps_no_worker_says_so() -> None:
    class Plain(MemoryDataloading):
        def append_buffer(self, buffer: Buffer) -> None: ...
        def __len__(self) -> int:
            return 0
        def get_transition(self, item: int) -> Any:
            raise IndexError(item)

    with pytest.raises(NotImplementedError, match="Plain does not keep each row's worker"):
        Plain().drop_worker("a")


@pytest.mark.parametrize("kind", RING)
def test_a_worker_quarantined_before_the_memory_holds_a_row_is_kept_out_from_its_first(kind: str) -> None:
    # a restarted trainer restores its quarantines before the sample log refills the memory
    memory = RING[kind](200)
    assert memory.set_quarantined("b", True) == 0
    assert memory.drop_worker("b") == 0
    for k in range(5):
        memory.append_buffer(packet("a", 10, 10 * k))
        memory.append_buffer(packet("b", 10, 10 * k))
    assert owners(memory) == {"a"} and memory.rows_of("b") == 50
    assert memory.set_quarantined("b", False) == 50 and owners(memory) == {"a", "b"}
