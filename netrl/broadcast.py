"""The server's newest-weights cache: parts arrive from the trainer and are streamed to each worker.

A version arrives as ``parts`` WEIGHTS messages (see :func:`netrl.wire.weight_parts`). Each part is forwarded to
workers as soon as it arrives, so the trainer->server and server->worker hops overlap. A worker gets the next
version only after acknowledging the one it received completely (a slow worker gets the newest version, not every
version); a newer version preempts one still streaming, starting from its first part.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from netrl.peers import Peer

log = logging.getLogger(__name__)


class WeightCache:
    """Frames of each part of the newest version received so far, and of the last complete version while a newer
    one is arriving: if the newer one is abandoned (its trainer left, or a part did not fit), workers get the last
    complete version instead of half of one.

    Parts must continue each other exactly (same size, next offset, the last part ending the buffer), a trainer
    session's versions only grow, and a version is at most ``max_bytes``. A version's parts may be resent (a
    trainer that reconnected): those of the version already complete are ignored.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parts: list[list[Any]] = []
        self.nparts = 0  # how many parts the newest version has
        self.version = -1
        self.nbytes = 0  # the newest version's size
        self.filled = 0  # bytes its parts so far cover, from offset 0
        self.session = ""  # the trainer process the cached version came from
        self.newest = -1  # the newest complete version from any trainer session, told to a new trainer
        self.completed = 0  # versions completed so far
        self._previous: tuple[int, int, list[list[Any]]] | None = None  # (version, nbytes, parts), complete

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
            frames: list[Any]) -> str | None:
        """Cache one part (``size`` bytes of a ``nbytes`` version, at ``offset``); returns what was wrong if it does
        not continue the version being received. A bad last part abandons its version."""
        if version == self.version and self.complete:
            return None  # resent after a reconnect: the same parts again
        if part == 0:
            if version < self.version:
                return f"weights v{version} are older than v{self.version}, already received from this trainer"
            if nbytes > self.max_bytes:
                return (f"weights v{version} declare {nbytes} bytes, over server.max_weights_bytes "
                        f"({self.max_bytes})")
            if self.complete:
                self._previous = (self.version, self.nbytes, self.parts)
            self._set(version, parts, [], nbytes)
        elif version != self.version or part != len(self.parts) or parts != self.nparts:
            return f"weights v{version} part {part} arrived out of order"
        elif nbytes != self.nbytes or offset != self.filled:
            return (f"weights v{version} part {part} ({size} bytes at offset {offset} of {nbytes}) does not continue "
                    f"the {self.filled} of {self.nbytes} bytes before it")
        if part == parts - 1 and offset + size != nbytes:
            self._abandon(f"its last part ends at byte {offset + size} of {nbytes}")
            return f"weights v{version} end at byte {offset + size} of {nbytes}"
        self.parts.append(frames)
        self.filled = offset + size
        if self.complete:
            self.newest = max(self.newest, version)
            self.completed += 1
            self._previous = None
        return None

    def _set(self, version: int, nparts: int, parts: list[list[Any]], nbytes: int) -> None:
        self.version, self.nparts, self.parts, self.nbytes = version, nparts, parts, nbytes
        self.filled = nbytes if parts else 0

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
