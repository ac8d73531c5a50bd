"""Every sampler with every transform, in both memory families: memories as the built-in pipelines build them (gym:
ReplayMemory; drone: ActionBufferMemory with its compressor; image: FrameStackMemory with its compressor, small frames;
a user's own: HistoryMemory with prev_actions and prev_rewards views) x {uniform, prioritized} x {none, 3-step returns}
x {transitions, sequences of 8 with burn-in 2} x {columns in RAM, on disk (memory.storage)}.

Packets come from three interleaved workers with two envs each, built with the real BufferBuilder (and the pipeline's
compressor), small packets, a lost packet and a worker restart in the stream. Each batch is checked item by item, step
by step, against a brute-force walk of the recorded trajectories: plain Python lists per stream (tests/memory/
streams.py), never the memory's link columns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from netrl.memory import disk
from netrl.memory.action_buffer import ActionBufferCompressor, ActionBufferMemory
from netrl.memory.disk import DiskRing, close_ring_storage
from netrl.memory.frames import FrameStackCompressor, FrameStackMemory
from netrl.memory.history import HistoryMemory
from netrl.memory.replay import ReplayMemory
from netrl.memory.views import prev_actions, prev_rewards
from netrl.samples.columns import tree_map
from tests.memory.streams import Recording, linked_successor, record

GAMMA, STACK, SIDE, ACT_BUF, VIEW = 0.9, 3, 6, 2, 3
LENGTH, BURN_IN, BATCH = 8, 2, 16


def position(rec: Recording, uid: int) -> tuple[list[int], int]:
    stream = rec.streams[rec.rows[uid].stream]
    return stream, stream.index(uid)


def window(rec: Recording, uid: int, length: int, value: Any) -> list[Any]:
    """The last ``length`` values up to row ``uid`` of its stream, clamped at its episode's first row."""
    stream, i = position(rec, uid)
    start = i
    while not rec.rows[stream[start]].reset:
        start -= 1
    return [value(stream[max(i - k, start)]) for k in range(length - 1, -1, -1)]


def image_row(rec: Recording, key: tuple[str, int], uid: int) -> tuple[Any, Any]:
    """The env's observation: a stack of the last frames, the episode's first repeated (Gymnasium's padding)."""
    frames = window(rec, uid, STACK, lambda u: np.full((SIDE, SIDE), u % 251, np.uint8))
    return np.array([uid], np.float32), np.stack(frames)


def drone_rows() -> Any:
    """rtgym's observations with its action buffer (reset_act_buf False, last_act_on_reset False: the drone
    pipeline's), per stream."""
    buffers: dict[tuple[str, int], list[np.ndarray]] = {}

    def make(rec: Recording, key: tuple[str, int], uid: int) -> tuple[Any, Any]:
        reset = rec.rows[uid].reset
        act = np.zeros(2, np.float32) if reset else np.array([uid, -uid], np.float32)  # a reset row: the default
        prev = buffers.get(key)
        buf = [act] * ACT_BUF if prev is None else [*prev[:-1], act] if reset else [*prev[1:], act]
        buffers[key] = buf
        return act, (np.array([uid], np.float32), *buf)

    return make


def uid_of(act: Any) -> int:
    return round(float(act[0]))


MEMORIES: dict[str, dict[str, Any]] = {
    "gym": {"cls": ReplayMemory, "overlap": 1},
    "drone": {"cls": ActionBufferMemory, "overlap": 2 * ACT_BUF - 1,  # the pipeline's
              "kwargs": {"act_buf_len": ACT_BUF, "reset_act_buf": False, "last_act_on_reset": False},
              "compressor": lambda: ActionBufferCompressor(ACT_BUF, reset_act_buf=False), "make_row": drone_rows},
    "image": {"cls": FrameStackMemory, "overlap": STACK, "kwargs": {"stack": STACK},
              "compressor": FrameStackCompressor, "make_row": lambda: image_row},
    "own": {"cls": HistoryMemory, "overlap": VIEW, "kwargs": {"views": [prev_actions(VIEW), prev_rewards(VIEW)]}},
}


def nstep_walk(rec: Recording, uid: int, n: int) -> tuple[int, float, int]:
    """(last row, discounted return, steps) of the n-step window from transition ``uid``."""
    cur, ret, m = uid, rec.rows[uid].rew, 1
    while m < n and not (rec.rows[cur].terminated or rec.rows[cur].truncated):
        nxt = linked_successor(rec, cur)
        if nxt is None:
            break
        ret += GAMMA ** m * rec.rows[nxt].rew
        cur, m = nxt, m + 1
    return cur, ret, m


