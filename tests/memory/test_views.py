"""Declared views against a brute-force walk over the rows each env really produced.

Each row carries a unique id in its action, reward and observation, so a window says which rows it came from.
Packets hold several envs' segments (env-major, each with its own context rows), random overlaps (some too short
for the views, so a few transitions cannot be rebuilt), stale rows of weight 0, terminations and truncations, and a
small ring that wraps many times. Every transition the memory can sample must carry exactly the windows the walk
gives, and it must be able to sample exactly those whose rows are all stored in one segment.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from netrl.agents.sac import SACAgent
from netrl.memory.frames import FrameStackMemory
from netrl.memory.history import HistoryMemory
from netrl.memory.views import (
    NEVER,
    View,
    declared_views,
    episode_offsets,
    last_observations,
    prev_actions,
    prev_rewards,
)
from netrl.samples import Buffer, concat_segments
from netrl.training.loop import TrainingOffline
from tests.fakes import ListSource


@dataclass
class Stream:
    """One env's rows, in the order it produced them, and what became of each."""

    env: int
    reset: list[bool] = field(default_factory=list)
    term: list[bool] = field(default_factory=list)
    trunc: list[bool] = field(default_factory=list)
    start: list[int] = field(default_factory=list)  # position of the row's episode's first row
    sent: int = 0  # rows sent as new rows so far
    end_at: dict[int, tuple[int, int, bool]] = field(default_factory=dict)  # pos -> (segment's first pos, append
    # index of that first row, weight > 0)

    def uid(self, pos: int) -> int:
        return self.env * 100_000 + pos

    def grow(self, rng: np.random.Generator, rows: int) -> None:
        while len(self.reset) < rows:
            first = len(self.reset)
            length = int(rng.integers(1, 9))
            for t in range(length + 1):
                last = t == length
                self.reset.append(t == 0)
                self.term.append(last and rng.random() < 0.5)
                self.trunc.append(last and not self.term[-1])
                self.start.append(first)

    def window(self, pos: int, length: int) -> list[int]:
        """Stream positions of the last ``length`` rows ending at ``pos``, padded with the episode's first row."""
        since = pos - self.start[pos]
        return [pos - min(length - 1 - j, since) for j in range(length)]


def values(uid: np.ndarray, env: np.ndarray) -> dict[str, np.ndarray]:
    uid = np.asarray(uid, np.int64)
    return {"act": np.stack([uid, -uid], axis=-1).astype(np.float32), "rew": uid.astype(np.float32),
            "obs/0": uid.astype(np.float32)[..., None],
            "obs/1": np.stack([uid % 251, np.broadcast_to(env, uid.shape)], axis=-1).astype(np.uint8)}


def segment(stream: Stream, rng: np.random.Generator, new: int, overlap: int, stale: float) -> Buffer:
    first = max(0, stream.sent - overlap)
    pos = np.arange(first, stream.sent + new)
    uid = np.array([stream.uid(int(p)) for p in pos])
    v = values(uid, np.full(len(pos), stream.env))
    weight = np.where(rng.random(len(pos)) < stale, 0.0, 1.0).astype(np.float32)
    return Buffer(act=v["act"], obs=(v["obs/0"], v["obs/1"]), rew=v["rew"],
                  terminated=np.array([stream.term[p] for p in pos]),
                  truncated=np.array([stream.trunc[p] for p in pos]),
                  reset=np.array([stream.reset[p] for p in pos]), context=pos < stream.sent,
                  policy_version=np.zeros(len(pos), np.int64), weight=weight)


VIEWS = [prev_actions(3), prev_rewards(2), last_observations(4, "obs/1"), last_observations(2, "obs/0", into="extra")]


