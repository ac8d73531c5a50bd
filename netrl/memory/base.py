"""Replay memories: tmrl's ``MemoryDataloading`` contract and :class:`ReplayMemory`, a fast default.

A memory receives :class:`~netrl.samples.Buffer` packets through ``append_buffer`` and hands the trainer
batches through :meth:`MemoryDataloading.sample`. A memory ported from tmrl implements only
``append_buffer``, ``__len__`` and ``get_transition``; the base class then samples items one by one and collates
them (tmrl's approach). :class:`ReplayMemory` stores rows in preallocated numpy columns and gathers a whole batch
with a few fancy-indexing calls, with no per-item Python code.
"""

from __future__ import annotations

import logging
import os
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from netrl.errors import ConfigError
from netrl.samples import Batch, Buffer, flatten, row, tree_map, unflatten
from netrl.util import takes_args

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_MEMORY_SIZE", "MemoryDataloading", "ReplayMemory", "collate", "save_dataset"]

Transition = tuple[Any, Any, float, Any, bool, bool, dict[str, Any]]


def collate(items: list[Any], device: str | torch.device) -> Any:
    """Stack a list of equally-structured samples (arrays, numbers, tuples, dicts) into tensors on ``device``."""
    first = items[0]
    if isinstance(first, (tuple, list)):
        return type(first)(collate([it[i] for it in items], device) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: collate([it[k] for it in items], device) for k in first}
    return torch.as_tensor(np.stack([np.asarray(x) for x in items])).to(device)


def _to_tensor(x: Any, device: str | torch.device) -> Any:
    # A read-only array (derived from the views sample_preprocessor gets) is copied: torch.from_numpy warns on it.
    return tree_map(lambda a: torch.from_numpy(np.ascontiguousarray(a) if a.flags.writeable else np.array(a))
                    .to(device, non_blocking=True), x)


def run_sample_preprocessor(fn: Callable[..., Any], batch: tuple[Any, ...]) -> Any:
    """``fn(*batch)`` on read-only views of the batch's arrays, so that changing one in place raises.

    The arrays are buffers reused between batches and, in :class:`~netrl.memory.frames.FrameStackMemory`, obs and
    next_obs are overlapping views of one window of frames: ``obs[:] = 0`` would also change next_obs. numpy
    refuses it ("assignment destination is read-only"). The views are made writeable again afterwards, so arrays
    that ``fn`` returns unchanged reach ``torch.from_numpy`` without a copy (and without its read-only warning).
    """
    locked: list[np.ndarray] = []

    def lock(a: Any) -> Any:
        if not isinstance(a, np.ndarray) or not a.flags.writeable:
            return a
        view = a.view()
        view.flags.writeable = False
        locked.append(view)
        return view

    out = fn(*tree_map(lock, batch))
    for view in locked:
        view.flags.writeable = True  # allowed: the memory behind it is ours and writeable
    return out


def draw_ends(rng: np.random.Generator, batch_size: int, rows: int, ends: int,
              valid: Callable[[np.ndarray], np.ndarray], ordered: Callable[[], np.ndarray]) -> np.ndarray:
    """``batch_size`` of a ring's ``rows`` that end one of its ``ends`` transitions, uniformly at random.

    By rejection sampling (``valid`` says which drawn rows end a transition), or, when few rows do (most are stale
    samples of weight 0, say), from ``ordered()``, the list of those that do: rejection would draw rows / ends times
    the batch (with 3 of 100,000 rows, 0.8 s and 290 MB for one batch).
    """
    if ends == 0:
        raise RuntimeError("the replay memory holds no complete transition yet")
    if ends * 16 < rows:
        listed = ordered()
        return listed[rng.integers(0, len(listed), size=batch_size)]
    chosen: list[np.ndarray] = []
    need = batch_size
    while need > 0:
        draw = rng.integers(0, rows, size=int(need * rows / ends * 1.2) + 8)
        draw = draw[valid(draw)][:need]
        chosen.append(draw)
        need -= len(draw)
    return np.concatenate(chosen)


def nth_end(ordered: np.ndarray, item: int) -> int:
    """The row where the ``item``-th transition (oldest first) ends, from a memory's ``ordered`` transition ends;
    IndexError unless ``0 <= item < len(ordered)``."""
    if not 0 <= item < len(ordered):
        raise IndexError(f"transition index {item} is out of range: the memory holds {len(ordered)} transitions "
                         "(0 <= item < len(memory))")
    return int(ordered[item])


