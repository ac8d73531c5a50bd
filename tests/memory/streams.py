"""Packets from several interleaved workers and envs, built with the real BufferBuilder, and the record of every
row as plain Python lists per stream: what the trajectory tests check a memory's walks and batches against.

Each fresh row gets a uid, increasing within its stream (worker session, env): ``obs = [uid]``, ``act = [uid]``,
``rew = uid / 8``. Packets can be lost (built but never delivered) and a worker can restart (a new session, whose
builders start over with a reset row)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from netrl.samples import Buffer, BufferBuilder, concat_segments


@dataclass
class Row:
    uid: int
    stream: tuple[str, int]  # (worker/session, env)
    obs: Any
    act: Any
    rew: float
    terminated: bool
    truncated: bool
    reset: bool
    delivered: bool = False
    weight: float = 1.0


@dataclass
class Recording:
    packets: list[Buffer] = field(default_factory=list)  # delivered, in order
    rows: dict[int, Row] = field(default_factory=dict)
    streams: dict[tuple[str, int], list[int]] = field(default_factory=dict)  # uids in the order the env made them
    fresh: list[list[int]] = field(default_factory=list)  # per delivered packet, the uids of its fresh rows


def record(seed: int, *, workers: int = 3, envs: int = 2, rounds: int = 60, overlap: int = 1, rows_max: int = 6,
           lose: tuple[int, ...] = (), restart: dict[int, int] | None = None, episode_end: float = 0.08,
           make_row: Callable[[Recording, tuple[str, int], int], tuple[Any, Any]] | None = None,
           compressor: Callable[..., Any] | None = None) -> Recording:
    """``rounds`` packets, each from a random worker; rounds in ``lose`` are built but not delivered; ``restart``
    maps a round to the worker that restarts before it. ``make_row(record, stream, uid) -> (act, obs)`` (the env's
    full observation; the row is in the record already) overrides the default rows; ``compressor`` is a pipeline's
    sample compressor, applied as the worker applies it (a new one per env and session). Episodes end by
    termination or truncation with probability ``episode_end`` per step."""
    rng = np.random.default_rng(seed)
    rec = Recording()
    sessions = {w: 0 for w in range(workers)}
    uid_next = [1]
    builders: dict[tuple[str, int], tuple[BufferBuilder, Any, list[bool]]] = {}

    def stream(w: int, e: int) -> tuple[BufferBuilder, Any, list[bool]]:
        key = (f"w{w}/s{sessions[w]}", e)
        if key not in builders:
            builders[key] = (BufferBuilder(rows_max + overlap + 2, overlap=overlap),
                             compressor() if compressor is not None else None, [True])
            rec.streams[key] = []
        return builders[key]

    restart = restart or {}
    for p in range(rounds):
        if p in restart:
            sessions[restart[p]] += 1
        w = int(rng.integers(workers))
        segments = []
        for e in range(envs):
            builder, comp, ended = stream(w, e)
            for _ in range(int(rng.integers(0, rows_max + 1))):
                uid = uid_next[0]
                uid_next[0] += 1
                reset = ended[0]
                term = not reset and bool(rng.random() < episode_end / 2)
                trunc = not reset and not term and bool(rng.random() < episode_end / 2)
                ended[0] = term or trunc
                rew = uid / 8
                key = (f"w{w}/s{sessions[w]}", e)
                rec.rows[uid] = row = Row(uid, key, None, None, rew, term, trunc, reset)
                rec.streams[key].append(uid)
                act, obs = ((np.array([uid], np.float32), np.array([uid], np.float32)) if make_row is None
                            else make_row(rec, key, uid))
                row.act, row.obs = act, obs
                if comp is not None:
                    act, obs, rew, term, trunc, _ = comp(act, obs, rew, term, trunc, {"reset": reset})
                builder.add(act, obs, rew, term, trunc, reset, p)
            buf = builder.cut()
            if buf is not None:
                segments.append((e, buf))
        if not segments:
            continue
        buf = concat_segments(segments)
        buf.worker, buf.seq = f"w{w}/s{sessions[w]}", p
        if p in lose:
            continue
        rec.fresh.append([])
        for e, seg in segments:
            fresh = int((~seg.context).sum())
            key = (f"w{w}/s{sessions[w]}", e)
            for uid in rec.streams[key][len(rec.streams[key]) - fresh:]:
                rec.rows[uid].delivered = True
                rec.fresh[-1].append(uid)
        rec.packets.append(buf)
    return rec


def linked_successor(rec: Recording, uid: int) -> int | None:
    """The uid a forward walk from ``uid`` reaches next, from the record alone: the next row of its stream, when both
    were delivered (a lost packet in between leaves a gap the memory must not bridge)."""
    row = rec.rows[uid]
    rows = rec.streams[row.stream]
    i = rows.index(uid)
    if i + 1 == len(rows):
        return None
    nxt = rows[i + 1]
    return nxt if rec.rows[nxt].delivered and row.delivered else None
