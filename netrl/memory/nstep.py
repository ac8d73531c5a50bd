"""n-step returns computed when a batch is sampled, from the rows the ring
already holds (no second copy).

For a sampled transition ending at row ``k`` the window takes rows ``k, k+1, ... k+m-1``
(``1 <= m <= n``): row ``j+1`` joins while it *continues* row ``j`` (it ends a transition, so it is
neither a reset, a context row nor a dropped stale row, and it lies between the ring's oldest and
newest rows) and transition ``j`` neither terminated nor truncated. Episode ends, env changes
and packet boundaries all start with a reset or context row, so no window crosses them, nor the
write head. The batch then holds::

    rew        = sum_{i<m} gamma^i rew_{k+i}
    next_obs   = obs_{k+m-1}        terminated, truncated = those of row k+m-1
    extra["steps_to_next_obs"] = m  (TorchRL's MultiStep key)
    extra["discount"]          = gamma^m, the discount of the bootstrap value (times 1 - terminated)

A window cut by truncation bootstraps from the state where the episode was cut; one
cut by termination does not.
"""

from __future__ import annotations

import numpy as np

__all__ = ["nstep_windows"]


def nstep_windows(cols: dict[str, np.ndarray], idx: np.ndarray, n: int, gamma: float, oldest: int, stored: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(last, ret, steps)`` for transitions ending at ring rows ``idx``: the row each window
    ends at, the discounted reward sum (float32) and the window length ``m`` (int64), in
    ``n - 1`` vectorised passes.

    ``cols`` are the ring's columns (``rew``, ``terminated``, ``truncated``, ``end``), ``oldest``
    the physical row of the oldest stored row and ``stored`` the number of rows stored."""
    capacity = len(cols["end"])
    last = np.asarray(idx, np.int64).copy()
    ret = cols["rew"][last].astype(np.float64)
    steps = np.ones(last.shape, np.int64)
    going = ~(cols["terminated"][last] | cols["truncated"][last])
    discount = 1.0
    for _ in range(n - 1):
        if not going.any():
            break
        nxt = (last + 1) % capacity
        # 0: the oldest row (the next is older data); >= stored: not written yet
        age = (nxt - oldest) % capacity
        joins = going & (age > 0) & (age < stored) & cols["end"][nxt]
        discount *= gamma
        ret += np.where(joins, discount * cols["rew"][nxt], 0.0)
        last = np.where(joins, nxt, last)
        steps += joins
        going = joins & ~(cols["terminated"][nxt] | cols["truncated"][nxt])
    return last, ret.astype(np.float32), steps