def sequence_walk(rec: Recording, uid: int) -> list[int]:
    steps = [uid]
    while len(steps) < LENGTH:
        cur = rec.rows[steps[-1]]
        nxt = linked_successor(rec, cur.uid)
        if cur.terminated or cur.truncated or nxt is None:
            break
        steps.append(nxt)
    return steps


def same(got: Any, want: Any) -> bool:
    if isinstance(want, tuple):
        return all(same(g, w) for g, w in zip(got, want, strict=True))
    return np.array_equal(np.asarray(got), np.asarray(want, dtype=np.asarray(got).dtype))


def segment(rec: Recording, uid: int) -> tuple[tuple[str, int], int]:
    """The recorded trajectory of a row: its stream, and how many breaks (lost packets) came before it in it."""
    stream, i = position(rec, uid)
    return rec.rows[uid].stream, sum(linked_successor(rec, u) is None for u in stream[:i])


def check_step(rec: Recording, batch: Any, at: tuple[int, ...], uid: int, kind: str, n_step: int) -> None:
    row = rec.rows[uid]
    assert row.delivered and not row.reset, uid  # a real transition
    stream, i = position(rec, uid)
    prev = stream[i - 1]
    item = tree_map(lambda t: t[at].numpy(), batch.obs)
    assert same(item, rec.rows[prev].obs), (kind, uid)
    last, ret, m = nstep_walk(rec, uid, n_step)
    assert same(tree_map(lambda t: t[at].numpy(), batch.next_obs), rec.rows[last].obs), (kind, uid, last)
    assert batch.rew[at].item() == pytest.approx(ret, rel=1e-5)
    assert (bool(batch.terminated[at]), bool(batch.truncated[at])) == (rec.rows[last].terminated,
                                                                       rec.rows[last].truncated)
    if n_step > 1:
        assert int(batch.extra["steps_to_next_obs"][at]) == m
        assert batch.extra["discount"][at].item() == pytest.approx(GAMMA ** m, rel=1e-6)
    if kind == "own":
        for name, value in (("prev_actions", lambda u: rec.rows[u].act), ("prev_rewards", lambda u: rec.rows[u].rew)):
            assert same(batch.extra[name][at].numpy(), np.stack(window(rec, prev, VIEW, value)))
            assert same(batch.extra["next_" + name][at].numpy(), np.stack(window(rec, last, VIEW, value)))


def check_batch(rec: Recording, memory: Any, kind: str, n_step: int, sequences: bool, prioritized: bool) -> int:
    batch = memory.sample()
    acts = batch.act.numpy()
    traj, episode = batch.extra["traj"].numpy(), batch.extra["episode"].numpy()
    assert traj.dtype == episode.dtype == np.int64 and traj.shape == acts.shape[:-1]
    ids: dict[Any, int] = {}
    steps = 0
    for b in range(BATCH):
        if not sequences:
            check_step(rec, batch, (b,), uid_of(acts[b]), kind, n_step)
            keys = [((b,), uid_of(acts[b]))]
        else:
            walk = sequence_walk(rec, uid_of(acts[b, 0]))
            mask = batch.extra["mask"][b].numpy()
            assert mask.tolist() == [j < len(walk) for j in range(LENGTH)], (kind, walk, mask)
            padded = walk + [walk[-1]] * (LENGTH - len(walk))
            assert [uid_of(a) for a in acts[b]] == padded, kind
            for j in range(LENGTH):
                check_step(rec, batch, (b, j), padded[j], kind, n_step)
            keys = [((b, j), u) for j, u in enumerate(padded)]
        for at, u in keys:  # trajectory and episode ids name the recorded trajectories and episodes one to one
            seg = segment(rec, u)
            ep = (seg, sum(rec.rows[x].reset for x in position(rec, u)[0][:position(rec, u)[1] + 1]))
            assert ids.setdefault(("traj", seg), int(traj[at])) == int(traj[at])
            assert ids.setdefault(("traj id", int(traj[at])), hash(seg)) == hash(seg)
            assert ids.setdefault(("episode", ep), int(episode[at])) == int(episode[at])
            assert ids.setdefault(("episode id", int(episode[at])), hash(ep)) == hash(ep)
            steps += 1
    if prioritized:
        weight, index = batch.weight.numpy(), batch.extra["index"].numpy()
        assert weight.shape == index.shape == acts.shape[:-1] and (weight > 0).all() and weight.max() <= 1
        if sequences:  # a sequence's importance weight on every step
            assert (weight == weight[:, :1]).all()
        td = np.random.default_rng(0).random(index.shape)
        assert memory.update_priority(td, index) > 0
    else:
        assert batch.weight is None and "index" not in batch.extra
    return steps