def check_columns(columns: dict[str, np.ndarray], stored: dict[str, np.ndarray], n: int) -> None:
    """Raise ValueError unless every column of an ``n``-row packet fits the memory's ``stored`` columns.

    Per-row shapes must match exactly (numpy would broadcast a ``(3, 1)`` observation into ``(3,)`` rows, or a
    scalar per row into every value), and dtypes must convert within their kind (``np.can_cast(..., "same_kind")``:
    float64 into float32 is fine; float into uint8 is refused, since numpy would truncate). Memories call this
    before writing anything, so a refused packet leaves them as they were.
    """
    for name, col in columns.items():
        want = stored[name]
        if col.shape[:1] != (n,):
            raise ValueError(f"column {name!r} has shape {col.shape}, not one row per sample of this {n}-row packet "
                             f"({(n, *want.shape[1:])}): the packet is malformed")
        if col.shape[1:] != want.shape[1:]:
            raise ValueError(f"column {name!r} has shape {col.shape[1:]} per row (shape {col.shape}); the memory "
                             f"stores {want.shape[1:]} per row: every worker (and the dataset) must send the same "
                             "observation and action shapes")
        if not np.can_cast(col.dtype, want.dtype, "same_kind"):
            raise ValueError(f"column {name!r} has dtype {col.dtype}; the memory stores {want.dtype}, and {col.dtype} "
                             f"does not convert to it without changing kind (e.g. float to integer): send "
                             f"{want.dtype}, or convert in the worker's sample_compressor")


DEFAULT_MEMORY_SIZE, DEFAULT_BATCH_SIZE = 1_000_000, 256


