"""Ring columns in memory-mapped files (``memory.storage`` disk), for a replay larger than RAM.

:class:`DiskRing` is what :func:`~netrl.memory.base.allocate_ring` is given when a memory's
columns go to disk: every column of at least :data:`DISK_ROW_BYTES` bytes per row (observations,
camera frames above all) becomes a numpy array over a shared memory map of its own file in
``folder``; the small columns (actions, rewards, flags, the rows' worker and version) stay in RAM,
a few bytes a row. The memories index these arrays as they index RAM ones, and write rows into
them so; they gather a batch's rows through :meth:`DiskRing.gather`, which reads them with
``preadv``, a call per run of consecutive rows, into the batch's buffer.

The files::

    <folder>/LOCK             one live memory per folder (netrl.storage.folderlock)
    <folder>/<column>.ring    one per column, its blocks reserved when it is made (fallocate)

Files left by a process that crashed are truncated and reused by the next memory on the folder;
:meth:`DiskRing.close` (the trainer's close, or the process's exit) removes them. Nothing in them
is needed for a restart: the trainer rebuilds its memory from the sample log, as with RAM.

Resident memory. The pages of a file that this process touches through its map are mapped into
it and count in its resident set (RssFile), up to the whole file. Batches are therefore read with
``preadv``, from the page cache, without mapping a page: on this project's VM a page fault costs
about 12 us, and a batch of 256 stacks of 84x84 frames took 3-5 ms through the map against 1 ms
from RAM. Rows written do map their pages, so a thread of each DiskRing
reads the process's RssFile every :data:`TRIM_INTERVAL_S` and, ``resident_bytes`` past what it was
when the files were mapped (the libraries' pages), unmaps
the pages (``madvise(MADV_DONTNEED)``): for a shared file mapping, the pages stay in the page
cache (written ones are written back as usual), and the next read maps them again (a minor fault,
no disk read while the page cache holds them). The sampling code itself is unchanged.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import shutil
import threading
import weakref
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from netrl.errors import ConfigError
from netrl.storage.folderlock import FolderLock

__all__ = [
    "DEFAULT_RESIDENT_MIB",
    "DISK_ROW_BYTES",
    "TRIM_INTERVAL_S",
    "DiskRing",
    "close_ring_storage",
    "disk_ring",
    "file_rss",
]

log = logging.getLogger(__name__)

DISK_ROW_BYTES = 64  # a column of fewer bytes per row stays in RAM (2M rows of 8 bytes: 16 MB)
# file pages kept mapped before they are unmapped (memory.storage_resident_mib)
DEFAULT_RESIDENT_MIB = 1024
TRIM_INTERVAL_S = 0.05  # between reads of RssFile: rows written at 1 GB/s add 50 MB
SUFFIX = ".ring"
_PREADV = hasattr(os, "preadv")

Rows = dict[str, tuple[tuple[int, ...], Any]]  # column name -> (per-row shape, numpy dtype)


def file_rss() -> int | None:
    """This process's resident file-backed and shared pages in bytes (``/proc/self/statm``'s third
    field: RssFile + RssShmem), None where there is no /proc (not Linux)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[2]) * mmap.PAGESIZE
    except (OSError, IndexError, ValueError):
        return None


