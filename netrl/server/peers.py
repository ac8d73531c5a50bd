"""The server's bookkeeping: connected peers and the packets it holds for the trainer."""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from netrl.net.liveness import Liveness
from netrl.server.weight_choice import LinkRate, WorkerModel
from netrl.storage.segments import Position

__all__ = ["MAX_COUNT", "MAX_REPORTED", "MAX_ROWS_PER_STEP", "Peer", "PeerTable", "QueuedPacket",
           "is_count"]

log = logging.getLogger(__name__)

REPORTED_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")  # a counter in a heartbeat's stats,
                                                     # e.g. "dropped_samples"
MAX_REPORTED = 32  # counters kept per peer
# The largest count the server takes from a peer (samples produced or wanted, a heartbeat
# counter): far beyond any run, exact as a float, and any sum of two still fits the wire's 64-bit
# integers (a PACE allowance, say).
MAX_COUNT = 2**53
# PACE counts rows: each env step granted lets a worker deliver its own rows per step (reset and
# context rows included), as its accepted packets show, at most this many: enough for tiny packets
# with a frame stack's context rows, and all a worker of reset-only packets can get.
MAX_ROWS_PER_STEP = 4
# packets remembered before a worker's first heartbeat (Peer.charged_early), and the most resends
# its first heartbeat may claim free of PACE (Peer.resends_left)
MAX_EARLY = 4096


def is_count(value: Any) -> bool:
    """A finite int or float within +-MAX_COUNT (not a bool, not NaN): what a heartbeat counter may
    be. (A worker reports ``version`` -1 before it has weights, so small negatives are fine.)"""
    # NaN fails both comparisons
    return type(value) in (int, float) and -MAX_COUNT < value < MAX_COUNT


