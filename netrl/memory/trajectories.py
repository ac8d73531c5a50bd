"""Trajectories across packets: each stored row's successor, trajectory and episode, shared by
the ring memories (:class:`~netrl.memory.replay.ReplayMemory`,
:class:`~netrl.memory.history.HistoryMemory` and the memories built on it).

A *stream* is what one env of one worker process sends: ``(buffer.worker, env)``, where a packet's
``worker`` is ``name/session`` (a restarted worker is a new session, so a new stream). Each packet
repeats, in front of each env segment, ``overlap`` *context* rows copied from the end of that env's
previous packet (:mod:`netrl.samples.columns`). A segment *continues* its stream's stored tail when
those context rows equal the stream's last stored rows (observation and action leaves, reward,
flags, policy version), which are still in the ring; otherwise (a packet lost or refused in
between, the tail overwritten, a new session, no context row) it starts a new trajectory.

Four columns per row, written with the packet:

- ``traj`` (int64): the trajectory id, new for each stream start or break;
- ``episode`` (int64): the episode id, new at each reset row and at a trajectory's first rows;
- ``run`` (int32): the rows after it in its packet's env segment, which follow it contiguously in
  the ring and in the trajectory: a walk jumps over them (:mod:`netrl.memory.sequences`);
- ``next`` (int64): the *absolute* row number (rows appended before it) of the row that follows
  within the trajectory, -1 for none yet. The stored tail of a continued stream is relinked to the
  segment's first non-context row, so forward walks skip the context rows' duplicates (which stay
  stored: backward views read them). An absolute number names one write, so a successor that the
  ring has overwritten since is seen as gone (:func:`successors`), and a walk ends there.

Walks (n-step windows, sequences) stop at a row that ends no sampleable transition: resets, context
rows, stale rows (weight 0), rows of a dropped or quarantined worker (:mod:`netrl.memory.owners`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from netrl.samples.columns import Buffer

__all__ = ["LINK_COLUMNS", "Linked", "TrajectoryLinks", "successors"]

LINK_COLUMNS = {"traj": np.int64, "episode": np.int64, "next": np.int64, "run": np.int32}
MAX_STREAMS = 4096  # streams remembered before those whose tail the ring overwrote are forgotten
_SAME = ("rew", "terminated", "truncated", "policy_version")  # cheap columns compared first


def successors(next_col: np.ndarray, rows: np.ndarray, total: int, size: int) -> np.ndarray:
    """The ring rows following ring rows ``rows`` in their trajectories, -1 where there is none,
    or it is no longer stored (``total`` rows appended, the newest ``size`` of them stored)."""
    nxt = next_col[rows]
    return np.where(nxt >= total - size, nxt % len(next_col), -1)


@dataclass
class _Tail:
    traj: int
    row: int  # absolute row number of the stream's newest stored row
    episode: int


@dataclass
class Linked:
    """A packet's link columns, and what to change once it is written
    (:meth:`TrajectoryLinks.commit`)."""

    columns: dict[str, np.ndarray]
    relink: list[tuple[int, int]]  # (absolute tail row, absolute row that now follows it)
    tails: dict[tuple[str, int], _Tail]  # the new tails of the streams this packet moves on
    next_traj: int
    next_episode: int


def _same(stored: np.ndarray, sent: np.ndarray) -> bool:
    # bytes: a few rows compare several times faster than with a ufunc
    if stored.dtype == sent.dtype:
        return stored.tobytes() == sent.tobytes()
    return bool((stored == sent).all())


def _host(col: Any, rows: Any) -> np.ndarray:
    if isinstance(col, torch.Tensor):  # a column on memory.device
        return col[rows if isinstance(rows, slice) else torch.from_numpy(rows).to(col.device)].cpu().numpy()
    return col[rows]


class TrajectoryLinks:
    """The streams' stored tails and the id counters of one memory (module docstring)."""

    def __init__(self) -> None:
        self._tails: dict[tuple[str, int], _Tail] = {}
        self._next_traj = 0
        self._next_episode = 0

    def link(self, buffer: Buffer, columns: dict[str, np.ndarray], ring: dict[str, Any], total: int,
             size: int, dropped: int = 0) -> Linked:
        """The link columns of ``buffer``'s rows (``columns``: what the memory will store for it),
        given the ``ring``'s columns (empty before the first packet) holding the newest ``size``
        of ``total`` rows. Row ``i`` of the packet becomes absolute row ``total - dropped + i``
        (a packet larger than the ring loses its first ``dropped`` rows). Changes nothing:
        :meth:`commit` does, once the packet is written."""
        n = len(buffer)
        total, now = total - dropped, total
        traj, episode, nxt = np.empty(n, np.int64), np.empty(n, np.int64), np.arange(1, n + 1, dtype=np.int64) + total
        run = np.empty(n, np.int32)
        reset, context = np.asarray(buffer.reset, bool), np.asarray(buffer.context, bool)
        env = buffer.envs
        cuts = (np.flatnonzero(env[1:] != env[:-1]) + 1).tolist() if buffer.env is not None else []
        tails: dict[tuple[str, int], _Tail] = {}  # the streams this packet moves on (merged at commit)
        relink: list[tuple[int, int]] = []
        next_traj, next_episode = self._next_traj, self._next_episode
        names = [k for k in (*_SAME, *(k for k in columns if k.startswith(("obs", "act")))) if k in ring]
        for a, b in zip([0, *cuts], [*cuts, n], strict=True):
            key = (buffer.worker, int(env[a]))
            nxt[b - 1] = -1
            run[a:b] = np.arange(b - a - 1, -1, -1)
            c = int(np.argmin(context[a:b])) if not context[a:b].all() else b - a  # leading context rows
            tail = self._tails.get(key)
            rows = self._stored(tail, c, ring, now, size)
            if tail is not None and rows is not None and self._continues(tail, columns, ring, names, a, c, rows):
                traj[a:a + c], episode[a:a + c] = ring["traj"][rows], ring["episode"][rows]
                t, ep = tail.traj, tail.episode
                first = a + c
            else:
                t, ep, first = next_traj, next_episode, a
                next_traj, next_episode = next_traj + 1, next_episode + 1
                if reset[a]:
                    next_episode -= 1  # the reset row opens the first episode
                    ep -= 1
            if first == b:  # context rows only: the stream's tail stays where it was
                continue
            if tail is not None and first > a:
                relink.append((tail.row, total + first))
            traj[first:b] = t
            if not reset[first:b].any():  # as a rule: one episode goes on
                episode[first:b] = ep
            else:
                starts = np.cumsum(reset[first:b])
                episode[first:b] = np.where(starts == 0, ep, next_episode + starts - 1)
                next_episode += int(starts[-1])
            tails[key] = _Tail(t, total + b - 1, int(episode[b - 1]))
        return Linked({"traj": traj, "episode": episode, "next": nxt, "run": run}, relink, tails, next_traj,
                      next_episode)

    @staticmethod
    def _stored(tail: _Tail | None, c: int, ring: dict[str, Any], total: int, size: int) -> Any:
        """The ring rows of a stream's last ``c`` stored rows (a slice when they do not wrap), None
        when there are none or (some of) them were overwritten."""
        if tail is None or not c or not ring or tail.row - c + 1 < total - size:
            return None
        cap = len(ring["traj"])
        lo = (tail.row - c + 1) % cap
        return slice(lo, lo + c) if lo + c <= cap else np.arange(lo, lo + c) % cap

    @staticmethod
    def _continues(tail: _Tail, columns: dict[str, np.ndarray], ring: dict[str, Any], names: list[str], a: int,
                   c: int, rows: Any) -> bool:
        """Whether the ``c`` context rows at ``a`` are the stream's last ``c`` stored ``rows``: the
        cheap columns first, then the observation and action leaves."""
        if not (ring["traj"][rows] == tail.traj).all():
            return False
        return all(_same(_host(ring[k], rows), columns[k][a:a + c]) for k in names)

    def commit(self, linked: Linked, ring: dict[str, Any], total: int, size: int) -> None:
        """After the packet is written (``total`` rows appended now, ``size`` stored): relink the
        continued tails, remember the streams' new tails."""
        cap = len(ring["next"])
        for tail, first in linked.relink:
            if tail >= total - size and first >= total - size:  # both still stored
                ring["next"][tail % cap] = first
        self._tails.update(linked.tails)
        self._next_traj, self._next_episode = linked.next_traj, linked.next_episode
        if len(self._tails) > MAX_STREAMS:  # forget streams whose tail is gone
            self._tails = {k: t for k, t in self._tails.items() if t.row >= total - size}