def allocate_ring(memory_size: int, rows: dict[str, tuple[tuple[int, ...], Any]]) -> dict[str, np.ndarray]:
    """Zeroed ring columns of ``memory_size`` rows, one per ``name: (per-row shape, dtype)``.

    Their size is known only when the first packet shows a row's shapes, long after the config was accepted and the
    trainer connected: a ``memory_size`` this machine cannot hold is reported here as the config problem it is,
    with the bytes it needs, and not as numpy's traceback (MemoryError; ValueError past numpy's largest array).
    """
    import psutil  # here: only allocations need it

    row_bytes = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in rows.values())
    need = memory_size * row_bytes
    try:
        ring = {name: np.zeros((memory_size, *shape), dtype) for name, (shape, dtype) in rows.items()}
    except (MemoryError, ValueError) as exc:
        if isinstance(exc, ValueError) and need < np.iinfo(np.intp).max:
            raise  # not numpy's "array is too big"
        available = psutil.virtual_memory().available
        raise ConfigError([f"memory.memory_size is {memory_size}: the replay memory needs {_gib(need)} for it "
                           f"({row_bytes} bytes per row) and could not allocate them; this machine has "
                           f"{_gib(available)} available, about {available // max(row_bytes, 1)} rows: lower "
                           "memory.memory_size to fit (leave room for the trainer itself), or train on a machine "
                           "with more memory"]) from None
    available = psutil.virtual_memory().available
    if need > available:  # the pages come as the ring fills: the system would kill the trainer then, without a word
        log.warning("memory.memory_size %d needs %s for the replay memory (%d bytes per row), more than the %s this "
                    "machine has available: the trainer will be killed as the memory fills, unless memory is freed "
                    "by then; lower memory.memory_size to about %d rows to be sure", memory_size, _gib(need), row_bytes,
                    _gib(available), available // max(row_bytes, 1))
    return ring


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"


class MemoryDataloading(ABC):
    """tmrl's replay-memory interface.

    Args:
        device: device of the tensors in the batches.
        nb_steps: training steps per round; iterating over the memory yields that many batches.
        obs_preprocessor: same function as the worker's; applied to observations before training.
        sample_preprocessor: data augmentation, ``f(obs, act, rew, next_obs, terminated, truncated)`` returning
            the same tuple; applied to each item (base class) or to each batch (:class:`ReplayMemory`). It must
            return new arrays rather than change its inputs: the batched memories pass read-only views (their
            buffers are reused, and a frame-stack memory's obs and next_obs share frames), so ``obs[:] = 0``
            raises; write ``obs = np.zeros_like(obs)`` instead.
        memory_size: capacity in rows, not transitions. Every row a worker sends takes a slot, including the rows
            that end no transition: each episode's reset row and the context rows repeated at the start of every
            packet (the pipeline's ``overlap``). So a full memory holds fewer than ``memory_size`` transitions:
            e.g. about 950 of 1000 with 20-row packets and overlap 1, 830 with overlap 4 (frame stacks) and 740
            with overlap 7.
        batch_size: transitions per batch.
        dataset_path: optional ``.npz`` file of samples to start from, written by :func:`save_dataset` (see
            :meth:`load_dataset`). Unlike tmrl, not a folder holding a pickled ``data.pkl``.
    """

    def __init__(self, device: str | torch.device = "cpu", nb_steps: int = 1, obs_preprocessor: Callable[..., Any]
                 | None = None, sample_preprocessor: Callable[..., Any] | None = None,
                 memory_size: int = DEFAULT_MEMORY_SIZE, batch_size: int = DEFAULT_BATCH_SIZE, dataset_path: str = "",
                 seed: int | None = None) -> None:
        problems = [f"{name} must be > 0 (got {value})" for name, value in
                    (("memory_size", memory_size), ("batch_size", batch_size)) if value <= 0]
        if problems:
            raise ValueError(f"{type(self).__name__}: {'; '.join(problems)}")
        self.device = device
        self.nb_steps = nb_steps
        self.obs_preprocessor = obs_preprocessor
        if sample_preprocessor is not None:
            _check_sample_preprocessor(sample_preprocessor)
        self.sample_preprocessor = sample_preprocessor
        self.memory_size = memory_size
        self.batch_size = batch_size
        self.rng = np.random.default_rng(seed)
        self.data: Any = []  # tmrl memories keep their storage here
        if dataset_path:
            self.load_dataset(dataset_path)

    @abstractmethod
    def append_buffer(self, buffer: Buffer) -> None:
        """Store a packet of rows (see :mod:`netrl.samples` for their meaning) and trim to ``memory_size``."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of items ``get_transition`` accepts: it is called with ``0 <= item < len(self)``."""

    @abstractmethod
    def get_transition(self, item: int) -> Transition:
        """``(last_obs, new_act, rew, new_obs, terminated, truncated, info)`` with the observations as stored.

        This generic :meth:`sample` applies ``obs_preprocessor`` to what this returns, so a memory that stores
        observations as the env produced them (tmrl's) must not apply it here. :class:`ReplayMemory` applies it
        once per row on append instead, so its ``get_transition`` returns preprocessed observations (and its own
        ``sample`` does not apply it again).
        """

    def sample_indices(self) -> np.ndarray:
        return self.rng.integers(0, len(self), size=self.batch_size)

    def sample(self) -> Batch:
        """One batch on ``self.device``. This generic version calls ``get_transition`` per item."""
        items = []
        for item in self.sample_indices():
            transition = self.get_transition(int(item))
            if len(transition) != 7:
                raise TypeError(f"{type(self).__name__}.get_transition must return 7 values, (last_obs, new_act, rew, "
                                f"new_obs, terminated, truncated, info); it returned {len(transition)}. tmrl before "
                                "0.5 (and its older tutorial) returned 6, (last_obs, new_act, rew, new_obs, done, "
                                "info): return terminated (the episode ended) and truncated (it was cut short, e.g. "
                                "by a time limit) instead of done")
            o, a, r, o2, term, trunc, _info = transition
            if self.obs_preprocessor is not None:
                o, o2 = self.obs_preprocessor(o), self.obs_preprocessor(o2)
            if self.sample_preprocessor is not None:
                o, a, r, o2, term, trunc = self.sample_preprocessor(o, a, r, o2, term, trunc)
            items.append((o, a, np.float32(r), o2, np.float32(term), np.float32(trunc)))
        o, a, r, o2, term, trunc = collate(items, self.device)
        return Batch(o, a.float(), r.float(), o2, term.float(), trunc.float())

    def __iter__(self) -> Iterator[Batch]:
        for _ in range(self.nb_steps):
            yield self.sample()

    def load_dataset(self, path: str | os.PathLike[str]) -> None:
        """Append an ``.npz`` dataset written by :func:`save_dataset` (arrays only, never pickles).

        Raises FileNotFoundError if ``path`` does not exist and ValueError if it is a folder (tmrl's layout) or
        not an ``.npz`` archive of sample columns (a pickle such as tmrl's ``data.pkl``, an ``.npy`` file...).
        Floating-point ``act`` and ``obs`` columns are stored as float32, whatever the file holds (rows built from
        Python floats are float64), as the agents train in float32 and workers send float32.
        """
        cols = _read_dataset(path)
        leaves = {k: v.astype(np.float32) if np.issubdtype(v.dtype, np.floating) else v
                  for k, v in cols.items() if k.startswith(("act", "obs"))}
        act = unflatten(_spec_from_names([k for k in leaves if k.startswith("act")], "act"), leaves)
        obs = unflatten(_spec_from_names([k for k in leaves if k.startswith("obs")], "obs"), leaves)
        self.append_buffer(Buffer(act=act, obs=obs, rew=cols["rew"], terminated=cols["terminated"],
                                  truncated=cols["truncated"], reset=cols["reset"], context=cols["context"],
                                  policy_version=cols["policy_version"], worker="dataset"))


def _check_sample_preprocessor(fn: Callable[..., Any]) -> None:
    """Raise TypeError unless ``fn`` takes netrl's six arguments."""
    if not callable(fn):
        raise TypeError(f"sample_preprocessor must be a function or None (got {type(fn).__name__})")
    if not takes_args(fn, 6):
        raise TypeError(f"sample_preprocessor {getattr(fn, '__name__', fn)!r} must take 6 arguments, (obs, act, "
                        "rew, next_obs, terminated, truncated), and return them in that order. tmrl's older "
                        "5-argument form, (obs, act, rew, next_obs, done), must split done into terminated (the "
                        "episode ended) and truncated (it was cut short, e.g. by a time limit)")


_DATASET_COLUMNS = ("rew", "terminated", "truncated", "reset", "context", "policy_version")  # plus act*, obs*


def _dataset_error(path: str | os.PathLike[str], problem: str) -> str:
    return (f"dataset_path {str(path)!r} {problem}. netrl reads one .npz file of sample columns, as written by "
            "netrl.memory.save_dataset; it does not read tmrl's pickled data.pkl datasets, because netrl never "
            "unpickles (to reuse one you trust, unpickle it yourself, put its rows in a netrl.Buffer and write that "
            "with save_dataset)")


def _read_dataset(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The columns of a :func:`save_dataset` file, with an error that says what to do for anything else."""
    p = Path(path)
    if p.is_dir():
        held = " holding tmrl's data.pkl" if (p / "data.pkl").exists() else ""
        raise ValueError(_dataset_error(path, f"is a folder{held}, not a file"))
    if not p.exists():
        npz = p.with_name(p.name + ".npz")  # np.savez (so save_dataset) adds .npz to a path without it
        hint = f"did you mean {str(npz)!r}? " if npz.is_file() else ""
        raise FileNotFoundError(_dataset_error(path, f'does not exist ({hint}pass dataset_path="" to start with an '
                                                     "empty memory, as tmrl does when its dataset folder is missing)"))
    try:
        loaded = np.load(p, allow_pickle=False)
    except ValueError:  # numpy's answer to a pickle (tmrl's data.pkl) and to any file it does not recognise
        raise ValueError(_dataset_error(path, "is not an .npz archive of arrays (it is a pickle, such as tmrl's "
                                              "data.pkl, or another format)")) from None
    except (EOFError, zipfile.BadZipFile) as e:
        raise ValueError(_dataset_error(path, f"is not a readable .npz archive ({e})")) from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(_dataset_error(path, "holds a single .npy array, not an .npz archive of columns"))
    with loaded:
        try:
            cols = {k: loaded[k] for k in loaded.files}
        except ValueError:
            raise ValueError(_dataset_error(path, "has a column of Python objects (pickled data)")) from None
    missing = [c for c in _DATASET_COLUMNS if c not in cols]
    missing += [f"{c} (or {c}/0, {c}/1...)" for c in ("act", "obs")
                if not any(k == c or k.startswith(c + "/") for k in cols)]
    if missing:
        raise ValueError(_dataset_error(path, f"lacks the columns {', '.join(missing)}"))
    return cols


def save_dataset(path: str | os.PathLike[str], buffer: Buffer) -> None:
    """Write ``buffer``'s rows to an ``.npz`` file that a memory's ``dataset_path`` reads back (arrays only).

    Columns: ``act`` and ``obs`` (or ``act/0``, ``act/1``... for a tuple), ``rew``, ``terminated``, ``truncated``,
    ``reset``, ``context`` and ``policy_version``, as in :class:`~netrl.samples.Buffer`. numpy adds ``.npz`` to a
    path without it.
    """
    act_spec, act_leaves = flatten(buffer.act, "act")
    obs_spec, obs_leaves = flatten(buffer.obs, "obs")
    for prefix, spec in (("act", act_spec), ("obs", obs_spec)):
        if not (isinstance(spec, str) or (isinstance(spec, list) and all(isinstance(s, str) for s in spec))):
            raise ValueError(f"save_dataset stores {prefix} as one array or a flat tuple of arrays, and this "
                             f"buffer's {prefix} is nested as {spec!r}: flatten it into a tuple first")
    np.savez(path, **dict(act_leaves + obs_leaves), **{c: getattr(buffer, c) for c in _DATASET_COLUMNS})


def _spec_from_names(names: list[str], prefix: str) -> Any:
    """Rebuild a flat spec from saved leaf names (``obs`` or ``obs/0``, ``obs/1``... one level deep)."""
    if names == [prefix]:
        return prefix
    return sorted(names, key=lambda n: int(n.rsplit("/", 1)[1]) if n.rsplit("/", 1)[1].isdigit() else n)


class ReplayMemory(MemoryDataloading):
    """A preallocated numpy ring buffer of rows with vectorised batch sampling.

    Rows are stored as the worker sent them (observations once, not twice per transition). A transition ends at
    every row that is neither a ``reset`` nor a ``context`` row; its previous observation is the row before.
    ``obs_preprocessor`` runs once per row when it is appended; ``sample_preprocessor`` runs once per batch.
    A batch's tensors share memory with reused buffers and stay valid until the next :meth:`sample` call.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
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
        super().__init__(*args, **kwargs)

    # -- storage -------------------------------------------------------------------------------------------
    def _allocate(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Empty ring columns for the act/obs leaves of ``columns`` (their per-row shape and dtype) and the rest."""
        fixed = {"rew": np.float32, "terminated": np.bool_, "truncated": np.bool_, "end": np.bool_,
                 "policy_version": np.int64, "weight": np.float32}
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
                       weight=np.ones(n, np.float32) if buffer.weight is None else np.asarray(buffer.weight))
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

    def sample(self) -> Batch:
        idx = self.sample_indices()
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
        weight = _to_tensor(self._gather("weight", "weight", idx), d) if self._weighted else None
        return Batch(_to_tensor(o, d), _to_tensor(a, d), _to_tensor(r, d), _to_tensor(o2, d), _to_tensor(term, d),
                     _to_tensor(trunc, d), weight)

    def get_transition(self, item: int) -> Transition:
        """The ``item``-th stored transition, oldest first (per-item access, for tests and tmrl-style code).

        The arrays are copies, which later packets do not change. The observations are as stored: after
        ``obs_preprocessor``, which this memory applies on append. Raises IndexError unless ``0 <= item < len()``.
        """
        i = nth_end(self._ordered_ends(), item)
        p = (i - 1) % self.memory_size
        cols = self._cols
        obs = {n: c for n, c in cols.items() if n.startswith("obs")}
        last_obs = unflatten(self._obs_spec, {n: c[p].copy() for n, c in obs.items()})
        new_obs = unflatten(self._obs_spec, {n: c[i].copy() for n, c in obs.items()})
        act = unflatten(self._act_spec, {n: c[i].copy() for n, c in cols.items() if n.startswith("act")})
        return (last_obs, act, float(cols["rew"][i]), new_obs, bool(cols["terminated"][i]),
                bool(cols["truncated"][i]), {"policy_version": int(cols["policy_version"][i])})

    def policy_versions(self, idx: np.ndarray) -> np.ndarray:
        return self._cols["policy_version"][idx]


def _stack_rows(rows: list[Any]) -> Any:
    first = rows[0]
    if isinstance(first, (tuple, list)):
        return tuple(_stack_rows([r[i] for r in rows]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _stack_rows([r[k] for r in rows]) for k in first}
    return np.stack([np.asarray(r) for r in rows])
