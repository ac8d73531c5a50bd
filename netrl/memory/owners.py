"""Who wrote each row of a ring memory: rows per worker, a worker's rows dropped or quarantined.

A ring memory (:class:`~netrl.memory.replay.ReplayMemory`,
:class:`~netrl.memory.history.HistoryMemory` and their subclasses) keeps each row's worker as a
small integer in its ``worker`` column and, in ``sent``, the value its sampling column (``end``,
or ``need``) had when the row arrived. The public face, the same on every memory that keeps
track (:class:`OwnedRows`)::

    memory.rows_of("w1")                 # rows of w1 the memory holds (sampleable or not)
    memory.worker_rows()                 # {worker: rows} for every worker holding some
    memory.rows_after("w1", 200)         # w1's rows once a 200-row packet of its is stored
    memory.set_quarantined("w1", True)   # its rows (and new ones) kept but never sampled
    memory.drop_worker("w1")             # its rows out of sampling for good; returns how many

Quarantine and drop change only the sampling column of the worker's rows (``end`` becomes False,
``need`` NEVER), so sampling costs what it did: draws never see them. Lifting a quarantine restores
the values ``sent`` kept. A dropped row keeps its slot until the ring overwrites it, but belongs to
no worker (id -1): it no longer counts against anyone's share.

A worker is its name, as its peer name (and CURVE key, with per-worker keys) gives it: the trainer
sees each packet's worker as ``name/session``, and a restarted worker starts a new session, so
rows are counted, quarantined and dropped by name (:func:`worker_key`), whichever the caller gives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netrl.memory.base import WorkerIds

__all__ = ["DROPPED", "OwnedRows", "worker_key"]

DROPPED = -1  # the worker id of a dropped row


def worker_key(worker: str) -> str:
    """The worker a packet's ``worker`` (``name/session``) or a name stands for: its name."""
    return worker.split("/", 1)[0]


