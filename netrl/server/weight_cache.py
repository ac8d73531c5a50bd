"""The server's weights cache: each named model's newest versions, in each format the trainer sends, as parts that
arrive from the trainer and are streamed to each worker.

A version arrives as ``parts`` WEIGHTS messages (see :func:`netrl.protocol.wire.weight_parts`), labelled by model
(absent: "policy"), format (absent: "float32") and, for a delta, its ``base``. Each part is forwarded to workers as soon
as it arrives, so the trainer->server and server->worker hops overlap. A worker gets a model's next message only after
acknowledging the one it received completely (a slow worker gets the newest version, not every version); a newer
version preempts one still streaming, starting from its first part. Which encoding each worker gets is
:mod:`netrl.server.weight_choice`'s choice.

What is kept, per trainer session: at most ``MAX_MODELS`` models (:data:`netrl.protocol.wire.MAX_MODELS`), each in at
most :data:`MAX_FORMATS` formats. Per (model, format): the newest full encoding, plus the last complete one while a
newer one arrives (if the newer one is abandoned, workers get the last complete version instead of half of one); and a
chain of deltas of recent versions, at most :data:`MAX_DELTAS` of them and at most the full encoding's size in delta
bytes (the oldest go first), plus the one arriving. Each encoding takes at most ``max_bytes + OVERHEAD_ROOM_BYTES`` of
memory (its frames plus :data:`PART_OVERHEAD_BYTES` per part), so the whole cache stays under
``MAX_MODELS * MAX_FORMATS * 4 * (max_bytes + OVERHEAD_ROOM_BYTES)``: two full encodings, the deltas and the arriving
delta per (model, format); in practice, a few times the largest model's float32 size.

The cache refuses an encoding unless its parts are exactly those :func:`~netrl.protocol.wire.weight_parts` makes (part 0
sets the part size) and part 0's layout passes :func:`~netrl.protocol.wire.check_layout`, which each worker applies
too (for a float32 full version against its size; for others only its structure: the server never decodes). A delta
whose base is no version of its (model, format) this trainer session sent can never be applied: it is dropped. This
module never imports torch: the server only moves bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from netrl.errors import ProtocolError
from netrl.protocol.wire import MAX_ENCODED_BYTES, MAX_MODELS, check_layout, frames_nbytes
from netrl.server.peers import Peer
from netrl.server.weight_choice import Sent, next_sent

__all__ = ["MAX_DELTAS", "MAX_FORMATS", "OVERHEAD_ROOM_BYTES", "PART_OVERHEAD_BYTES", "Encoding", "LoggedProblem",
           "ModelCache", "WeightCache"]

log = logging.getLogger(__name__)

# What a cached part costs the server beyond its frames (Python and zmq objects): measured at ~950 bytes. A version's
# frames plus this per part must fit in max_bytes + OVERHEAD_ROOM_BYTES, so that neither many tiny parts nor huge
# headers make a version within max_bytes take far more memory; the room keeps a version of max_bytes in 1 MiB
# parts (1 KiB of bookkeeping per MiB, plus its layout) within the limit.
PART_OVERHEAD_BYTES = 1024
OVERHEAD_ROOM_BYTES = 16 << 20
MAX_FORMATS = 4  # per model: auto sends three
MAX_DELTAS = 16  # per (model, format)
KNOWN_VERSIONS = 64  # versions of a (model, format) remembered as bases a delta may continue


class LoggedProblem(str):
    """A refusal the cache has logged itself (once): the server only counts it."""


class Encoding:
    """Frames of each part of the newest version of one encoding received so far, and (``keep_previous``) of the last
    complete version while a newer one is arriving.

    Parts must continue each other exactly (same declared size, next offset, each as large as part 0 but the last,
    which ends the buffer, so a ``nbytes`` version of ``part_bytes`` parts has ``ceil(nbytes / part_bytes)`` of
    them), versions only grow, and a version is at most ``max_bytes``, and takes at most
    ``max_bytes + OVERHEAD_ROOM_BYTES`` of memory: its frames plus :data:`PART_OVERHEAD_BYTES` per part. A
    version's parts may be resent (a trainer that reconnected): those of the version already complete are ignored.
    """

    def __init__(self, max_bytes: int, label: str = "weights", sized_layout: bool = True,
                 keep_previous: bool = True) -> None:
        self.max_bytes, self.label = max_bytes, label
        self.sized_layout = sized_layout  # the layout describes this buffer (a float32 full version)
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
        self._previous: tuple[int, int, list[list[Any]], int] | None = None  # (version, nbytes, parts, held), complete
        self._checked: tuple[Any, int] | None = None  # the last layout and size that passed check_layout

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
        """Cache one part (``size`` bytes of a ``nbytes`` version, at ``offset``); returns what was wrong if it does
        not continue the version being received. A bad last part, or one over ``max_bytes``, abandons its version.
        ``layout`` is the part's ``body["layout"]``: part 0's is checked (:func:`check_layout`)."""
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
            return (f"{name} part {part} ({size} bytes at offset {offset} of {nbytes}) does not continue "
                    f"the {self.filled} of {self.nbytes} bytes before it")
        elif part < parts - 1 and size != self.part_bytes:
            return (f"{name} part {part} has {size} bytes; every part but the last has the "
                    f"{self.part_bytes} bytes of part 0")
        if self.held + cost > self.max_bytes + OVERHEAD_ROOM_BYTES:  # headers far larger than a trainer's
            self._abandon(f"its parts take over server.max_weights_bytes + {OVERHEAD_ROOM_BYTES} bytes of memory")
            return (f"{name} part {part} takes {cost} bytes of memory after {self.held} for the parts "
                    f"before it: over server.max_weights_bytes ({self.max_bytes}) + {OVERHEAD_ROOM_BYTES}")
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
            return f"{name} declare {nbytes} bytes, over server.max_weights_bytes ({self.max_bytes})"
        if size == 0 and nbytes:
            return f"{name} declare {nbytes} bytes, but part 0 is empty (only an empty version may be)"
        expected = -(-nbytes // size) if size else 1  # every part is as large as part 0 but the last
        if parts != expected:
            return (f"{name} declare {nbytes} bytes in {parts} parts, but part 0 has {size} bytes: parts "
                    f"of that size make {expected}")
        if nbytes + parts * PART_OVERHEAD_BYTES > self.max_bytes + OVERHEAD_ROOM_BYTES:
            return (f"{name} of {nbytes} bytes in {parts} parts would take over server.max_weights_bytes "
                    f"({self.max_bytes}) + {OVERHEAD_ROOM_BYTES} bytes of memory, with {PART_OVERHEAD_BYTES} bytes of "
                    "bookkeeping per part: send larger parts (netrl's trainer sends 1 MiB parts)")
        bound = nbytes if self.sized_layout else MAX_ENCODED_BYTES  # (another encoding's size says nothing of it)
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
                return f"{self.label} v{version} are not newer than the delta to v{newest}, already received"
            if base not in known:
                log.debug("%s v%d (from v%d) dropped: it continues no version of this model and format the trainer "
                          "sent, so no worker could apply it", self.label, version, base)
                return LoggedProblem(f"{self.label} v{version} continue v{base}, which this trainer never sent")
            if self.arriving is not None:
                self.arriving.clear()  # unfinished: a worker streaming it starts over with the newer one
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
        """At most MAX_DELTAS deltas, and at most the full encoding's size in delta bytes: the oldest go first."""
        while self.links and (len(self.links) > MAX_DELTAS or sum(d.nbytes for d in self.links.values()) > full_nbytes):
            del self.links[min(self.links)]

    def chain(self, held: int, version: int) -> list[Encoding] | None:
        """The deltas from ``held`` to ``version`` (the last may be arriving), oldest first; None if one is missing."""
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