def expected(stream: Stream, pos: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per view, the (obs side, next side) values the walk gives for the transition ending at ``pos``."""
    out = {}
    for view in VIEWS:
        sides = []
        for q in (pos - 1, pos):
            uid = np.array([stream.uid(p) for p in stream.window(q, view.length)])
            sides.append(values(uid, np.full(len(uid), stream.env))[view.source])
        out[view.name] = (sides[0], sides[1])
    return out


def sampleable(streams: list[Stream], total: int, capacity: int) -> set[int]:
    """Uids of the transitions whose rows are all in one segment and still stored."""
    reach = max(view.length for view in VIEWS) - 1
    out = set()
    for s in streams:
        for pos, (seg_first, seg_index, weighted) in s.end_at.items():
            oldest = pos - 1 - min(reach, pos - 1 - s.start[pos - 1])
            if weighted and oldest >= seg_first and seg_index + (oldest - seg_first) >= total - capacity:
                out.add(s.uid(pos))
    return out


def locate(streams: list[Stream], uid: int) -> tuple[Stream, int]:
    return streams[uid // 100_000], uid % 100_000


@pytest.mark.parametrize("seed", range(6))
def test_declared_views_give_what_a_brute_force_walk_gives(seed: int) -> None:
    rng = np.random.default_rng(seed)
    envs = int(rng.integers(1, 4))
    streams = [Stream(e) for e in range(envs)]
    capacity = int(rng.integers(40, 90))
    memory = HistoryMemory(memory_size=capacity, batch_size=32, seed=seed, views=VIEWS)
    total, checked = 0, 0
    for round_ in range(40):
        overlap = int(rng.integers(1, 6))  # below 4 some windows reach before the segment: they must be absent
        parts = []
        for s in streams:
            new = int(rng.integers(1, 7))
            s.grow(rng, s.sent + new)
            buf = segment(s, rng, new, overlap, stale=0.1)
            first = s.sent - int(buf.context.sum())
            for i in np.flatnonzero(buf.transition_end):
                s.end_at[first + int(i)] = (first, total + sum(len(b) for _, b in parts), True)
            for i in np.flatnonzero(~buf.context & ~buf.reset & (buf.weight == 0)):
                s.end_at[first + int(i)] = (first, 0, False)
            s.sent += new
            parts.append((s.env, buf))
        packet = concat_segments(parts)
        packet.weight = np.concatenate([b.weight for _, b in parts])  # the trainer sets them on the whole packet
        memory.append_buffer(packet)
        total += len(packet)
        if round_ % 3:  # a full sweep every third packet keeps the test fast
            continue
        got = set()
        for i in range(len(memory)):
            o, a, r, o2, term, trunc, info = memory.get_transition(i)
            uid = int(a[0])
            stream, pos = locate(streams, uid)
            want = expected(stream, pos)
            np.testing.assert_array_equal(o[1], want["obs/1"][0])  # the view into the observation
            np.testing.assert_array_equal(o2[1], want["obs/1"][1])
            np.testing.assert_array_equal(o[0], [uid - 1])  # the stored leaf, at the row before and the row
            np.testing.assert_array_equal(o2[0], [uid])
            for name in ("prev_actions", "prev_rewards", "last_obs_0"):
                np.testing.assert_array_equal(info["extra"][name], want[name][0], err_msg=name)
                np.testing.assert_array_equal(info["extra"]["next_" + name], want[name][1], err_msg=name)
            assert (r, term, trunc) == (uid, stream.term[pos], stream.trunc[pos])
            got.add(uid)
        truth = sampleable(streams, total, capacity)
        assert got == truth, (sorted(got - truth), sorted(truth - got))
        checked += len(got)
        if len(memory):
            batch = memory.sample()
            for b, uid in enumerate(batch.act[:, 0].numpy().astype(np.int64)):
                stream, pos = locate(streams, int(uid))
                want = expected(stream, pos)
                np.testing.assert_array_equal(batch.obs[1][b].numpy(), want["obs/1"][0])
                np.testing.assert_array_equal(batch.next_obs[1][b].numpy(), want["obs/1"][1])
                for name in ("prev_actions", "prev_rewards", "last_obs_0"):
                    np.testing.assert_array_equal(batch.extra[name][b].numpy(), want[name][0], err_msg=name)
                    np.testing.assert_array_equal(batch.extra["next_" + name][b].numpy(), want[name][1])
    assert total > 3 * capacity and checked > 100  # the ring wrapped, and there was plenty to check


def test_a_batch_carries_each_view_with_its_leading_dimensions() -> None:
    rng = np.random.default_rng(0)
    stream = Stream(0)
    stream.grow(rng, 30)
    memory = HistoryMemory(memory_size=100, batch_size=8, seed=0, views=VIEWS)
    memory.append_buffer(segment(stream, rng, 30, 1, stale=0.0))
    batch = memory.sample()
    assert batch.obs[0].shape == (8, 1) and batch.obs[1].shape == (8, 4, 2) and batch.next_obs[1].shape == (8, 4, 2)
    assert batch.extra["prev_actions"].shape == (8, 3, 2) and batch.extra["prev_rewards"].shape == (8, 2)
    assert batch.extra["last_obs_0"].shape == (8, 2, 1) and batch.extra["next_prev_actions"].shape == (8, 3, 2)
    # the next observation's window is the observation's, shifted by one row
    np.testing.assert_array_equal(batch.extra["next_prev_actions"][:, :-1], batch.extra["prev_actions"][:, 1:])


def frame_packet(stream: Stream, rng: np.random.Generator, new: int, overlap: int) -> Buffer:
    buf = segment(stream, rng, new, overlap, stale=0.0)
    uid = buf.act[:, 0].astype(np.int64)
    frames = np.stack([uid % 251, uid // 100_000], axis=-1).astype(np.uint8)[:, :, None] * np.ones((1, 1, 3), np.uint8)
    buf.obs, buf.weight = frames, None
    return buf


@pytest.mark.parametrize("seed", range(3))
def test_frame_stacks_never_mix_the_envs_of_a_packet(seed: int) -> None:
    """A packet of several envs: each env's segment starts with its own context rows, mid-episode; a stack must
    clamp at its own env's episode start, never at a reset row of the env before it."""
    rng = np.random.default_rng(seed)
    stack = 3
    streams = [Stream(e) for e in range(3)]
    memory = FrameStackMemory(memory_size=500, batch_size=8, stack=stack, seed=seed)
    checked = 0
    for _ in range(12):
        parts = []
        for s in streams:
            new = int(rng.integers(2, 8))
            s.grow(rng, s.sent + new)
            parts.append((s.env, frame_packet(s, rng, new, stack)))
            s.sent += new
        memory.append_buffer(concat_segments(parts))
    for i in range(len(memory)):
        o, a, *_ = memory.get_transition(i)
        stream, pos = locate(streams, int(a[0]))
        o2 = memory.get_transition(i)[3]
        for side, q in ((o, pos - 1), (o2, pos)):
            want = [[stream.uid(p) % 251, stream.env] for p in stream.window(q, stack)]
            np.testing.assert_array_equal(side[:, :, 0], want)
        checked += 1
    assert checked > 60


def test_bad_views_are_refused_naming_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"view 'prev_actions': length must be an int between 1 and 127 \(got 0\)"):
        prev_actions(0)
    with pytest.raises(ValueError, match=r"view 'x': into must be 'extra' or 'obs' \(got 'next'\)"):
        View("x", "act", 2, into="next")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="view 'stack' goes into the observation, so its name must be"):
        View("stack", "obs", 2, into="obs")
    with pytest.raises(ValueError, match="view name 'Prev Actions' must be a lowercase identifier"):
        View("Prev Actions", "act", 2)
    with pytest.raises(ValueError, match=r"HistoryMemory: two views are named 'prev_actions'"):
        HistoryMemory(memory_size=10, views=[prev_actions(2), prev_actions(3)])
    with pytest.raises(ValueError, match=r"memory_size \(4\) must be larger than 5 \(view 'prev_actions' reads up "):
        HistoryMemory(memory_size=4, views=[prev_actions(5)])
    with pytest.raises(ValueError, match=r"memory_size \(4\) must be larger than stack \(4\)"):
        FrameStackMemory(memory_size=4, stack=4)


