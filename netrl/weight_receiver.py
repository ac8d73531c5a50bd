"""A worker's incoming weights, on its network thread: assembled from parts, checked, loaded into a spare actor.

The control path picks the loaded actor up between two env steps with :meth:`WeightSlot.swap`, a pointer swap,
so a weight update never delays a real-time step.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from netrl.errors import ProtocolError
from netrl.status import worth_logging
from netrl.weights import (
    KnownLayout,
    WeightAssembler,
    check_weights,
    flat_arrays,
    load_weights,
    tensor_views,
    weight_specs,
)
from netrl.wire import Message

__all__ = ["WeightReceiver", "WeightSlot"]

log = logging.getLogger(__name__)


class WeightSlot:
    """Hands a fully loaded actor from the network thread to the control path (double buffering)."""

    def __init__(self, spare: torch.nn.Module) -> None:
        self._lock = threading.Lock()
        self._pending: tuple[int, str, torch.nn.Module] | None = None
        self._spares = [spare]

    def take_module(self) -> torch.nn.Module:
        """Network thread: a module nobody else uses (a not-yet-swapped pending one is taken back)."""
        with self._lock:
            if self._pending is not None:
                module, self._pending = self._pending[2], None
                return module
            return self._spares.pop()

    def put(self, version: int, session: str, module: torch.nn.Module) -> None:
        with self._lock:
            self._pending = (version, session, module)

    def swap(self, current: torch.nn.Module) -> tuple[int, str, torch.nn.Module] | None:
        """Control path: the pending actor, if any; ``current`` becomes the next spare."""
        if self._pending is None:  # cheap check without the lock; the lock below makes it exact
            return None
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is not None:
                self._spares.append(current)
            return pending


class WeightReceiver:
    """Network thread: check received weights against the actor, load them into a spare one, save them.

    Nothing a server sends stops the thread: a version that does not fit (parts out of order, a malformed layout,
    weights that do not match the actor or are not finite) is rejected, counted once in ``weights_rejected`` and
    logged, and the actor in use stays. The rest of a rejected version's parts are dropped, counted in
    ``weight_parts_dropped`` (a new part 0 starts it again)."""

    _KEEP_LOADED_AT = 1000  # versions remembered in loaded_at (a benchmark polls it)

    def __init__(self, template_actor: torch.nn.Module, spare: torch.nn.Module, version: int,
                 save: Callable[[torch.nn.Module, int, str], None]) -> None:
        self.template_actor, self.save = template_actor, save
        self.specs = weight_specs(template_actor)
        self.slot = WeightSlot(spare)
        self.version, self.session = version, ""
        self.counts: collections.Counter[str] = collections.Counter()
        self.loaded_at: dict[int, float] = {}  # version -> time.time() it was ready for the control path
        self.known = KnownLayout(template_actor)
        self.assembler = WeightAssembler(max_bytes=self.known.nbytes)  # a bigger version is rejected early
        self._backing: dict[int, np.ndarray] = {}  # id(module) -> the flat buffer its tensors view
        self._save_failing = False
        self._own: dict[int, dict[str, torch.Tensor]] = {}  # id(module) -> its state_dict(keep_vars=True)
        self._rejected: tuple[str, int] | None = None  # (session, version) rejected last: its parts are dropped

    def __call__(self, msg: Message) -> dict[str, Any]:
        b, version, session = msg.body, msg.policy_version, msg.body["session"]
        if session == self.session and version <= self.version:
            return self.stats()  # already have it (e.g. re-sent after a reconnect)
        if (session, version) == self._rejected:
            if b["part"]:
                self.counts["weight_parts_dropped"] += 1  # the version was rejected (and logged) once: not per part
                return self.stats()
            self._rejected = None  # sent again from its part 0: a new try
        try:
            self.assembler.add(session, version, b["part"], b["parts"], b["offset"], b["nbytes"], b["layout"],
                               msg.arrays["chunk"])
            if not self.assembler.done:
                return self.stats()
            flat, layout = self.assembler.take()
        except ValueError as exc:
            return self._reject(session, version, str(exc))
        if self.known.matches(flat, layout):  # the usual case: the trainer's actor has our tensors
            tensors, finite = self.known.tensors(flat)
        else:
            try:
                tensors, finite = tensor_views(flat_arrays(flat, layout)), False
            except ProtocolError as exc:
                return self._reject(session, version, str(exc), flat)
        if not finite:  # checked as tensors: torch's sum is the fastest finiteness proof
            problems = check_weights(self.specs, tensors)
            if problems:
                return self._reject(session, version, "; ".join(problems[:5]), flat)
        module = self.slot.take_module()
        own = self._own.get(id(module))
        if own is None:
            own = self._own[id(module)] = module.state_dict(keep_vars=True)
        load_weights(module, tensors, assign=True, own=own)  # no copy on CPU: the actor's tensors view the buffer
        if next(module.parameters()).device.type == "cpu":
            self.assembler.release(self._backing.get(id(module)))  # its old buffer is no longer viewed
            self._backing[id(module)] = flat
        else:
            self.assembler.release(flat)  # copied to the device: the buffer is free again
        self.slot.put(version, session, module)
        self.loaded_at[version] = time.time()
        if len(self.loaded_at) > self._KEEP_LOADED_AT:  # one entry per version would grow for as long as it runs
            del self.loaded_at[next(iter(self.loaded_at))]
        self.version, self.session = version, session
        self.counts["weights_received"] += 1
        log.log(logging.INFO if self.counts["weights_received"] == 1 else logging.DEBUG,
                "weights v%d ready (%d received)", version, self.counts["weights_received"])
        self._save(module, version, session)
        return self.stats()

    def _save(self, module: torch.nn.Module, version: int, session: str) -> None:
        """Keep the weights on disk: a convenience for the next start, so a failed write (a full disk) is logged
        when it starts and when it ends, counted, and never stops the worker."""
        try:
            self.save(module, version, session)
        except OSError as exc:
            self.counts["weights_save_failed"] += 1
            if not self._save_failing:
                log.error("could not save weights v%d (%s); the worker goes on with them loaded, and a restart "
                          "would start from the last saved version: free disk space there or check permissions",
                          version, exc)
            self._save_failing = True
            return
        if self._save_failing:
            log.info("saving received weights works again (v%d saved)", version)
        self._save_failing = False

    def _reject(self, session: str, version: int, why: str, flat: np.ndarray | None = None) -> dict[str, Any]:
        self.assembler.release(flat)
        self._rejected = (session, version)
        self.counts["weights_rejected"] += 1
        if worth_logging(self.counts["weights_rejected"], first=10, every=100):  # a server sending only bad versions
            why = why if len(why) <= 2000 else why[:2000] + "..."  # it may quote tensor names of any length
            log.error("rejected weights v%d from the server (%d rejected so far; the worker keeps the actor it has): "
                      "%s", version, self.counts["weights_rejected"], why)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        return {"version": self.version, **self.counts}
