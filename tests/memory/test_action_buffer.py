"""ActionBufferMemory against an oracle: rtgym's action-buffer rules replayed in plain Python.

Random episode lengths, unrecorded test episodes, random packet sizes and a small ring, for each of rtgym's three
reset behaviours. Every transition the memory can sample must carry exactly the buffers the env produced, and
the transitions it can sample must be exactly those whose buffers hold no action the memory never saw.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pytest

from netrl.memory.action_buffer import ActionBufferCompressor, ActionBufferMemory
from netrl.samples import BufferBuilder, concat_segments
from tests.recording import same

L = 3
DEFAULT = np.zeros(2, np.float32)


def rtgym_rows(rng: np.random.Generator, reset_act_buf: bool, last_act_on_reset: bool, episodes: int
               ) -> list[tuple[Any, ...]]:
    """Rows (act, obs, rew, terminated, truncated, reset, recorded, hidden) following rtgym's rules.

    ``hidden`` says whether the row's buffer holds an entry the memory cannot know: one carried across an
    unrecorded test episode (everything in the buffer when a recorded episode starts after one).
    """
    buf: deque[tuple[np.ndarray, bool]] = deque([(DEFAULT, False)] * L, maxlen=L)  # (action, hidden)
    rows = []
    counter = 0.0
    skipped = False  # an unrecorded episode ran since the last recorded row

    def obs() -> tuple[Any, ...]:
        return (np.float32([counter]), *(a for a, _ in buf))

    def hidden() -> bool:
        return any(h for _, h in buf)

    for _ in range(episodes):
        recorded = rng.random() > 0.25  # a quarter are test episodes: the env runs them, the worker records nothing
        if recorded and skipped:
            buf.extend([(a, True) for a, _ in buf])  # the memory will see a seam here
            skipped = False
        skipped |= not recorded
        if reset_act_buf:
            buf.extend([(DEFAULT, False)] * L)
        elif not last_act_on_reset:
            buf[-1] = (DEFAULT, False)
        counter += 1
        rows.append((DEFAULT, obs(), 0.0, False, False, True, recorded, hidden()))
        for t in range(int(rng.integers(1, 9))):
            act = rng.uniform(-1, 1, 2).astype(np.float32)
            buf.append((act, False))
            counter += 1
            end = t == 7 or rng.random() < 0.15
            rows.append((act, obs(), -1.0, False, end, False, recorded, hidden()))
            if end:
                break
        if not rows[-1][4]:
            rows[-1] = (*rows[-1][:4], True, *rows[-1][5:])  # the episode's last row ends it
    return rows


@pytest.mark.parametrize(("reset_act_buf", "last_act_on_reset"), [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_memory_matches_rtgym_rules_exactly(reset_act_buf: bool, last_act_on_reset: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = rtgym_rows(rng, reset_act_buf, last_act_on_reset, episodes=60)
    truth: dict[bytes, tuple[Any, Any]] = {}
    visible: set[bytes] = set()  # transitions whose two buffers the memory can know
    prev_obs, prev_hidden = None, False
    for act, obs, *_, reset, recorded, hidden in rows:
        if not reset and recorded:
            truth[act.tobytes()] = (prev_obs, obs)
            if not (hidden or prev_hidden):
                visible.add(act.tobytes())
        prev_obs, prev_hidden = obs, hidden
    compress = ActionBufferCompressor(L, reset_act_buf, last_act_on_reset)
    overlap = 2 * L - 1
    packet = int(rng.integers(3, 12))
    builder = BufferBuilder(packet + overlap + 2, overlap)
    memory = ActionBufferMemory(memory_size=int(rng.integers(30, 60)), batch_size=64, seed=seed, act_buf_len=L,
                                reset_act_buf=reset_act_buf, last_act_on_reset=last_act_on_reset)
    seen: set[bytes] = set()
    recorded_rows = [r for r in rows if r[6]]
    for k, (act, obs, rew, term, trunc, reset, _, _) in enumerate(recorded_rows):
        a, o, r, te, tr, _ = compress(act, obs, rew, term, trunc, {})
        builder.add(a, o, r, te, tr, reset, 0)
        if len(builder) < packet and k < len(recorded_rows) - 1:
            continue
        buffer = builder.cut()
        assert buffer is not None
        memory.append_buffer(buffer)
        for i in range(len(memory)):
            o1, a1, _, o2, *_ = memory.get_transition(i)
            want = truth[np.asarray(a1).tobytes()]
            assert same(o1, want[0]) and same(o2, want[1]), f"transition {i} of {len(memory)}"
            seen.add(np.asarray(a1).tobytes())
    assert memory.total_appended > 2 * memory.memory_size
    assert seen == visible, (len(seen - visible), len(visible - seen), len(truth))  # exact, or never sampled
    assert len(visible) > 0.75 * len(truth)
    if reset_act_buf:
        assert compress.seams == 0
    else:
        assert compress.seams > 0  # test episodes moved the carried buffer


def test_a_seam_inside_an_episode_hides_exactly_the_buffers_that_reach_past_it() -> None:
    """Actions are their row numbers; a seam at row 5 (say, after a restart mid-episode) must hide every buffer
    that holds an action from before row 5, and only those."""
    n = 12
    builder = BufferBuilder(n + 1, 1)
    for k in range(n):
        act = np.full(2, k, np.float32)
        seam = np.uint8(k == 5)
        builder.add(DEFAULT if k == 0 else act, (np.float32([k]), seam), 0.0, False, False, k == 0, 0)
    buffer = builder.cut()
    assert buffer is not None
    for mode in [(True, False), (False, False), (False, True)]:
        memory = ActionBufferMemory(memory_size=50, act_buf_len=L, reset_act_buf=mode[0], last_act_on_reset=mode[1])
        memory.append_buffer(buffer)
        got = {}
        for i in range(len(memory)):
            o1, a1, _, o2, *_ = memory.get_transition(i)
            got[int(a1[0])] = ([int(x[0]) for x in o1[1:]], [int(x[0]) for x in o2[1:]])
        assert sorted(got) == [1, 2, 3, 4, 8, 9, 10, 11], mode  # 5, 6, 7 reach back past the seam
        assert got[8] == ([5, 6, 7], [6, 7, 8]) and got[2] == ([0, 0, 1], [0, 1, 2]), mode


@pytest.mark.parametrize(("reset_act_buf", "last_act_on_reset"), [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("seed", [0, 1])
def test_memory_matches_rtgym_rules_exactly_with_several_envs_per_packet(reset_act_buf: bool,
                                                                        last_act_on_reset: bool, seed: int) -> None:
    """A worker with three envs sends env-major packets: each env's buffers must come from its own rows only."""
    rng = np.random.default_rng(100 + seed)
    overlap = 2 * L - 1
    envs = []
    truth: dict[bytes, tuple[Any, Any]] = {}
    visible: set[bytes] = set()
    for _ in range(3):
        rows = [r for r in rtgym_rows(rng, reset_act_buf, last_act_on_reset, episodes=40)]
        prev_obs, prev_hidden = None, False
        for act, obs, *_, reset, recorded, hidden in rows:
            if not reset and recorded:
                truth[act.tobytes()] = (prev_obs, obs)
                if not (hidden or prev_hidden):
                    visible.add(act.tobytes())
            prev_obs, prev_hidden = obs, hidden
        recorded_rows = [r for r in rows if r[6]]
        envs.append((recorded_rows, ActionBufferCompressor(L, reset_act_buf, last_act_on_reset),
                     BufferBuilder(20 + overlap, overlap)))
    memory = ActionBufferMemory(memory_size=150, batch_size=64, seed=seed, act_buf_len=L,
                                reset_act_buf=reset_act_buf, last_act_on_reset=last_act_on_reset)
    seen: set[bytes] = set()
    sent = [0, 0, 0]
    while any(s < len(rows) for s, (rows, _, _) in zip(sent, envs, strict=True)):
        segments = []
        for e, (rows, compress, builder) in enumerate(envs):
            for act, obs, rew, term, trunc, reset, _, _ in rows[sent[e]:sent[e] + int(rng.integers(1, 8))]:
                builder.add(*compress(act, obs, rew, term, trunc, {})[:5], reset, 0)
                sent[e] += 1
            buffer = builder.cut()
            if buffer is not None:
                segments.append((e, buffer))
        memory.append_buffer(concat_segments(segments))
        for i in range(len(memory)):
            o1, a1, _, o2, *_ = memory.get_transition(i)
            want = truth[np.asarray(a1).tobytes()]
            assert same(o1, want[0]) and same(o2, want[1]), f"transition {i} of {len(memory)}"
            seen.add(np.asarray(a1).tobytes())
    assert memory.total_appended > 2 * memory.memory_size
    # Every buffer was exact (above). The oracle's set is close but not exact here: with short packets, an env's
    # first defaults are unknowable once its first row is only context, and a "hidden" entry that happens to equal
    # the default action makes no seam (the rebuilt buffer is still right).
    assert len(seen & visible) >= 0.95 * len(visible) and len(seen - visible) <= 0.02 * len(visible)
