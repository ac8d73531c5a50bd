"""The hand-over of a loaded actor from a worker's network thread to its control path, a pointer
swap between two env steps (:class:`~netrl.worker.weight_receiver.WeightReceiver` loads each version
into a spare actor)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

__all__ = ["WeightSlot"]


class WeightSlot:
    """Hands a fully loaded actor from the network thread to the control path (double buffering).

    Every actor is in one place at a time: the control path's (current), pending (loaded, not yet
    swapped in), the network thread's (being written), or spare. A pending actor stays pending until
    a newer one is put in its place, so a version that fails midway never costs the control path the
    one before it. That takes at most three actors; ``make`` builds the third when the first new
    version comes before the control path swapped in the last."""

    def __init__(self, spare: torch.nn.Module, make: Callable[[], torch.nn.Module]) -> None:
        self._lock = threading.Lock()
        self._pending: tuple[int, str, torch.nn.Module] | None = None
        self._spares = [spare]
        self._make = make
        # set by put: a control path waiting for a version wakes (sync collection)
        self.arrived = threading.Event()

    def take_spare(self) -> torch.nn.Module:
        """Network thread: an actor that neither the control path nor the pending slot holds."""
        with self._lock:
            if self._spares:
                return self._spares.pop()
        return self._make()

    def give_back(self, module: torch.nn.Module) -> None:
        """Network thread: a taken actor that got no version (the version was rejected)."""
        with self._lock:
            self._spares.append(module)

    def put(self, version: int, session: str, module: torch.nn.Module) -> None:
        with self._lock:
            if self._pending is not None:  # never swapped in: a spare again
                self._spares.append(self._pending[2])
            self._pending = (version, session, module)
        self.arrived.set()

    def pending_version(self) -> int | None:
        """Control path: the version waiting to be swapped in, if any."""
        pending = self._pending
        return None if pending is None else pending[0]

    def swap(self, current: torch.nn.Module) -> tuple[int, str, torch.nn.Module] | None:
        """Control path: the pending actor, if any; ``current`` becomes a spare."""
        if self._pending is None:  # cheap check without the lock; the lock below makes it exact
            return None
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is not None:
                self._spares.append(current)
            return pending
