"""A worker's incoming weights, on its network thread: assembled from parts, checked,
loaded into a spare actor.

The control path picks the loaded actor up between two env steps with
:meth:`~netrl.worker.weight_slot.WeightSlot.swap`, a pointer swap, so a weight update never
delays a real-time step. A worker with further model targets (an observation normaliser, a user's
module: :mod:`netrl.protocol.models`) has one :class:`WeightReceiver` and one slot per model, and
:class:`ModelReceivers` routes each WEIGHTS part to its model's.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from netrl.errors import ProtocolError
from netrl.protocol.messages import Message
from netrl.protocol.models import POLICY, version_column
from netrl.protocol.weight_formats import FormatError, WeightFormat, crc, flat_nbytes
from netrl.protocol.weights import (
    KnownLayout,
    WeightAssembler,
    check_weights,
    flat_arrays,
    load_weights,
    sum_is_finite,
    tensor_views,
    weight_specs,
)
from netrl.util import worth_logging
from netrl.worker.weight_decode import Encodings, Refused
from netrl.worker.weight_slot import WeightSlot

__all__ = ["ModelReceivers", "WeightReceiver"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Bound:
    """A CPU actor whose tensors view one flat buffer in the worker's own layout, for as
    long as it lives: a version in that layout is written straight into the buffer, and
    nothing is re-pointed per version."""

    module: torch.nn.Module
    flat: np.ndarray
    whole: torch.Tensor | None  # the buffer as one tensor, for the one-sum finiteness
                                # proof (KnownLayout.views)
    own: dict[str, torch.Tensor]  # the module's tensors (state_dict(keep_vars=True)), views of flat


class _Saver:
    """Writes received weights to disk on its own thread, the newest version first: on a
    slow disk (an SD card, a stalled network mount) a write on the network thread would hold
    back its heartbeats for seconds, and the server would drop the worker. A version that
    arrives while another is written waits; a newer one replaces it, unwritten. :meth:`close`
    writes the one waiting."""

    def __init__(self, write: Callable[[dict[str, torch.Tensor], int, str], None]) -> None:
        self._write = write
        self._cond = threading.Condition()
        self._next: tuple[dict[str, torch.Tensor], int, str] | None = None
        self._writing = self._closed = False
        self._thread: threading.Thread | None = None  # started with the first version

    def put(self, state: dict[str, torch.Tensor], version: int, session: str) -> None:
        with self._cond:
            self._next = (state, version, session)
            self._cond.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="netrl-weight-saver", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._closed:
                    self._cond.wait()
                if self._next is None:
                    return
                job, self._next, self._writing = self._next, None, True
            try:
                self._write(*job)
            # (a disk's refusal is handled inside): a bug must not end the saving for good
            except Exception:
                log.exception("saving received weights v%d failed", job[1])
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait until every version put is written (or replaced); False if that
        took over ``timeout`` s."""
        with self._cond:
            return self._cond.wait_for(lambda: self._next is None and not self._writing, timeout)

    def close(self, timeout: float) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():  # a daemon: it cannot keep the process from exiting
                log.warning("the received weights were still being written to disk after "
                            "%.0f s: the file may hold an older version (a restart is "
                            "sent the current one by the server anyway)", timeout)