def test_a_view_of_a_column_the_memory_does_not_store_is_refused_before_anything_is_stored() -> None:
    rng = np.random.default_rng(0)
    stream = Stream(0)
    stream.grow(rng, 10)
    memory = HistoryMemory(memory_size=50, views=[View("state", "extra/recurrent_state", 1)])
    with pytest.raises(ValueError, match=r"HistoryMemory: view 'state' reads the column 'extra/recurrent_state', which "
                                         r"this memory does not store \(it stores \['act', 'env', "):
        memory.append_buffer(segment(stream, rng, 10, 1, stale=0.0))
    assert len(memory) == 0 and memory.total_appended == 0
    leaf = HistoryMemory(memory_size=50, views=[last_observations(2, "obs/5")])
    with pytest.raises(ValueError, match=r"reads the column 'obs/5', which this memory does not store"):
        leaf.append_buffer(segment(stream, rng, 10, 1, stale=0.0))


def test_views_are_declared_before_the_first_packet() -> None:
    rng = np.random.default_rng(0)
    stream = Stream(0)
    stream.grow(rng, 10)
    memory = HistoryMemory(memory_size=50)
    memory.add_views([prev_rewards(2)])
    memory.append_buffer(segment(stream, rng, 10, 1, stale=0.0))
    assert memory.sample().extra["prev_rewards"].shape == (256, 2)
    with pytest.raises(ValueError, match=r"HistoryMemory already stores packets: declare the views \['prev_actions'\] "
                                         "before the first packet arrives"):
        memory.add_views([prev_actions(2)])


