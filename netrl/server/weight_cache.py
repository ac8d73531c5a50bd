"""The server's weights cache: each named model's newest versions, in each format the trainer
sends, as parts that arrive from the trainer and are streamed to each worker.

A version arrives as ``parts`` WEIGHTS messages (see :func:`netrl.protocol.wire.weight_parts`),
labelled by model (absent: "policy"), format (absent: "float32") and, for a delta, its ``base``.
Each part is forwarded to workers as soon as it arrives, so the trainer->server and server->worker
hops overlap. A worker gets a model's next message only after acknowledging the one it received
completely (a slow worker gets the newest version, not every version); a newer version
preempts one still streaming, starting from its first part. Which encoding each worker gets is
:func:`next_sent`'s choice (by :func:`netrl.server.weight_choice.choose`).

What is kept, per trainer session: at most ``MAX_MODELS`` models
(:data:`netrl.protocol.wire.MAX_MODELS`), each in at most :data:`MAX_FORMATS` formats. Per
(model, format): the newest full encoding, plus the last complete one while a newer one arrives
(if the newer one is abandoned, workers get the last complete version instead of half of one);
and a chain of deltas of recent versions, at most :data:`MAX_DELTAS` of them and at most the full
encoding's size in delta bytes (the oldest go first), plus the one arriving. Each encoding takes at
most ``max_bytes + OVERHEAD_ROOM_BYTES`` of memory (its frames plus :data:`PART_OVERHEAD_BYTES`
per part), so the whole cache stays under ``MAX_MODELS * MAX_FORMATS * 4 * (max_bytes +
OVERHEAD_ROOM_BYTES)``: two full encodings, the deltas and the arriving delta per (model,
format); in practice, a few times the largest model's float32 size.

The cache refuses an encoding unless its parts are exactly those
:func:`~netrl.protocol.wire.weight_parts` makes (part 0 sets the part size) and part 0's layout
passes :func:`~netrl.protocol.wire.check_layout`, which each worker applies too (for a float32 full
version against its size; for others only its structure: the server never decodes). A delta whose
base is no version of its (model, format) this trainer session sent can never be applied: it is
dropped. This module never imports torch: the server only moves bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from netrl.protocol.wire import MAX_MODELS
from netrl.server.peers import Peer
from netrl.server.weight_choice import (
    DEFAULT_BUDGET_S,
    MAX_PIPELINE,
    MIN_RATE_BYTES,
    Candidate,
    Sent,
    WorkerModel,
    choose,
)
from netrl.server.weight_encodings import (
    MAX_DELTAS,
    OVERHEAD_ROOM_BYTES,
    PART_OVERHEAD_BYTES,
    DeltaChain,
    Encoding,
    LoggedProblem,
)

__all__ = ["MAX_DELTAS", "MAX_FORMATS", "OVERHEAD_ROOM_BYTES", "PART_OVERHEAD_BYTES", "Encoding", "LoggedProblem",
           "ModelCache", "WeightCache"]

log = logging.getLogger(__name__)

MAX_FORMATS = 4  # per model: auto sends three
KNOWN_VERSIONS = 64  # versions of a (model, format) remembered as bases a delta may continue
MAX_SLOW_SESSIONS = 256  # worker sessions remembered as slow across their reconnects
# a slow worker counts as fast again only after this many rate samples since it was last found
# slow, none of them slow: a link near the threshold would flip the trainer's encoding on and off
FAST_SAMPLES = 3

class ModelCache:
    """One model's encodings: a full :class:`Encoding` and a :class:`DeltaChain` per format."""

    def __init__(self, name: str, max_bytes: int) -> None:
        self.name, self.max_bytes = name, max_bytes
        self.fulls: dict[str, Encoding] = {}
        self.deltas: dict[str, DeltaChain] = {}
        self.rank: dict[str, int] = {}
        self.budget_s: float | None = None
        self.known: dict[str, set[int]] = {}  # per format: versions it had, which deltas
                                              # may continue
        # per recent version: (format, delta?) that started
        self.started: dict[int, set[tuple[str, bool]]] = {}

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
                return (f"weights of model {self.name!r} in format {fmt!r}: "
                        f"this model already comes in {MAX_FORMATS} formats "
                        f"({', '.join(self.fulls)}), the most a server keeps")
            if base is not None:
                log.debug("%s v%d (from v%d) dropped: no version of this format arrived before "
                          "it, so no worker could apply it", self.label(fmt, True), version, base)
                return LoggedProblem(f"{self.label(fmt, True)} v{version} arrived "
                                     f"before any full version")
            self.fulls[fmt] = Encoding(self.max_bytes, self.label(fmt, False), sized_layout=fmt == "float32")
            self.deltas[fmt] = DeltaChain(self.max_bytes, self.label(fmt, True))
            self.known[fmt] = set()
        full = self.fulls[fmt]
        if base is None:
            problem = full.add(version, part, parts, offset, nbytes, size, frames, layout)
        else:
            problem = self.deltas[fmt].add(version, base, part, parts, offset, nbytes, size, frames, layout,
                                           self.known[fmt])
        # a format that never got anywhere
        if problem and full.version < 0 and not self.deltas[fmt].links:
            del self.fulls[fmt], self.deltas[fmt], self.known[fmt]
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
    """Every model's encodings from the current trainer session (:class:`ModelCache` each),
    and what each worker is sent of them. The attributes of today's single cache (``version``,
    ``parts``, ...) read the policy's float32 full encoding."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.models: dict[str, ModelCache] = {}
        self.session = ""  # the trainer process the cached versions came from
        self.newest: dict[str, int] = {}  # per model: the newest complete version from any
                                          # trainer session
        self._refused_models: set[str] = set()  # models beyond MAX_MODELS, logged once per session
        # per model: what the last session sent of a version
        self._expected: dict[str, set[tuple[str, bool]]] = {}
        # sessions of workers found slow (slow_workers): the link's rate samples when last found so
        self._slow_sessions: dict[str, int] = {}

    # -- today's single cache: the policy's float32 full encoding ----------------------------------
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

    # -- the trainer's side ------------------------------------------------------------------------
    def trainer_session(self, session: str, peers: list[Peer]) -> None:
        """A trainer said HELLO: a new trainer process need not continue the old one's versions, so
        forget the cached ones and what every peer holds."""
        if session == self.session:
            return
        if self.session and self.models:
            log.info("new trainer session %s; dropping cached weights (%s)", session[:8],
                     ", ".join(f"{n} v{m.complete_version}" for n, m in self.models.items()))
        self.session = session
        # what the old session sent of each model's last version: a restarted trainer most likely
        # sends the same formats, so its first version waits for them too (a worker left waiting for
        # one it no longer sends gets its next version: see candidates below)
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
                full.abandon_unfinished(f"its trainer left after "
                                        f"{len(full.parts)} of {full.nparts} parts")
                chain = model.deltas[fmt]
                if chain.arriving is not None:
                    # stale for a worker streaming it: it is sent something else
                    chain.arriving.clear()
                    chain.arriving = None

    def add(self, version: int, part: int, parts: int, offset: int, nbytes: int, size: int,
            frames: list[Any], layout: list[Any], fields: dict[str, Any] | None = None) -> str | None:
        """Cache one part (``size`` bytes of a ``nbytes`` encoding, at ``offset``) of the model,
        format and base that ``fields`` name (the WEIGHTS body: absent, "policy" in float32, full);
        returns what was wrong, if anything. ``layout`` is the part's ``body["layout"]``."""
        fields = fields or {}
        name, fmt, base = fields.get("model", "policy"), fields.get("format", "float32"), fields.get("base")
        model = self.models.get(name)
        if model is None:
            if len(self.models) >= MAX_MODELS:
                if name not in self._refused_models:
                    self._refused_models.add(name)
                    log.error("weights of model %r refused: the trainer already sends %d models "
                              "(%s), the most a server keeps (MAX_MODELS); publish fewer models",
                              name, MAX_MODELS,
                              ", ".join(self.models))
                return LoggedProblem(f"weights of model {name!r}: over "
                                     f"{MAX_MODELS} models (MAX_MODELS)")
            if part != 0:
                return f"weights of model {name!r} v{version} part {part} arrived out of order"
            model = ModelCache(name, self.max_bytes)
            if name in self._expected:
                # (no delta starts one)
                model.started[-1] = {key for key in self._expected[name] if not key[1]}
        problem = model.add(fmt, base, version, part, parts, offset, nbytes, size, frames, layout, fields)
        # (a model whose first part was refused is not kept)
        if model.fulls and name not in self.models:
            self.models[name] = model
        if model.complete_version > self.newest.get(name, -1):
            self.newest[name] = model.complete_version
        return problem

    # -- the workers' side -------------------------------------------------------------------------
    def stream(self, worker: Peer, send: Callable[[list[Any]], bool]) -> int:
        """Send ``worker`` the parts of each model's next message it lacks, as far as they
        have arrived, the model with the fewest bytes left first (a small model never waits
        behind a big one's parts).

        ``send`` returns False when the worker's queue is full; the next call resumes where this one
        stopped. Returns how many messages this call completed for the worker."""
        done, progressed = 0, True
        while progressed:  # a message completed: the next may follow it at once (a pipelined delta)
            progressed = False
            plan: list[tuple[int, str, Sent]] = []
            for name, model in self.models.items():
                sent = next_sent(worker, name, model)
                if sent is not None:
                    plan.append((sent.nbytes, name, sent))
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
                    st.inflight.append(sent)
                    st.streaming = None
                    done += 1
                    progressed = True
        return done

    def slow_workers(self, workers: Iterable[Peer], now: float) -> int:
        """Workers whose link does not carry a model's float32 version within its budget
        (``network.weight_format`` adaptive: while there is one, the trainer sends the compact
        formats too, and the server picks per worker as under auto): by its measured rate; before
        any is measured, by a message on its way to it for over twice the budget (a 4 MB float32
        version behind reno at 1% loss never arrived: the worker reconnected during each of its
        1 MiB parts, so no rate was ever measured). A worker so found is remembered by its session,
        across its reconnects, and stays slow until :data:`FAST_SAMPLES` rate samples since say it
        is not (hysteresis: a link near the threshold does not flip the trainer's encoding)."""
        slow = 0
        for worker in workers:
            since = worker.link.samples - self._slow_sessions.get(worker.session, 0)
            if self._slow(worker, now):
                slow += 1
                self._slow_sessions.pop(worker.session, None)  # (to the end: the newest)
                self._slow_sessions[worker.session] = worker.link.samples
                while len(self._slow_sessions) > MAX_SLOW_SESSIONS:
                    del self._slow_sessions[next(iter(self._slow_sessions))]
            elif worker.session not in self._slow_sessions:
                continue
            elif worker.link.rate is not None and since >= FAST_SAMPLES:
                del self._slow_sessions[worker.session]
            else:
                slow += 1
        return slow

    def _slow(self, worker: Peer, now: float) -> bool:
        rate = worker.link.rate
        for name, model in self.models.items():
            if name not in worker.wants:
                continue
            budget = model.budget_s if model.budget_s is not None else DEFAULT_BUDGET_S
            if rate is not None:
                full = model.fulls.get("float32")
                if full is not None and full.nbytes > rate * budget:
                    return True
                continue
            st = worker.models.get(name)
            sent = (st.inflight[0] if st.inflight else st.streaming) if st else None
            if sent is not None and sent.started and now - sent.started > 2 * budget:
                return True
        return False

    def describe(self) -> dict[str, Any]:
        """--status: per model, its newest version and the formats and deltas
        cached, with their bytes."""
        return {name: model.describe() for name, model in self.models.items()}