class ModelCache:
    """One model's encodings: a full :class:`Encoding` and a :class:`DeltaChain` per format."""

    def __init__(self, name: str, max_bytes: int) -> None:
        self.name, self.max_bytes = name, max_bytes
        self.fulls: dict[str, Encoding] = {}
        self.deltas: dict[str, DeltaChain] = {}
        self.rank: dict[str, int] = {}
        self.budget_s: float | None = None
        self.known: dict[str, set[int]] = {}  # per format: versions it had, which deltas may continue
        self.started: dict[int, set[tuple[str, bool]]] = {}  # per recent version: (format, delta?) that started

    def label(self, fmt: str, delta: bool) -> str:
        if self.name == "policy" and fmt == "float32" and not delta:
            return "weights"  # today's messages, word for word
        return f"weights {self.name}/{fmt}{' delta' if delta else ''}"

    @property
    def complete_version(self) -> int:
        return max((e.complete_version for e in self.fulls.values()), default=-1)

    def add(self, fmt: str, base: int | None, version: int, part: int, parts: int, offset: int, nbytes: int,
            size: int, frames: list[Any], layout: list[Any], fields: dict[str, Any]) -> str | None:
        if fmt not in self.fulls:
            if len(self.fulls) >= MAX_FORMATS:
                return (f"weights of model {self.name!r} in format {fmt!r}: this model already comes in "
                        f"{MAX_FORMATS} formats ({', '.join(self.fulls)}), the most a server keeps")
            if base is not None:
                return LoggedProblem(f"{self.label(fmt, True)} v{version} arrived before any full version")
            self.fulls[fmt] = Encoding(self.max_bytes, self.label(fmt, False), sized_layout=fmt == "float32")
            self.deltas[fmt] = DeltaChain(self.max_bytes, self.label(fmt, True))
            self.known[fmt] = set()
        full = self.fulls[fmt]
        if base is None:
            problem = full.add(version, part, parts, offset, nbytes, size, frames, layout)
        else:
            problem = self.deltas[fmt].add(version, base, part, parts, offset, nbytes, size, frames, layout,
                                           self.known[fmt])
        if problem:
            return problem
        if part == 0:
            self.rank[fmt] = fields.get("rank", self.rank.get(fmt, 0))
            self.budget_s = fields.get("budget_s", self.budget_s)
            self.started.setdefault(version, set()).add((fmt, base is not None))
            while len(self.started) > 3:
                del self.started[min(self.started)]
        if full.complete and full.version >= 0:
            self._remember(fmt, full.version)
        chain = self.deltas[fmt]
        if version in chain.links:
            self._remember(fmt, version)
        chain.trim(full.nbytes)
        return None

    def _remember(self, fmt: str, version: int) -> None:
        known = self.known[fmt]
        known.add(version)
        while len(known) > KNOWN_VERSIONS:
            known.discard(min(known))

    def describe(self) -> dict[str, Any]:
        return {"version": self.complete_version,
                "formats": {f: {"version": e.complete_version, "bytes": e.nbytes if e.complete else 0,
                                "rank": self.rank.get(f, 0),
                                "deltas": {f"{d.base}->{v}": d.nbytes for v, d in sorted(self.deltas[f].links.items())}}
                            for f, e in self.fulls.items()}}


