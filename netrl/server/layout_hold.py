"""Packets the trainer refused for their sample layout, kept on disk until a trainer of theirs
connects.

::

    trainer --ACK (layout_refused: parts of a bundle)--> SampleRelay --> keep(): <spool>/held/<tag>/
    trainer --SCHEMA (its layout's tag)--> SampleRelay --> release(): back to the spool's end

The server checks packets against the layout it knows when they arrive, but a packet spooled
while no trainer was connected (or under the previous trainer's layout) can reach a trainer of
another layout, which refuses it. Such a packet is fine for a trainer of its own layout (the usual
cause is a trainer started without the workers' sample compressor), so it is kept: in a folder per
layout, named after the layout's tag (:attr:`~netrl.protocol.schema.SampleSchema.tag`, in hex),
each a :class:`~netrl.server.spool.Spool` with a head of its own, so a restarted server finds them.
When a trainer of that layout connects, they go back to the spool and reach it from there; a folder
emptied so is removed. Together the folders hold at most ``max_bytes``; beyond that, or when the
disk refuses, or for a layout beyond :data:`MAX_LAYOUTS`, :meth:`LayoutHold.keep` says why it could
not keep a packet, and the relay reports it.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

from netrl.errors import NetrlError, ProtocolError
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import decode, frames_nbytes
from netrl.server.counters import ServerCounters
from netrl.server.peers import QueuedPacket
from netrl.server.spool import Spool
from netrl.server.spool_gate import SpoolGate

__all__ = ["LayoutHold", "tag_name"]

log = logging.getLogger(__name__)

# packets moved back to the spool per call: the server's loop stays responsive while it moves many
RELEASE_PER_PASS = 256
# layouts held at once: each keeps a file open, and a worker could make a new layout per packet
MAX_LAYOUTS = 16
_TAG_NAME = re.compile(r"[0-9a-f]{12}")  # a tag has 6 bytes (SampleSchema.tag)


def tag_name(tag: int) -> str:
    """How a layout's tag names its folder, and appears in ``--status``."""
    return f"{tag:012x}"


