"""build_memory: a training loop's memory from its class (or tmrl-style ``partial``)
and the loop's settings."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from netrl.errors import ConfigError
from netrl.memory.base import DEFAULT_BATCH_SIZE, DEFAULT_MEMORY_SIZE, MemoryDataloading
from netrl.memory.device import storage_device
from netrl.memory.disk import DEFAULT_RESIDENT_MIB, disk_ring
from netrl.memory.history import HistoryMemory
from netrl.memory.replay import ReplayMemory

__all__ = ["build_memory"]

log = logging.getLogger(__name__)


def build_memory(memory_cls: Callable[..., MemoryDataloading], *, device: str, steps: int, memory_size: int | None,
                 batch_size: int | None, seed: int | None, memory_device: str = "cpu",
                 storage: str = "ram", storage_folder: str | None = None,
                 resident_mib: int = DEFAULT_RESIDENT_MIB) -> tuple[MemoryDataloading, int, int]:
    """``(memory, memory_size, batch_size)``: ``memory_cls(device=..., nb_steps=steps, ...)``
    and the sizes it has.

    ``memory_size`` and ``batch_size`` come from the ``partial(memory_cls, ...)`` (tmrl's way),
    else from these arguments (the loop's fields: config.json's memory section), else the memory's
    defaults; set in both places they must agree (ValueError otherwise). ``seed`` is passed
    only to a memory that takes it (tmrl's tutorial's does not). ``storage`` "disk"
    (``memory.storage``) gives the memory a :class:`~netrl.memory.disk.DiskRing` on
    ``storage_folder``, locked from here on, which keeps ``resident_mib`` of its files mapped.
    """
    # a functools.partial's
    preset: dict[str, Any] = dict(getattr(memory_cls, "keywords", None) or {})
    takes = _keywords(memory_cls)
    name = getattr(getattr(memory_cls, "func", memory_cls), "__name__", repr(memory_cls))
    kwargs: dict[str, Any] = {"device": device, "nb_steps": steps}
    if memory_device != "cpu":
        kwargs["storage_device"] = storage_device(memory_device, device, name, takes)
    if storage != "ram":
        kwargs["ring_storage"] = disk_ring(storage, storage_folder, memory_device, name, takes,
                                           resident_mib)
    sources: dict[str, str] = {}
    for key, ours in (("memory_size", memory_size), ("batch_size", batch_size)):
        theirs = preset.get(key)
        if ours is not None and theirs is not None and ours != theirs:
            raise ValueError(f"{key} is set twice, to different values: partial({name}, "
                             f"{key}={theirs}) and TrainingOffline({key}={ours}) "
                             f"(config.json: memory.{key}); set it in one "
                             f"place (tmrl sets it in the memory's partial)")
        if theirs is not None:
            sources[key] = f"partial({name})"
        elif ours is not None:
            if takes is not None and key not in takes:
                raise ValueError(f"TrainingOffline({key}={ours}) is set, but "
                                 f"{name}.__init__ takes no {key} argument: add "
                                 f"one (and pass it to MemoryDataloading.__init__)")
            kwargs[key] = ours
            sources[key] = "TrainingOffline"
        else:
            sources[key] = f"{name}'s default"
    if "seed" not in preset:
        if takes is None or "seed" in takes:
            kwargs["seed"] = seed
        elif seed is not None:
            log.info("%s.__init__ takes no seed argument: its batches are not seeded by seed=%d",
                     name, seed)
    try:
        memory = memory_cls(**kwargs)
        if "ring_storage" in kwargs:
            check_ring_memory(memory, name)
    except BaseException:
        if "ring_storage" in kwargs:
            kwargs["ring_storage"].close()  # the folder is free again
        raise
    size = int(getattr(memory, "memory_size", kwargs.get("memory_size", DEFAULT_MEMORY_SIZE)))
    batch = int(getattr(memory, "batch_size", kwargs.get("batch_size", DEFAULT_BATCH_SIZE)))
    log.info("replay memory %s: memory_size=%d (from %s), batch_size=%d (from %s)", name, size,
             sources["memory_size"], batch, sources["batch_size"])
    return memory, size, batch


def check_ring_memory(memory: Any, memory_name: str) -> None:
    """ConfigError unless ``memory`` puts its columns where its ``ring_storage`` says: a memory
    that takes ``**kwargs`` (RolloutMemory, a tmrl memory) may take it and never use it."""
    if not isinstance(memory, (ReplayMemory, HistoryMemory)):
        raise ConfigError([f'memory.storage is "disk", but {memory_name} keeps its rows its '
                           f'own way: only ReplayMemory, HistoryMemory and the memories built '
                           f'on them keep them on disk (not the sync collection\'s '
                           f'RolloutMemory); set memory.storage to "ram"'])


def _keywords(cls: Callable[..., Any]) -> set[str] | None:
    """The keyword arguments ``cls(...)`` accepts; None if it takes ``**kwargs`` or
    its signature is unknown."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in params if p.kind in named}
