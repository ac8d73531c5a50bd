"""ReplayMemory: netrl's default memory, a preallocated ring of sample columns sampled in a few vectorised calls."""

from __future__ import annotations

from typing import Any

import numpy as np

from netrl.memory.base import (
    MemoryDataloading,
    Transition,
    WorkerIds,
    allocate_ring,
    check_columns,
    draw_ends,
    env_column,
    extra_columns,
    nth_end,
    run_sample_preprocessor,
    to_tensor,
)
from netrl.memory.sequences import check_sequence_args, sample_sequences
from netrl.samples import Batch, Buffer, flatten, row, unflatten

__all__ = ["ReplayMemory"]

class ReplayMemory(MemoryDataloading):
    """A preallocated numpy ring buffer of rows with vectorised batch sampling.

    Rows are stored as the worker sent them (observations once, not twice per transition). A transition ends at
    every row that is neither a ``reset`` nor a ``context`` row; its previous observation is the row before.
    ``obs_preprocessor`` runs once per row when it is appended; ``sample_preprocessor`` runs once per batch.
    A batch's tensors share memory with reused buffers and stay valid until the next :meth:`sample` call.

    ``sequence_length`` L > 1 makes every batch ``batch_size`` sequences of L consecutive transitions of one env,
    fields shaped ``[B, L, ...]`` with ``batch.extra["mask"]``, for recurrent agents; ``burn_in`` (< L) is what the
    agent runs without gradient (see :mod:`netrl.memory.sequences`).
    """

    def __init__(self, *args: Any, sequence_length: int = 1, burn_in: int = 0, **kwargs: Any) -> None:
        self._cols: dict[str, np.ndarray] = {}
        self._out: dict[str, np.ndarray] = {}
        self._act_spec: Any = None
        self._obs_spec: Any = None
        self._pos = 0  # next physical row to write
        self._size = 0  # rows stored
        self._ends = 0  # rows flagged as transition ends among the stored rows
        self.total_appended = 0
        self._weighted = False
        self._ordered: np.ndarray | None = None  # sampleable rows oldest first (_ordered_ends); reset on append
        self._workers = WorkerIds()
        self._sampled: np.ndarray | None = None  # the rows of the last batch
        super().__init__(*args, **kwargs)
        problems = check_sequence_args(sequence_length, burn_in, self.memory_size)
        if problems:
            raise ValueError(f"{type(self).__name__}: {'; '.join(problems)}")
        self.sequence_length, self.burn_in = sequence_length, burn_in

    # -- storage -------------------------------------------------------------------------------------------
    def _allocate(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Empty ring columns for the act/obs leaves of ``columns`` (their per-row shape and dtype) and the rest."""
        fixed = {"rew": np.float32, "terminated": np.bool_, "truncated": np.bool_, "end": np.bool_,
                 "policy_version": np.int64, "weight": np.float32, "worker": np.int32,
                 "env": np.uint16}
        return allocate_ring(self.memory_size, {name: ((), fixed[name]) if name in fixed else (col.shape[1:], col.dtype)
                                                for name, col in columns.items()})

    def append_buffer(self, buffer: Buffer) -> None:
        """Store a packet's rows. A packet that does not fit (another structure, per-row shape or kind of dtype than
        the first packet's) raises ValueError before anything is written, so the memory stays as it was."""
        n = len(buffer)
        if n == 0:
            return
        obs = buffer.obs
        if self.obs_preprocessor is not None:
            rows = [self.obs_preprocessor(row(obs, i)) for i in range(n)]
            obs = _stack_rows(rows)
        act_spec, act_leaves = flatten(buffer.act, "act")
        obs_spec, obs_leaves = flatten(obs, "obs")
        if self._cols and (act_spec, obs_spec) != (self._act_spec, self._obs_spec):
            raise ValueError("a packet's observation/action structure differs from the memory's; "
                             "every worker must run the same pipeline")
        columns = {name: np.asarray(leaf) for name, leaf in act_leaves + obs_leaves}
        columns.update(rew=np.asarray(buffer.rew), terminated=np.asarray(buffer.terminated),
                       truncated=np.asarray(buffer.truncated), end=buffer.transition_end,
                       policy_version=np.asarray(buffer.policy_version),
                       weight=np.ones(n, np.float32) if buffer.weight is None else np.asarray(buffer.weight),
                       worker=self._workers.column(buffer.worker, n), env=env_column(buffer, n))
        columns.update(extra_columns(buffer, self._cols))
        stored = self._cols or self._allocate(columns)
        check_columns(columns, stored, n)  # before any change: a refused packet must leave the memory as it was
        if not self._cols:
            self._act_spec, self._obs_spec, self._cols = act_spec, obs_spec, stored
        if buffer.weight is not None and bool((columns["weight"][columns["end"]] < 1).any()):
            self._weighted = True  # from now on batches carry loss weights
        if n > self.memory_size:  # keep only the newest rows, as the ring would
            columns = {k: v[n - self.memory_size:] for k, v in columns.items()}
            n = self.memory_size
        idx = (self._pos + np.arange(n)) % self.memory_size
        filled = min(self._size + n, self.memory_size) - self._size  # rows landing in empty slots
        if n > filled:  # the others replace old rows: forget the transition ends they held
            self._ends -= int(self._cols["end"][idx[filled:]].sum())
        for name, col in columns.items():
            self._cols[name][idx] = col
        self._ends += int(columns["end"].sum())
        self._pos = int((self._pos + n) % self.memory_size)
        self._size = min(self._size + n, self.memory_size)
        self.total_appended += n
        self._ordered = None

    # -- sampling ------------------------------------------------------------------------------------------
    def _valid(self, idx: np.ndarray) -> np.ndarray:
        """Rows where a transition ends and whose previous row is still stored."""
        oldest = self._pos if self._size == self.memory_size else 0
        return self._cols["end"][idx] & (idx != oldest)

    def __len__(self) -> int:
        if not self._cols:
            return 0
        oldest = self._pos if self._size == self.memory_size else 0
        return self._ends - int(self._cols["end"][oldest] and self._size > 0)

    def _ordered_ends(self) -> np.ndarray:
        """The physical rows where a sampleable transition ends, oldest first (computed once per append)."""
        if self._ordered is None:
            logical = (np.arange(self._size) + (self._pos if self._size == self.memory_size else 0)) % self.memory_size
            self._ordered = logical[self._valid(logical)] if self._cols else logical
        return self._ordered

    def sample_indices(self) -> np.ndarray:
        """Physical rows of ``batch_size`` transition ends, uniformly at random (see :func:`draw_ends`)."""
        return draw_ends(self.rng, self.batch_size, self._size, len(self), self._valid, self._ordered_ends)

    def _gather(self, key: str, name: str, idx: np.ndarray) -> np.ndarray:
        col = self._cols[name]
        out = self._out.get(key)
        if out is None or out.shape[0] != len(idx):
            out = self._out[key] = np.empty((len(idx), *col.shape[1:]), col.dtype)
        np.take(col, idx, axis=0, out=out)
        return out

    def batch_workers(self) -> list[str] | None:
        return None if self._sampled is None else self._workers.named(self._cols["worker"][self._sampled])

    def sample(self) -> Batch:
        if self.sequence_length > 1:
            return sample_sequences(self)
        idx = self._sampled = self.sample_indices()
        return self._batch(idx)

    def _batch(self, idx: np.ndarray) -> Batch:
        """The transitions that end at physical rows ``idx`` (1-D), one gather per column."""
        prev = (idx - 1) % self.memory_size
        leaves_now = {n: self._gather("now:" + n, n, idx) for n in self._cols if n.startswith("obs")}
        leaves_prev = {n: self._gather("prev:" + n, n, prev) for n in self._cols if n.startswith("obs")}
        act_leaves = {n: self._gather(n, n, idx) for n in self._cols if n.startswith("act")}
        o, o2 = unflatten(self._obs_spec, leaves_prev), unflatten(self._obs_spec, leaves_now)
        a = unflatten(self._act_spec, act_leaves)
        r = self._gather("rew", "rew", idx)
        term = self._gather("terminated", "terminated", idx).astype(np.float32)
        trunc = self._gather("truncated", "truncated", idx).astype(np.float32)
        if self.sample_preprocessor is not None:
            o, a, r, o2, term, trunc = run_sample_preprocessor(self.sample_preprocessor, (o, a, r, o2, term, trunc))
        d = self.device
        weight = to_tensor(self._gather("weight", "weight", idx), d) if self._weighted else None
        extra = {n[6:]: to_tensor(self._gather(n, n, idx), d) for n in self._cols if n.startswith("extra/")}
        return Batch(to_tensor(o, d), to_tensor(a, d), to_tensor(r, d), to_tensor(o2, d), to_tensor(term, d),
                     to_tensor(trunc, d), weight, extra=extra)

    def get_transition(self, item: int) -> Transition:
        """The ``item``-th stored transition, oldest first (per-item access, for tests and tmrl-style code).

        The arrays are copies, which later packets do not change. The observations are as stored: after
        ``obs_preprocessor``, which this memory applies on append. ``info["extra"]`` holds the actor's extra outputs
        recorded with the action, if any. Raises IndexError unless ``0 <= item < len()``.
        """
        i = nth_end(self._ordered_ends(), item)
        p = (i - 1) % self.memory_size
        cols = self._cols
        obs = {n: c for n, c in cols.items() if n.startswith("obs")}
        last_obs = unflatten(self._obs_spec, {n: c[p].copy() for n, c in obs.items()})
        new_obs = unflatten(self._obs_spec, {n: c[i].copy() for n, c in obs.items()})
        act = unflatten(self._act_spec, {n: c[i].copy() for n, c in cols.items() if n.startswith("act")})
        info: dict[str, Any] = {"policy_version": int(cols["policy_version"][i])}
        extra = {n[6:]: c[i].copy() for n, c in cols.items() if n.startswith("extra/")}
        if extra:
            info["extra"] = extra
        return (last_obs, act, float(cols["rew"][i]), new_obs, bool(cols["terminated"][i]),
                bool(cols["truncated"][i]), info)

    def policy_versions(self, idx: np.ndarray) -> np.ndarray:
        return self._cols["policy_version"][idx]


def _stack_rows(rows: list[Any]) -> Any:
    first = rows[0]
    if isinstance(first, (tuple, list)):
        return tuple(_stack_rows([r[i] for r in rows]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _stack_rows([r[k] for r in rows]) for k in first}
    return np.stack([np.asarray(r) for r in rows])
