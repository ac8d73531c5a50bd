"""The parts of one encoding of one model, as they arrive from the trainer: :class:`Encoding` (a
full version, with the last complete one kept while a newer one arrives) and :class:`DeltaChain` (a
(model, format)'s recent deltas). :mod:`netrl.server.weight_cache` holds them per model and format,
and says what that costs in memory."""

from __future__ import annotations

import logging
from typing import Any

from netrl.errors import ProtocolError
from netrl.protocol.wire import MAX_ENCODED_BYTES, check_layout, frames_nbytes

__all__ = ["MAX_DELTAS", "OVERHEAD_ROOM_BYTES", "PART_OVERHEAD_BYTES", "DeltaChain", "Encoding", "LoggedProblem"]

log = logging.getLogger(__name__)

# What a cached part costs the server beyond its frames (Python and zmq objects): measured at ~950
# bytes. A version's frames plus this per part must fit in max_bytes + OVERHEAD_ROOM_BYTES, so
# that neither many tiny parts nor huge headers make a version within max_bytes take far more
# memory; the room keeps a version of max_bytes in 1 MiB parts (1 KiB of bookkeeping per MiB,
# plus its layout) within the limit.
PART_OVERHEAD_BYTES = 1024
OVERHEAD_ROOM_BYTES = 16 << 20
MAX_DELTAS = 16  # per (model, format)


class LoggedProblem(str):
    """A refusal the cache has logged itself (once): the server only counts it."""


