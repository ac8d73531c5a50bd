"""A ring-buffer memory that assembles each row's input from earlier rows: declared views (frame
stacks, action buffers, ``prev_actions``...).

A row's input may need earlier rows (see :mod:`netrl.memory.views`): the last frames of a
stack, the actions of rtgym's action buffer, RLlib's ``prev_actions`` and ``prev_rewards``.
:class:`HistoryMemory` stores every row once and assembles the views when it samples, by index
arithmetic over the ring. Each row that ends a transition records how many rows back its views read
(``need``); a transition can be sampled while all of those rows are still stored, so wrapping the
ring never yields a half-overwritten stack. A memory is configured by the views it is given::

    HistoryMemory(views=[prev_actions(4), prev_rewards(4)])  # batch.extra["prev_actions"],
                                                             # ["next_prev_actions"]
    HistoryMemory(views=[last_observations(4)])  # obs of [B, 4, ...] from one stored obs per row

A worker's sample compressor can drop from each row whatever earlier rows already hold (tmrl's
idea): the newest frame of a stack, the observation without rtgym's action buffer. The matching
memories are thin declarations on this one: :class:`~netrl.memory.frames.FrameStackMemory` and
:class:`~netrl.memory.action_buffer.ActionBufferMemory` read their packets (``_obs_columns``)
and declare a view each.

Rows of one packet are written contiguously, and a packet is self-contained (see
:mod:`netrl.samples`), so a row and the rows it reads are always from the same packet, at
fixed distances in the ring. n-step windows and sequences go forward along each row's trajectory,
across packets (:mod:`netrl.memory.sampling`); views are assembled per step. Batches are gathered
with a few fancy-indexing calls into reused buffers; nothing loops over items.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from netrl.memory.base import (
    MemoryDataloading,
    allocate_ring,
    batch_key,
    check_columns,
    env_column,
    extra_columns,
    nth_end,
    run_sample_preprocessor,
)
from netrl.memory.device import row_entries
from netrl.memory.owners import OwnedRows
from netrl.memory.sampling import Sampling
from netrl.memory.sequences import sequence_batch
from netrl.memory.trajectories import TrajectoryLinks
from netrl.memory.views import (
    MAX_NEED,
    NEVER,
    View,
    check_views,
    declared_views,
    segment_offsets,
    sliding_rows,
    transition_needs,
)
from netrl.samples.batch import Batch
from netrl.samples.columns import Buffer, Spec, flatten, row, spec_leaves, tree_map, unflatten

__all__ = ["MAX_NEED", "NEVER", "HistoryMemory", "attach_views", "transition_needs"]


class HistoryMemory(Sampling, OwnedRows, MemoryDataloading):
    """Preallocated ring of rows with vectorised sampling of transitions whose
    declared views are still stored.

    Args:
        views: what each row's input needs from earlier rows (:class:`~netrl.memory.views.View`);
            more can be added with :meth:`add_views` until the first packet arrives (an
            agent's own declarations).
        *args, **kwargs: :class:`~netrl.memory.base.MemoryDataloading`'s arguments.

    ``obs_preprocessor`` is not supported: the observations are assembled per batch, so
    preprocess in the model. ``sample_preprocessor`` runs once per batch, on read-only arrays: it
    must return new arrays rather than change its inputs, because obs and next_obs share rows
    (overlapping views of one gathered window) and the buffers are reused. Rows with a loss
    weight of 0 (stale samples the trainer drops) end no transition; other weights below 1 make
    every batch carry ``Batch.weight``. A batch's tensors share memory with reused buffers (and
    with each other: a view's obs and next_obs sides are views of one tensor) and stay valid
    until the next :meth:`sample` call.

    Each row's worker is kept: :meth:`rows_of`, :meth:`drop_worker` and :meth:`set_quarantined`
    (:mod:`netrl.memory.owners`).
    """

    _SAMPLING, _NONE = "need", NEVER

    def __init__(self, *args: Any, views: Sequence[View] = (), n_step: int = 1, gamma: float | None = None,
                 prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4, beta_steps: int = 100_000,
                 eps: float = 1e-6, sequence_length: int = 1, burn_in: int = 0, priority_eta: float = 0.9,
                 **kwargs: Any) -> None:
        self._sampling_init(n_step, gamma, prioritized, alpha, beta, beta_steps, eps, sequence_length, burn_in,
                            priority_eta)
        self._cols: dict[str, np.ndarray] = {}
        self._out: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}
        self._act_spec: Any = None
        self._obs_spec: Spec = None
        self._pos = 0  # next physical row to write
        self._size = 0  # rows stored
        self._ends = 0  # stored rows with need != NEVER
        self._ordered: np.ndarray | None = None  # valid rows in logical order, for get_transition
        self._weighted = False  # True once a packet carried loss weights below 1 (stale samples)
        self.total_appended = 0
        self._owned_init()
        self._links = TrajectoryLinks()
        self._sampled: np.ndarray | None = None  # the rows of the last batch
        self.views: list[View] = []
        super().__init__(*args, **kwargs)
        self._sampling_setup()
        if self.obs_preprocessor is not None:
            raise ValueError(f"{type(self).__name__} rebuilds observations per batch and "
                             f"takes no obs_preprocessor; preprocess inside the model instead")
        self.add_views(views)

    def add_views(self, views: Sequence[View]) -> None:
        """Declare more views (an agent's). ValueError once a packet is stored (its rows
        hold no offsets for them), for a name already taken, or for a view that reaches further
        back than the memory holds."""
        if not views:
            return
        name = type(self).__name__
        if self._cols:
            raise ValueError(f"{name} already stores packets: declare the views "
                             f"{[v.name for v in views]} before the first packet arrives")
        checked = check_views([*self.views, *views], name)
        for view in views:
            if self.memory_size <= view.max_reach + 1:
                raise ValueError(f"memory_size ({self.memory_size}) must be "
                                 f"larger than {self._reach_label(view)}: a "
                                 f"transition reads {view.max_reach + 2} rows, so a "
                                 f"smaller memory could never hold one")
        self.views = checked

    def _reach_label(self, view: View) -> str:
        return f"{view.max_reach + 1} (view {view.name!r} reads up to {view.max_reach} rows back)"

    # -- subclass hook -----------------------------------------------------------------------------
    def _obs_columns(self, buffer: Buffer) -> tuple[Spec, dict[str, np.ndarray]]:
        """The observation's spec (leaf names) and the per-row columns to store for it (leading
        dimension ``len(buffer)``); leaves that a view fills (``into="obs"``) need no column.
        Raise ValueError on bad input."""
        spec, leaves = flatten(buffer.obs, "obs")
        return spec, {name: np.asarray(leaf) for name, leaf in leaves}

    # -- storage -----------------------------------------------------------------------------------
    def append_buffer(self, buffer: Buffer) -> None:
        """Store a packet's rows. A packet that does not fit (another structure, per-row shape or
        kind of dtype than the first packet's) raises ValueError before anything is written, so
        the memory stays as it was."""
        n = len(buffer)
        if n == 0:
            return
        act_spec, act_leaves = flatten(buffer.act, "act")
        obs_spec, columns = self._obs_columns(buffer)
        columns.update((name, np.asarray(leaf)) for name, leaf in act_leaves)
        weight = getattr(buffer, "weight", None)
        columns.update(rew=np.asarray(buffer.rew, np.float32), terminated=np.asarray(buffer.terminated),
                       truncated=np.asarray(buffer.truncated), policy_version=np.asarray(buffer.policy_version),
                       weight=np.ones(n, np.float32) if weight is None else np.asarray(weight, np.float32),
                       worker=self._workers.column(buffer.worker, n), env=env_column(buffer, n))
        columns.update(extra_columns(buffer, self._cols))
        if not self._cols:
            self._check_layout(obs_spec, columns)
        columns.update(self._view_columns(buffer, columns))
        columns["need"] = self._needs(buffer, columns)
        self._owned_columns(buffer.worker, columns, n)
        linked = self._links.link(buffer, columns, self._cols, self.total_appended, self._size,
                                  max(0, n - self.memory_size))
        columns.update(linked.columns)
        need = columns["need"]
        if self._cols and (act_spec != self._act_spec or obs_spec != self._obs_spec or set(columns) != set(self._cols)):
            raise ValueError("a packet's observation/action structure differs from "
                             "the memory's; every worker must run the same pipeline")
        cap = self.memory_size
        stored = self._cols or allocate_ring(
            cap, {k: (v.shape[1:], v.dtype) for k, v in columns.items()}, self.ring_storage)
        # before any change: a refused packet must leave the memory as it was
        check_columns(columns, stored, n)
        if not self._cols:
            self._act_spec, self._obs_spec, self._cols = act_spec, obs_spec, stored
        if weight is not None and bool((columns["weight"][need != NEVER] < 1).any()):
            self._weighted = True  # from now on batches carry loss weights
        if n > cap:  # keep only the newest rows, as the ring would
            columns = {k: v[n - cap:] for k, v in columns.items()}
            n = cap
        idx = (self._pos + np.arange(n)) % cap
        filled = min(self._size + n, cap) - self._size  # rows landing in empty slots
        evicted = self._cols["worker"][idx[filled:]]
        if n > filled:  # the others replace old rows: forget the transitions they ended
            self._ends -= int(np.count_nonzero(self._cols["need"][idx[filled:]] != NEVER))
        for name, col in columns.items():
            self._cols[name][idx] = col
        self._owned_written(columns["worker"], evicted)
        self._ends += int(np.count_nonzero(columns["need"] != NEVER))
        self._pos = int((self._pos + n) % cap)
        self._size = min(self._size + n, cap)
        self.total_appended += n
        self._links.commit(linked, self._cols, self.total_appended, self._size)
        self._ordered = None
        if self._priorities is not None:
            self._priorities.written(idx, columns["need"] != NEVER, self._oldest)
            self._head_priorities()

    def _check_layout(self, obs_spec: Spec, columns: dict[str, np.ndarray]) -> None:
        """At the first packet: every view reads a stored column, fills an observation leaf that
        exists, and every other observation leaf is stored."""
        name = type(self).__name__
        for view in self.views:
            if view.source not in columns:
                raise ValueError(f"{name}: view {view.name!r} reads the column {view.source!r}, "
                                 f"which this memory does not store (it stores {sorted(columns)})")
        leaves = spec_leaves(obs_spec)
        filled = {v.name for v in self.views if v.into == "obs"}
        missing = sorted(filled - set(leaves))
        if missing:
            raise ValueError(f"{name}: view {missing[0]!r} goes into the observation leaf "
                             f"{missing[0]!r}, but the observations have the leaves {leaves}")
        for leaf in leaves:
            if leaf not in filled and leaf not in columns:
                raise ValueError(f"{name}: the observation leaf {leaf!r} is "
                                 f"neither stored nor filled by a view")

    def _view_columns(self, buffer: Buffer, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {f"view/{view.name}": segment_offsets(view, buffer) for view in self.views}

    def _needs(self, buffer: Buffer, columns: dict[str, np.ndarray]) -> np.ndarray:
        """Per row: rows back the transition it ends reads, ``NEVER`` if none ends there or a
        view is unknown. A view whose windows do not slide at a transition end (a rule that breaks
        the convention) raises ValueError."""
        row_need = np.zeros(len(buffer), np.int64)
        for view in self.views:
            off = columns[f"view/{view.name}"]
            row_need = np.where((off == NEVER).any(axis=1) | (row_need == NEVER), NEVER,
                                np.maximum(row_need, off.max(axis=1)))
        need = transition_needs(buffer, row_need)
        ends = np.flatnonzero(need != NEVER)
        for view in self.views:
            bad = sliding_rows(view, columns[f"view/{view.name}"], ends)
            if len(bad):
                raise ValueError(f"packet {buffer.seq} of worker {buffer.worker or '(unnamed)'}, "
                                 f"row {int(bad[0])}: view {view.name!r}'s window is not the "
                                 f"previous row's shifted by one; a view's rule must slide at "
                                 f"every row that continues a trajectory (netrl.memory.views)")
        return need

    def _sampling_changed(self, rows: np.ndarray, now: np.ndarray) -> None:
        self._ordered = None
        if self._priorities is not None:
            self._priorities.written(rows, now != NEVER, self._oldest)
            self._head_priorities()

    def _head_priorities(self) -> None:
        """Priority 0 for the oldest rows whose views lost rows to the ring: never drawn."""
        assert self._priorities is not None
        head = (self._oldest + np.arange(min(self._size, MAX_NEED))) % self.memory_size
        lost = head[(self._cols["need"][head] != NEVER) & ~self._valid(head)]
        if len(lost):
            self._priorities.tree.update(lost, 0.0)

    # -- validity ----------------------------------------------------------------------------------
    def _valid(self, idx: np.ndarray) -> np.ndarray:
        """Ring rows that end a transition whose whole history is still stored."""
        logical = (idx - self._oldest) % self.memory_size
        return self._cols["need"][idx] <= np.minimum(logical, MAX_NEED)  # NEVER (255) never passes

    def __len__(self) -> int:
        if not self._cols:
            return 0
        # Only the oldest rows may have lost part of their history.
        head = (self._oldest + np.arange(min(self._size, MAX_NEED))) % self.memory_size
        need = self._cols["need"][head]
        return self._ends - int(np.count_nonzero((need != NEVER) & ~self._valid(head)))

    # -- sampling ----------------------------------------------------------------------------------
    def _ordered_ends(self) -> np.ndarray:
        """The ring rows where a sampleable transition ends, oldest first (computed
        once per append)."""
        if self._ordered is None:
            logical = (np.arange(self._size) + self._oldest) % self.memory_size
            self._ordered = logical[self._valid(logical)] if self._cols else logical
        return self._ordered

    def _take(self, key: str, col: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """``col[idx]`` along the first axis, into an output buffer reused between
        batches of the same shape.

        torch's ``index_select`` copies rows about twice as fast as ``np.take`` here (4 KB
        frames: 0.65 against 1.15 ms for 1,280 rows of a 1M-row ring), so it does the
        copy; both arrays stay numpy.
        """
        shape = (*idx.shape, *col.shape[1:])
        out = self._out.get((key, shape))
        if out is None or out.dtype != col.dtype:
            out = self._out[(key, shape)] = np.empty(shape, col.dtype)
        if self.ring_storage is not None and self.ring_storage.gather(col, idx, out):
            return out  # read from its file (memory.storage disk)
        if idx.size < 64:  # a few rows (get_transition): numpy has less overhead per call
            np.take(col, idx, axis=0, out=out)
            return out
        try:
            flat = torch.from_numpy(out).view(-1, *col.shape[1:])
            torch.index_select(torch.from_numpy(col), 0, torch.from_numpy(idx.reshape(-1).astype(np.int64, copy=False)),
                               out=flat)
        except TypeError:  # a dtype torch does not have
            np.take(col, idx, axis=0, out=out)
        return out

    def _windows(self, idx: np.ndarray, tag: str = "") -> dict[str, np.ndarray]:
        """Per view, the ``length + 1`` values a transition ending at ring rows ``idx`` reads:
        ``(B, length + 1, ...)``, whose ``[:, :-1]`` is the observation's view and ``[:, 1:]``
        the next observation's."""
        out = {}
        prev = (idx - 1) % self.memory_size
        for view in self.views:
            off = self._cols[f"view/{view.name}"]
            rows = np.empty((len(idx), view.length + 1), np.int64)
            rows[:, 0] = prev - off[prev, 0]
            rows[:, 1:] = idx[:, None] - off[idx]
            rows %= self.memory_size
            out[view.name] = self._take(f"{tag}view:{view.name}", self._cols[view.source], rows)
        return out

    def _observations(self, idx: np.ndarray, windows: dict[str, np.ndarray], tag: str = "") -> tuple[Any, Any]:
        """Batched ``(obs, next_obs)`` (numpy trees) for transitions ending at ring rows
        ``idx``: stored leaves at the row before and the row, views into the observation
        from their windows."""
        prev = (idx - 1) % self.memory_size
        now: dict[str, np.ndarray] = {}
        before: dict[str, np.ndarray] = {}
        filled = {v.name for v in self.views if v.into == "obs"}
        for leaf in spec_leaves(self._obs_spec):
            if leaf in filled:
                before[leaf], now[leaf] = windows[leaf][:, :-1], windows[leaf][:, 1:]
            else:
                before[leaf] = self._take(tag + "prev:" + leaf, self._cols[leaf], prev)
                now[leaf] = self._take(tag + "now:" + leaf, self._cols[leaf], idx)
        return unflatten(self._obs_spec, before), unflatten(self._obs_spec, now)

    def _transitions(self, idx: np.ndarray) -> tuple[tuple[Any, Any, np.ndarray, Any, np.ndarray, np.ndarray],
                                                      dict[str, np.ndarray]]:
        windows = self._windows(idx)
        o, o2 = self._observations(idx, windows)
        act = unflatten(self._act_spec, {n: self._take(n, self._cols[n], idx) for n in self._cols
                                         if n == "act" or n.startswith("act/")})
        r = self._take("rew", self._cols["rew"], idx)
        term = self._take("terminated", self._cols["terminated"], idx).astype(np.float32)
        trunc = self._take("truncated", self._cols["truncated"], idx).astype(np.float32)
        return (o, act, r, o2, term, trunc), windows

    def batch_workers(self) -> list[str] | None:
        return None if self._sampled is None else self._workers.named(self._cols["worker"][self._sampled])

    def sample(self) -> Batch:
        rows, mask, importance = self._walk()
        idx = rows.reshape(-1)  # a sequence's B * L steps gathered flat, shaped [B, L] at the end
        (o, a, r, o2, term, trunc), windows = self._transitions(idx)
        nxt_windows, steps = windows, None
        if self.n_step > 1:  # the next observation, its views and flags where each window ends
            last, r, steps = self._nstep(idx)
            nxt_windows = self._windows(last, "n:")
            o2 = self._observations(last, nxt_windows, "n:")[1]
            term = self._take("n:terminated", self._cols["terminated"], last).astype(np.float32)
            trunc = self._take("n:truncated", self._cols["truncated"], last).astype(np.float32)
        if self.sample_preprocessor is not None:
            o, a, r, o2, term, trunc = run_sample_preprocessor(self.sample_preprocessor, (o, a, r, o2, term, trunc))
        d = self.device
        weight = self._take("weight", self._cols["weight"], idx) if self._weighted else None
        if importance is not None:
            weight = importance.reshape(-1) * (1.0 if weight is None else weight)
        extra = {k: _tensor(self._take(n, c, idx), d) for n, c in self._cols.items() if (k := batch_key(n))}
        extra.update(traj=_tensor(self._cols["traj"][idx], d), episode=_tensor(self._cols["episode"][idx], d))
        for view in self.views:
            if view.into == "extra":
                extra[view.name] = _tensor(windows[view.name], d)[:, :-1]
                extra["next_" + view.name] = _tensor(nxt_windows[view.name], d)[:, 1:]
        if steps is not None:
            extra["steps_to_next_obs"] = _tensor(steps, d)
            extra["discount"] = _tensor((self.gamma ** steps).astype(np.float32), d)
        if importance is not None:
            extra["index"] = _tensor(self._absolute(idx), d)
        o, o2 = _tensor(o, d), _tensor(o2, d)
        if self.obs_transform is not None:  # new tensors: the stored rows stay raw
            o, o2 = self.obs_transform(o), self.obs_transform(o2)
        batch = Batch(o, _tensor(a, d), _tensor(r, d), o2, _tensor(term, d), _tensor(trunc, d),
                      None if weight is None else _tensor(np.asarray(weight, np.float32), d), extra=extra)
        return batch if mask is None else sequence_batch(batch, mask, d)

    def get_transition(self, item: int) -> tuple[Any, Any, float, Any, bool, bool, dict[str, Any]]:
        """The ``item``-th sampleable transition, oldest first, as copies (per-item access, for
        tests and tmrl-style code). ``info["extra"]`` holds the actor's extra outputs recorded
        with the action and the views that go into ``batch.extra``, ``info["info"]`` the env's
        declared info entries, if any. Raises IndexError
        unless ``0 <= item < len()``."""
        i = nth_end(self._ordered_ends(), item)
        transition, windows = self._transitions(np.array([i]))
        o, a, r, o2, term, trunc = (tree_map(np.copy, x) for x in transition)
        info: dict[str, Any] = {"policy_version": int(self._cols["policy_version"][i])}
        extra = row_entries(self._cols, i, "extra")
        for view in self.views:
            if view.into == "extra":
                window = windows[view.name][0]
                extra[view.name], extra["next_" + view.name] = window[:-1].copy(), window[1:].copy()
        if extra:
            info["extra"] = extra
        if env_info := row_entries(self._cols, i, "info"):
            info["info"] = env_info
        return (row(o, 0), row(a, 0), float(r[0]), row(o2, 0), bool(term[0]), bool(trunc[0]), info)

    def policy_versions(self, idx: np.ndarray) -> np.ndarray:
        return self._cols["policy_version"][idx]

def attach_views(memory: MemoryDataloading, agent: Any) -> None:
    """Add the views ``agent`` declares (an optional ``views()`` method) to ``memory``, before
    any packet arrives. ValueError naming both when the memory cannot assemble views (it is
    not a :class:`HistoryMemory`)."""
    views = declared_views(agent)
    if not views:
        return
    if not isinstance(memory, HistoryMemory):
        raise ValueError(f"{type(agent).__name__} declares the views {[v.name for v in views]}, "
                         f"but {type(memory).__name__} cannot assemble views: train "
                         f"with netrl.memory.HistoryMemory (or FrameStackMemory, "
                         f"ActionBufferMemory), e.g. memory_cls=HistoryMemory")
    memory.add_views(views)


def _tensor(x: Any, device: str | torch.device) -> Any:
    """numpy tree -> tensors on ``device``; strided views (e.g. overlapping frame
    windows) are not copied on CPU.

    A read-only array (derived from the views ``sample_preprocessor`` gets) is copied:
    torch.from_numpy warns on it.
    """
    return tree_map(lambda a: torch.from_numpy(a if a.flags.writeable else a.copy()).to(device, non_blocking=True), x)