def next_sent(worker: Peer, name: str, model: ModelCache) -> Sent | None:
    """What ``worker`` is being sent of ``model`` (None: nothing now)."""
    st = worker.models.get(name)
    if st is None:
        st = worker.models[name] = WorkerModel()
    if len(st.inflight) >= MAX_PIPELINE:
        return None  # acknowledgements first
    if st.streaming is not None and not st.streaming.stale:
        return st.streaming
    st.streaming = None
    if name not in worker.wants:
        if not st.refused_logged:
            st.refused_logged = True
            log.info("%s is not sent model %r: it has no target for it (its models: %s)",
                     worker.label, name,
                     ", ".join(worker.wants))
        return None
    ways = candidates(model, st.ahead, worker.decodes)
    if ways is None:
        return None
    if not ways and st.holds is None and model.fulls and not st.refused_logged:
        if not any(f in model.fulls for f in worker.decodes):
            st.refused_logged = True
            log.warning("%s is not sent model %r: it decodes none of its "
                        "formats (the trainer sends %s; the worker decodes %s)",
                        worker.label, name, ", ".join(model.fulls),
                        ", ".join(worker.decodes))
    pick = choose(ways, worker.link.rate, model.budget_s)
    if pick is None:
        return None
    if st.inflight:
        if (pick.base, pick.format) != (st.inflight[-1].version, st.inflight[-1].format):
            # only a delta on the newest in flight may follow it before its ACK:
            # the rest waits for them
            return None
        if not drains_in_time(st, worker.link.rate, model.budget_s):
            # a queue behind a slow link would hold old versions: the newest goes after the ACKs
            return None
    st.streaming = Sent(pick.version, pick.format, pick.base, pick.first, pick.first.nbytes)
    st.ever_sent = True
    # once per version and worker: what a slow link's figures are made of (docs/benchmarks/links.md)
    log.debug("%s is sent %s %s, %d bytes (%d in flight; link %s, budget %s)", worker.label,
              name, st.streaming.label, st.streaming.nbytes, len(st.inflight),
              "unmeasured" if worker.link.rate is None else f"{worker.link.rate / 1e3:.1f} KB/s",
              "default" if model.budget_s is None else f"{model.budget_s:g} s")
    return st.streaming


