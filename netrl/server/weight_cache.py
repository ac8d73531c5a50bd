"""The server's newest-weights cache: parts arrive from the trainer and are streamed to each worker.

A version arrives as ``parts`` WEIGHTS messages (see :func:`netrl.protocol.wire.weight_parts`). Each part is forwarded
to workers as soon as it arrives, so the trainer->server and server->worker hops overlap. A worker gets the next
version only after acknowledging the one it received completely (a slow worker gets the newest version, not every
version); a newer version preempts one still streaming, starting from its first part.

The cache refuses a version unless its parts are exactly those :func:`~netrl.protocol.wire.weight_parts` makes (part 0
sets the part size) and part 0's layout passes :func:`~netrl.protocol.wire.check_layout`, which each worker applies
too. This module never imports torch: the server only moves bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from netrl.errors import ProtocolError
from netrl.protocol.wire import check_layout, frames_nbytes
from netrl.server.peers import Peer

__all__ = ["OVERHEAD_ROOM_BYTES", "PART_OVERHEAD_BYTES", "WeightCache"]

log = logging.getLogger(__name__)

# What a cached part costs the server beyond its frames (Python and zmq objects): measured at ~950 bytes. A version's
# frames plus this per part must fit in max_bytes + OVERHEAD_ROOM_BYTES, so that neither many tiny parts nor huge
# headers make a version within max_bytes take far more memory; the room keeps a version of max_bytes in 1 MiB
# parts (1 KiB of bookkeeping per MiB, plus its layout) within the limit.
PART_OVERHEAD_BYTES = 1024
OVERHEAD_ROOM_BYTES = 16 << 20



class WeightCache:
    """Frames of each part of the newest version received so far, and of the last complete version while a newer
    one is arriving: if the newer one is abandoned (its trainer left, or a part did not fit), workers get the last
    complete version instead of half of one.

    Parts must continue each other exactly (same declared size, next offset, each as large as part 0 but the last,
    which ends the buffer, so a ``nbytes`` version of ``part_bytes`` parts has ``ceil(nbytes / part_bytes)`` of
    them), a trainer session's versions only grow, and a version is at most ``max_bytes``, and takes at most
    ``max_bytes + OVERHEAD_ROOM_BYTES`` of memory: its frames plus :data:`PART_OVERHEAD_BYTES` per part. A
    version's parts may be resent (a trainer that reconnected): those of the version already complete are ignored.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parts: list[list[Any]] = []
        self.nparts = 0  # how many parts the newest version has
        self.version = -1
        self.nbytes = 0  # the newest version's size
        self.filled = 0  # bytes its parts so far cover, from offset 0
        self.part_bytes = 0  # the newest version's part size: that of its part 0
        self.held = 0  # memory its parts so far take: frames plus PART_OVERHEAD_BYTES each
        self.session = ""  # the trainer process the cached version came from
        self.newest = -1  # the newest complete version from any trainer session, told to a new trainer
        self.completed = 0  # versions completed so far
        self._previous: tuple[int, int, list[list[Any]]] | None = None  # (version, nbytes, parts), complete
        self._checked: tuple[Any, int] | None = None  # the last layout and size that passed check_layout

    def trainer_session(self, session: str, peers: list[Peer]) -> None:
        """A trainer said HELLO: a new trainer process need not continue the old one's versions, so forget the
        cached one and what every peer holds."""
        if session == self.session:
            return
        if self.session:
            log.info("new trainer session %s; dropping cached weights v%d", session[:8], self.version)
        self.session = session
        self._set(-1, 0, [], 0)
        self._previous = None
        for peer in peers:
            peer.version, peer.inflight_version, peer.streaming = -1, None, None

    def trainer_left(self) -> None:
        """The trainer is gone: a version it did not finish is abandoned."""
        if self.parts and not self.complete:
            self._abandon(f"its trainer left after {len(self.parts)} of {self.nparts} parts")

    @property
    def complete(self) -> bool:
        return bool(self.parts) and len(self.parts) == self.nparts

    @property
    def complete_version(self) -> int:
        """The newest version a worker can get in full (-1: none)."""
        return self.version if self.complete else (self._previous[0] if self._previous else -1)

    def add(self, version: int, part: int, parts: int, offset: int, nbytes: int, size: int,
            frames: list[Any], layout: list[Any]) -> str | None:
        """Cache one part (``size`` bytes of a ``nbytes`` version, at ``offset``); returns what was wrong if it does
        not continue the version being received. A bad last part, or one over ``max_bytes``, abandons its version.
        ``layout`` is the part's ``body["layout"]``: part 0's is checked (:func:`check_layout`)."""
        if version == self.version and self.complete:
            return None  # resent after a reconnect: the same parts again
        cost = frames_nbytes(frames) + PART_OVERHEAD_BYTES
        if part == 0:
            problem = self._first_part(version, parts, nbytes, size, layout)
            if problem:
                return problem
            if self.complete:
                self._previous = (self.version, self.nbytes, self.parts)
            self._set(version, parts, [], nbytes)
            self.part_bytes = size
        elif version != self.version or part != len(self.parts) or parts != self.nparts:
            return f"weights v{version} part {part} arrived out of order"
        elif nbytes != self.nbytes or offset != self.filled:
            return (f"weights v{version} part {part} ({size} bytes at offset {offset} of {nbytes}) does not continue "
                    f"the {self.filled} of {self.nbytes} bytes before it")
        elif part < parts - 1 and size != self.part_bytes:
            return (f"weights v{version} part {part} has {size} bytes; every part but the last has the "
                    f"{self.part_bytes} bytes of part 0")
        if self.held + cost > self.max_bytes + OVERHEAD_ROOM_BYTES:  # headers far larger than a trainer's
            self._abandon(f"its parts take over server.max_weights_bytes + {OVERHEAD_ROOM_BYTES} bytes of memory")
            return (f"weights v{version} part {part} takes {cost} bytes of memory after {self.held} for the parts "
                    f"before it: over server.max_weights_bytes ({self.max_bytes}) + {OVERHEAD_ROOM_BYTES}")
        if part == parts - 1 and offset + size != nbytes:
            self._abandon(f"its last part ends at byte {offset + size} of {nbytes}")
            return f"weights v{version} end at byte {offset + size} of {nbytes}"
        self.parts.append(frames)
        self.filled = offset + size
        self.held += cost
        if self.complete:
            self.newest = max(self.newest, version)
            self.completed += 1
            self._previous = None
        return None

    def _first_part(self, version: int, parts: int, nbytes: int, size: int, layout: list[Any]) -> str | None:
        """What is wrong with a version that part 0 starts (None: cache it)."""
        if version < self.version:
            return f"weights v{version} are older than v{self.version}, already received from this trainer"
        if nbytes > self.max_bytes:
            return f"weights v{version} declare {nbytes} bytes, over server.max_weights_bytes ({self.max_bytes})"
        if size == 0 and nbytes:
            return f"weights v{version} declare {nbytes} bytes, but part 0 is empty (only an empty version may be)"
        expected = -(-nbytes // size) if size else 1  # every part is as large as part 0 but the last
        if parts != expected:
            return (f"weights v{version} declare {nbytes} bytes in {parts} parts, but part 0 has {size} bytes: parts "
                    f"of that size make {expected}")
        if nbytes + parts * PART_OVERHEAD_BYTES > self.max_bytes + OVERHEAD_ROOM_BYTES:
            return (f"weights v{version} of {nbytes} bytes in {parts} parts would take over server.max_weights_bytes "
                    f"({self.max_bytes}) + {OVERHEAD_ROOM_BYTES} bytes of memory, with {PART_OVERHEAD_BYTES} bytes of "
                    "bookkeeping per part: send larger parts (netrl's trainer sends 1 MiB parts)")
        if (layout, nbytes) != self._checked:  # a trainer sends the same layout with every version
            try:
                check_layout(layout, nbytes)
            except ProtocolError as exc:
                return f"weights v{version} have a bad layout, refused (workers would refuse them too): {exc}"
            self._checked = (layout, nbytes)
        return None

    def _set(self, version: int, nparts: int, parts: list[list[Any]], nbytes: int) -> None:
        self.version, self.nparts, self.parts, self.nbytes = version, nparts, parts, nbytes
        self.filled = nbytes if parts else 0
        self.part_bytes = self.held = 0  # a version set whole is complete: no part of it is added any more

    def _abandon(self, why: str) -> None:
        log.warning("weights v%d abandoned: %s; workers get %s", self.version, why,
                    f"v{self._previous[0]}" if self._previous else "none until the next version")
        if self._previous:
            version, nbytes, parts = self._previous
            self._set(version, len(parts), parts, nbytes)
        else:
            self._set(-1, 0, [], 0)
        self._previous = None

    def stream(self, worker: Peer, send: Callable[[list[Any]], bool]) -> bool:
        """Send ``worker`` the parts of the newest version it lacks, as far as they have arrived.

        ``send`` returns False when the worker's queue is full; the next call resumes where this one stopped.
        Returns True when this call completed the version for the worker."""
        version = self.version
        if not self.parts or worker.version >= version or worker.inflight_version == version:
            return False
        if worker.streaming != version:
            if worker.inflight_version is not None and worker.streaming is None:
                return False  # it has a complete older version to acknowledge first
            worker.streaming, worker.sent_parts = version, 0
        while worker.sent_parts < len(self.parts):
            if not send(self.parts[worker.sent_parts]):
                return False
            worker.sent_parts += 1
        if worker.sent_parts < self.nparts:
            return False
        worker.inflight_version, worker.streaming = version, None
        return True