class OwnedRows:
    """Mixin for a ring memory (module docstring). The memory calls :meth:`_owned_init` in its
    ``__init__``, :meth:`_owned_columns` on each packet before writing it and :meth:`_owned_written`
    once it is written, and implements :meth:`_sampling_changed`."""

    _cols: dict[str, Any]
    _size: int
    _pos: int
    _ends: int
    memory_size: int
    _SAMPLING: str  # the column that says which rows end a sampleable transition
    _NONE: Any  # its value for a row that ends none

    def _owned_init(self) -> None:
        self._workers = WorkerIds()  # the worker column's ids: name/session, as batch_workers tells
        self._keys = WorkerIds()  # names (worker_key)
        self._key_of = np.zeros(0, np.int64)  # worker column id -> name id
        self._ids_of: list[list[int]] = []  # name id -> its worker column ids (one a session)
        self._counts = np.zeros(0, np.int64)  # rows held, per name id
        self._held: set[int] = set()  # quarantined name ids

    def _key_id(self, worker: str) -> int:
        """``worker``'s name id, registered on first sight."""
        k = self._keys.id_of(worker_key(worker))
        if k is not None:
            return k
        self._keys.column(worker_key(worker), 0)
        k = len(self._keys.names) - 1
        self._ids_of.append([])
        if len(self._counts) <= k:
            self._counts = np.concatenate([self._counts, np.zeros(k + 1 - len(self._counts), np.int64)])
        return k

    def _owned_columns(self, name: str, columns: dict[str, np.ndarray], n: int) -> None:
        """Add a packet's ``worker`` and ``sent`` columns, and hide its rows when ``name`` is
        quarantined."""
        columns["worker"] = ids = self._workers.column(name, n)
        i, k = int(ids[0]), self._key_id(name)
        if len(self._key_of) <= i:
            self._key_of = np.concatenate([self._key_of, np.zeros(i + 1 - len(self._key_of), np.int64)])
        if i not in self._ids_of[k]:
            self._key_of[i] = k
            self._ids_of[k].append(i)
        columns["sent"] = columns[self._SAMPLING].copy()
        if k in self._held:
            columns[self._SAMPLING] = np.full_like(columns["sent"], self._NONE)

    def _owned_written(self, new: np.ndarray, evicted: np.ndarray) -> None:
        """Count the rows of ``new`` (their worker ids) in, those of ``evicted`` out."""
        self._counts[self._key_of[int(new[0])]] += len(new)
        if len(evicted):
            names = self._key_of[evicted[evicted != DROPPED]]
            self._counts -= np.bincount(names, minlength=len(self._counts))

    def _sampling_changed(self, rows: np.ndarray, now: np.ndarray) -> None:
        """Rows ``rows`` of the sampling column now hold ``now`` (already written): the memory
        updates what it derives from them (counts, cached orders, priorities)."""
        raise NotImplementedError

    # -- the public face ---------------------------------------------------------------------------
    def rows_of(self, worker: str) -> int:
        """The rows of ``worker`` (a name, or a packet's ``name/session``: every session of that
        name) the memory holds, sampleable or not; 0 for a worker it never saw."""
        k = self._keys.id_of(worker_key(worker))
        return 0 if k is None else int(self._counts[k])

    def worker_rows(self) -> dict[str, int]:
        """Rows held per worker name, for every worker holding some."""
        return {self._keys.names[k]: int(c) for k, c in enumerate(self._counts) if c > 0}

    def workers_holding(self) -> int:
        """How many workers hold rows."""
        return int(np.count_nonzero(self._counts))

    def rows_after(self, worker: str, rows: int) -> int:
        """The rows ``worker`` would hold once ``rows`` more of its rows are stored: the ring
        overwrites its oldest rows, some of them perhaps ``worker``'s own."""
        have = self.rows_of(worker)
        rows = min(rows, self.memory_size)
        over = self._size + rows - self.memory_size  # rows the ring would overwrite
        if over <= 0 or have == 0:
            return have + rows
        start = self._pos if self._size == self.memory_size else 0
        col = self._cols["worker"]
        ids = col[start:start + over]  # the oldest rows, in at most two slices (the ring wraps)
        if len(ids) < over:
            ids = np.concatenate([ids, col[: over - len(ids)]])
        return have + rows - len(self._rows_of_key(self._key_id(worker), ids))

    def set_quarantined(self, worker: str, flag: bool) -> int:
        """Quarantine ``worker`` (``flag`` True): its rows stay, and count against its share,
        but no batch draws them, nor the rows it sends while quarantined; False lifts it, and its
        rows still stored are drawn again. Returns the rows of ``worker`` whose state changed."""
        k = self._key_id(worker)  # a worker not seen yet is quarantined from its first row
        if flag == (k in self._held):
            return 0
        (self._held.add if flag else self._held.discard)(k)
        if not self._cols:  # no row stored yet: the flag alone keeps its rows out
            return 0
        rows = self._stored_rows_of(k)
        if flag:
            self._set_sampling(rows, np.full(len(rows), self._NONE, self._cols[self._SAMPLING].dtype))
        else:
            self._set_sampling(rows, self._cols["sent"][rows])
        return len(rows)

    def quarantined(self) -> list[str]:
        """The workers quarantined now, sorted."""
        return sorted(self._keys.names[k] for k in self._held)

    def drop_worker(self, worker: str) -> int:
        """Take every row of ``worker`` the memory holds out of sampling for good (a revoked
        key's): they no longer count as its rows, and the ring overwrites them in turn. Rows it
        sends later are stored as usual (refusing them is the server's part). Returns how many
        rows were dropped."""
        k = self._keys.id_of(worker_key(worker))
        if k is None or not self._cols:
            return 0
        rows = self._stored_rows_of(k)
        none = np.full(len(rows), self._NONE, self._cols[self._SAMPLING].dtype)
        self._cols["sent"][rows] = none
        self._set_sampling(rows, none)
        self._cols["worker"][rows] = DROPPED
        self._counts[k] = 0
        return len(rows)

    def _rows_of_key(self, k: int, ids: np.ndarray) -> np.ndarray:
        """Where worker name ``k``'s rows are among the worker column ids ``ids``."""
        mine = self._ids_of[k]
        if not mine:
            return np.zeros(0, np.int64)
        # one session, as a rule: a comparison, not np.isin (a check made for every packet)
        return np.flatnonzero(ids == mine[0] if len(mine) == 1 else np.isin(ids, mine))

    def _stored_rows_of(self, k: int) -> np.ndarray:
        if not self._cols:
            return np.zeros(0, np.int64)
        # the first _size slots: the ring fills in order
        return self._rows_of_key(k, self._cols["worker"][: self._size])

    def _set_sampling(self, rows: np.ndarray, values: np.ndarray) -> None:
        col = self._cols[self._SAMPLING]
        self._ends -= int(np.count_nonzero(col[rows] != self._NONE))
        col[rows] = values
        self._ends += int(np.count_nonzero(values != self._NONE))
        self._sampling_changed(rows, values)
