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
    """Frames of each part of the newest version received so far."""

    def __init__(self) -> None:
        self.parts: list[list[Any]] = []
        self.nparts = 0  # how many parts the newest version has
        self.version = -1
        self.session = ""  # the trainer process the cached version came from
        self.newest = -1  # the newest complete version from any trainer session, told to a new trainer

    def trainer_session(self, session: str, peers: list[Peer]) -> None:
        """A trainer said HELLO: a new trainer process need not continue the old one's versions, so forget the
        cached one and what every peer holds."""
        if session == self.session:
            return
        if self.session:
            log.info("new trainer session %s; dropping cached weights v%d", session[:8], self.version)
        self.session = session
        self.parts, self.nparts, self.version = [], 0, -1
        for peer in peers:
            peer.version, peer.inflight_version, peer.streaming = -1, None, None

    @property
    def complete(self) -> bool:
        return bool(self.parts) and len(self.parts) == self.nparts

    def add(self, version: int, part: int, parts: int, frames: list[Any]) -> str | None:
        """Cache one part; returns what was wrong if it does not continue the version being received."""
        if part == 0:
            self.parts, self.version, self.nparts = [frames], version, parts
        elif version == self.version and part == len(self.parts) and parts == self.nparts:
            self.parts.append(frames)
        else:
            return f"weights v{version} part {part} arrived out of order"
        if self.complete:
            self.newest = max(self.newest, version)
        return None

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