@pytest.mark.parametrize("storage", ["ram", "disk"])
@pytest.mark.parametrize("sequences", [False, True], ids=["transitions", "sequences"])
@pytest.mark.parametrize("n_step", [1, 3], ids=["1-step", "3-step"])
@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
@pytest.mark.parametrize("kind", list(MEMORIES))
def test_every_sampler_and_transform_matches_a_brute_force_walk(kind: str, prioritized: bool, n_step: int,
                                                                sequences: bool, storage: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    spec = MEMORIES[kind]
    make_row = spec["make_row"]() if "make_row" in spec else None
    rec = record(7, rounds=70, overlap=spec["overlap"], rows_max=5, lose=(12, 40), restart={25: 1},
                 make_row=make_row, compressor=spec.get("compressor"))
    options: dict[str, Any] = {"prioritized": prioritized, "n_step": n_step, "gamma": GAMMA}
    if sequences:
        options.update(sequence_length=LENGTH, burn_in=BURN_IN)
    if storage == "disk":  # memory.storage disk: the ring's columns in memory-mapped files, here
        monkeypatch.setattr(disk, "DISK_ROW_BYTES", 1)  # every one (the wide ones only, by default)
        options["ring_storage"] = DiskRing(tmp_path / "replay")
    memory = spec["cls"](memory_size=5000, batch_size=BATCH, seed=1, **spec.get("kwargs", {}), **options)
    try:
        for buf in rec.packets:
            memory.append_buffer(buf)
        torch.manual_seed(0)
        checked = sum(check_batch(rec, memory, kind, n_step, sequences, prioritized) for _ in range(3))
        in_files = len(memory.ring_storage.paths) if storage == "disk" else 0
    finally:
        close_ring_storage(memory)
    assert checked == 3 * BATCH * (LENGTH if sequences else 1)
    assert (in_files > 5) == (storage == "disk")  # observations, actions, rewards, links...


def test_sequences_in_a_memory_on_a_device_are_refused_naming_both_keys() -> None:
    with pytest.raises(ValueError, match=r"memory.sequence_length 8 with memory.device 'cpu': sequences follow links "
                                         r"kept in host columns"):
        ReplayMemory(memory_size=100, batch_size=4, sequence_length=8, storage_device="cpu")


@pytest.mark.parametrize("sequences", [False, True], ids=["transitions", "sequences"])
@pytest.mark.parametrize("kind", list(MEMORIES))
def test_prioritized_batches_stay_exact_while_the_ring_overwrites_the_oldest_rows_history(kind: str,
                                                                                       sequences: bool) -> None:
    # the oldest rows lose the rows their views read first: a row drawn by priority must still have them
    spec = MEMORIES[kind]
    make_row = spec["make_row"]() if "make_row" in spec else None
    rec = record(8, rounds=70, overlap=spec["overlap"], rows_max=5, lose=(12, 40), restart={25: 1},
                 make_row=make_row, compressor=spec.get("compressor"))
    options: dict[str, Any] = {"prioritized": True, "n_step": 3, "gamma": GAMMA, "alpha": 1.0}
    if sequences:
        options.update(sequence_length=LENGTH, burn_in=BURN_IN)
    memory = spec["cls"](memory_size=45, batch_size=BATCH, seed=1, **spec.get("kwargs", {}), **options)
    checked = 0
    for row in rec.rows.values():  # delivered once appended: the walks never reach rows still to come
        row.delivered = False
    for k, buf in enumerate(rec.packets):
        memory.append_buffer(buf)
        for uid in rec.fresh[k]:
            rec.rows[uid].delivered = True
        if k > 10 and len(memory) > 0:
            checked += check_batch(rec, memory, kind, 3, sequences, True)
    assert memory.total_appended > 5 * memory.memory_size and checked > 50 * BATCH