class WeightCache:
    """Every model's encodings from the current trainer session (:class:`ModelCache` each), and what each worker is
    sent of them. The attributes of today's single cache (``version``, ``parts``, ...) read the policy's float32 full
    encoding."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.models: dict[str, ModelCache] = {}
        self.session = ""  # the trainer process the cached versions came from
        self.newest: dict[str, int] = {}  # per model: the newest complete version from any trainer session
        self._refused_models: set[str] = set()  # models beyond MAX_MODELS, logged once per session
        self._expected: dict[str, set[tuple[str, bool]]] = {}  # per model: what the last session sent of a version

    # -- today's single cache: the policy's float32 full encoding ------------------------------------------------
    @property
    def primary(self) -> Encoding:
        model = self.models.get("policy")
        return model.fulls.get("float32") or _EMPTY if model else _EMPTY

    @property
    def version(self) -> int:
        return self.primary.version

    @property
    def parts(self) -> list[list[Any]]:
        return self.primary.parts

    @property
    def nparts(self) -> int:
        return self.primary.nparts

    @property
    def held(self) -> int:
        return self.primary.held

    @property
    def complete_version(self) -> int:
        """The newest version of the policy a worker can get in full, in any format (-1: none)."""
        model = self.models.get("policy")
        return model.complete_version if model else -1

    @property
    def completed(self) -> int:
        """Complete encodings received so far (full versions and deltas, every model)."""
        return sum(e.completed for m in self.models.values() for e in m.fulls.values()) + sum(
            c.completed for m in self.models.values() for c in m.deltas.values())

    def newest_versions(self) -> dict[str, int]:
        """WELCOME's ``models``: each model's newest complete version from any trainer session."""
        return dict(self.newest)

    # -- the trainer's side -----------------------------------------------------------------------------------------
    def trainer_session(self, session: str, peers: list[Peer]) -> None:
        """A trainer said HELLO: a new trainer process need not continue the old one's versions, so forget the
        cached ones and what every peer holds."""
        if session == self.session:
            return
        if self.session and self.models:
            log.info("new trainer session %s; dropping cached weights (%s)", session[:8],
                     ", ".join(f"{n} v{m.complete_version}" for n, m in self.models.items()))
        self.session = session
        # what the old session sent of each model's last version: a restarted trainer most likely sends the same
        # formats, so its first version waits for them too (a worker left waiting for one it no longer sends gets
        # its next version: see weight_choice.candidates)
        self._expected = {name: m.started[max(m.started)] for name, m in self.models.items() if m.started}
        self.models = {}
        self._refused_models = set()
        for peer in peers:
            peer.version = -1
            for st in peer.models.values():
                st.reset()

    def trainer_left(self) -> None:
        """The trainer is gone: versions it did not finish are abandoned."""
        for model in self.models.values():
            for fmt, full in model.fulls.items():
                full.abandon_unfinished(f"its trainer left after {len(full.parts)} of {full.nparts} parts")
                chain = model.deltas[fmt]
                if chain.arriving is not None:
                    chain.arriving.clear()  # stale for a worker streaming it: it is sent something else
                    chain.arriving = None

    def add(self, version: int, part: int, parts: int, offset: int, nbytes: int, size: int,
            frames: list[Any], layout: list[Any], fields: dict[str, Any] | None = None) -> str | None:
        """Cache one part (``size`` bytes of a ``nbytes`` encoding, at ``offset``) of the model, format and base that
        ``fields`` name (the WEIGHTS body: absent, "policy" in float32, full); returns what was wrong, if anything.
        ``layout`` is the part's ``body["layout"]``."""
        fields = fields or {}
        name, fmt, base = fields.get("model", "policy"), fields.get("format", "float32"), fields.get("base")
        model = self.models.get(name)
        if model is None:
            if len(self.models) >= MAX_MODELS:
                if name not in self._refused_models:
                    self._refused_models.add(name)
                    log.error("weights of model %r refused: the trainer already sends %d models (%s), the most a "
                              "server keeps (MAX_MODELS); publish fewer models", name, MAX_MODELS,
                              ", ".join(self.models))
                return LoggedProblem(f"weights of model {name!r}: over {MAX_MODELS} models (MAX_MODELS)")
            if part != 0:
                return f"weights of model {name!r} v{version} part {part} arrived out of order"
            model = ModelCache(name, self.max_bytes)
            if name in self._expected:
                model.started[-1] = {key for key in self._expected[name] if not key[1]}  # (no delta starts one)
        problem = model.add(fmt, base, version, part, parts, offset, nbytes, size, frames, layout, fields)
        if model.fulls and name not in self.models:
            self.models[name] = model
        if model.complete_version > self.newest.get(name, -1):
            self.newest[name] = model.complete_version
        return problem

    # -- the workers' side ------------------------------------------------------------------------------------------
    def stream(self, worker: Peer, send: Callable[[list[Any]], bool]) -> int:
        """Send ``worker`` the parts of each model's next message it lacks, as far as they have arrived, the model with
        the fewest bytes left first (a small model never waits behind a big one's parts).

        ``send`` returns False when the worker's queue is full; the next call resumes where this one stopped.
        Returns how many messages this call completed for the worker."""
        plan: list[tuple[int, str, Sent]] = []
        for name, model in self.models.items():
            sent = next_sent(worker, name, model)
            if sent is not None:
                plan.append((sent.nbytes, name, sent))
        done = 0
        for _, name, sent in sorted(plan, key=lambda p: (p[0], p[1])):
            st = worker.models[name]
            parts = sent.encoding.parts
            while sent.sent_parts < len(parts):
                if not send(parts[sent.sent_parts]):
                    return done
                if sent.sent_parts == 0:
                    sent.started = time.monotonic()
                sent.sent_parts += 1
            if sent.sent_parts == sent.encoding.nparts:
                st.inflight, st.streaming = sent, None
                done += 1
        return done

    def describe(self) -> dict[str, Any]:
        """--status: per model, its newest version and the formats and deltas cached, with their bytes."""
        return {name: model.describe() for name, model in self.models.items()}


_EMPTY = Encoding(0)