def test_a_rule_whose_windows_do_not_slide_is_refused_naming_the_view_and_row() -> None:
    def newest_twice(segment: Buffer, length: int) -> np.ndarray:
        off = episode_offsets(segment, length)
        off[5] = 0  # row 5's window holds row 5 twice instead of rows 4 and 5
        return off

    rng = np.random.default_rng(0)
    stream = Stream(0)
    stream.reset, stream.term, stream.trunc, stream.start = [True] + [False] * 9, [False] * 10, [False] * 10, [0] * 10
    memory = HistoryMemory(memory_size=50, views=[View("odd", "act", 2, rule=newest_twice)])
    with pytest.raises(ValueError, match=r"packet 0 of worker \(unnamed\), row 5: view 'odd''s window is not the "
                                         "previous row's shifted by one"):
        memory.append_buffer(segment(stream, rng, 10, 1, stale=0.0))
    assert len(memory) == 0


def test_an_unknown_entry_is_never_and_hides_its_transitions() -> None:
    """A packet that starts mid-episode with one context row: the first windows reach before it."""
    rng = np.random.default_rng(0)
    stream = Stream(0)
    stream.reset, stream.term, stream.trunc, stream.start = [True] + [False] * 19, [False] * 20, [False] * 20, [0] * 20
    memory = HistoryMemory(memory_size=50, views=[prev_actions(3)])
    memory.append_buffer(segment(stream, rng, 10, 1, stale=0.0))
    stream.sent = 10
    memory.append_buffer(segment(stream, rng, 10, 1, stale=0.0))  # row 9 as context, then rows 10..19
    assert memory._cols["view/prev_actions"][11].tolist() == [NEVER, 1, 0]
    uids = sorted(int(memory.get_transition(i)[1][0]) for i in range(len(memory)))
    assert uids == [*range(1, 10), *range(12, 20)]  # 10 and 11 read rows 8 and 7, which the packet does not hold


