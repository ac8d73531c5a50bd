"""One live process per run folder or spool folder.

Two trainers appending to one sample log, or two servers to one spool, interleave their records and corrupt them
for every later restart. Each role therefore holds an exclusive lock on ``<folder>/LOCK`` while it runs: an OS
file lock (``flock`` on POSIX, ``msvcrt.locking`` on Windows), which the kernel releases when the process ends, so
a crash never leaves a stale lock behind. The file holds the holder's pid, for the error the next process gets.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from netrl.errors import FolderInUse, NetrlError

__all__ = ["FolderLock", "make_folder"]

LOCK_NAME = "LOCK"


class FolderLock:
    """An exclusive lock on ``folder`` (created if missing). ``what`` names the folder in errors ("run folder");
    ``fix`` says what to do when another process holds it. Another lock ``name`` than ``LOCK`` locks something else
    in the folder (a worker's name, :mod:`netrl.worker_names`)."""

    def __init__(self, folder: str | Path, what: str, fix: str, name: str = LOCK_NAME) -> None:
        self.path = Path(folder) / name
        self.what, self.fix = what, fix
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise FolderInUse naming the process that holds it. Idempotent."""
        if self._fd is not None:
            return
        make_folder(self.path.parent, self.what)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise NetrlError(f"cannot lock the {self.what} {self.path.parent}: {exc}") from None
        try:
            _lock(fd)
        except OSError:
            try:
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            except OSError:  # Windows: the holder's locked byte cannot be read
                holder = "unknown"
            os.close(fd)
            raise FolderInUse(f"the {self.what} {self.path.parent} is in use by another process (pid {holder}): "
                              f"{self.fix}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Let the folder go (closing the file releases the lock; the file stays). Idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def make_folder(folder: Path, what: str) -> None:
    """Create ``folder`` (and its parents) if missing; NetrlError names the file in the way, or the OS error."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        why = (f"{blocker} is a file, not a folder: move it away, or choose another folder" if blocker is not None
               else str(exc))
        raise NetrlError(f"cannot use {folder} as the {what}: {why}") from None


if sys.platform == "win32":  # pragma: no cover - Windows only
    import msvcrt

    def _lock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # the first byte: enough to exclude another holder
else:
    import fcntl

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
