"""Worker names: what a worker calls itself when config.json does not say, and one running worker per name.

A worker's name picks its files in the run folder (``episodes_<name>.csv``, ``worker_policy_<name>.pt``) and is how
the server's logs and status table know it. Started from config.json without ``worker.worker_id``, a worker takes its
machine's host name, so that after a restart it continues its own CSV (one learning curve in ``--plot``, not one per
run) and starts from the weights it saved last. A second worker on the same machine and run folder takes
``<host>-2``, the next ``<host>-3``, and so on: each holds a lock on ``<run folder>/worker_<name>.lock`` while it
runs, which the OS releases when it ends, crash or not, so the name is free again for its restart. A name given in
config.json or by ``--worker-id`` is locked the same way, and a second worker given it is refused.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
from pathlib import Path

from netrl.errors import FolderInUse
from netrl.folderlock import FolderLock, make_folder
from netrl.msgtypes import PEER_NAME

__all__ = ["claim_worker_id", "default_worker_id", "host_name"]


def host_name() -> str:
    """This machine's host name as a valid worker name (:data:`netrl.msgtypes.PEER_NAME`): other characters become
    '-', and a long one is cut to 64 characters."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).lstrip("._-") or "worker"
    return host[:64]


def default_worker_id() -> str:
    """``<host>-<pid>``: the name of a RolloutWorker built in Python without one (it has no run folder to lock a
    name in, so the process id keeps two on one machine apart)."""
    pid = str(os.getpid())
    return f"{host_name()[:63 - len(pid)]}-{pid}"


def claim_worker_id(run_dir: Path, worker_id: str | None) -> tuple[str, FolderLock]:
    """The name this worker runs under, and the lock that keeps it its own until released (see the module's text).

    Raises FolderInUse when ``worker_id`` is given and another running worker holds it in ``run_dir``."""
    fix = ("give each worker on this machine its own --worker-id (config.json: worker.worker_id), or leave it out: "
           "each worker then takes a name of its own")
    make_folder(run_dir, "run folder")
    if worker_id is not None:
        lock = _name_lock(run_dir, worker_id, fix)
        lock.acquire()
        return worker_id, lock
    host = host_name()
    for n in itertools.count(1):
        suffix = "" if n == 1 else f"-{n}"
        name = host[:64 - len(suffix)] + suffix
        assert PEER_NAME.fullmatch(name), name
        lock = _name_lock(run_dir, name, fix)
        try:
            lock.acquire()
        except FolderInUse:  # a running worker has it: try the next
            continue
        return name, lock
    raise AssertionError("unreachable")  # pragma: no cover - itertools.count never ends


def _name_lock(run_dir: Path, name: str, fix: str) -> FolderLock:
    return FolderLock(run_dir, f"worker name {name!r} in the run folder", fix, name=f"worker_{name}.lock")
