"""Trajectories across packets (netrl.memory.trajectories): forward links, trajectory and episode ids, checked
against the plain record of what each stream sent (tests/memory/streams.py), for both ring memory families."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from netrl.memory.history import HistoryMemory
from netrl.memory.replay import ReplayMemory
from netrl.memory.trajectories import successors
from tests.memory.streams import Recording, linked_successor, record

MEMORIES = [ReplayMemory, HistoryMemory]


def append_all(memory: Any, rec: Recording) -> dict[int, int]:
    """Append the delivered packets; uid -> absolute row of its fresh (non-context) copy."""
    fresh: dict[int, int] = {}
    for buf in rec.packets:
        base = memory.total_appended
        memory.append_buffer(buf)
        for i in np.flatnonzero(~buf.context).tolist():
            fresh[int(buf.obs[i, 0])] = base + i
    return fresh


def stored_rows(memory: Any, fresh: dict[int, int]) -> dict[int, int]:
    """uid -> ring row of every stored fresh row."""
    low = memory.total_appended - memory._size
    return {uid: a % memory.memory_size for uid, a in fresh.items() if a >= low}


def check_links(memory: Any, rec: Recording, fresh: dict[int, int]) -> int:
    """Every stored row's successor is the one the record says, or none; returns the links checked."""
    where = stored_rows(memory, fresh)
    rows = np.array(list(where.values()))
    nxt = successors(memory._cols["next"], rows, memory.total_appended, memory._size)
    checked = 0
    for uid, n in zip(where, nxt.tolist(), strict=True):
        want = linked_successor(rec, uid)
        if want is None:
            assert n == -1, (uid, n)
            continue
        assert n == where[want], (uid, want, n)  # a successor is newer: stored when its row is
        checked += 1
    return checked


def walk_partition(memory: Any, rec: Recording, fresh: dict[int, int]) -> None:
    """Rows share a trajectory id iff the record chains them; episode ids split trajectories at resets."""
    where = stored_rows(memory, fresh)
    traj, episode = memory._cols["traj"], memory._cols["episode"]
    for uid, r in where.items():
        want = linked_successor(rec, uid)
        if want is not None and want in where:
            assert traj[where[want]] == traj[r]
            same_episode = not rec.rows[want].reset
            assert (episode[where[want]] == episode[r]) == same_episode, (uid, want)
    # different streams never share a trajectory, nor rows separated by a loss
    by_traj: dict[int, set[tuple[str, int]]] = {}
    for uid, r in where.items():
        by_traj.setdefault(int(traj[r]), set()).add(rec.rows[uid].stream)
    assert all(len(s) == 1 for s in by_traj.values())


@pytest.mark.parametrize("memory_cls", MEMORIES)
@pytest.mark.parametrize("overlap", [1, 3])
def test_rows_link_to_their_successor_across_packets_of_interleaved_workers(memory_cls: Any, overlap: int) -> None:
    rec = record(1, rounds=80, overlap=overlap, lose=(20, 41), restart={30: 1, 55: 2})
    memory = memory_cls(memory_size=10_000, batch_size=8, seed=0)
    fresh = append_all(memory, rec)
    # every row whose successor was delivered links to it, across packets; nothing bridges a loss or a restart
    assert check_links(memory, rec, fresh) > 300
    walk_partition(memory, rec, fresh)
    cross = sum(1 for uid, row in rec.rows.items() if row.delivered and linked_successor(rec, uid) is not None)
    assert cross > 300


@pytest.mark.parametrize("memory_cls", MEMORIES)
def test_a_lost_packet_and_a_restarted_worker_start_new_trajectories(memory_cls: Any) -> None:
    rec = record(2, workers=1, envs=1, rounds=12, lose=(5,), restart={9: 0}, episode_end=0)
    memory = memory_cls(memory_size=1000, batch_size=8, seed=0)
    fresh = append_all(memory, rec)
    where = stored_rows(memory, fresh)
    ids = {int(memory._cols["traj"][r]) for r in where.values()}
    assert len(ids) == 3  # before the loss, after it, after the restart
    walk_partition(memory, rec, fresh)


@pytest.mark.parametrize("memory_cls", MEMORIES)
def test_an_overwritten_successor_ends_a_walk(memory_cls: Any) -> None:
    rec = record(3, workers=1, envs=1, rounds=40, rows_max=5, episode_end=0)
    memory = memory_cls(memory_size=37, batch_size=8, seed=0)
    fresh = append_all(memory, rec)
    # the absolute rows that every stored row's link names are stored, or the link reads as none
    rows = np.arange(memory._size)
    nxt = successors(memory._cols["next"], rows, memory.total_appended, memory._size)
    oldest = memory._pos if memory._size == memory.memory_size else 0
    age = (rows - oldest) % memory.memory_size
    linked = nxt >= 0
    assert ((nxt[linked] - oldest) % memory.memory_size > age[linked]).all()  # always forward, never past the head
    assert check_links(memory, rec, fresh) > 10


@pytest.mark.parametrize("memory_cls", MEMORIES)
def test_batches_carry_trajectory_and_episode_ids(memory_cls: Any) -> None:
    rec = record(4, rounds=30)
    memory = memory_cls(memory_size=1000, batch_size=64, seed=0)
    fresh = append_all(memory, rec)
    batch = memory.sample()
    traj, episode = batch.extra["traj"].numpy(), batch.extra["episode"].numpy()
    assert traj.dtype == np.int64 and episode.dtype == np.int64 and traj.shape == (64,)
    where = stored_rows(memory, fresh)
    for b in range(64):
        r = where[int(batch.next_obs[b, 0])]
        assert traj[b] == memory._cols["traj"][r] and episode[b] == memory._cols["episode"][r]


@pytest.mark.parametrize("memory_cls", MEMORIES)
@pytest.mark.parametrize("how", ["quarantine", "drop"])
def test_sequences_with_n_step_windows_never_hold_a_quarantined_or_dropped_workers_rows(memory_cls: Any,
                                                                                        how: str) -> None:
    # a trajectory is one worker's, so a walk from another worker's row never reaches w1's; stale rows inside a
    # trajectory end walks (test_sequences.py, test_nstep.py)
    rec = record(5, rounds=60, rows_max=5, episode_end=0.02)
    memory = memory_cls(memory_size=5000, batch_size=64, seed=0, sequence_length=8, n_step=3, gamma=0.9)
    fresh = append_all(memory, rec)
    if how == "quarantine":
        memory.set_quarantined("w1", True)
    else:
        memory.drop_worker("w1")
    where = stored_rows(memory, fresh)
    owner = {r: rec.rows[uid].stream[0] for uid, r in where.items()}
    crossed = 0
    for _ in range(5):
        batch = memory.sample()
        uid = batch.act.numpy()[..., 0].astype(np.int64)
        mask = batch.extra["mask"].numpy()
        steps = uid[mask]
        assert not any(rec.rows[int(u)].stream[0].startswith("w1/") for u in steps)
        crossed += int((mask.sum(1) > 6).sum())
    assert crossed > 0 and any(o.startswith("w1/") for o in owner.values())
