"""Worker names: what a worker calls itself when config.json does not say, and
one running worker per name.

A worker's name picks its files in the run folder (``episodes_<name>.csv``,
``worker_policy_<name>.pt``) and is how the server's logs and status table know it. Started from
config.json without ``worker.worker_id``, a worker takes its machine's host name, so that after a
restart it continues its own CSV (one learning curve in ``--plot``, not one per run) and starts
from the weights it saved last. Further workers on the same machine and run folder take the lowest
free of ``<host>-2``, ``<host>-3``...: each holds a lock on ``<run folder>/worker_<name>.lock``
while it runs, which the OS releases when it ends, crash or not. One worker per machine therefore
always gets its name back; with more, a restarted one takes the lowest name free at that moment. A
name given in config.json or by ``--worker-id`` is locked the same way, and a second worker
given it is refused. Where the run folder cannot hold locks (read-only, or a file system without
them), the worker warns and runs under its name unlocked.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path

from netrl.errors import FolderInUse, NetrlError
from netrl.protocol.messages import PEER_NAME
from netrl.storage.folderlock import FolderLock, make_folder

__all__ = ["MAX_WORKERS_PER_HOST", "claim_worker_id", "default_worker_id", "host_name"]

log = logging.getLogger(__name__)

MAX_WORKERS_PER_HOST = 1000  # default names tried, <host> to <host>-1000, before giving up


def host_name() -> str:
    """This machine's host name as a valid worker name (:data:`netrl.protocol.messages.PEER_NAME`):
    other characters become '-', and a long one is cut to 64 characters."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).lstrip("._-") or "worker"
    return host[:64]


def default_worker_id() -> str:
    """``<host>-<pid>``: the name of a RolloutWorker built in Python without one (it has no run
    folder to lock a name in, so the process id keeps two on one machine apart)."""
    pid = str(os.getpid())
    return f"{host_name()[:63 - len(pid)]}-{pid}"


def claim_worker_id(run_dir: Path, worker_id: str | None) -> tuple[str, FolderLock | None]:
    """The name this worker runs under, and the lock that keeps it its own until released (None: the
    run folder cannot hold one). See the module's text.

    Raises FolderInUse when ``worker_id`` is given and another running worker
    holds it in ``run_dir``."""
    fix = ("give each worker on this machine its own --worker-id (config.json: "
           "worker.worker_id), or leave it out: each worker then takes a name of its own")
    host = host_name()
    names = [worker_id] if worker_id is not None else [
        host if n == 1 else f"{host[:64 - len(str(n)) - 1]}-{n}" for n in range(1, MAX_WORKERS_PER_HOST + 1)]
    taken: list[str] = []
    for name in names:
        assert PEER_NAME.fullmatch(name), name
        lock = FolderLock(run_dir, f"worker name {name!r} in the run folder", fix, name=f"worker_{name}.lock")
        try:
            make_folder(run_dir, "run folder")
            lock.acquire()
        except FolderInUse:
            if worker_id is not None:
                raise
            taken.append(f"{name} (pid {lock.holder})")
            continue
        # no lock here: run anyway, unlocked (the lock only keeps names apart)
        except NetrlError as exc:
            log.warning("%s; this worker runs as %r with no lock on that name, so another "
                        "worker on this machine could take the same name and files", exc, name)
            return name, None
        if taken:
            log.info("worker names taken by other workers on this machine: %s; this worker is %r",
                     ", ".join(taken),
                     name)
        return name, lock
    raise NetrlError(f"{MAX_WORKERS_PER_HOST} workers named after this "
                     f"host already run in {run_dir}: give this one its "
                     f"own --worker-id (config.json: worker.worker_id)")