@dataclass
class Peer:
    """A connected worker or trainer, keyed by its ZeroMQ routing id."""

    rid: bytes
    role: str
    name: str
    session: str
    address: str
    liveness: Liveness
    connected_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    version: int = -1  # newest policy version the worker acknowledged
    # a worker's weights: per model, what it holds and what is on its way
    # (netrl.server.weight_choice); the models it has targets for and the formats it decodes (its
    # HELLO's; absent: the policy in float32), its link's rate
    models: dict[str, WorkerModel] = field(default_factory=dict)
    wants: list[str] = field(default_factory=lambda: ["policy"])
    decodes: list[str] = field(default_factory=lambda: ["float32"])
    link: LinkRate = field(default_factory=LinkRate)
    samples: int = 0
    packets: int = 0
    produced: int = 0  # env steps the worker has produced, as of its latest packet or heartbeat
    # when ``produced`` last rose (or it connected)
    produced_at: float = field(default_factory=time.monotonic)
    allowance: int = 0  # PACE last sent
    window: int = 0  # the bytes it may have in flight it was last told (its share of
                     # the server's memory)
    bytes_in: int = 0  # bytes of its packets so far (what the worker counts against its window) ...
    cost_in: int = 0  # ... and the memory they take at the server (relay.memory_cost)
    over_window: int = 0  # packets refused because its packets held took its share of the memory
    reported: dict[str, Any] = field(default_factory=dict)  # counters from the peer's heartbeats
    bad_reports: int = 0  # heartbeats with counters that were ignored
    key: str = ""  # name of the CURVE key it connected with ("" without CURVE)
    # a worker: whether a trainer is connected, and the tag of the sample layout packets are checked
    # against (0: none), as the server last told it
    told: tuple[int, int] | None = None
    # a worker's HELLO: the largest packet it makes (0: not declared, small defaults apply), and
    # whether it asked to be exempt from PACE (a real-time worker); it is exempt (``paced`` false:
    # its packets never held for pacing) only if server.unpaced_workers names its key
    max_rows: int = 0
    max_bytes: int = 0
    paced: bool = True
    asked_unpaced: bool = False
    rows: int = 0  # rows of its accepted packets: env steps (``samples``), reset and context rows
    num_envs: int = 1  # envs it runs (worker.num_envs): its packets' env column stays below it
    pace_budget: int = 0  # rows it may still deliver: PACE raises granted (in its rows per
                          # step), less the rows accepted since
    over_pace: int = 0  # packets refused because they went beyond its PACE allowance
    # Its first heartbeat on a connection this server process had not seen: the env steps it had
    # made before (-1 until then) and its unacknowledged packets. No PACE of this server granted
    # them (a restarted server): their resends are not charged to its allowance, or a worker that
    # has finished (its count no longer rising) would be held for good.
    made_before: int = -1
    resends_left: int = 0
    # packets accepted before that heartbeat, charged: (its count when made, rows), refunded then
    # if they prove resends (they come at once on connecting, the heartbeat a moment later)
    charged_early: list[tuple[int, int]] = field(default_factory=list)
    oversized: int = 0  # packets refused because they went beyond its declared
                        # bounds or the server's
    layout_refusals: int = 0  # packets refused for another sample layout than the trainer's
                              # (it keeps them)
    flushing: bool = False  # it is stopping: its packets go to the spool at once, so that its
                            # stop is quick and safe

    @property
    def label(self) -> str:
        key = f", key {self.key}" if self.key else ""
        return f"{self.role} {self.name!r} ({self.address}, session {self.session[:8]}{key})"

    def report(self, stats: dict[Any, Any]) -> list[str]:
        """Keep a heartbeat's counters for --status: at most MAX_REPORTED short names with
        counts (:func:`is_count`), not whatever a peer sends (the snapshot must stay small,
        and a NaN or a 2**64 would break it and the pacing). Returns what it ignored, as
        ``key=value`` texts safe to log."""
        kept: dict[str, Any] = {}
        ignored = []
        for k, v in stats.items():
            if isinstance(k, str) and REPORTED_NAME.fullmatch(k) and is_count(v) and len(kept) < MAX_REPORTED:
                kept[k] = v
            else:
                ignored.append(f"{k!r:.48}={v!r:.32}")
        self.reported = kept
        return ignored

    def granted(self, allowance: int) -> None:
        """A PACE raising its allowance to ``allowance`` was sent: the env steps that lets it
        produce beyond what it had (or beyond its count, if it has used up its allowance), in rows
        (:meth:`rows_per_step`), are added to what it may deliver."""
        steps = max(0, allowance - max(self.allowance, self.produced))
        self.pace_budget += math.ceil(steps * self.rows_per_step())
        self.allowance = allowance

    def rows_per_step(self) -> float:
        """Rows its packets carry per env step (reset rows, each packet's context rows), as
        its accepted packets show, within 1 to ``MAX_ROWS_PER_STEP``; the most before it
        has delivered a step."""
        if not self.samples:
            return MAX_ROWS_PER_STEP
        return min(MAX_ROWS_PER_STEP, max(1.0, self.rows / self.samples))

    def carry_over(self, old: Peer) -> None:
        """Its own session reconnecting (a network blip): keep what the server granted and
        counted, so that resending its unacknowledged packets neither costs it its allowance nor
        lets it take more than its share."""
        self.produced, self.produced_at, self.allowance = old.produced, old.produced_at, old.allowance
        self.pace_budget, self.over_pace, self.oversized = old.pace_budget, old.over_pace, old.oversized
        # this server granted what it sent so far: its resends are paced (or held ones, free)
        self.made_before, self.resends_left = max(0, old.made_before), old.resends_left

    def first_report(self) -> None:
        """Its first heartbeat here (see ``made_before``): what it had made and not delivered."""
        if self.role != "worker" or self.made_before >= 0:
            return
        got = self.reported
        produced = got.get("produced")
        self.made_before = produced if type(produced) is int else 0
        # a claim: bounded as the packets remembered before it are, so a worker that inflates it
        # skips PACE for at most that many packets (its replay share still caps what it holds)
        self.resends_left = min(MAX_EARLY, sum(v for k in ("backlog_packets", "held_packets")
                                               if type(v := got.get(k)) is int))
        # (not counted against resends_left: the heartbeat's backlog no longer names those the
        # server has acknowledged since, spooled or delivered)
        self.pace_budget += sum(rows for made, rows in self.charged_early if made <= self.made_before)
        self.charged_early = []

    def charged(self, produced: int, rows: int) -> None:
        """A packet of ``rows`` accepted, charged to its allowance, made at count ``produced``."""
        self.pace_budget -= rows
        if self.made_before < 0 and len(self.charged_early) < MAX_EARLY:
            self.charged_early.append((produced, rows))

    def resend(self, produced: int, key_held: bool) -> bool:
        """Whether a packet made when its count was ``produced`` is a resend no PACE of this
        server granted (``key_held``: one held here already passes anyway)."""
        return not key_held and self.resends_left > 0 and produced <= self.made_before

    def produced_up_to(self, produced: int) -> None:
        """The worker says it has produced this many env steps (a packet's or a
        heartbeat's count)."""
        produced = min(produced, MAX_COUNT)
        if produced > self.produced:
            self.produced, self.produced_at = produced, time.monotonic()

    def weights_acked(self, versions: list[int], model: str = "policy", fmt: str = "float32",
                      need_full: bool = False) -> str | None:
        """A worker's ACK of the ``model`` version it received completely (in ``fmt``): it must
        match the oldest message of that model in flight (see netrl.server.weight_choice);
        what is wrong with it, or None. ``need_full``: it could not apply it, so what it holds is
        unknown, what is in flight behind it is dropped, and it gets a full version next. An
        ACK of a message so dropped, or one that crossed a new trainer session's reset (nothing in
        flight), is harmless and ignored."""
        st = self.models.get(model)
        if st is None or not st.ever_sent:
            if model == "policy":  # (as ever: an ACK of the policy before any was sent is harmless)
                return None
            return (f"acknowledged weights of model {model!r} "
                    f"{versions[:4]}, but was never sent that model")
        if len(versions) == 1 and (fmt, versions[0]) in st.dropped:
            del st.dropped[(fmt, versions[0])]
            return None
        if not st.inflight:
            if need_full:
                st.holds = None
                if model == "policy":
                    self.version = -1
            return None
        sent = st.inflight[0]
        if versions != [sent.version] or fmt != sent.format:
            return (f"acknowledged weights of model {model!r} {versions[:4]} ({fmt[:32]!r}) but "
                    f"was sent {model!r} {sent.label}{' first' if len(st.inflight) > 1 else ''}")
        now = time.monotonic()
        if need_full:
            st.holds = None
            st.drop_inflight()
            if model == "policy":
                self.version = -1
        else:
            st.holds = (sent.format, sent.version)
            del st.inflight[0]
            # a pipelined message's bytes went after those of the one before: its wait
            # behind them is no slowness
            self.link.measured(sent.nbytes, now - max(sent.started, st.acked_at))
            log.debug("%s acknowledged %s %s %.2f s after its first part was sent", self.label,
                      model, sent.label, now - sent.started)
            if model == "policy":
                self.version = sent.version
        st.acked_at = now
        return None

    def describe(self) -> dict[str, Any]:
        """What --status shows of it (weights and samples only for a worker: the
        trainer's are in "progress")."""
        about = {"name": self.name, "session": self.session, "address": self.address,
                 "connected_at": self.connected_at, "last_seen": self.last_seen, "key": self.key,
                 "reported": dict(self.reported)}
        if self.role == "worker":  # the version this trainer session sent it, or else the
                                   # one it says it holds
            # (a restart)
            held = self.version if self.version >= 0 else int(self.reported.get("version", -1))
            about.update(version=held, samples=self.samples, rows=self.rows, packets=self.packets,
                         paced=self.paced, asked_unpaced=self.asked_unpaced,
                         over_pace=self.over_pace, oversized=self.oversized, envs=self.num_envs,
                         models={name: st.describe() for name, st in self.models.items() if st.ever_sent},
                         link_rate=self.link.rate)
        return about