class Encoding:
    """Frames of each part of the newest version of one encoding received so far, and
    (``keep_previous``) of the last complete version while a newer one is arriving.

    Parts must continue each other exactly (same declared size, next offset, each as large as
    part 0 but the last, which ends the buffer, so a ``nbytes`` version of ``part_bytes`` parts
    has ``ceil(nbytes / part_bytes)`` of them), versions only grow, and a version is at most
    ``max_bytes``, and takes at most ``max_bytes + OVERHEAD_ROOM_BYTES`` of memory: its frames
    plus :data:`PART_OVERHEAD_BYTES` per part. A version's parts may be resent (a trainer that
    reconnected): those of the version already complete are ignored.
    """

    def __init__(self, max_bytes: int, label: str = "weights", sized_layout: bool = True,
                 keep_previous: bool = True) -> None:
        self.max_bytes, self.label = max_bytes, label
        # the layout describes this buffer (a float32 full version)
        self.sized_layout = sized_layout
        self.keep_previous = keep_previous
        self.parts: list[list[Any]] = []
        self.nparts = 0  # how many parts the newest version has
        self.version = -1
        self.nbytes = 0  # the newest version's size
        self.filled = 0  # bytes its parts so far cover, from offset 0
        self.part_bytes = 0  # the newest version's part size: that of its part 0
        self.held = 0  # memory its parts so far take: frames plus PART_OVERHEAD_BYTES each
        self.completed = 0  # versions completed so far
        self.base: int | None = None  # a delta's base version
        # (version, nbytes, parts, held), complete
        self._previous: tuple[int, int, list[list[Any]], int] | None = None
        self._checked: tuple[Any, int] | None = None  # the last layout and size that
                                                      # passed check_layout

    @property
    def complete(self) -> bool:
        return bool(self.parts) and len(self.parts) == self.nparts

    @property
    def complete_version(self) -> int:
        """The newest version a worker can get in full (-1: none)."""
        return self.version if self.complete else (self._previous[0] if self._previous else -1)

    @property
    def memory(self) -> int:
        return self.held + (self._previous[3] if self._previous else 0)

    def clear(self) -> None:
        self._set(-1, 0, [], 0, 0)
        self._previous = None

    def add(self, version: int, part: int, parts: int, offset: int, nbytes: int, size: int,
            frames: list[Any], layout: list[Any]) -> str | None:
        """Cache one part (``size`` bytes of a ``nbytes`` version, at ``offset``); returns what
        was wrong if it does not continue the version being received. A bad last part, or one over
        ``max_bytes``, abandons its version. ``layout`` is the part's ``body["layout"]``: part
        0's is checked (:func:`check_layout`)."""
        if version == self.version and self.complete:
            return None  # resent after a reconnect: the same parts again
        cost = frames_nbytes(frames) + PART_OVERHEAD_BYTES
        name = f"{self.label} v{version}"
        if part == 0:
            problem = self._first_part(version, parts, nbytes, size, layout)
            if problem:
                return problem
            if self.complete and self.keep_previous:
                self._previous = (self.version, self.nbytes, self.parts, self.held)
            self._set(version, parts, [], nbytes, 0)
            self.part_bytes = size
        elif version != self.version or part != len(self.parts) or parts != self.nparts:
            return f"{name} part {part} arrived out of order"
        elif nbytes != self.nbytes or offset != self.filled:
            return (f"{name} part {part} ({size} bytes at offset {offset} of {nbytes}) "
                    f"does not continue the {self.filled} of {self.nbytes} bytes before it")
        elif part < parts - 1 and size != self.part_bytes:
            return (f"{name} part {part} has {size} bytes; every part but the last has the "
                    f"{self.part_bytes} bytes of part 0")
        # headers far larger than a trainer's
        if self.held + cost > self.max_bytes + OVERHEAD_ROOM_BYTES:
            self._abandon(f"its parts take over server.max_weights_bytes + "
                          f"{OVERHEAD_ROOM_BYTES} bytes of memory")
            return (f"{name} part {part} takes {cost} bytes of memory "
                    f"after {self.held} for the parts before it: over "
                    f"server.max_weights_bytes ({self.max_bytes}) + {OVERHEAD_ROOM_BYTES}")
        if part == parts - 1 and offset + size != nbytes:
            self._abandon(f"its last part ends at byte {offset + size} of {nbytes}")
            return f"{name} end at byte {offset + size} of {nbytes}"
        self.parts.append(frames)
        self.filled = offset + size
        self.held += cost
        if self.complete:
            self.completed += 1
            self._previous = None
        return None

    def _first_part(self, version: int, parts: int, nbytes: int, size: int, layout: list[Any]) -> str | None:
        """What is wrong with a version that part 0 starts (None: cache it)."""
        name = f"{self.label} v{version}"
        if version < self.version:
            return f"{name} are older than v{self.version}, already received from this trainer"
        if nbytes > self.max_bytes:
            return (f"{name} declare {nbytes} bytes, over "
                    f"server.max_weights_bytes ({self.max_bytes})")
        if size == 0 and nbytes:
            return (f"{name} declare {nbytes} bytes, but part 0 is "
                    f"empty (only an empty version may be)")
        # every part is as large as part 0 but the last
        expected = -(-nbytes // size) if size else 1
        if parts != expected:
            return (f"{name} declare {nbytes} bytes in {parts} parts, but part 0 "
                    f"has {size} bytes: parts of that size make {expected}")
        if nbytes + parts * PART_OVERHEAD_BYTES > self.max_bytes + OVERHEAD_ROOM_BYTES:
            return (f"{name} of {nbytes} bytes in {parts} parts would take over "
                    f"server.max_weights_bytes ({self.max_bytes}) + {OVERHEAD_ROOM_BYTES} bytes of "
                    f"memory, with {PART_OVERHEAD_BYTES} bytes of bookkeeping per "
                    f"part: send larger parts (netrl's trainer sends 1 MiB parts)")
        # (another encoding's size says nothing of it)
        bound = nbytes if self.sized_layout else MAX_ENCODED_BYTES
        if (layout, bound) != self._checked:  # a trainer sends the same layout with every version
            try:
                check_layout(layout, bound)
            except ProtocolError as exc:
                return f"{name} have a bad layout, refused (workers would refuse them too): {exc}"
            self._checked = (layout, bound)
        return None

    def _set(self, version: int, nparts: int, parts: list[list[Any]], nbytes: int, held: int) -> None:
        self.version, self.nparts, self.parts, self.nbytes = version, nparts, parts, nbytes
        self.filled = nbytes if parts else 0
        self.part_bytes, self.held = 0, held

    def _abandon(self, why: str) -> None:
        log.warning("%s v%d abandoned: %s; workers get %s", self.label, self.version, why,
                    f"v{self._previous[0]}" if self._previous else "none until the next version")
        if self._previous:
            version, nbytes, parts, held = self._previous
            self._set(version, len(parts), parts, nbytes, held)
        else:
            self._set(-1, 0, [], 0, 0)
        self._previous = None

    def abandon_unfinished(self, why: str) -> None:
        if self.parts and not self.complete:
            self._abandon(why)


class DeltaChain:
    """The deltas of one (model, format): complete ones by version, and the one arriving."""

    def __init__(self, max_bytes: int, label: str) -> None:
        self.max_bytes, self.label = max_bytes, label
        self.links: dict[int, Encoding] = {}
        self.arriving: Encoding | None = None
        self.completed = 0  # deltas completed so far

    def add(self, version: int, base: int, part: int, parts: int, offset: int, nbytes: int, size: int,
            frames: list[Any], layout: list[Any], known: set[int]) -> str | None:
        if version in self.links:
            return None  # resent after a reconnect
        if part == 0:
            newest = max([*self.links, *([self.arriving.version] if self.arriving else [])], default=-1)
            if version <= newest:
                return (f"{self.label} v{version} are not newer than "
                        f"the delta to v{newest}, already received")
            if base not in known:
                log.debug("%s v%d (from v%d) dropped: it continues no version of this "
                          "model and format the trainer sent, so no worker could apply it",
                          self.label, version, base)
                return LoggedProblem(f"{self.label} v{version} continue "
                                     f"v{base}, which this trainer never sent")
            if self.arriving is not None:
                # unfinished: a worker streaming it starts over with the newer one
                self.arriving.clear()
            self.arriving = Encoding(self.max_bytes, self.label, sized_layout=False, keep_previous=False)
            self.arriving.base = base
        elif self.arriving is None or self.arriving.version != version:
            return f"{self.label} v{version} part {part} arrived out of order"
        delta = self.arriving
        problem = delta.add(version, part, parts, offset, nbytes, size, frames, layout)
        if problem or delta.version < 0:
            self.arriving = None if delta.version < 0 else self.arriving
            return problem
        if delta.complete:
            self.links[version] = delta
            self.arriving = None
            self.completed += 1
        return None

    def trim(self, full_nbytes: int) -> None:
        """At most MAX_DELTAS deltas, and at most the full encoding's size in delta
        bytes: the oldest go first."""
        while self.links and (len(self.links) > MAX_DELTAS or sum(d.nbytes for d in self.links.values()) > full_nbytes):
            del self.links[min(self.links)]

    def chain(self, held: int, version: int) -> list[Encoding] | None:
        """The deltas from ``held`` to ``version`` (the last may be arriving), oldest first;
        None if one is missing."""
        links, at = [], version
        while at != held:
            link = self.links.get(at) or (self.arriving if self.arriving and self.arriving.version == at else None)
            if link is None or link.base is None or link.base < held:
                return None
            links.append(link)
            at = link.base
        return links[::-1] or None

    @property
    def memory(self) -> int:
        return sum(d.held for d in self.links.values()) + (self.arriving.held if self.arriving else 0)
