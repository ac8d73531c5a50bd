"""ReplayMemory: netrl's default memory, a preallocated ring of sample columns sampled in a
few vectorised calls."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from netrl.memory.base import (
    MemoryDataloading,
    Transition,
    allocate_ring,
    batch_key,
    check_columns,
    env_column,
    extra_columns,
    nth_end,
    run_sample_preprocessor,
    to_tensor,
)
from netrl.memory.device import allocate_tensor_ring, check_storage_device, row_copy, row_entries, write_rows
from netrl.memory.owners import OwnedRows
from netrl.memory.sampling import Sampling
from netrl.memory.sequences import sequence_batch
from netrl.memory.trajectories import LINK_COLUMNS, TrajectoryLinks
from netrl.samples.batch import Batch
from netrl.samples.columns import Buffer, flatten, row, unflatten

__all__ = ["ReplayMemory"]

class ReplayMemory(Sampling, OwnedRows, MemoryDataloading):
    """A preallocated numpy ring buffer of rows with vectorised batch sampling.

    Rows are stored as the worker sent them (observations once, not twice per transition). A
    transition ends at every row that is neither a ``reset`` nor a ``context`` row; its previous
    observation is the row before. ``obs_preprocessor`` runs once per row when it is appended;
    ``sample_preprocessor`` runs once per batch. A batch's tensors share memory with reused
    buffers and stay valid until the next :meth:`sample` call, or the ``count - 1`` after it once
    :meth:`keep_batches` was called.

    ``n_step`` > 1 turns rewards into n-step returns with ``gamma`` (the agent's discount),
    computed per batch from the stored rows (:mod:`netrl.memory.nstep`): batches then carry
    ``extra["discount"]`` and ``extra["steps_to_next_obs"]``. ``prioritized`` draws transitions by
    priority (:mod:`netrl.memory.priority`, with ``alpha``, ``beta`` annealed to 1 over
    ``beta_steps`` training steps, and ``eps``): batches then carry ``weight`` (importance weights
    times stale-sample weights) and ``extra["index"]``, and :meth:`update_priority` takes the new
    priorities of a batch's samples.

    ``sequence_length`` L > 1 makes every batch ``batch_size`` sequences of L consecutive
    transitions of one trajectory, fields shaped ``[B, L, ...]`` with ``batch.extra["mask"]``,
    for recurrent agents; ``burn_in`` (< L) is what the agent runs without gradient
    (see :mod:`netrl.memory.sequences`). Each step of a sequence takes n-step returns, and
    ``prioritized`` draws sequence starts by priority (R2D2's ``priority_eta`` mixture,
    :func:`~netrl.memory.priority.sequence_priority`). Sequences need host columns.

    ``storage_device`` (``memory.device``): None keeps every column in host memory; a torch device
    (``"cuda"``) keeps the columns batches are made of there (see :mod:`netrl.memory.device`),
    and gathers batches there.

    Each row's worker is kept: :meth:`rows_of`, :meth:`drop_worker` and :meth:`set_quarantined`
    (:mod:`netrl.memory.owners`).
    """

    _SAMPLING, _NONE = "end", False

    def __init__(self, *args: Any, n_step: int = 1, gamma: float | None = None, prioritized: bool = False,
                 alpha: float = 0.6, beta: float = 0.4, beta_steps: int = 100_000, eps: float = 1e-6,
                 storage_device: str | None = None, sequence_length: int = 1, burn_in: int = 0,
                 priority_eta: float = 0.9, **kwargs: Any) -> None:
        if n_step > 1 and storage_device is not None:
            raise ValueError(f"memory.n_step {n_step} with memory.device "
                             f"{storage_device!r}: n-step returns are summed from host "
                             f'columns; set memory.device to "cpu" or memory.n_step to 1')
        if sequence_length > 1 and storage_device is not None:
            raise ValueError(f"memory.sequence_length {sequence_length} with memory.device "
                             f"{storage_device!r}: sequences follow links kept in host columns "
                             f'step by step; set memory.device to "cpu" or memory.sequence_length to 1')
        self._sampling_init(n_step, gamma, prioritized, alpha, beta, beta_steps, eps, sequence_length, burn_in,
                            priority_eta)
        self._cols: dict[str, Any] = {}  # numpy arrays; tensors on storage_device for
                                         # the batch columns
        self._out: dict[tuple[int, str], Any] = {}  # (slot, key) -> gather buffer
        self._slots, self._slot, self._pinned = 1, 0, False  # see keep_batches
        self._storage = None if storage_device is None else str(check_storage_device(storage_device))
        self._act_spec: Any = None
        self._obs_spec: Any = None
        self._pos = 0  # next physical row to write
        self._size = 0  # rows stored
        self._ends = 0  # rows flagged as transition ends among the stored rows
        self.total_appended = 0
        self._weighted = False
        # sampleable rows oldest first (_ordered_ends); reset on append
        self._ordered: np.ndarray | None = None
        self._owned_init()
        self._links = TrajectoryLinks()
        self._sampled: np.ndarray | None = None  # the rows of the last batch
        super().__init__(*args, **kwargs)
        self._sampling_setup()
        if self._storage is not None and self.sample_preprocessor is not None:
            raise ValueError(f"{type(self).__name__}: sample_preprocessor runs on numpy "
                             f"batches, and with storage_device {self._storage!r} "
                             f"(memory.device) batches are gathered on the device: set "
                             f'memory.device to "cpu" to keep the sample_preprocessor')

    # -- storage -----------------------------------------------------------------------------------
    def _allocate(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Empty ring columns for the act/obs leaves of ``columns`` (their per-row shape
        and dtype) and the rest."""
        fixed = {"rew": np.float32, "terminated": np.bool_, "truncated": np.bool_, "end": np.bool_,
                 "policy_version": np.int64, "weight": np.float32, "worker": np.int32,
                 "env": np.uint16, "sent": np.bool_, **LINK_COLUMNS}
        rows = {name: ((), fixed[name]) if name in fixed else (col.shape[1:], col.dtype)
                for name, col in columns.items()}
        if self._storage is not None:
            return allocate_tensor_ring(self.memory_size, rows, self._storage)
        return allocate_ring(self.memory_size, rows, self.ring_storage)

    def append_buffer(self, buffer: Buffer) -> None:
        """Store a packet's rows. A packet that does not fit (another structure, per-row shape or
        kind of dtype than the first packet's) raises ValueError before anything is written, so
        the memory stays as it was."""
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
                       env=env_column(buffer, n))
        self._owned_columns(buffer.worker, columns, n)
        columns.update(extra_columns(buffer, self._cols))
        linked = self._links.link(buffer, columns, self._cols, self.total_appended, self._size,
                                  max(0, n - self.memory_size))
        columns.update(linked.columns)
        stored = self._cols or self._allocate(columns)
        # before any change: a refused packet must leave the memory as it was
        check_columns(columns, stored, n)
        if not self._cols:
            self._act_spec, self._obs_spec, self._cols = act_spec, obs_spec, stored
        if buffer.weight is not None and bool((columns["weight"][columns["end"]] < 1).any()):
            self._weighted = True  # from now on batches carry loss weights
        if n > self.memory_size:  # keep only the newest rows, as the ring would
            columns = {k: v[n - self.memory_size:] for k, v in columns.items()}
            n = self.memory_size
        idx = (self._pos + np.arange(n)) % self.memory_size
        filled = min(self._size + n, self.memory_size) - self._size  # rows landing in empty slots
        evicted = self._cols["worker"][idx[filled:]]
        if n > filled:  # the others replace old rows: forget the transition ends they held
            self._ends -= int(self._cols["end"][idx[filled:]].sum())
        write_rows(self._cols, idx, columns)
        self._owned_written(columns["worker"], evicted)
        self._ends += int(columns["end"].sum())
        self._pos = int((self._pos + n) % self.memory_size)
        self._size = min(self._size + n, self.memory_size)
        self.total_appended += n
        self._links.commit(linked, self._cols, self.total_appended, self._size)
        self._ordered = None
        if self._priorities is not None:
            self._priorities.written(idx, columns["end"], self._pos if self._size == self.memory_size else 0)

    def _sampling_changed(self, rows: np.ndarray, now: np.ndarray) -> None:
        self._ordered = None
        if self._priorities is not None:
            self._priorities.written(rows, now, self._pos if self._size == self.memory_size else 0)

    # -- sampling ----------------------------------------------------------------------------------
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
        """The physical rows where a sampleable transition ends, oldest first
        (computed once per append)."""
        if self._ordered is None:
            logical = (np.arange(self._size) + (self._pos if self._size == self.memory_size else 0)) % self.memory_size
            self._ordered = logical[self._valid(logical)] if self._cols else logical
        return self._ordered

    def keep_batches(self, count: int, pinned: bool = False) -> bool:
        """Gather into ``count`` sets of buffers in turn (page-locked ones with ``pinned``,
        for host columns), so that a batch stays valid through the ``count - 1``
        :meth:`sample` calls after it."""
        if count < 1:
            raise ValueError(f"keep_batches: count must be >= 1 (got {count})")
        # tensor columns gather in place
        pinned = pinned and self._storage is None and torch.cuda.is_available()
        if (count, pinned) != (self._slots, self._pinned):
            self._slots, self._slot, self._pinned, self._out = count, 0, pinned, {}
        return type(self).sample is ReplayMemory.sample

    def _rows(self, idx: np.ndarray) -> Any:
        """``idx`` where the columns live: on the storage device, or as it is."""
        if self._storage is None:
            return idx
        return torch.from_numpy(np.ascontiguousarray(idx, np.int64)).to(self._storage, non_blocking=True)

    def _gather(self, key: str, name: str, idx: Any) -> Any:
        col = self._cols[name]
        out = self._out.get((self._slot, key))
        if isinstance(col, torch.Tensor):
            rows = idx if isinstance(idx, torch.Tensor) else self._rows(idx)
            if out is None or out.shape[0] != len(rows):
                out = self._out[(self._slot, key)] = col.new_empty((len(rows), *col.shape[1:]))
            return torch.index_select(col, 0, rows, out=out)
        if out is None or out.shape[0] != len(idx):
            shape = (len(idx), *col.shape[1:])
            out = self._out[(self._slot, key)] = (
                torch.empty(shape, dtype=torch.from_numpy(col[:0]).dtype, pin_memory=True).numpy() if self._pinned
                else np.empty(shape, col.dtype))
        # memory.storage disk: read from its file
        if self.ring_storage is None or not self.ring_storage.gather(col, idx, out):
            np.take(col, idx, axis=0, out=out)
        return out

    def batch_workers(self) -> list[str] | None:
        return None if self._sampled is None else self._workers.named(self._cols["worker"][self._sampled])

    def sample(self) -> Batch:
        self._slot = (self._slot + 1) % self._slots
        rows, mask, importance = self._walk()
        if mask is None:
            return self._batch(rows, importance)
        # one gather per column, over all B * L rows, then shaped [B, L]
        flat = self._batch(rows.reshape(-1), None if importance is None else importance.reshape(-1))
        return sequence_batch(flat, mask, self.device)

    def _batch(self, idx: np.ndarray, importance: np.ndarray | None = None) -> Batch:
        """The transitions that end at physical rows ``idx`` (1-D), one gather per column;
        ``importance``: their importance weights (prioritized)."""
        prev = self._rows((idx - 1) % self.memory_size)
        nxt, r, steps = idx, None, None
        if self.n_step > 1:
            nxt, r, steps = self._nstep(idx)
        rows = self._rows(idx)
        nxt_rows = rows if steps is None else self._rows(nxt)
        leaves_now = {n: self._gather("now:" + n, n, nxt_rows) for n in self._cols if n.startswith("obs")}
        leaves_prev = {n: self._gather("prev:" + n, n, prev) for n in self._cols if n.startswith("obs")}
        act_leaves = {n: self._gather(n, n, rows) for n in self._cols if n.startswith("act")}
        o, o2 = unflatten(self._obs_spec, leaves_prev), unflatten(self._obs_spec, leaves_now)
        a = unflatten(self._act_spec, act_leaves)
        r = self._gather("rew", "rew", rows) if r is None else r
        term = _as_float(self._gather("terminated", "terminated", nxt_rows))
        trunc = _as_float(self._gather("truncated", "truncated", nxt_rows))
        if self.sample_preprocessor is not None:
            o, a, r, o2, term, trunc = run_sample_preprocessor(self.sample_preprocessor, (o, a, r, o2, term, trunc))
        d = self.device
        weight = self._gather("weight", "weight", rows) if self._weighted else None
        # a column on the storage device
        if importance is not None and isinstance(weight, torch.Tensor):
            weight = torch.from_numpy(importance).to(weight.device) * weight
        elif importance is not None:
            weight = importance if weight is None else importance * weight
        weight = to_tensor(weight, d) if weight is not None else None
        extra = {k: to_tensor(self._gather(n, n, rows), d) for n in self._cols if (k := batch_key(n))}
        extra.update(traj=to_tensor(self._cols["traj"][idx], d), episode=to_tensor(self._cols["episode"][idx], d))
        if steps is not None:
            extra["steps_to_next_obs"] = to_tensor(steps, d)
            extra["discount"] = to_tensor((self.gamma ** steps).astype(np.float32), d)
        if importance is not None:
            extra["index"] = to_tensor(self._absolute(idx), d)
        o, o2 = to_tensor(o, d), to_tensor(o2, d)
        # new tensors: the gather buffers keep the raw observations
        if self.obs_transform is not None:
            o, o2 = self.obs_transform(o), self.obs_transform(o2)
        return Batch(o, to_tensor(a, d), to_tensor(r, d), o2, to_tensor(term, d), to_tensor(trunc, d), weight,
                     extra=extra)

    def get_transition(self, item: int) -> Transition:
        """The ``item``-th stored transition, oldest first (per-item access, for
        tests and tmrl-style code).

        The arrays are copies, which later packets do not change. The observations are as stored:
        after ``obs_preprocessor``, which this memory applies on append. ``info["extra"]``
        holds the actor's extra outputs recorded with the action, ``info["info"]`` the env's
        declared info entries (:mod:`netrl.samples.info`), if any. Raises IndexError
        unless ``0 <= item < len()``.
        """
        i = nth_end(self._ordered_ends(), item)
        p = (i - 1) % self.memory_size
        cols = self._cols
        obs = {n: c for n, c in cols.items() if n.startswith("obs")}
        last_obs = unflatten(self._obs_spec, {n: row_copy(c, p) for n, c in obs.items()})
        new_obs = unflatten(self._obs_spec, {n: row_copy(c, i) for n, c in obs.items()})
        act = unflatten(self._act_spec, {n: row_copy(c, i) for n, c in cols.items() if n.startswith("act")})
        info: dict[str, Any] = {"policy_version": int(cols["policy_version"][i])}
        for prefix in ("extra", "info"):
            if entries := row_entries(cols, i, prefix):
                info[prefix] = entries
        return (last_obs, act, float(cols["rew"][i]), new_obs, bool(cols["terminated"][i]),
                bool(cols["truncated"][i]), info)

    def policy_versions(self, idx: np.ndarray) -> np.ndarray:
        return self._cols["policy_version"][idx]


def _as_float(flags: Any) -> Any:
    return flags.float() if isinstance(flags, torch.Tensor) else flags.astype(np.float32)


def _stack_rows(rows: list[Any]) -> Any:
    first = rows[0]
    if isinstance(first, (tuple, list)):
        return tuple(_stack_rows([r[i] for r in rows]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _stack_rows([r[k] for r in rows]) for k in first}
    return np.stack([np.asarray(r) for r in rows])
