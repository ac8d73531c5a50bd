"""What the server sends each worker of each model: what the worker holds, what is on its way, and
the choice between a model's cached encodings (netrl.server.weight_cache holds them).

Per worker and per model, :class:`WorkerModel` keeps the (format, version) the worker acknowledged
(unknown after a ``need_full`` ACK or a new trainer session), the messages sent completely but not
acknowledged yet (oldest first), and the one whose parts are being sent. Deltas are pipelined: while
messages of a model are in flight to a worker, the next one may go when it is a delta whose base is
the newest in flight, in the same format (the worker receives them in order over one connection and
applies each to the version it just took), at most :data:`MAX_PIPELINE` messages of a model sent or
being sent and not acknowledged, and only while the worker's measured link rate carries what is in
flight within the budget (or, while the rate is unknown, that is under :data:`MIN_RATE_BYTES`)
(behind a link that cannot keep
up, queued deltas would only ever bring old versions: the newest then goes after the ACKs, as a
chain or in full); a full version waits for every ACK (sent behind a delta it would waste the
link). So a chain ``b -> ... -> v`` streams back to back, not one delta per round trip. ACKs come in
order: each must match the oldest message in flight. A ``need_full`` ACK drops everything in
flight (the deltas behind it cannot apply either): their ACKs, each a ``need_full`` too, are
expected and ignored. Models are independent: a big policy streaming to a slow worker never holds
back a small model's next version.

:func:`choose` picks between the candidates of the newest version (one per format the worker
decodes, each either a full encoding or the delta chain from the version the worker holds, or will
hold once what is in flight arrives): the only one; or, with several (``auto``), the lowest ``rank``
(fidelity order, 0 = exact) whose bytes reach the worker within ``budget_s`` at its measured
link rate, else the one with the fewest bytes; the fewest bytes too while the rate is unknown.
:class:`LinkRate` measures the rate from complete versions of at least :data:`MIN_RATE_BYTES`:
bytes / (ACK time - time its first part was sent, or the time the message before it was
acknowledged if later: a pipelined message's wait behind the one before is no slowness of
the link), smaller ones taken together until they reach that size, smoothed (EWMA 0.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_BUDGET_S", "MAX_PIPELINE", "MIN_RATE_BYTES", "Candidate", "LinkRate", "Sent", "WorkerModel",
           "choose"]

# smaller versions say more about the round trip than about the link's rate
MIN_RATE_BYTES = 64 << 10
RATE_EWMA = 0.5
DEFAULT_BUDGET_S = 1.0  # network.weight_budget_s's default, for a trainer that sends several
                        # formats without one
MAX_PIPELINE = 4  # messages of a model sent (or being sent) to a worker and not acknowledged yet
MAX_DROPPED = 64  # (format, version)s dropped from a pipeline whose ACKs are still awaited,
                  # per worker and model


@dataclass
class Sent:
    """One message of a model on its way to a worker: ``encoding``
    (netrl.server.weight_cache.Encoding) holds its parts; it is stale once that encoding holds
    another version (a newer one preempts it, as it always did)."""

    version: int
    format: str
    base: int | None  # a delta against this version (None: a full version)
    encoding: Any
    nbytes: int
    started: float = 0.0  # monotonic time its first part was sent (0: none yet)
    sent_parts: int = 0

    @property
    def stale(self) -> bool:
        return self.encoding.version != self.version

    @property
    def label(self) -> str:
        return f"v{self.version} ({self.format}{f', delta from v{self.base}' if self.base is not None else ''})"


@dataclass
class WorkerModel:
    """One model at one worker."""

    holds: tuple[str, int] | None = None  # (format, version) it acknowledged; None: unknown
    inflight: list[Sent] = field(default_factory=list)  # sent completely, not acknowledged yet:
                                                        # oldest first
    streaming: Sent | None = None  # its parts being sent
    # dropped from the pipeline: ACKs ignored
    dropped: dict[tuple[str, int], None] = field(default_factory=dict)
    acked_at: float = 0.0  # monotonic time of its last ACK
    ever_sent: bool = False  # an ACK of a model never sent is refused
    refused_logged: bool = False  # "not streamed to it" logged once per (worker, model)

    def reset(self) -> None:
        """A new trainer session: what it holds is unknown, and nothing is on its way any more."""
        self.holds, self.inflight, self.streaming = None, [], None
        self.dropped.clear()

    @property
    def version(self) -> int:
        return self.holds[1] if self.holds else -1

    @property
    def ahead(self) -> tuple[str, int] | None:
        """The (format, version) it will hold once what is in flight is acknowledged
        (that it holds without)."""
        return (self.inflight[-1].format, self.inflight[-1].version) if self.inflight else self.holds

    def drop_inflight(self) -> None:
        """A ``need_full`` ACK of the oldest in flight: the rest cannot apply, so their ACKs
        (need_full) are expected and ignored; a message half sent is abandoned (the worker never
        acknowledges a message it lacks parts of)."""
        for sent in self.inflight[1:]:
            self.dropped[(sent.format, sent.version)] = None
        while len(self.dropped) > MAX_DROPPED:  # (a worker that never acknowledges them)
            del self.dropped[next(iter(self.dropped))]
        self.inflight, self.streaming = [], None

    def describe(self) -> dict[str, Any]:
        about: dict[str, Any] = {"version": self.version, "format": self.holds[0] if self.holds else None}
        if self.inflight:
            about["in_flight"] = [s.label for s in self.inflight]
        if self.streaming:
            about["sending"] = self.streaming.label
        return about


@dataclass
class LinkRate:
    """A worker's measured link rate in bytes/s (None until MIN_RATE_BYTES came back ACKed, in
    one version or in smaller messages taken together)."""

    rate: float | None = None
    samples: int = 0
    # small messages (int8 deltas of 13 KB) add up to a sample: without them a worker that only
    # gets small ones kept the rate of its first full version, and deltas queued for a link
    # that had become slower
    small_bytes: int = 0
    small_seconds: float = 0.0

    def measured(self, nbytes: int, seconds: float) -> None:
        if seconds <= 0:
            return
        if nbytes < MIN_RATE_BYTES:
            self.small_bytes += nbytes
            self.small_seconds += seconds
            if self.small_bytes < MIN_RATE_BYTES:
                return
            nbytes, seconds = self.small_bytes, self.small_seconds
            self.small_bytes, self.small_seconds = 0, 0.0
        sample = nbytes / seconds
        self.rate = sample if self.rate is None else RATE_EWMA * sample + (1 - RATE_EWMA) * self.rate
        self.samples += 1


@dataclass(order=True)
class Candidate:
    """One way to bring a worker to the newest version in ``format``: ``first`` is the next
    message to send (the full encoding, or the first delta of the chain); ``nbytes`` counts the
    whole way (every delta of a chain)."""

    rank: int
    format: str
    nbytes: int
    first: Any = field(compare=False)
    base: int | None = field(default=None, compare=False)
    version: int = field(default=-1, compare=False)


def choose(candidates: list[Candidate], rate: float | None, budget_s: float | None) -> Candidate | None:
    """The candidate to send (None: there is none): see the module's docstring."""
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    fewest = min(candidates, key=lambda c: (c.nbytes, c.rank, c.format))
    if rate is None or rate <= 0:
        return fewest
    budget = budget_s if budget_s is not None else DEFAULT_BUDGET_S
    in_time = [c for c in candidates if c.nbytes / rate <= budget]
    return min(in_time, key=lambda c: (c.rank, c.nbytes, c.format)) if in_time else fewest
