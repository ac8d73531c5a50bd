"""A sum tree over a ring's rows, in numpy: batched priority updates and
batched proportional sampling.

The leaves hold one priority per row (0: the row cannot be sampled); each inner node holds the
sum of its two children, so the root is the total. Both operations work on a whole batch at
once, one array operation per level of the tree (``log2(capacity)`` levels, 20 for a million
rows), with no per-item Python loop:

* :meth:`SumTree.update` writes a batch of leaves, then recomputes their ancestors level by level;
* :meth:`SumTree.find` descends from the root for a batch of prefix sums together, going left where
  the prefix sum is below the left child's sum (and subtracting it when going right).

:meth:`SumTree.sample` draws stratified prefix sums (one uniform draw in each of B equal slices of
the total, as Schaul et al. do) so a batch covers the distribution evenly. Sums are float64: with a
million float32 leaves the rounding of the upper sums would bias the draws.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SumTree"]


class SumTree:
    """Priorities of ``capacity`` rows (all 0 at first) in a complete binary
    tree of float64 sums."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a SumTree needs capacity >= 1 (got {capacity})")
        self.capacity = capacity
        # a power of two >= capacity: every level full
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.depth = self.leaves.bit_length() - 1
        # node i has children 2i, 2i + 1; the root is 1
        self._tree = np.zeros(2 * self.leaves, np.float64)
        # strided views: _left[i] and _right[i] are node i's children (gathers from a view
        # are the fastest in numpy)
        self._left, self._right = self._tree[0::2], self._tree[1::2]

    @property
    def total(self) -> float:
        return float(self._tree[1])

    def get(self, idx: np.ndarray) -> np.ndarray:
        """The priorities of rows ``idx``."""
        return self._tree[self.leaves + np.asarray(idx, np.int64)]

    def update(self, idx: np.ndarray, priority: np.ndarray | float) -> None:
        """Set the priorities of rows ``idx`` (for a row given twice, the last value wins)
        and their ancestors' sums.

        Raises ValueError for a negative or non-finite priority, or a row outside the tree: a NaN
        would poison the total and every later draw."""
        idx = np.asarray(idx, np.int64).reshape(-1)
        values = np.broadcast_to(np.asarray(priority, np.float64), idx.shape)
        if idx.size == 0:
            return
        if not np.isfinite(values).all() or (values < 0).any():
            bad = values[~np.isfinite(values) | (values < 0)][0]
            raise ValueError(f"priorities must be finite and >= 0 (got {bad})")
        if idx.min() < 0 or idx.max() >= self.capacity:
            raise ValueError(f"row {int(idx.min() if idx.min() < 0 else idx.max())} is "
                             f"outside the tree's {self.capacity} rows")
        tree, left, right = self._tree, self._left, self._right
        node = self.leaves + idx
        tree[node] = values
        # a parent named twice gets the same sum twice: no need to deduplicate
        for _ in range(self.depth):
            node >>= 1
            tree[node] = left[node] + right[node]

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """The row whose slice of the cumulative priorities holds each prefix
        sum in ``[0, total)``."""
        left = self._left
        value = np.array(prefix, np.float64, copy=True).reshape(-1)
        node = np.ones(value.shape, np.int64)
        for _ in range(self.depth):
            left_sum = left[node]
            right = value >= left_sum
            value -= left_sum * right
            node <<= 1
            node += right
        return node - self.leaves

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` rows drawn with probability proportional to their priority,
        stratified over the total.

        Raises RuntimeError when every priority is 0. Rounding can land a prefix sum on a row of
        priority 0 (past the last positive row, or at the edge of a slice): such draws are drawn
        again over the whole total."""
        total = self.total
        if not total > 0:
            raise RuntimeError("no row has a priority above 0: nothing can be sampled")
        prefix = (np.arange(n) + rng.random(n)) * (total / n)
        rows = self.find(np.minimum(prefix, np.nextafter(total, 0.0)))
        for _ in range(8):
            bad = np.flatnonzero(self._tree[self.leaves + rows] <= 0)
            if bad.size == 0:
                return rows
            rows[bad] = self.find(rng.random(bad.size) * total)
        # cannot happen with finite values
        raise RuntimeError("the sum tree's sums no longer match its priorities")