def drains_in_time(st: WorkerModel, rate: float | None, budget_s: float | None) -> bool:
    """Whether the link carries what is in flight to the worker within the budget, so that a delta
    may queue behind it. Behind a link that cannot keep up (float32 deltas of 3 MB at 10 Mbit/s),
    pipelined deltas would queue up and the worker would only ever get old versions; waiting for the
    ACKs lets it skip to the newest instead."""
    queued = sum(sent.nbytes for sent in st.inflight)
    if rate is None:  # unmeasured: a little may queue, too little to hold a newer version back long
        return queued <= MIN_RATE_BYTES
    if len(st.inflight) == 1 and queued <= MIN_RATE_BYTES:
        # one small message may always queue behind the one in flight: the link stays busy while its
        # ACK comes back (without, int8 deltas of 9 KB went one per round trip behind a link
        # measured at 20 KB/s with a 0.24 s budget, and the worker fell 8 versions behind)
        return True
    budget = budget_s if budget_s is not None else DEFAULT_BUDGET_S
    # small deltas too: 3 int8 deltas of 13 KB queued behind a 35 KB/s link made each arrive 1.5 s
    # late (docs/benchmarks/links.md)
    return queued <= rate * budget


def candidates(model: ModelCache, holds: tuple[str, int] | None, decodes: list[str]) -> list[Candidate] | None:
    """Ways to bring a worker holding ``holds`` (format, version; None: unknown) to the newest
    version it can decode ([]: nothing newer; None: wait, an encoding the trainer sent for the
    previous version has not started for this one yet)."""
    fmts = [f for f in decodes if f in model.fulls and model.fulls[f].parts]
    if not fmts:
        return []
    version = max(model.fulls[f].version for f in fmts)
    if holds is not None and holds[1] >= version:
        return []
    previous = max((v for v in model.started if v < version), default=None)
    if previous is not None:
        started = model.started.get(version, set())
        # the trainer sends them together: a better one is coming
        for fmt, delta in model.started[previous]:
            relevant = fmt in decodes and (not delta or (holds is not None and holds[0] == fmt))
            if relevant and (fmt, delta) not in started:
                return None
    out = []
    for fmt in fmts:
        full = model.fulls[fmt]
        if full.version != version:
            continue
        rank = model.rank.get(fmt, 0)
        if holds is not None and holds[0] == fmt:
            chain = model.deltas[fmt].chain(holds[1], version)
            nbytes = sum(d.nbytes for d in chain) if chain else 0
            if chain and nbytes < full.nbytes:
                out.append(Candidate(rank, fmt, nbytes, chain[0], chain[0].base, chain[0].version))
                continue
        out.append(Candidate(rank, fmt, full.nbytes, full, None, version))
    return out


_EMPTY = Encoding(0)