class ViewsAgent:
    def views(self) -> list[View]:
        return [prev_actions(2)]


def test_an_agent_declares_its_views() -> None:
    assert [v.name for v in declared_views(ViewsAgent())] == ["prev_actions"]
    assert declared_views(object()) == []

    class Wrong:
        def views(self) -> Any:
            return ["prev_actions"]

    with pytest.raises(TypeError, match=r"Wrong.views\(\) must return a list of netrl.memory.views.View"):
        declared_views(Wrong())


class PrevActionsSAC(SACAgent):
    """SAC whose critic would condition on the last two actions: it declares them, and sees them in its batches."""

    seen: list[Any] = []

    def views(self) -> list[View]:
        return [prev_actions(2)]

    def train(self, batch: Any) -> dict[str, Any]:
        PrevActionsSAC.seen.append({k: v.clone() for k, v in batch.extra.items()} | {"act": batch.act.clone()})
        return super().train(batch)


def test_the_views_an_agent_declares_reach_it_through_the_training_loop() -> None:
    obs, act = gymnasium.spaces.Box(-1, 1, (3,), np.float32), gymnasium.spaces.Box(-10, 10, (1,), np.float32)
    training = TrainingOffline(env_cls=(obs, act), memory_cls=HistoryMemory, training_agent_cls=PrevActionsSAC,
                               epochs=1, rounds=1, steps=3, start_training=0, memory_size=100, batch_size=8, seed=0,
                               device="cpu")
    training.build()
    n = 20
    packet = Buffer(act=np.arange(n, dtype=np.float32)[:, None] / 2, obs=np.zeros((n, 3), np.float32),
                    rew=np.zeros(n, np.float32), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                    reset=np.arange(n) % 10 == 0, context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64),
                    worker="w", seq=1, recv_version=1)
    assert training.add(packet) == n - 2
    PrevActionsSAC.seen.clear()
    source = ListSource([])
    training.start(source)  # type: ignore[arg-type]
    for _ in training.run_epoch(source, threading.Event()):  # type: ignore[arg-type]
        pass
    assert len(PrevActionsSAC.seen) == 3
    for extra in PrevActionsSAC.seen:
        rows = (extra["act"][:, 0] * 2).long()  # each action is its row number / 2
        start = rows // 10 * 10  # the episode's reset row, whose action pads the window
        want_next = torch.stack([torch.maximum(rows - 1, start), rows], dim=1).float() / 2
        torch.testing.assert_close(extra["next_prev_actions"][:, :, 0], want_next)
        torch.testing.assert_close(extra["prev_actions"][:, 1, 0], want_next[:, 0])


def test_an_agent_that_declares_views_is_refused_with_a_memory_that_cannot_assemble_them() -> None:
    obs, act = gymnasium.spaces.Box(-1, 1, (3,), np.float32), gymnasium.spaces.Box(-1, 1, (1,), np.float32)
    training = TrainingOffline(env_cls=(obs, act), training_agent_cls=PrevActionsSAC, memory_size=100, batch_size=8,
                               device="cpu")
    with pytest.raises(ValueError, match=r"PrevActionsSAC declares the views \['prev_actions'\], but ReplayMemory "
                                         "cannot assemble views: train with netrl.memory.HistoryMemory"):
        training.build()


def test_a_view_into_an_observation_leaf_that_does_not_exist_is_refused() -> None:
    rng = np.random.default_rng(0)
    stream = Stream(0)
    stream.grow(rng, 10)
    memory = HistoryMemory(memory_size=50, views=[View("obs/7", "obs/1", 2, into="obs")])
    with pytest.raises(ValueError, match=r"HistoryMemory: view 'obs/7' goes into the observation leaf 'obs/7', but the "
                                         r"observations have the leaves \['obs/0', 'obs/1'\]"):
        memory.append_buffer(segment(stream, rng, 10, 1, stale=0.0))
