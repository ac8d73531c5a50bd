"""n-step returns computed when a batch is sampled, from the rows the ring
already holds (no second copy).

For a sampled transition ending at row ``k`` the window takes ``m`` rows (``1 <= m <= n``) of
its trajectory, following each row's successor (:mod:`netrl.memory.trajectories`), so a window
crosses packet boundaries: the successor joins while it is still stored and ends a sampleable
transition (not a reset row, a stale row, a dropped or quarantined worker's row) and the
transition before it neither terminated nor truncated. The batch then holds::

    rew        = sum_{i<m} gamma^i rew_{k+i}
    next_obs   = obs_{k+m-1}        terminated, truncated = those of row k+m-1
    extra["steps_to_next_obs"] = m  (TorchRL's MultiStep key)
    extra["discount"]          = gamma^m, the discount of the bootstrap value (times 1 - terminated)

A window cut by truncation bootstraps from the state where the episode was cut; one
cut by termination does not.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from netrl.memory.trajectories import successors

__all__ = ["nstep_windows"]


def nstep_windows(cols: dict[str, np.ndarray], idx: np.ndarray, n: int, gamma: float, total: int, size: int,
                  joins: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(last, ret, steps)`` for transitions ending at ring rows ``idx`` (any shape): the row each
    window ends at, the discounted reward sum (float32) and the window length ``m`` (int64), in
    ``n - 1`` vectorised passes.

    ``cols`` are the ring's columns (``rew``, ``terminated``, ``truncated``, ``next``), ``total``
    the rows appended so far and ``size`` the rows stored; ``joins(rows)`` says which rows end a
    sampleable transition (the ring's ``end`` column, or a memory's views still stored)."""
    last = np.asarray(idx, np.int64).copy()
    ret = cols["rew"][last].astype(np.float64)
    steps = np.ones(last.shape, np.int64)
    going = ~(cols["terminated"][last] | cols["truncated"][last])
    discount = 1.0
    for _ in range(n - 1):
        if not going.any():
            break
        nxt = successors(cols["next"], last, total, size)
        going &= nxt >= 0
        going[going] = joins(nxt[going])
        discount *= gamma
        ret += np.where(going, discount * cols["rew"][np.where(going, nxt, last)], 0.0)
        last = np.where(going, nxt, last)
        steps += going
        going &= ~(cols["terminated"][last] | cols["truncated"][last])
    return last, ret.astype(np.float32), steps
