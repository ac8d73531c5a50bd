"""Replay columns held as tensors (``memory.device`` cuda): sized before they are allocated, each
packet copied in once, batches gathered where they live.

:class:`~netrl.memory.replay.ReplayMemory` built with ``storage_device`` keeps the columns a
batch is made of (observations, actions, rewards, flags, loss weights, extra outputs) as
tensors on that device, and the few it draws rows by (:data:`HOST_COLUMNS`) as numpy arrays in
host memory: drawing a batch's rows stays numpy code, and only the row numbers travel to
the device. The same code runs with ``storage_device="cpu"``, which is how the tests on a
machine without CUDA exercise it.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from netrl.errors import ConfigError
from netrl.memory.base import allocate_ring, np_dtype

__all__ = ["HEADROOM", "HOST_COLUMNS", "allocate_tensor_ring", "check_storage_device", "fit_problem", "row_copy",
           "storage_device", "write_rows"]

log = logging.getLogger(__name__)

# what rows are drawn and reported by
HOST_COLUMNS = frozenset({"end", "sent", "worker", "policy_version", "env", "traj", "episode", "next", "run"})
HEADROOM = 0.8  # of a CUDA device's free memory: the agent, its optimisers and the
                # batches need the rest

Rows = dict[str, tuple[tuple[int, ...], Any]]  # column name -> (per-row shape, numpy dtype)


def check_storage_device(device: str) -> torch.device:
    """``device`` as a torch.device; ConfigError naming ``memory.device`` when it is CUDA
    and this torch has none."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError([f'memory.device is "cuda" but torch.cuda.is_available() is '
                           f'False (torch {torch.__version__} on this machine '
                           f'has no CUDA device): set memory.device to "cpu"'])
    return dev


def storage_device(memory_device: str, training_device: str, memory_name: str, takes: set[str] | None) -> str:
    """Where ``memory.device`` puts the replay columns of a ``memory_name`` whose ``__init__`` takes
    the keywords ``takes`` (None: any): the training device, which must be a CUDA one."""
    if memory_device != "cuda":
        raise ConfigError([f'memory.device must be "cpu" or "cuda" (got "{memory_device}")'])
    check_storage_device(memory_device)
    if not training_device.startswith("cuda"):
        raise ConfigError([f'memory.device is "cuda" but the training device is '
                           f'"{training_device}" (trainer.device): batches '
                           f'would be copied back to it; set trainer.device to '
                           f'"cuda" (or null), or memory.device to "cpu"'])
    if takes is not None and "storage_device" not in takes:
        raise ConfigError([f'memory.device is "cuda", but {memory_name}.__init__ takes no '
                           f'storage_device argument: only ReplayMemory and memories built on it '
                           f'keep their columns on the device; set memory.device to "cpu"'])
    return training_device


def _bytes_per_row(rows: Rows) -> int:
    return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in rows.values())


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:,.1f} MiB"


def fit_problem(memory_size: int, row_bytes: int, free: int, device: str) -> str | None:
    """Why ``memory_size`` rows of ``row_bytes`` do not fit in the ``free`` bytes of ``device``, or
    None if they do within :data:`HEADROOM`."""
    need = memory_size * row_bytes
    room = int(free * HEADROOM)
    if need <= room:
        return None
    return (f"memory.memory_size is {memory_size}: the replay memory on {device} needs "
            f"{_gib(need)} ({row_bytes} bytes per row), and {device} has "
            f"{_gib(free)} free, of which the memory may take {HEADROOM:.0%} (the "
            f"agent needs the rest): about {room // max(row_bytes, 1):,} rows "
            f'fit. Lower memory.memory_size, or set memory.device to "cpu" '
            f"(batches are then copied to the device from page-locked host memory)")


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil  # here: only allocations need it

    return int(psutil.virtual_memory().available)


def allocate_tensor_ring(memory_size: int, rows: Rows, device: str) -> dict[str, Any]:
    """Zeroed ring columns: numpy arrays for :data:`HOST_COLUMNS`, tensors on
    ``device`` for the others.

    Logs what the device columns need before allocating them, and raises ConfigError naming
    ``memory.memory_size`` when they do not fit (see :func:`fit_problem`)."""
    dev = check_storage_device(device)
    on_device = {name: spec for name, spec in rows.items() if name not in HOST_COLUMNS}
    row_bytes, free = _bytes_per_row(on_device), _free_bytes(dev)
    log.info("replay memory on %s: memory.memory_size %d rows x %d bytes = %s, with %s free there",
             dev, memory_size,
             row_bytes, _gib(memory_size * row_bytes), _gib(free))
    problem = fit_problem(memory_size, row_bytes, free, str(dev))
    if problem:
        raise ConfigError([problem])
    ring: dict[str, Any] = allocate_ring(memory_size, {n: s for n, s in rows.items() if n in HOST_COLUMNS})
    for name, (shape, dtype) in on_device.items():
        ring[name] = torch.zeros((memory_size, *shape), dtype=torch.from_numpy(np.empty(0, dtype)).dtype, device=dev)
    return ring


def write_rows(ring: dict[str, Any], idx: np.ndarray, columns: dict[str, np.ndarray]) -> None:
    """Write a packet's ``columns`` into the ring's rows ``idx``: each tensor column with one
    copy to its device and one scatter there, each numpy column in place."""
    on: dict[torch.device, torch.Tensor] = {}
    for name, values in columns.items():
        col = ring[name]
        if isinstance(col, torch.Tensor):
            rows = on.get(col.device)
            if rows is None:
                rows = on[col.device] = torch.from_numpy(np.ascontiguousarray(idx, np.int64)).to(col.device)
            # writeable and in the stored dtype (check_columns allowed only
            # conversions within a kind)
            src = torch.from_numpy(np.require(values, np_dtype(col), ("C", "W")))
            # pageable: the copy is done when this returns
            col.index_copy_(0, rows, src.to(col.device))
        else:
            col[idx] = values


def row_copy(col: Any, i: int) -> np.ndarray:
    """Row ``i`` of a ring column as a numpy array of its own."""
    return col[i].cpu().numpy().copy() if isinstance(col, torch.Tensor) else np.array(col[i], copy=True)


def row_entries(cols: dict[str, Any], i: int, prefix: str) -> dict[str, np.ndarray]:
    """Row ``i`` of every column named ``<prefix>/<name>`` (the actor's ``extra`` outputs, the env's
    ``info`` entries), by name, as copies: what ``get_transition`` puts in its ``info``."""
    start = len(prefix) + 1
    return {n[start:]: row_copy(c, i) for n, c in cols.items() if n.startswith(prefix + "/")}