class DiskRing:
    """Where a memory's ring columns go on disk: ``folder`` (created if missing), locked at once,
    so that a second memory on it is refused (FolderInUse names the folder and its holder).

    ``resident_bytes`` bounds the file pages kept mapped (module docstring); 0: no bound (the
    pages are unmapped only as the kernel sees fit). Call :meth:`close` when done (idempotent);
    the process's exit does it too.
    """

    def __init__(
        self, folder: str | os.PathLike[str], resident_bytes: int = DEFAULT_RESIDENT_MIB * 2**20
    ) -> None:
        if resident_bytes < 0:
            raise ValueError(f"resident_bytes must be >= 0 (got {resident_bytes})")
        self.folder = Path(folder)
        self.resident_bytes = resident_bytes
        self._lock = FolderLock(
            self.folder,
            "replay memory folder",
            "give each trainer its own memory.storage_folder (by default "
            "<run folder>/replay, so each run its own), or stop the other one",
        )
        self._lock.acquire()
        self.paths: list[Path] = []
        self._maps: list[mmap.mmap] = []
        self._fds: list[int] = []  # one per file, for preadv
        self._columns: dict[int, tuple[np.ndarray, int, int]] = {}  # id -> (column, fd, row bytes)
        self.trims = 0  # times the mapped pages were unmapped
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # the files go when the process ends without close() (not when it is killed: the next
        # memory on the folder then reuses them)
        self._finalizer = weakref.finalize(
            self, _remove, self.paths, self._fds, self._lock, self._stop, os.getpid()
        )

    def allocate(self, memory_size: int, rows: Rows) -> dict[str, np.ndarray]:
        """Zeroed columns of ``memory_size`` rows: arrays over files for the columns of more
        than one value per row, RAM arrays for the others. ConfigError with the bytes needed
        when the folder's disk has no room for the files. The files' blocks are reserved now
        (``posix_fallocate``, no bytes written), so a disk that fills later cannot fail a write
        into the map (SIGBUS, the trainer gone); where the file system cannot reserve, they stay
        sparse and a warning says so. Each call replaces the files of the one before (a
        memory allocates again when its first packet was refused)."""
        on_disk = {
            n: s
            for n, s in rows.items()
            if memory_size and _nbytes(memory_size, s) >= DISK_ROW_BYTES * memory_size
        }
        need = sum(_nbytes(memory_size, s) for s in on_disk.values())
        self._maps.clear()
        self.paths.clear()
        self._columns.clear()
        _close_fds(self._fds)
        for stale in self.folder.glob(f"*{SUFFIX}"):  # a crashed run's, or ours: reused
            stale.unlink()
        free = shutil.disk_usage(self.folder).free
        if need > free:
            row_bytes = need // max(memory_size, 1)
            raise ConfigError(
                [
                    f"memory.storage is disk: the replay memory needs {need:,} bytes "
                    f"({_size(need)}, {row_bytes:,} bytes per row) for "
                    f"memory.memory_size {memory_size} rows in {self.folder}, and "
                    f"its disk has {free:,} bytes free, about {free // max(row_bytes, 1):,} "
                    f"rows: lower memory.memory_size, or set memory.storage_folder to "
                    f"a disk with room"
                ]
            )
        log.info(
            "replay memory on disk in %s: %d columns, %s for %d rows (blocks reserved), "
            "resident file pages kept under %s",
            self.folder,
            len(on_disk),
            _size(need),
            memory_size,
            _size(self.resident_bytes) if self.resident_bytes else "no bound",
        )
        ring = {
            name: np.zeros((memory_size, *shape), dtype)
            for name, (shape, dtype) in rows.items()
            if name not in on_disk
        }
        for name, (shape, dtype) in on_disk.items():
            ring[name] = self._mapped(name, (memory_size, *shape), np.dtype(dtype))
        base = file_rss()
        if self.resident_bytes and self._thread is None and base is not None:
            # the libraries' file pages (torch's alone: 200 MB) count in RssFile too
            self._thread = threading.Thread(
                target=_trim_loop,
                name="netrl-replay-trim",
                daemon=True,
                args=(weakref.ref(self), self._stop, base + self.resident_bytes),
            )
            self._thread.start()
        return {name: ring[name] for name in rows}  # in the order asked

    def _mapped(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        path = self.folder / f"{quote(name, safe='')}{SUFFIX}"
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._fds.append(fd)
        os.ftruncate(fd, size)
        _reserve(fd, size, path)
        mapped = mmap.mmap(fd, size)
        self.paths.append(path)
        self._maps.append(mapped)
        column = np.frombuffer(mapped, dtype).reshape(shape)
        self._columns[id(column)] = (column, fd, size // shape[0])
        return column

    def gather(self, col: np.ndarray, idx: np.ndarray, out: np.ndarray) -> bool:
        """``out[...] = col[idx]`` read from the file with ``preadv`` if ``col`` is one of these
        files' columns (True), without mapping its pages; False (nothing done) for any other
        array. ``out`` is C-contiguous, of ``col``'s dtype and shape
        ``(*idx.shape, *col.shape[1:])`` (the memories' gather buffers)."""
        known = self._columns.get(id(col))
        if known is None or known[0] is not col or not out.flags.c_contiguous or not _PREADV:
            return False  # (a non-contiguous out would be read into a copy; no preadv: Windows)
        _, fd, row = known
        flat = idx.reshape(-1)
        if flat.size == 0:
            return True
        # runs of consecutive rows, one read each: a frame stack and its next frame are one run
        cuts = (np.flatnonzero(np.diff(flat) != 1) + 1).tolist()
        starts, first = [0, *cuts], flat.tolist()
        into = out.reshape(-1).view(np.uint8).data  # a memoryview of the buffer
        for start, end in zip(starts, [*cuts, flat.size], strict=True):
            got = os.preadv(fd, [into[start * row : end * row]], first[start] * row)
            if got != (end - start) * row:
                raise IndexError(
                    f"rows {first[start]}..{first[end - 1]} are not all within the "
                    f"{col.shape[0]} rows of this column"
                )
        return True

    def trim(self) -> None:
        """Unmap every mapped page of the files (they stay in the page cache)."""
        for mapped in list(self._maps):
            mapped.madvise(mmap.MADV_DONTNEED)
        self.trims += 1

    def close(self) -> None:
        """Stop trimming, remove the files and let the folder go. Idempotent. The arrays stay
        readable while referenced (an unlinked file lives until its maps are gone)."""
        self._columns.clear()  # before their files are closed: gather() no longer reads them
        self._finalizer()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:,.1f} MiB"


def _nbytes(memory_size: int, spec: tuple[tuple[int, ...], Any]) -> int:
    shape, dtype = spec
    return memory_size * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _reserve(fd: int, size: int, path: Path) -> None:
    """Reserve ``size`` bytes of blocks for ``fd``: ConfigError if the disk has no room left (it
    filled since the check), a warning where the file system cannot (the file stays sparse)."""
    reserve = getattr(os, "posix_fallocate", None)  # none on macOS and Windows
    try:
        if reserve is None:
            raise OSError(errno.EOPNOTSUPP, "no posix_fallocate on this system")
        reserve(fd, 0, size)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise ConfigError([f"memory.storage is disk: {path} could not reserve {size:,} bytes, "
                               f"its disk is full: set memory.storage_folder to a disk with room, "
                               f"or lower memory.memory_size"]) from None
        log.warning("replay memory on disk: %s stays sparse, its blocks could not be reserved "
                    "(%s): if its disk fills up, a write into it kills the trainer (SIGBUS)",
                    path, e)


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    fds.clear()


def _remove(
    paths: list[Path], fds: list[int], lock: FolderLock, stop: threading.Event, owner: int
) -> None:
    if os.getpid() != owner:  # a forked child that exits normally: the files are its parent's
        return
    stop.set()
    _close_fds(fds)
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    lock.release()


def _trim_loop(ring: weakref.ref[DiskRing], stop: threading.Event, limit: int) -> None:
    while not stop.wait(TRIM_INTERVAL_S):
        owner = ring()
        if owner is None:
            return
        rss = file_rss()
        if rss is not None and rss > limit:
            try:
                owner.trim()
            except (OSError, ValueError) as exc:  # ValueError: a map closed under us
                log.warning(
                    "could not unmap the replay memory's file pages (%s): resident memory "
                    "now grows with the pages read",
                    exc,
                )
                return
        del owner  # no reference kept while waiting: the ring can be collected


def disk_ring(
    storage: str,
    folder: str | None,
    memory_device: str,
    memory_name: str,
    takes: set[str] | None,
    resident_mib: int = DEFAULT_RESIDENT_MIB,
) -> DiskRing:
    """The :class:`DiskRing` that ``memory.storage`` asks for, for a ``memory_name`` whose
    ``__init__`` takes the keywords ``takes`` (None: any); ConfigError naming the keys that
    rule it out."""
    if storage != "disk":
        raise ConfigError([f'memory.storage must be "ram" or "disk" (got "{storage}")'])
    if memory_device != "cpu":
        raise ConfigError(
            [
                f'memory.storage "disk" with memory.device "{memory_device}": the '
                f"columns live either in files or on the device; set memory.device "
                f'to "cpu" or memory.storage to "ram"'
            ]
        )
    if not folder:
        raise ValueError(
            'memory_storage "disk" needs memory_folder, the folder of the column '
            "files (config.json: memory.storage_folder, by default the run "
            "folder's replay/)"
        )
    if takes is not None and "ring_storage" not in takes:
        raise ConfigError(
            [
                f'memory.storage is "disk", but {memory_name}.__init__ takes no '
                f"ring_storage argument: only the memories that keep rows in ring "
                f"columns (ReplayMemory, HistoryMemory and those built on them) "
                f'keep them on disk; set memory.storage to "ram"'
            ]
        )
    return DiskRing(folder, resident_mib * 2**20)


def close_ring_storage(memory: Any) -> None:
    """Close ``memory``'s :class:`DiskRing`, if it has one (the trainer's close)."""
    storage = getattr(memory, "ring_storage", None)
    if isinstance(storage, DiskRing):
        storage.close()