class WeightReceiver:
    """Network thread: check received weights against the actor, load them into a spare one, save
    them (on a thread of their own).

    A version laid out like the worker's own actor (the usual case) is assembled straight
    into a spare CPU actor's buffer, which its tensors view (:class:`_Bound`), and proven
    finite with one sum; any other version is assembled apart, checked tensor by tensor
    and copied into a spare actor.

    Nothing a server sends stops the thread: a version that does not fit (parts out of
    order, a malformed layout, weights that do not match the actor or are not finite) is
    rejected, counted once in ``weights_rejected`` and logged, and the actor in use stays. The
    rest of a rejected version's parts are dropped, counted in ``weight_parts_dropped`` (a
    new part 0 starts it again)."""

    _KEEP_LOADED_AT = 1000  # versions remembered in loaded_at (a benchmark polls it)

    def __init__(self, template_actor: torch.nn.Module, spare: torch.nn.Module, version: int,
                 save: Callable[[dict[str, torch.Tensor], int, str], None] | None, model: str = POLICY) -> None:
        self.template_actor, self.save = template_actor, save
        # as the log lines name its versions
        self.what = "weights" if model == POLICY else f"model {model!r}"
        self.specs = weight_specs(template_actor)
        self.slot = WeightSlot(spare, lambda: copy.deepcopy(template_actor))
        self.version, self.session = version, ""
        self.counts: collections.Counter[str] = collections.Counter()
        # version -> time.time() it was ready for the control path
        self.loaded_at: dict[int, float] = {}
        self.known = KnownLayout(template_actor)
        # a bigger version is rejected early
        self.assembler = WeightAssembler(max_bytes=self.known.nbytes)
        self._bound: dict[int, _Bound] = {}  # id(module) -> its buffer (CPU actors only)
        self._on_cpu = all(t.device.type == "cpu" for t in template_actor.state_dict().values())
        self._target: _Bound | None = None  # the spare actor the version being assembled lands in
        self._save_failing = False
        # None: nothing to keep on disk
        self._saver = _Saver(self._write) if save is not None else None
        self._rejected: tuple[str, int] | None = None  # (session, version) rejected last: its
                                                       # parts are dropped
        # versions in another format than float32, and deltas (netrl.worker.weight_decode); an
        # encoding may be larger than the flat buffer (a custom format, a delta of
        # random bytes), within reason
        self.encodings = Encodings(max_bytes=2 * self.known.nbytes + (1 << 20))
        # a version refused for a reason a full version cures: its ACK asks for one
        self.need_full = -1

    def __call__(self, msg: Message) -> dict[str, Any]:
        b, version, session = msg.body, msg.policy_version, msg.body["session"]
        if session == self.session and version <= self.version:
            return self.stats()  # already have it (e.g. re-sent after a reconnect)
        if (session, version) == self._rejected:
            if b["part"]:
                # the version was rejected (and logged) once: not per part
                self.counts["weight_parts_dropped"] += 1
                return self.stats()
            self._rejected = None  # sent again from its part 0: a new try
        if "base" in b or b.get("format", "float32") != "float32":
            return self._encoded(msg)
        try:
            into = self._landing(b["nbytes"], b["layout"]) if b["part"] == 0 else None
            self.assembler.add(session, version, b["part"], b["parts"], b["offset"], b["nbytes"], b["layout"],
                               msg.arrays["chunk"], into)
            if not self.assembler.done:
                return self.stats()
            flat, layout = self.assembler.take()
            # (a trainer sending deltas: the base of the next one)
            if "crc" in b and crc(flat) != b["crc"]:
                raise Refused(f"weights v{version} in float32 have the crc "
                              f"{crc(flat):#010x}, not the trainer's {b['crc']:#010x}")
        except Refused as exc:
            self._drop_target()
            return self._reject(session, version, str(exc), need_full=True)
        except ValueError as exc:
            return self._reject(session, version, str(exc))
        target, self._target = self._target, None
        if target is not None:  # assembled in place: the actor already holds the version
            problems = [] if sum_is_finite(target.whole) else check_weights(
                self.specs, {k: t.detach() for k, t in target.own.items()})
            if problems:
                self.slot.give_back(target.module)
                return self._reject(session, version, "; ".join(problems[:5]))
            module = target.module
        else:
            loaded = self._load_copy(session, version, flat, layout)
            if loaded is None:
                return self.stats()
            module = loaded
        if "crc" in b:
            # the module may view flat, and a spare reuses it
            self.encodings.keep("float32", version, flat.copy())
        return self._loaded(version, session, module)

    def _encoded(self, msg: Message) -> dict[str, Any]:
        """A version in another format, or a delta: assembled apart, decoded into a
        spare module, checked."""
        b, version, session = msg.body, msg.policy_version, msg.body["session"]
        if b["part"] == 0:
            self._drop_target()  # a float32 version cut short
        try:
            if not self.encodings.add(session, version, b, msg.arrays["chunk"]):
                return self.stats()
            fmt, encoding, layout = self.encodings.take(version, b)
            module = self._decode(session, version, fmt, encoding, layout)
        except Refused as exc:
            return self._reject(session, version, str(exc), need_full=True)
        except ValueError as exc:
            return self._reject(session, version, str(exc))
        if module is None:  # rejected (and logged) by the checks
            return self.stats()
        self.encodings.keep(fmt.name, version, encoding)
        return self._loaded(version, session, module)

    def _decode(self, session: str, version: int, fmt: WeightFormat, encoding: np.ndarray,
                layout: list[Any]) -> torch.nn.Module | None:
        """Decode into a spare module (a CPU one in the worker's own layout: straight into its
        buffer) and check it as a float32 version is checked; None: rejected."""
        try:
            if self._on_cpu and layout == self.known.layout:
                target = self._bind(self.slot.take_spare())
                try:
                    fmt.decode(encoding, layout, target.flat)
                except FormatError:
                    self.slot.give_back(target.module)
                    raise
                problems = [] if sum_is_finite(target.whole) else check_weights(
                    self.specs, {k: t.detach() for k, t in target.own.items()})
                if problems:
                    self.slot.give_back(target.module)
                    self._reject(session, version, "; ".join(problems[:5]))
                    return None
                return target.module
            out = np.zeros(flat_nbytes(layout), np.uint8)
            fmt.decode(encoding, layout, out)
        except FormatError as exc:
            raise Refused(f"weights v{version} in {fmt.name}: {exc}") from None
        return self._load_copy(session, version, out, layout)

    def _loaded(self, version: int, session: str, module: torch.nn.Module) -> dict[str, Any]:
        self.need_full = -1
        self.slot.put(version, session, module)
        self.loaded_at[version] = time.time()
        # one entry per version would grow for as long as it runs
        if len(self.loaded_at) > self._KEEP_LOADED_AT:
            del self.loaded_at[next(iter(self.loaded_at))]
        self.version, self.session = version, session
        self.counts["weights_received"] += 1
        log.log(logging.INFO if self.counts["weights_received"] == 1 else logging.DEBUG,
                "%s v%d ready (%d received)", self.what, version, self.counts["weights_received"])
        # a copy: once the control path lets go of this actor, the next version lands there
        if self._saver is not None:
            self._saver.put({k: t.detach().clone() for k, t in module.state_dict().items()}, version, session)
        return self.stats()

    def saved(self, timeout: float = 10.0) -> bool:
        """Wait until the versions received so far are on disk (or replaced by newer
        ones); False on a timeout."""
        return self._saver is None or self._saver.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write the version waiting to be saved, if any (the worker's close)."""
        if self._saver is not None:
            self._saver.close(timeout)

    def _landing(self, nbytes: int, layout: Any) -> np.ndarray | None:
        """Part 0: the buffer of the spare CPU actor a version in the worker's own layout is
        assembled in (the one taken for the version before, if that one never finished);
        None for any other version."""
        if not self._on_cpu or nbytes != self.known.nbytes or layout != self.known.layout:
            self._drop_target()  # (an actor on another device: assembled apart, then copied there)
            return None
        if self._target is None:
            self._target = self._bind(self.slot.take_spare())
        return self._target.flat

    def _bind(self, module: torch.nn.Module) -> _Bound:
        """A CPU module's _Bound, made on its first version."""
        bound = self._bound.get(id(module))
        if bound is not None and bound.module is module:
            return bound
        own = module.state_dict(keep_vars=True)
        # zero padding, as the trainer's: see KnownLayout
        flat = np.zeros(self.known.nbytes, np.uint8)
        views, whole = self.known.views(flat)
        load_weights(module, views, assign=True, own=own)  # from now on its tensors view flat
        bound = self._bound[id(module)] = _Bound(module, flat, whole, own)
        return bound

    def _drop_target(self) -> None:
        if self._target is not None:
            self.slot.give_back(self._target.module)
            self._target = None

    def _load_copy(self, session: str, version: int, flat: np.ndarray, layout: list[Any]) -> torch.nn.Module | None:
        """A version assembled apart: checked, then copied into a spare actor (None: rejected)."""
        if self.known.matches(flat, layout):  # the worker's own layout, for an actor not on the CPU
            tensors, finite = self.known.tensors(flat)
        else:
            try:
                tensors, finite = tensor_views(flat_arrays(flat, layout)), False
            except ProtocolError as exc:
                self._reject(session, version, str(exc), flat)
                return None
        if not finite:  # checked as tensors: torch's sum is the fastest finiteness proof
            problems = check_weights(self.specs, tensors)
            # a target that explains its own shapes
            named = getattr(self.template_actor, "check_state", None)
            if problems and named is not None:  # (the obs_norm statistics name the observation
                                                # leaf and the key)
                problems = [*named(tensors), *(p for p in problems if " has shape " not in p)]
            if problems:
                self._reject(session, version, "; ".join(problems[:5]), flat)
                return None
        module = self.slot.take_spare()
        # a copy: into a bound actor's own buffer, or onto the actor's device
        load_weights(module, tensors)
        self.assembler.release(flat)
        return module

    def _write(self, state: dict[str, torch.Tensor], version: int, session: str) -> None:
        """Saver thread: keep the weights on disk. A convenience for the next start, so a
        failed write (a full disk) is logged when it starts and when it ends, counted,
        and never stops the worker."""
        assert self.save is not None
        try:
            self.save(state, version, session)
        except OSError as exc:
            self.counts["weights_save_failed"] += 1
            if not self._save_failing:
                log.error("could not save weights v%d (%s); the worker goes on with "
                          "them loaded, and a restart would start from the last "
                          "saved version: free disk space there or check permissions",
                          version, exc)
            self._save_failing = True
            return
        if self._save_failing:
            log.info("saving received weights works again (v%d saved)", version)
        self._save_failing = False

    def _reject(self, session: str, version: int, why: str, flat: np.ndarray | None = None,
                need_full: bool = False) -> dict[str, Any]:
        self.assembler.release(flat)
        self._drop_target()
        self._rejected = (session, version)
        self.counts["weights_rejected"] += 1
        if need_full:
            self.need_full = version
            self.counts["weights_need_full"] += 1
        # a server sending only bad versions
        if worth_logging(self.counts["weights_rejected"], first=10, every=100):
            # it may quote tensor names of any length
            why = why if len(why) <= 2000 else why[:2000] + "..."
            log.error("rejected %s v%d from the server (%d rejected so "
                      "far; the worker keeps the version it has): %s",
                      self.what, version, self.counts["weights_rejected"], why)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        return {"version": self.version, **self.counts}


class ModelReceivers:
    """Network thread: each WEIGHTS part to the receiver of its model (``model`` in
    its body; absent: "policy").

    Weights for a model this worker has no target for are rejected with an error naming
    the model and the worker's targets (logged once per name), counted per version in
    ``weights_unknown_model``, and not acknowledged: a server streams a model only to workers whose
    HELLO names it, so only a server that ignores that sends one. Heartbeat stats: the policy's,
    with each other model's version as ``<model>_version`` and the counters of all.
    """

    def __init__(self, receivers: dict[str, WeightReceiver]) -> None:
        self.receivers = receivers
        self.policy = receivers[POLICY]
        self._others = [(name, rx) for name, rx in receivers.items() if name != POLICY]
        self.counts: collections.Counter[str] = collections.Counter()
        self._unknown: set[str] = set()  # model names logged

    def __call__(self, msg: Message) -> dict[str, Any]:
        model = msg.body.get("model", POLICY)
        if model == POLICY:  # the usual part: no more than a look-up on the way
            stats = self.policy(msg)
            return stats if not self._others and not self.counts else self.stats()
        rx = self.receivers.get(model)
        if rx is None:
            self._reject_unknown(model, msg)
        else:
            rx(msg)
        return self.stats()

    def ack(self, msg: Message) -> dict[str, Any] | None:
        """The ACK body for a version whose last part ``msg`` is (None: not
        acknowledged, see the class)."""
        model = msg.body.get("model", POLICY)
        if model not in self.receivers:
            return None
        ack = {"seqs": [msg.policy_version], "model": model, "format": msg.body.get("format", "float32")}
        if self.receivers[model].need_full == msg.policy_version:
            ack["need_full"] = True  # the server sends a full version of the model next
        return ack

    def _reject_unknown(self, model: str, msg: Message) -> None:
        if msg.body["part"] != 0:
            return  # counted and logged with its part 0
        self.counts["weights_unknown_model"] += 1
        if model not in self._unknown and len(self._unknown) < 64:
            self._unknown.add(model)
            log.error("rejected weights v%d of the model %r from the server: this worker has no "
                      "target for it (its targets: %s). The worker goes on without it; to load it, "
                      "give the worker a module of that name (RolloutWorker(models={%r: module}))",
                      msg.policy_version, model,
                      ", ".join(self.receivers), model)

    def stats(self) -> dict[str, Any]:
        stats = self.policy.stats()
        for name, rx in self._others:
            stats[version_column(name)] = rx.version
            for key, count in rx.counts.items():
                stats[key] = stats.get(key, 0) + count
        for key, count in self.counts.items():
            stats[key] = stats.get(key, 0) + count
        return stats

    def saved(self, timeout: float = 10.0) -> bool:
        return self.policy.saved(timeout)

    def close(self, timeout: float = 10.0) -> None:
        self.policy.close(timeout)
