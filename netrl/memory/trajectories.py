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

Three columns per row, written with the packet:

- ``traj`` (int64): the trajectory id, new for each stream start or break;
- ``episode`` (int64): the episode id, new at each reset row and at a trajectory's first rows;
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

LINK_COLUMNS = {"traj": np.int64, "episode": np.int64, "next": np.int64}
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
    tails: dict[tuple[str, int], _Tail]
    next_traj: int
    next_episode: int


def _host(col: Any, rows: np.ndarray) -> np.ndarray:
    if isinstance(col, torch.Tensor):  # a column on memory.device
        return col[torch.from_numpy(rows).to(col.device)].cpu().numpy()
    return np.asarray(col[rows])


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
        reset, context = np.asarray(buffer.reset, bool), np.asarray(buffer.context, bool)
        env = buffer.envs
        cuts = np.flatnonzero(env[1:] != env[:-1]) + 1
        tails = dict(self._tails)
        relink: list[tuple[int, int]] = []
        next_traj, next_episode = self._next_traj, self._next_episode
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), n], strict=True):
            key = (buffer.worker, int(env[a]))
            nxt[b - 1] = -1
            c = int(np.argmin(context[a:b])) if not context[a:b].all() else b - a  # leading context rows
            tail = tails.get(key)
            if tail is not None and c and self._continues(tail, columns, ring, a, c, now, size):
                rows = (np.arange(tail.row - c + 1, tail.row + 1)) % len(ring["traj"])
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
            starts = np.cumsum(reset[first:b])
            traj[first:b] = t
            episode[first:b] = np.where(starts == 0, ep, next_episode + starts - 1)
            next_episode += int(starts[-1])
            tails[key] = _Tail(t, total + b - 1, int(episode[b - 1]))
        return Linked({"traj": traj, "episode": episode, "next": nxt}, relink, tails, next_traj, next_episode)

    @staticmethod
    def _continues(tail: _Tail, columns: dict[str, np.ndarray], ring: dict[str, Any], a: int, c: int,
                   total: int, size: int) -> bool:
        """Whether the ``c`` context rows at ``a`` are the stream's last ``c`` stored rows."""
        if not ring or tail.row - c + 1 < total - size:
            return False  # (part of) the tail was overwritten
        rows = np.arange(tail.row - c + 1, tail.row + 1) % len(ring["traj"])
        if not (ring["traj"][rows] == tail.traj).all():
            return False
        names = [*_SAME, *(k for k in columns if k.startswith(("obs", "act")))]
        return all(np.array_equal(_host(ring[k], rows), columns[k][a:a + c]) for k in names if k in ring)

    def commit(self, linked: Linked, ring: dict[str, Any], total: int, size: int) -> None:
        """After the packet is written (``total`` rows appended now, ``size`` stored): relink the
        continued tails, remember the streams' new tails."""
        cap = len(ring["next"])
        for tail, first in linked.relink:
            if tail >= total - size and first >= total - size:  # both still stored
                ring["next"][tail % cap] = first
        self._tails, self._next_traj, self._next_episode = linked.tails, linked.next_traj, linked.next_episode
        if len(self._tails) > MAX_STREAMS:  # forget streams whose tail is gone
            self._tails = {k: t for k, t in self._tails.items() if t.row >= total - size}
