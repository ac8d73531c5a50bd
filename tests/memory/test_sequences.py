"""Sequence batches ([B, L] with a mask) against a reference built from how the rows were generated: random episodes
with terminations and truncations, packets of random sizes from two workers with three envs each, stale rows and a
ring that wraps many times."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

from netrl.memory.replay import ReplayMemory
from netrl.memory.sequences import sequence_index
from netrl.samples import Buffer, BufferBuilder, concat_segments


@dataclass
class Row:
    """What the generator knows about a row it sent fresh (not as a context copy)."""

    packet: int
    terminated: bool
    truncated: bool
    reset: bool
    weight: float


def generate(seed: int, rounds: int = 60) -> tuple[list[Buffer], dict[int, Row]]:
    """Packets from 2 workers x 3 envs. Row uids are consecutive within an env's stream, so uid + 1 is the row that
    followed uid in that env; obs = [uid], act = [2 uid], rew = uid / 2."""
    rng = np.random.default_rng(seed)
    rows: dict[int, Row] = {}
    builders = {(w, e): BufferBuilder(64, overlap=1) for w in range(2) for e in range(3)}
    nxt = {key: (key[0] * 10 + key[1]) * 10_000 for key in builders}
    ended = dict.fromkeys(builders, True)
    packets = []
    for p in range(rounds):
        w = int(rng.integers(2))
        segments = []
        for e in range(3):
            key, b = (w, e), builders[(w, e)]
            for _ in range(int(rng.integers(0, 13))):
                uid = nxt[key]
                nxt[key] += 1
                reset = ended[key]
                term = not reset and rng.random() < 0.08
                trunc = not reset and not term and rng.random() < 0.05
                ended[key] = term or trunc
                b.add(np.array([2.0 * uid], np.float32), np.array([uid], np.float32), uid / 2, term, trunc, reset, p)
                rows[uid] = Row(len(packets), term, trunc, reset, 1.0)
            buf = b.cut()
            if buf is not None:
                segments.append((e, buf))
        if not segments:
            continue
        buf = concat_segments(segments)
        buf.worker, buf.seq = f"w{w}", p
        draw = rng.random(len(buf))  # stale rows, dropped (weight 0: no transition) or down-weighted
        buf.weight = np.select([draw < 0.07, draw < 0.12], [0.0, 0.5], 1.0).astype(np.float32)
        for i in np.flatnonzero(~buf.context):
            rows[int(buf.obs[i, 0])].weight = float(buf.weight[i])
        packets.append(buf)
    return packets, rows


def expected(start: int, length: int, rows: dict[int, Row]) -> tuple[list[int], str]:
    """The transitions (uids of their rows) of the sequence that starts at ``start``, and why it stopped."""
    seq = [start]
    while len(seq) < length:
        last, nxt = rows[seq[-1]], rows.get(seq[-1] + 1)
        if last.terminated or last.truncated:
            return seq, "episode end"
        if nxt is None:
            return seq, "newest row"
        if nxt.weight == 0:
            return seq, "stale row"
        seq.append(seq[-1] + 1)
    return seq, "full"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sequences_cross_packets_but_never_an_episode_env_or_stale_row_and_are_padded_and_masked(seed: int) -> None:
    packets, rows = generate(seed)
    length, batch = 6, 128
    memory = ReplayMemory(memory_size=301, batch_size=batch, sequence_length=length, burn_in=2, seed=seed)
    for buf in packets:
        memory.append_buffer(buf)
    assert memory.total_appended > 3 * memory.memory_size  # the ring wrapped several times
    why: Counter[str] = Counter()
    for _ in range(10):
        b = memory.sample()
        mask = b.extra["mask"].numpy()
        assert mask.shape == (batch, length) and mask.dtype == np.bool_ and mask[:, 0].all()
        assert b.obs.shape == b.next_obs.shape == b.act.shape == (batch, length, 1)
        for name in ("rew", "terminated", "truncated", "weight"):
            assert getattr(b, name).shape == (batch, length), name
        uid = b.next_obs.numpy()[..., 0].astype(np.int64)
        for k in range(batch):
            start = int(uid[k, 0])
            assert not rows[start].reset and rows[start].weight > 0  # a sampleable transition
            want, reason = expected(start, length, rows)
            why[reason] += 1
            padded = want + [want[-1]] * (length - len(want))
            assert mask[k].tolist() == [True] * len(want) + [False] * (length - len(want)), (k, want)
            assert uid[k].tolist() == padded
            np.testing.assert_array_equal(b.obs.numpy()[k, :, 0], np.array(padded) - 1)  # the row before each
            np.testing.assert_array_equal(b.act.numpy()[k, :, 0], 2.0 * np.array(padded))
            np.testing.assert_array_equal(b.rew.numpy()[k], np.array(padded, np.float32) / 2)
            np.testing.assert_array_equal(b.terminated.numpy()[k], [float(rows[u].terminated) for u in padded])
            np.testing.assert_array_equal(b.truncated.numpy()[k], [float(rows[u].truncated) for u in padded])
            np.testing.assert_array_equal(b.weight.numpy()[k], [rows[u].weight for u in padded])
            why["crossed a packet"] += rows[padded[-1]].packet != rows[start].packet
    # every way a sequence stops, and sequences follow their env's trajectory across packets
    assert set(why) == {"episode end", "newest row", "stale row", "full", "crossed a packet"}, why


def test_a_sequence_stops_at_the_ring_write_head_and_never_reads_the_old_rows_beyond_it() -> None:
    # one episode of 12 steps in one packet, written over a ring of 10 rows: the newest row is physical row 2, and
    # rows 3... hold older steps of the same episode, which a sequence must not append after the newest
    b = BufferBuilder(64)
    b.add(np.zeros(1, np.float32), np.array([0], np.float32), 0.0, False, False, True, 0)
    for t in range(1, 13):
        b.add(np.zeros(1, np.float32), np.array([t], np.float32), 1.0, False, False, False, 0)
    buf = b.cut()
    assert buf is not None
    memory = ReplayMemory(memory_size=10, batch_size=200, sequence_length=4, seed=0)
    memory.append_buffer(buf)
    batch = memory.sample()
    uid, mask = batch.next_obs.numpy()[..., 0], batch.extra["mask"].numpy()
    for k in range(200):
        n = int(mask[k].sum())
        assert n == min(4, 13 - int(uid[k, 0]))  # stops at the newest step, 12
        assert uid[k].tolist() == [min(uid[k, 0] + j, 12) for j in range(4)]
    assert set(uid[:, 0].tolist()) == set(range(4, 13))  # step 3's previous row was overwritten: not sampleable


def test_sequence_index_matches_a_step_by_step_walk_on_random_columns() -> None:
    rng = np.random.default_rng(5)
    cap, length = 50, 7
    end, term, trunc = (rng.random(cap) < p for p in (0.8, 0.1, 0.1))
    for size, total in ((50, 117), (31, 31)):
        low = total - size
        # random links: forward to a stored row, to an overwritten one, or none
        nxt = rng.integers(low - 10, total, size=cap)
        nxt[rng.random(cap) < 0.2] = -1
        # runs: a row followed by its ring neighbour in its segment (links to the next absolute row)
        run = np.zeros(cap, np.int32)
        absolute = total - 1 - (total - 1 - np.arange(cap)) % cap
        for r in rng.permutation(cap)[: cap // 2]:
            nxt[r] = absolute[(r + 1) % cap] if absolute[(r + 1) % cap] == absolute[r] + 1 else nxt[r]
        for r in range(cap - 1, -1, -1):  # rows after r that follow it contiguously
            follows = absolute[r] >= low and nxt[r] == absolute[r] + 1 and (r + 1) % cap != total % cap
            run[r] = run[(r + 1) % cap] + 1 if follows else 0
        cols = {"end": end, "terminated": term, "truncated": trunc, "next": nxt, "run": run}
        starts = rng.integers(0, cap, size=100)
        idx, mask = sequence_index(starts, length, cols, total, size, lambda rows: end[rows])
        for k, s in enumerate(starts):
            walk = [int(s)]
            while len(walk) < length:
                cur = walk[-1]
                a = int(nxt[cur])
                if a < low or not end[a % cap] or term[cur] or trunc[cur]:
                    break
                walk.append(a % cap)
            assert idx[k].tolist() == walk + [walk[-1]] * (length - len(walk))
            assert int(mask[k].sum()) == len(walk)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sequence_length": 0}, r"sequence_length must be >= 1 \(got 0"),
    ({"sequence_length": 101}, r"sequence_length \(101\) must be <= memory_size \(100\)"),
    ({"sequence_length": 8, "burn_in": 8}, r"burn_in \(8\) must be < sequence_length \(8\)"),
    ({"sequence_length": 1, "burn_in": 1}, r"burn_in \(1\) must be < sequence_length \(1\)"),
    ({"sequence_length": 8, "burn_in": -1}, r"burn_in must be >= 0 \(got -1\)"),
])
def test_bad_sequence_arguments_are_refused_naming_them(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplayMemory(memory_size=100, batch_size=10, **kwargs)
