"""tmrl's ``MemoryDataloading`` contract, and the vectorised helpers the batched memories share.

A memory receives :class:`~netrl.samples.Buffer` packets through ``append_buffer`` and hands the
trainer batches through :meth:`MemoryDataloading.sample`. A memory ported from tmrl implements
only ``append_buffer``, ``__len__`` and ``get_transition``; the base class then samples items
one by one and collates them (tmrl's approach). :class:`~netrl.memory.replay.ReplayMemory`
stores rows in preallocated numpy columns and gathers a whole batch with a few fancy-indexing
calls, with no per-item Python code.
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from netrl.errors import ConfigError
from netrl.memory.dataset import read_dataset
from netrl.samples.batch import Batch
from netrl.samples.columns import Buffer, tree_map
from netrl.util import takes_args

if TYPE_CHECKING:
    from netrl.memory.disk import DiskRing

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_MEMORY_SIZE", "MemoryDataloading", "Transition", "WorkerIds", "allocate_ring",
           "batch_key",
           "check_columns", "collate", "draw_ends", "env_column", "extra_columns", "np_dtype", "nth_end",
           "run_sample_preprocessor", "to_tensor"]

Transition = tuple[Any, Any, float, Any, bool, bool, dict[str, Any]]


def collate(items: list[Any], device: str | torch.device) -> Any:
    """Stack a list of equally-structured samples (arrays, numbers, tuples, dicts)
    into tensors on ``device``."""
    first = items[0]
    if isinstance(first, (tuple, list)):
        return type(first)(collate([it[i] for it in items], device) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: collate([it[k] for it in items], device) for k in first}
    return torch.as_tensor(np.stack([np.asarray(x) for x in items])).to(device)


def to_tensor(x: Any, device: str | torch.device) -> Any:
    # A read-only array (derived from the views sample_preprocessor gets) is copied:
    # torch.from_numpy warns on it. A tensor is a column already gathered on a
    # device (memory.device cuda).
    return tree_map(lambda a: a.to(device, non_blocking=True) if isinstance(a, torch.Tensor) else
                    torch.from_numpy(np.ascontiguousarray(a) if a.flags.writeable else np.array(a))
                    .to(device, non_blocking=True), x)


def run_sample_preprocessor(fn: Callable[..., Any], batch: tuple[Any, ...]) -> Any:
    """``fn(*batch)`` on read-only views of the batch's arrays, so that
    changing one in place raises.

    The arrays are buffers reused between batches and, in
    :class:`~netrl.memory.frames.FrameStackMemory`, obs and next_obs are overlapping views of one
    window of frames: ``obs[:] = 0`` would also change next_obs. numpy refuses it ("assignment
    destination is read-only"). The views are made writeable again afterwards, so arrays that ``fn``
    returns unchanged reach ``torch.from_numpy`` without a copy (and without its read-only warning).
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
    """``batch_size`` of a ring's ``rows`` that end one of its ``ends`` transitions,
    uniformly at random.

    By rejection sampling (``valid`` says which drawn rows end a transition), or, when few
    rows do (most are stale samples of weight 0, say), from ``ordered()``, the list of those
    that do: rejection would draw rows / ends times the batch (with 3 of 100,000 rows, 0.8 s
    and 290 MB for one batch).
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
    """The row where the ``item``-th transition (oldest first) ends, from a memory's ``ordered``
    transition ends; IndexError unless ``0 <= item < len(ordered)``."""
    if not 0 <= item < len(ordered):
        raise IndexError(f"transition index {item} is out of range: the memory holds "
                         f"{len(ordered)} transitions (0 <= item < len(memory))")
    return int(ordered[item])


def check_columns(columns: dict[str, np.ndarray], stored: dict[str, Any], n: int) -> None:
    """Raise ValueError unless every column of an ``n``-row packet fits the
    memory's ``stored`` columns.

    Per-row shapes must match exactly (numpy would broadcast a ``(3, 1)`` observation into
    ``(3,)`` rows, or a scalar per row into every value), and dtypes must convert within their
    kind (``np.can_cast(..., "same_kind")``: float64 into float32 is fine; float into uint8 is
    refused, since numpy would truncate). Memories call this before writing anything, so a refused
    packet leaves them as they were.
    """
    for name, col in columns.items():
        want = stored[name]
        want_dtype = np_dtype(want)
        if col.shape[:1] != (n,):
            raise ValueError(f"column {name!r} has shape {col.shape}, not "
                             f"one row per sample of this {n}-row packet "
                             f"({(n, *want.shape[1:])}): the packet is malformed")
        if col.shape[1:] != want.shape[1:]:
            raise ValueError(f"column {name!r} has shape {col.shape[1:]} per "
                             f"row (shape {col.shape}); the memory stores "
                             f"{want.shape[1:]} per row: every worker (and the dataset) "
                             f"must send the same observation and action shapes")
        if not np.can_cast(col.dtype, want_dtype, "same_kind"):
            raise ValueError(f"column {name!r} has dtype {col.dtype}; the memory stores "
                             f"{want_dtype}, and {col.dtype} does not convert to it "
                             f"without changing kind (e.g. float to integer): send "
                             f"{want_dtype}, or convert in the worker's sample_compressor")


def np_dtype(column: np.ndarray | torch.Tensor) -> np.dtype[Any]:
    """A ring column's numpy dtype, also for a column held as a tensor on a device
    (memory.device cuda)."""
    if isinstance(column, torch.Tensor):
        return torch.empty(0, dtype=column.dtype).numpy().dtype
    return column.dtype


DEFAULT_MEMORY_SIZE, DEFAULT_BATCH_SIZE = 1_000_000, 256


def extra_columns(buffer: Buffer, stored: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A packet's extra outputs as columns ``extra/<name>`` and its info entries as
    ``info/<name>`` (:mod:`netrl.samples.info`); ValueError unless they are the ones the memory's
    ``stored`` columns hold (none yet: any), since a packet without one would leave old rows'
    values in its slots."""
    cols = {f"extra/{name}": np.asarray(col) for name, col in (getattr(buffer, "extra", None) or {}).items()}
    info = getattr(buffer, "info", None) or {}
    cols.update((f"info/{name}", np.asarray(col)) for name, col in info.items())
    for group, what, who in (("extra/", "extra outputs", "actor"),
                             ("info/", "info keys", "pipeline")):
        have = sorted(n[len(group):] for n in stored if n.startswith(group))
        got = sorted(n[len(group):] for n in cols if n.startswith(group))
        if stored and got != have:
            raise ValueError(f"packet {buffer.seq} of worker "
                             f"{buffer.worker or '(unnamed)'} carries the {what} {got}; the "
                             f"memory stores {have}: every worker must run the same {who}")
    return cols


def batch_key(column: str) -> str | None:
    """The ``batch.extra`` key of a stored column: an extra output's name, an info entry's
    ``info/<name>``; None for the other columns."""
    if column.startswith("extra/"):
        return column[6:]
    return column if column.startswith("info/") else None


def env_column(buffer: Buffer, n: int) -> np.ndarray:
    """A packet's ``env`` column (which of its worker's envs each row came from),
    zeros when it has none."""
    env = getattr(buffer, "env", None)
    return np.zeros(n, np.uint16) if env is None else np.asarray(env, np.uint16)


class WorkerIds:
    """Small integers for worker names, so a memory keeps each row's worker in an int32 column (4
    bytes a row): the training loop names the workers whose samples were in a batch that
    made a training step go wrong."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._ids: dict[str, int] = {}

    def column(self, name: str, n: int) -> np.ndarray:
        """``n`` rows of ``name``'s id."""
        if name not in self._ids:
            self._ids[name] = len(self.names)
            self.names.append(name)
        return np.full(n, self._ids[name], np.int32)

    def id_of(self, name: str) -> int | None:
        """``name``'s id, None for a name not seen yet."""
        return self._ids.get(name)

    def named(self, ids: np.ndarray) -> list[str]:
        """The names of these ids, sorted, each once."""
        return sorted(self.names[int(i)] or "(unnamed)" for i in np.unique(ids) if i >= 0)


def allocate_ring(memory_size: int, rows: dict[str, tuple[tuple[int, ...], Any]],
                  storage: DiskRing | None = None) -> dict[str, np.ndarray]:
    """Zeroed ring columns of ``memory_size`` rows, one per ``name: (per-row shape, dtype)``: in
    RAM, or with ``storage`` (a memory's ``ring_storage``, ``memory.storage`` disk) in files it
    maps (:mod:`netrl.memory.disk`).

    Their size is known only when the first packet shows a row's shapes, long after the config was
    accepted and the trainer connected: a ``memory_size`` this machine cannot hold is reported
    here as the config problem it is, with the bytes it needs, and not as numpy's traceback
    (MemoryError; ValueError past numpy's largest array).
    """
    if storage is not None:
        return storage.allocate(memory_size, rows)
    import psutil  # here: only allocations need it

    row_bytes = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in rows.values())
    need = memory_size * row_bytes
    try:
        ring = {name: np.zeros((memory_size, *shape), dtype) for name, (shape, dtype) in rows.items()}
    except (MemoryError, ValueError) as exc:
        if isinstance(exc, ValueError) and need < np.iinfo(np.intp).max:
            raise  # not numpy's "array is too big"
        available = psutil.virtual_memory().available
        raise ConfigError([f"memory.memory_size is {memory_size}: the replay memory "
                           f"needs {_gib(need)} for it ({row_bytes} bytes per row) and "
                           f"could not allocate them; this machine has {_gib(available)} "
                           f"available, about {available // max(row_bytes, 1)} rows: "
                           f"lower memory.memory_size to fit (leave room for the trainer "
                           f"itself), or train on a machine with more memory"]) from None
    available = psutil.virtual_memory().available
    # the pages come as the ring fills: the system would kill the trainer then, without a word
    if need > available:
        log.warning("memory.memory_size %d needs %s for the replay memory (%d bytes per row), more "
                    "than the %s this machine has available: the trainer will be killed as the "
                    "memory fills, unless memory is freed by then; lower memory.memory_size to "
                    "about %d rows to be sure", memory_size, _gib(need), row_bytes,
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
        sample_preprocessor: data augmentation, ``f(obs, act, rew, next_obs, terminated,
            truncated)`` returning the same tuple; applied to each item (base class) or to each
            batch (:class:`ReplayMemory`). It must return new arrays rather than change its
            inputs: the batched memories pass read-only views (their buffers are reused, and a
            frame-stack memory's obs and next_obs share frames), so ``obs[:] = 0`` raises; write
            ``obs = np.zeros_like(obs)`` instead.
        memory_size: capacity in rows, not transitions. Every row a worker sends takes a slot,
            including the rows that end no transition: each episode's reset row and the context rows
            repeated at the start of every packet (the pipeline's ``overlap``). So a full memory
            holds fewer than ``memory_size`` transitions: e.g. about 950 of 1000 with 20-row packets
            and overlap 1, 830 with overlap 4 (frame stacks) and 740 with overlap 7.
        batch_size: transitions per batch.
        dataset_path: optional ``.npz`` file of samples to start from, written by
            :func:`save_dataset` (see :meth:`load_dataset`). Unlike tmrl, not a folder
            holding a pickled ``data.pkl``.

    ``ring_storage``: where :func:`allocate_ring` puts the columns of the memories that store rows
    in a ring (ReplayMemory, HistoryMemory and those built on them): None, RAM; a
    :class:`~netrl.memory.disk.DiskRing`, memory-mapped files (``memory.storage`` disk).

    ``obs_transform`` (an attribute, None by default): a callable applied to a batch's ``obs`` and
    ``next_obs`` (trees of tensors on ``device``) after they are gathered, before the batch is
    returned, so the memory keeps the observations as they arrived. The trainer sets it to its
    observation normaliser (``env.normalize_obs``).
    """

    # a class attribute: tmrl memories skip our __init__ too
    obs_transform: Callable[[Any], Any] | None = None
    ring_storage: DiskRing | None = None

    def __init__(self, device: str | torch.device = "cpu", nb_steps: int = 1, obs_preprocessor: Callable[..., Any]
                 | None = None, sample_preprocessor: Callable[..., Any] | None = None,
                 memory_size: int = DEFAULT_MEMORY_SIZE, batch_size: int = DEFAULT_BATCH_SIZE, dataset_path: str = "",
                 seed: int | None = None, ring_storage: DiskRing | None = None) -> None:
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
        self.ring_storage = ring_storage  # before a dataset is loaded into the ring
        self.data: Any = []  # tmrl memories keep their storage here
        if dataset_path:
            self.load_dataset(dataset_path)

    @abstractmethod
    def append_buffer(self, buffer: Buffer) -> None:
        """Store a packet of rows (see :mod:`netrl.samples` for their meaning) and
        trim to ``memory_size``."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of items ``get_transition`` accepts: it is called
        with ``0 <= item < len(self)``."""

    @abstractmethod
    def get_transition(self, item: int) -> Transition:
        """``(last_obs, new_act, rew, new_obs, terminated, truncated,
        info)`` with the observations as stored.

        This generic :meth:`sample` applies ``obs_preprocessor`` to what this returns, so a
        memory that stores observations as the env produced them (tmrl's) must not apply it here.
        :class:`ReplayMemory` applies it once per row on append instead, so its ``get_transition``
        returns preprocessed observations (and its own ``sample`` does not apply it again).
        """

    def sample_indices(self) -> np.ndarray:
        return self.rng.integers(0, len(self), size=self.batch_size)

    def keep_batches(self, count: int, pinned: bool = False) -> bool:
        """Whether a batch from :meth:`sample` can stay valid through the ``count - 1`` calls after
        it; a memory that says True then keeps it so (and gathers into page-locked host memory
        with ``pinned``, for copies to a CUDA device that do not block). The training loop asks
        with ``count`` 2 to gather batch k+1 while the agent trains on batch k, and copies each
        batch of a memory that says False. This generic :meth:`sample` builds new tensors every
        call, so it keeps them all; a subclass with its own ``sample`` must say what it does."""
        return type(self).sample is MemoryDataloading.sample

    def batch_workers(self) -> list[str] | None:
        """The workers whose samples were in the batch :meth:`sample` returned last, or None
        when this memory does not keep track (the training loop then names the workers whose
        packets it stored lately)."""
        return None

    # Each row's worker (netrl.memory.owners): the memories netrl ships keep track; one ported
    # from tmrl does not, and says so.
    def rows_of(self, worker: str) -> int:
        """The rows of ``worker`` this memory holds."""
        raise NotImplementedError(_untracked(self, "rows_of"))

    def drop_worker(self, worker: str) -> int:
        """Take ``worker``'s rows out of sampling for good; returns how many."""
        raise NotImplementedError(_untracked(self, "drop_worker"))

    def set_quarantined(self, worker: str, flag: bool) -> int:
        """Keep ``worker``'s rows but never sample them while ``flag`` is on; returns the rows
        whose state changed."""
        raise NotImplementedError(_untracked(self, "set_quarantined"))

    def sample(self) -> Batch:
        """One batch on ``self.device``. This generic version calls ``get_transition`` per item."""
        items = []
        for item in self.sample_indices():
            transition = self.get_transition(int(item))
            if len(transition) != 7:
                raise TypeError(f"{type(self).__name__}.get_transition must return 7 values, "
                                f"(last_obs, new_act, rew, new_obs, terminated, truncated, "
                                f"info); it returned {len(transition)}. tmrl before 0.5 (and its "
                                f"older tutorial) returned 6, (last_obs, new_act, rew, new_obs, "
                                f"done, info): return terminated (the episode ended) and truncated "
                                f"(it was cut short, e.g. by a time limit) instead of done")
            o, a, r, o2, term, trunc, _info = transition
            if self.obs_preprocessor is not None:
                o, o2 = self.obs_preprocessor(o), self.obs_preprocessor(o2)
            if self.sample_preprocessor is not None:
                o, a, r, o2, term, trunc = self.sample_preprocessor(o, a, r, o2, term, trunc)
            items.append((o, a, np.float32(r), o2, np.float32(term), np.float32(trunc)))
        o, a, r, o2, term, trunc = collate(items, self.device)
        if self.obs_transform is not None:
            o, o2 = self.obs_transform(o), self.obs_transform(o2)
        # float64 actions (Python floats) train as float32; integer ones (Discrete) stay integers
        return Batch(o, a.float() if a.is_floating_point() else a, r.float(), o2, term.float(), trunc.float())

    def __iter__(self) -> Iterator[Batch]:
        for _ in range(self.nb_steps):
            yield self.sample()

    def load_dataset(self, path: str | os.PathLike[str]) -> None:
        """Append an ``.npz`` dataset written by :func:`save_dataset` (arrays only, never pickles).

        Raises FileNotFoundError if ``path`` does not exist and ValueError if it is a folder
        (tmrl's layout) or not an ``.npz`` archive of sample columns (a pickle such as tmrl's
        ``data.pkl``, an ``.npy`` file...). Floating-point ``act`` and ``obs`` columns are stored as
        float32, whatever the file holds (rows built from Python floats are float64), as the agents
        train in float32 and workers send float32.
        """
        self.append_buffer(read_dataset(path))


def _untracked(memory: MemoryDataloading, what: str) -> str:
    return (f"{type(memory).__name__} does not keep each row's worker, so {what} cannot be done: "
            f"derive it from netrl's ReplayMemory or HistoryMemory (netrl.memory.owners)")


def _check_sample_preprocessor(fn: Callable[..., Any]) -> None:
    """Raise TypeError unless ``fn`` takes netrl's six arguments."""
    if not callable(fn):
        raise TypeError(f"sample_preprocessor must be a function or None (got {type(fn).__name__})")
    if not takes_args(fn, 6):
        raise TypeError(f"sample_preprocessor {getattr(fn, '__name__', fn)!r} must take 6 "
                        f"arguments, (obs, act, rew, next_obs, terminated, truncated), and "
                        f"return them in that order. tmrl's older 5-argument form, (obs, act, "
                        f"rew, next_obs, done), must split done into terminated (the episode "
                        f"ended) and truncated (it was cut short, e.g. by a time limit)")
