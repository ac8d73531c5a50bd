"""One live process per run folder or spool folder.

Two trainers appending to one sample log, or two servers to one spool, interleave their records
and corrupt them for every later restart. Each role therefore holds an exclusive lock on
``<folder>/LOCK`` while it runs: an OS file lock (``flock`` on POSIX, ``msvcrt.locking`` on
Windows), which the kernel releases when the process ends, so a crash never leaves a stale lock
behind. The file holds the holder's pid, for the error the next process gets (on POSIX; Windows does
not let another process read the locked byte). A child forked without exec (multiprocessing, an
env's helper process) drops its copies of the held locks at once, so that it never keeps
one after its parent is gone.
"""

from __future__ import annotations

import errno
import os
import sys
import weakref
from pathlib import Path

from netrl.errors import FolderInUse, NetrlError

__all__ = ["FolderLock", "make_folder", "sync_folder"]

LOCK_NAME = "LOCK"


class FolderLock:
    """An exclusive lock on ``folder`` (created if missing). ``what`` names the folder in
    errors ("run folder"); ``fix`` says what to do when another process holds it.
    Another lock ``name`` than ``LOCK`` locks something else in the folder (a worker's
    name, :mod:`netrl.worker.names`)."""

    def __init__(self, folder: str | Path, what: str, fix: str, name: str = LOCK_NAME) -> None:
        self.path = Path(folder) / name
        self.what, self.fix = what, fix
        # the pid of the process holding it, after acquire() raised FolderInUse
        # ("unknown" if unread)
        self.holder = ""
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise FolderInUse naming the process that holds it. Idempotent."""
        if self._fd is not None:
            return
        make_folder(self.path.parent, self.what)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise NetrlError(f"cannot lock the {self.what} {self.path.parent}: {exc}; "
                             f"make the folder writable, or choose another") from None
        try:
            _lock(fd)
        except OSError as exc:
            if exc.errno not in _HELD_ELSEWHERE:  # e.g. ENOLCK: a network file system without locks
                os.close(fd)
                raise NetrlError(f"cannot lock the {self.what} {self.path.parent}: "
                                 f"{exc}; its file system may not support file "
                                 f"locks: choose a folder on a local disk") from None
            try:
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            except OSError:  # Windows: the holder's locked byte cannot be read
                holder = "unknown"
            os.close(fd)
            self.holder = holder
            # e.g. a notebook's second Trainer on the folder of one not closed
            if holder == str(os.getpid()):
                raise FolderInUse(f"the {self.what} {self.path.parent} is in use by this "
                                  f"process (pid {holder}), by an object not closed yet "
                                  f"(close() it first); otherwise {self.fix}") from None
            raise FolderInUse(f"the {self.what} {self.path.parent} is in use by "
                              f"another process (pid {holder}): {self.fix}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        _held.add(self)

    def release(self) -> None:
        """Let the folder go (closing the file releases the lock; the file stays). Idempotent."""
        if self._fd is not None:
            _unlock(self._fd)
            os.close(self._fd)
            self._fd = None
            _held.discard(self)


_held: weakref.WeakSet[FolderLock] = weakref.WeakSet()  # the locks this process holds


def _drop_in_child() -> None:
    """In a forked child: close its copies of the parent's lock files, which would otherwise keep
    the parent's locks (a flock belongs to the open file, which fork shares) after the parent ends.
    The parent's locks are unchanged."""
    for lock in list(_held):
        if lock._fd is not None:
            os.close(lock._fd)
            lock._fd = None
    _held.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_drop_in_child)


def make_folder(folder: Path, what: str) -> None:
    """Create ``folder`` (and its parents) if missing; NetrlError names the file in
    the way, or the OS error."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        why = (f"{blocker} is a file, not a folder: move it away, or "
               f"choose another folder" if blocker is not None
               else str(exc))
        raise NetrlError(f"cannot use {folder} as the {what}: {why}") from None


if sys.platform == "win32":  # pragma: no cover - Windows only
    import msvcrt

    # what msvcrt.locking raises for a byte another process locked
    _HELD_ELSEWHERE = {errno.EACCES, errno.EDEADLK}

    def _lock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # the first byte: enough to exclude another holder

    # Windows may release a lock some time after its file is closed: unlock first
    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    # flock's "would block": another open file holds the lock
    _HELD_ELSEWHERE = {errno.EAGAIN, errno.EWOULDBLOCK}

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(fd: int) -> None:  # closing the file releases a flock
        pass


def sync_folder(folder: Path) -> None:
    """Make the files created, renamed or removed in ``folder`` survive a power cut: the names
    live in the folder, and fsync of a file does not write its folder (POSIX)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