class PeerTable:
    """The connected peers, by port and ZeroMQ routing id, and workers by session; at
    most one is the trainer.

    A routing id is chosen by the client, so it names a peer only together with the port
    (the role) it came in on: a worker-port connection that copies the trainer's id is
    another peer, never the trainer.
    """

    def __init__(self) -> None:
        self.by_rid: dict[tuple[str, bytes], Peer] = {}
        self.workers_by_session: dict[str, Peer] = {}
        self.trainer: Peer | None = None

    def __len__(self) -> int:
        return len(self.by_rid)

    def get(self, role: str, rid: bytes) -> Peer | None:
        return self.by_rid.get((role, rid))

    def values(self) -> list[Peer]:
        """A copy, so that a send which forgets an unreachable peer does not upset the loop."""
        return list(self.by_rid.values())

    def workers(self) -> list[Peer]:
        return list(self.workers_by_session.values())

    def worker_count(self) -> int:
        """Connected workers, without building a list (asked on every acknowledgement)."""
        return len(self.workers_by_session)

    def window(self, max_queue_bytes: int) -> int:
        """Memory each worker's packets may take at the server: together, half of what the server
        holds in memory, the rest being room for joins and stragglers. (Without this, many workers'
        windows overflow the memory queue into the disk spool while the trainer keeps up.)"""
        return max(1, max_queue_bytes // 2 // max(1, self.worker_count()))

    def raised_allowances(self, wanted: int, idle_after_s: float) -> list[tuple[Peer, int]]:
        """Split the ``wanted`` samples between the workers that are producing (each may produce
        its share beyond what it has); returns the workers whose allowance rises, with the new
        allowance, to be told (only throttled workers wait for it; the caller sets ``allowance``
        once the PACE is sent, so a lost one is sent again).

        A worker that has had allowance left for ``idle_after_s`` without producing (a slow
        env, a stuck or idle process) keeps what it has but takes no share: otherwise every
        idle connection would shrink the busy workers' shares. It is paced again as soon as it
        produces or runs out of allowance."""
        workers = self.workers()
        now = time.monotonic()
        # (out of allowance: no room for a row of each of its envs, a step it cannot take in part)
        busy = [w for w in workers if w.produced + w.num_envs > w.allowance
                or now - w.produced_at < idle_after_s] or workers
        share = -(-min(max(0, wanted), MAX_COUNT) // max(1, len(busy)))
        # a share of at least one step of every env (a vector worker never takes a step in part:
        # less would leave it waiting, and the trainer with it); clamped: always fits a PACE
        raised = [(w, min(w.produced + (share and max(share, w.num_envs)), MAX_COUNT)) for w in busy]
        return [(w, allowance) for w, allowance in raised if allowance > w.allowance]

    def session_problem(self, new: Peer) -> str | None:
        """Why a worker may not take this session: another connected worker holds it (a reconnecting
        worker keeps its name and key)."""
        old = self.workers_by_session.get(new.session) if new.role == "worker" else None
        if old is None or (old.name, old.key) == (new.name, new.key):
            return None
        return (f"session {new.session[:8]} belongs to the connected worker {old.name!r}"
                f"{f' (key {old.key})' if old.key else ''}; each worker process has its own")

    def replaced_by(self, new: Peer) -> list[Peer]:
        """The entries a new connection replaces: one that said HELLO again on the same connection,
        its own worker session reconnecting, or (a trainer) the old trainer."""
        same_connection = self.by_rid.get((new.role, new.rid))
        old = self.trainer if new.role == "trainer" else self.workers_by_session.get(new.session)
        return [p for p in (same_connection, old if old is not same_connection else None) if p is not None]

    def add(self, peer: Peer) -> None:
        """Add a peer; whatever :meth:`replaced_by` names must have been removed first."""
        assert not self.replaced_by(peer), "add() after removing the peers it replaces"
        self.by_rid[(peer.role, peer.rid)] = peer
        if peer.role == "trainer":
            self.trainer = peer
        else:
            self.workers_by_session[peer.session] = peer

    def remove(self, peer: Peer) -> None:
        if self.by_rid.get((peer.role, peer.rid)) is peer:
            del self.by_rid[(peer.role, peer.rid)]
        if self.workers_by_session.get(peer.session) is peer:
            del self.workers_by_session[peer.session]
        if peer is self.trainer:
            self.trainer = None


@dataclass
class QueuedPacket:
    """A worker's sample packet held by the server: its frames, unchanged,
    and where it came from."""

    worker: str
    session: str
    seq: int
    steps: int
    frames: list[Any]
    nbytes: int
    received: float
    spool_position: Position | None = None  # set when the packet was read back from the spool
    inflated: int = 0  # bytes its arrays take once the trainer decompresses them
                       # (0: those on the wire)

    @property
    def trainer_bytes(self) -> int:
        """What the packet takes at the trainer, decoded: compressed images may take
        far more than on the wire."""
        return max(self.inflated, self.nbytes)
