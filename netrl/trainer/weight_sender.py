"""Weights out, on the training thread: a published model's tensors into the WEIGHTS commands the
trainer's network thread sends.

Publishing a version copies the model's tensors into one flat buffer
(:func:`netrl.protocol.weights.flat_layout`), whose WEIGHTS parts ZeroMQ then sends without a copy:
the buffer must not be written again until every send of it is done, nor while the encoding thread
reads it (``network.weight_format``: :class:`~netrl.trainer.encoding.WeightEncoder`).
:class:`SnapshotPool` hands out a buffer that nothing reads any more, so that a trainer publishing
every few steps allocates almost nothing; :class:`WeightSender` cuts each encoding into parts and
hands them to the network thread, whose outboxes (:mod:`netrl.trainer.outbox`) send them.
:class:`~netrl.trainer.link.TrainerLink` numbers the versions and calls it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import zmq

from netrl.errors import NetrlError
from netrl.net.thread import Command, command_head
from netrl.protocol.models import POLICY
from netrl.protocol.weights import (
    MIN_COMPACT_PART_BYTES,
    MIN_PART_BYTES,
    copy_tensors,
    flat_layout,
    flat_views,
    part_bytes,
)
from netrl.protocol.wire import encode, weight_parts
from netrl.trainer.encoding import Encoded, WeightEncoder

__all__ = ["Snapshot", "SnapshotPool", "WeightSender"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Snapshot:
    """A flat buffer the trainer copies an actor into, the tensors viewing it for that actor's
    layout, and the sends of the version in it that are still reading it."""

    flat: np.ndarray
    layout: list[list[Any]]
    views: list[torch.Tensor]
    trackers: list[zmq.MessageTracker] = dataclasses.field(default_factory=list)
    busy: bool = False  # waiting for the encoding thread, which reads it (network.weight_format)


class SnapshotPool:
    """The buffers of the versions published lately, newest last (:attr:`held`)."""

    def __init__(self) -> None:
        self.held: list[Snapshot] = []

    def take(self, layout: list[list[Any]], nbytes: int, keep: int) -> Snapshot:
        """A buffer no send still reads, with views for ``layout``, held as the newest: the network
        thread keeps the newest version until the next one. With more than ``keep`` buffers held and
        none free, the oldest leaves the pool, whatever still reads it."""
        for i, snap in enumerate(self.held):
            if snap.flat.nbytes == nbytes and not snap.busy and all(t.done for t in snap.trackers):
                del self.held[i]
                # another actor of the same size: view it anew, padding zeroed again
                if snap.layout != layout:
                    snap.flat.fill(0)
                    snap = Snapshot(snap.flat, layout, flat_views(snap.flat, layout))
                snap.trackers.clear()
                break
        else:
            if len(self.held) > keep:
                self.held.pop(0)  # let an old, still-busy buffer go; a fresh one is allocated below
            # zero padding between tensors: a worker's one-sum check (KnownLayout)
            flat = np.zeros(nbytes, np.uint8)
            snap = Snapshot(flat, layout, flat_views(flat, layout))
        self.held.append(snap)
        return snap


class WeightSender:
    """Sends each version of each model as WEIGHTS commands through ``command`` (the trainer's
    network thread's :meth:`~netrl.net.thread.NetThread.command`), encoded first on the encoding
    thread when ``encoder`` is given."""

    def __init__(self, name: str, session: str, command: Callable[..., zmq.MessageTracker | None],
                 encoder: WeightEncoder | None) -> None:
        self.name, self.session, self.command, self.encoder = name, session, command, encoder
        self.snapshots = SnapshotPool()  # reusable flat buffers
        # sync collection's announcement, sent with every policy version
        self.collect: dict[str, Any] | None = None
        # network.weight_format adaptive: whether to encode (a worker's link is slow); float32
        # alone, from the training thread as without an encoder, otherwise. None: always encode
        self.compact: Callable[[], bool] | None = None
        self._compacting = False
        # the stats of the server's last heartbeat: while they count a worker whose link is slow or
        # not measured yet, every encoding goes in small parts (any format)
        self.server_stats: Callable[[], dict[str, Any]] = dict

    def send(self, actor: torch.nn.Module, model: str, slot: int, version: int, trained_steps: int,
             keep: int) -> None:
        """Snapshot ``actor`` into a reused flat buffer (one of ``keep``) and send it in parts as
        ``model``'s ``version``; ``slot``: the model's slot, already shifted into the command's part
        number."""
        # once: it costs tens of microseconds, a third of a small actor's publish
        state = actor.state_dict()
        layout, nbytes = flat_layout(state)
        snap = self.snapshots.take(layout, nbytes, keep)
        copy_tensors(snap.views, list(state.values()))  # the views were made for this very layout
        if self.encoder is not None and self._encode():  # encoded and sent on the encoding thread
            # the publish, as without an encoder (what a version's latency is measured from)
            log.debug("published %s v%d, to be encoded",
                      "weights" if model == POLICY else f"model {model!r}", version)
            snap.busy = True
            self.encoder.put(model, version, trained_steps, snap.flat, layout,
                             lambda out: self._send_encoded(model, slot, version, trained_steps,
                                                            snap, out),
                             lambda: setattr(snap, "busy", False),
                             exact=getattr(actor, "exact_weights", False))
            return
        if self.encoder is not None:  # (adaptive) its pace, for the versions it encodes later
            self.encoder.published(model)
        fields = {} if model == POLICY else {"model": model}
        self._send_encoding(Encoded(snap.flat, fields, True), model, slot, version, trained_steps,
                            snap)
        log.debug("published %s v%d in %d parts",
                  "weights" if model == POLICY else f"model {model!r}", version, len(snap.trackers))

    def _encode(self) -> bool:
        """Whether this version goes through the encoder (adaptive: while a worker is slow)."""
        if self.compact is None:
            return True
        compact = self.compact()
        if compact != self._compacting:
            self._compacting = compact
            log.info("%s", "a worker's link is too slow for float32 weights: they go in float16 "
                     "and int8 too, with deltas, and the server picks per worker "
                     "(network.weight_format adaptive)" if compact else
                     "no worker's link is slow any more: weights go in float32 alone "
                     "(network.weight_format adaptive)")
        return compact

    def _send_encoding(self, out: Encoded, model: str, slot: int, version: int, trained_steps: int,
                       snap: Snapshot) -> None:
        """Hand one encoding's WEIGHTS parts to the network thread (zero-copy: a snapshot stays busy
        until sent); a compact one (all but float32's full version) in smaller parts, for the slow
        links it goes to; every one in small parts while the server counts a slow worker or one
        whose link is not measured yet."""
        compact = out.fields.get("format", "float32") != "float32" or "base" in out.fields
        smallest = MIN_COMPACT_PART_BYTES if compact else MIN_PART_BYTES
        stats = self.server_stats()
        slow = bool(stats.get("slow_workers") or stats.get("unmeasured_workers"))
        size = part_bytes(out.data.nbytes, smallest, slow)
        for msg in weight_parts(self.name, self.session, version, trained_steps, out.data,
                                snap.layout, size, out.fields):
            if self.collect is not None and model == POLICY:
                msg.body["collect"] = self.collect
            head = command_head(Command.WEIGHTS, slot | msg.body["part"], version)
            tracker = self.command([head, *encode(msg)], track=out.snapshot)
            if tracker is not None:
                snap.trackers.append(tracker)

    def _send_encoded(self, model: str, slot: int, version: int, trained_steps: int,
                      snap: Snapshot, out: list[Encoded]) -> None:
        """Encoding thread: send a version's encodings, then free its snapshot (unless a send still
        reads it)."""
        try:
            for encoded in out:
                self._send_encoding(encoded, model, slot, version, trained_steps, snap)
        except NetrlError:  # the network thread has stopped: the training thread hears of it later
            pass
        finally:
            snap.busy = False