class LayoutHold:
    """The held packets of every layout but the connected trainer's, in ``directory`` (the spool's
    ``held`` folder), counted in ``stats``. Construct (no I/O), :meth:`open`, then :meth:`close`."""

    def __init__(self, directory: str | Path, max_bytes: int, stats: ServerCounters,
                 fsync: bool = False) -> None:
        self.dir, self.max_bytes, self.stats, self.fsync = Path(directory), max_bytes, stats, fsync
        self.stores: dict[int, Spool] = {}  # tag -> its packets

    def open(self) -> None:
        """Open the folders a previous run left (an empty one is removed)."""
        if not self.dir.is_dir():
            return
        for path in sorted(self.dir.iterdir()):
            if not (path.is_dir() and _TAG_NAME.fullmatch(path.name)):
                log.warning("%s is not a held layout's folder (those are named after the layout's "
                            "tag, 12 hex digits): left alone", path)
                continue
            store = Spool(path, self.max_bytes, self.fsync).open()
            self.stores[int(path.name, 16)] = store
            if not store.packets:
                self._remove(int(path.name, 16))
        if self.stores:
            log.info("%s holds %d packets (%d samples) refused for their sample layout, for %d "
                     "layouts: each goes to the first trainer of its layout that connects",
                     self.dir, self.packets, self.steps, len(self.stores))

    @property
    def packets(self) -> int:
        return sum(store.packets for store in self.stores.values())

    @property
    def steps(self) -> int:
        return sum(store.steps for store in self.stores.values())

    @property
    def bytes(self) -> int:
        return sum(store.bytes for store in self.stores.values())

    def keep_packet(self, packet: QueuedPacket, trainer_layout: int, max_bytes: int) -> str | None:
        """Keep a packet that the trainer of layout ``trainer_layout`` refused for its layout, under
        its own layout (read from its frames, of at most ``max_bytes``); what kept it from the disk,
        if anything."""
        try:
            msg = decode(packet.frames, max_bytes, inflate=False, stored=True)
            tag = SampleSchema.of_packet(msg.body, msg.arrays).tag
        except ProtocolError as exc:
            return f"it does not read back ({exc})"
        if tag == trainer_layout:  # never so, unless the roles disagree on what a layout is
            return f"its layout is the trainer's ({tag_name(tag)}) as far as the server can tell"
        problem = self.keep(tag, packet.frames, {"worker": packet.worker, "session": packet.session,
                                                 "seq": packet.seq, "steps": packet.steps,
                                                 "inflated": packet.trainer_bytes})
        if problem is None:
            self.stats.samples_held += packet.steps
        return problem

    def lost(self, packet: QueuedPacket, problem: str) -> None:
        """A spooled packet refused for its layout that :meth:`keep_packet` could not keep: counted
        and logged, with why."""
        self.stats.samples_held_lost += packet.steps
        log.error("lost spooled packet %d of worker %s (%d samples), which the trainer refused for "
                  "its sample layout: the server could not keep it, as %s (%d such samples lost "
                  "so far)", packet.seq, packet.worker, packet.steps, problem,
                  self.stats.samples_held_lost)

    def keep(self, tag: int, frames: list[Any], meta: dict[str, Any]) -> str | None:
        """Keep a packet of layout ``tag`` (``meta`` as the spool's); what kept it from the disk, if
        anything."""
        size = frames_nbytes(frames)
        if self.bytes + size > self.max_bytes:
            return (f"the held packets' folder {self.dir} is full ({self.bytes} of "
                    f"{self.max_bytes} bytes, as server.spool_max_bytes): start a trainer of "
                    "their layout to take them, or raise server.spool_max_bytes")
        if tag not in self.stores and len(self.stores) >= MAX_LAYOUTS:
            return (f"the server already holds packets of {MAX_LAYOUTS} other layouts, its most "
                    f"(in {self.dir}): start trainers of their layouts to take them")
        try:
            store = self.stores.get(tag)
            if store is None:
                store = self.stores[tag] = Spool(self.dir / tag_name(tag), self.max_bytes,
                                                 self.fsync).open()
            store.push(frames, meta)
        except (OSError, NetrlError) as exc:  # NetrlError: the folder cannot be made or read
            return f"the disk refused the held packets' folder {self.dir} ({exc})"
        return None

    def release_to(self, tag: int, spool: Spool, gate: SpoolGate) -> None:
        """Move packets held for layout ``tag`` (the connected trainer's) back to ``spool``, unless
        ``gate`` rests it after the disk refused; a refusal now makes it rest."""
        if tag in self.stores and not gate.resting(time.monotonic()):
            try:
                self.release(tag, spool)
            except OSError as exc:
                gate.failed(exc)

    def release(self, tag: int, spool: Spool) -> int:
        """Move packets of layout ``tag`` to the end of ``spool``, as many as fit there (up to
        :data:`RELEASE_PER_PASS`); the samples moved. An OSError (the spool's disk refusing) leaves
        the rest held."""
        store = self.stores.get(tag)
        moved = 0
        if store is None:
            return 0
        for sp in store.take(lambda count, *_: count < RELEASE_PER_PASS):
            if not spool.fits(sp.nbytes):
                store.untake(sp.position)
                break
            try:
                spool.push(sp.frames, sp.meta)
            except OSError:
                store.untake(sp.position)
                raise
            store.ack(sp.position)  # after the push: a crash between the two only sends it twice
            moved += int(sp.meta["steps"])
        self.stats.samples_released += moved
        if not store.packets:
            self._remove(tag)
            log.info("the packets held for sample layout %s are back in the spool, for the "
                     "trainer of their layout", tag_name(tag))
        return moved

    def _remove(self, tag: int) -> None:
        store = self.stores.pop(tag)
        store.close()
        shutil.rmtree(store.dir, ignore_errors=True)

    def tick(self) -> None:
        """Record the heads that moved (see :meth:`Spool.tick`)."""
        for store in self.stores.values():
            store.tick()

    def describe(self) -> dict[str, Any]:
        """What ``--status`` shows: the totals, and per layout its packets, samples and workers."""
        layouts = {}
        for tag, store in self.stores.items():
            layouts[tag_name(tag)] = {"packets": store.packets, "samples": store.steps,
                                      "workers": sorted(store.by_worker)}
        return {"packets": self.packets, "samples": self.steps, "bytes": self.bytes,
                "layouts": layouts}

    def close(self) -> None:
        """Record every head and close the folders. Idempotent."""
        for store in self.stores.values():
            store.close()
