"""What the server takes from workers: the checks a sample packet passes before the relay,
and how much each worker may send.

::

    worker  --SAMPLES-->  sender, size and value checks --> SampleRelay.accept()
                              (or a NACK: never resent)
                          another layout than the trainer's --> a NACK naming the layout: the
                              worker keeps the packet until the server names another
                              (heartbeats), and the trainer gets a NOTICE
                          beyond the worker's share of the memory, or (while the trainer paces)
                              beyond its PACE allowance in rows --> a NACK: resend later
    worker  --HEARTBEAT-> its counters (kept for --status if they are counts) and samples
                          produced (for pacing)
    trainer --SCHEMA-->   the layout packets are checked against (saved in the spool folder for a
                          restarted server)
    trainer --PROGRESS--> a PACE allowance per worker: the samples the trainer still wants, split
                          between the workers that are producing; a worker may deliver the rows
                          of those env steps, reset and context rows included (each takes a
                          slot in the trainer's memory), at its own rows per step
                          (netrl.server.peers.Peer.rows_per_step); server.unpaced_workers
                          names the keys that are never held for it
    worker  <--ACK--      every ACK carries the worker's window: its share of the server's memory,
                          in the bytes of its packets (a packet takes FRAME_OVERHEAD per frame
                          beyond its bytes: a tiny one, many times)

The server's loop routes these messages here and supplies the send;
:class:`~netrl.server.admission.Admission` counts and logs what is rejected.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from netrl.config.sections import NetworkConfig
from netrl.errors import ProtocolError, SampleRejected
from netrl.protocol.messages import Message, MsgType, printable
from netrl.protocol.schema import LayoutMismatch, SampleSchema, load_schema, save_schema
from netrl.protocol.wire import BUNDLE_HEADER_ROOM, PacketLimits, PacketTooLarge, frames_nbytes, sample_row_bytes
from netrl.server.admission import UNDECLARED_ROWS, Admission
from netrl.server.counters import ServerCounters
from netrl.server.peers import MAX_COUNT, MAX_REPORTED, Peer, PeerTable, QueuedPacket
from netrl.server.relay import SampleRelay, memory_cost
from netrl.util import worth_logging

__all__ = ["SampleIntake"]

log = logging.getLogger(__name__)

# A worker that reports no new samples for this many heartbeat intervals while it has allowance left
# takes no share of the trainer's wish (a producing worker reports its count in every heartbeat).
IDLE_HEARTBEATS = 4
# a window told may exceed the worker's share by 1/8 of it until its next ACK: the shares are half
# of server.max_queue_bytes, the other half room for such slack
WINDOW_SLACK = 8
# causes of layout refusals told to one trainer connection (a worker could make endless causes)
MAX_NOTICES = 16


class SampleIntake:
    """Worker packets checked for the relay, and each worker's window and PACE allowance.

    The server constructs it (no I/O), then calls :meth:`open`, and routes SAMPLES,
    HEARTBEAT, SCHEMA and PROGRESS to its ``on_*`` methods; the relay acknowledges workers
    through :meth:`tell_worker`.
    """

    def __init__(self, net: NetworkConfig, max_queue_bytes: int, schema_path: Path, peers: PeerTable,
                 admission: Admission, relay: SampleRelay, stats: ServerCounters,
                 send: Callable[[Peer, Message], None], max_rows_per_packet: int = 65_536) -> None:
        self.net, self.max_queue_bytes, self.schema_path = net, max_queue_bytes, schema_path
        self.max_rows_per_packet = max_rows_per_packet
        self.peers, self.admission, self.stats, self.send = peers, admission, stats, send
        self.relay = relay
        self.schema: SampleSchema | None = None
        # the layout's most bytes per row
        self._row_bytes: tuple[SampleSchema | None, int] = (None, 0)
        self.progress: dict[str, int] | None = None  # the trainer's latest PROGRESS
                                                     # (None: no trainer)
        self.workers_joined = False  # since the last pass of the server's loop
        # the trainer connection, and the causes it was told
        self._noticed: tuple[bytes, set[str]] = (b"", set())

    def open(self) -> None:
        """Read the layout a previous run saved (packets are checked against it until the
        trainer sends its own)."""
        self.schema = load_schema(self.schema_path)

    # -- packets in --------------------------------------------------------------------------------
    def on_samples(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """A worker's packet: refused with a NACK unless it passes every check,
        else handed to the relay."""
        # the trainer trusts these names
        if msg.body["session"] != peer.session or msg.sender != peer.name:
            self._refuse(peer, msg.seq, f"the packet says it is from worker {msg.sender[:64]!r}, "
                                        f"session {msg.body['session'][:16]!r}, "
                                        f"but this connection said HELLO as "
                                        f"{peer.name!r}, session {peer.session[:16]!r}")
            return
        nbytes = frames_nbytes(frames)
        if nbytes > self.relay.bundle_limit:
            self._refuse(peer, msg.seq, f"a packet of {nbytes} bytes cannot reach "
                                        f"the trainer, whose messages are capped at "
                                        f"network.max_message_bytes ({self.net.max_message_bytes}) "
                                        f"with {BUNDLE_HEADER_ROOM} bytes kept for the "
                                        f"bundle header: send fewer samples per packet")
            return
        if self.schema is not None:
            try:
                self.schema.check(msg.body, msg.arrays, peer.label)
            except LayoutMismatch as exc:
                self._refuse_layout(peer, msg.seq, exc)
                return
            except SampleRejected as exc:
                self._refuse(peer, msg.seq, str(exc))
                return
        a = msg.arrays
        env = a.get("env")
        # non-decreasing (wire): the last is max
        if env is not None and len(env) and int(env[-1]) >= peer.num_envs:
            self._refuse(peer, msg.seq, f"packet {msg.seq} from {peer.label} has "
                                        f"rows of env {int(env[-1])} (row "
                                        f"{int(np.argmax(env >= peer.num_envs))}), but the "
                                        f"worker declared {peer.num_envs} envs at HELLO")
            return
        rows = len(a["reset"])
        steps = int(np.count_nonzero(~(a["reset"] | a["context"])))
        # compressed arrays are declared-size stand-ins here
        inflated = sum(arr.nbytes for arr in a.values())
        packet = QueuedPacket(peer.name, msg.body["session"], msg.seq, steps, frames, nbytes, time.monotonic(),
                              inflated=inflated)
        cost, held = memory_cost(packet), self.relay.held_cost.get(peer.session, 0)
        peer.bytes_in, peer.cost_in = peer.bytes_in + nbytes, peer.cost_in + cost
        # (resends: ok)
        if held and held + cost > self.window() and (peer.session, msg.seq) not in self.relay.held:
            self._over_window(peer, msg.seq, nbytes, held)
            return
        resend = peer.resend(msg.body["produced"], (peer.session, msg.seq) in self.relay.held)
        if not resend and self._over_pace(peer, msg.seq, rows):
            return
        peer.produced_up_to(msg.body["produced"])
        outcome = self.relay.accept(packet, self.peers.trainer is not None, spool_now=peer.flushing)
        if outcome in ("held", "spooled"):
            peer.samples += steps
            peer.rows += rows
            peer.packets += 1
            if resend:
                peer.resends_left -= 1
            else:
                peer.charged(msg.body["produced"], rows)
            self.stats.samples_in += steps

    def packet_limits(self, peer: Peer | None) -> PacketLimits:
        """How large a packet from ``peer`` may be, checked before it is inflated: the rows and
        bytes it declared at HELLO, within ``server.max_rows_per_packet``, the trainer's layout
        (rows times the bytes of a row) and ``network.max_message_bytes``."""
        rows, nbytes = self.max_rows_per_packet, self.net.max_message_bytes
        source = f"server.max_rows_per_packet is {rows}"
        if peer is not None and peer.max_rows:
            rows = min(rows, peer.max_rows)
            source = f"the worker declared {peer.max_rows} rows at HELLO; {source}"
        elif rows > UNDECLARED_ROWS:  # its bytes follow from the layout, below
            rows = UNDECLARED_ROWS
            source = (f"no bound was declared at HELLO, so {UNDECLARED_ROWS} rows apply (netrl's "
                      f"workers declare theirs); {source}")
        if peer is not None and peer.max_bytes:
            nbytes = min(nbytes, peer.max_bytes)
            source += f"; it declared {peer.max_bytes} bytes"
        if self.schema is not None:
            # asked for every message: computed once per layout
            if self._row_bytes[0] is not self.schema:
                self._row_bytes = (self.schema, sample_row_bytes(self.schema.leaves))
            nbytes = min(nbytes, rows * self._row_bytes[1])
        return PacketLimits(rows, nbytes, source)

    def on_oversized(self, peer: Peer, exc: PacketTooLarge) -> None:
        """A packet beyond its worker's bounds, refused before it was inflated: counted, and a
        NACK tells the worker not to resend it (an honest worker never makes one: its bounds
        are its own configuration)."""
        peer.oversized += 1
        self.stats.oversized_packets += 1
        self._refuse(peer, exc.seq, str(exc))

    def _over_pace(self, peer: Peer, seq: int, rows: int) -> bool:
        """While the trainer paces, a packet beyond the rows its worker was allowed (PACE) is held
        back with a NACK (the worker resends it once a PACE allows more): a worker that ignores its
        allowance, or sends rows that are no env steps (reset and context rows take slots in the
        trainer's memory too), would otherwise take the other workers' share. Only the workers
        whose key server.unpaced_workers names (real-time workers) are never held."""
        if (self.progress is None or not peer.paced or rows <= max(0, peer.pace_budget)
                or (peer.session, seq) in self.relay.held):
            return False
        peer.over_pace += 1
        self.stats.pace_refusals += 1
        reason = (f"over this worker's PACE allowance: the trainer paces the rows it takes "
                  f"(env steps, reset and context rows alike), and this worker may deliver "
                  f"{max(0, peer.pace_budget)} more (its allowance is {peer.allowance} env steps "
                  f"produced in all, at {peer.rows_per_step():.2f} rows each), not the {rows} rows "
                  f"of this packet; a throttled worker waits for its allowance")
        if peer.asked_unpaced:
            reason += (f" (its HELLO said paced false, but only the server's operator exempts a "
                       f"worker from pacing: server.unpaced_workers does not name "
                       f"{self.admission.unpaced_key(peer)!r})")
        if worth_logging(peer.over_pace, first=3):
            log.warning("held back a packet of %d rows from %s, %s (%d held back so far)",
                        rows, peer.label,
                        reason, peer.over_pace)
        self.send(peer, Message(MsgType.NACK, "server", body={"seqs": [seq], "retry_s": 1.0, "reason": reason}))
        return True

    def _refuse(self, peer: Peer, seq: int, reason: str) -> None:
        """A packet that can never be relayed: logged, counted, and a NACK tells the
        worker not to resend it."""
        self.admission.reject("worker", peer.rid, peer, reason)
        self.send(peer, Message(MsgType.NACK, "server", body={"seqs": [seq], "retry_s": 0, "reason": f"rejected: "
                                                              f"{reason}"}))

    @property
    def layout_tag(self) -> int:
        """The tag of the layout packets are checked against (0: none); the server's
        heartbeats tell the workers."""
        return 0 if self.schema is None else self.schema.tag

    def _refuse_layout(self, peer: Peer, seq: int, exc: LayoutMismatch) -> None:
        """A packet of another layout than the trainer's: the trainer is the one to fix (its sample
        compressor or pipeline), and the packet is fine for a trainer with the worker's layout. So
        its worker keeps it (the NACK names this layout; the worker resends it once the server names
        another), and the trainer is told each cause once per connection (a NOTICE)."""
        assert self.schema is not None
        self.stats.layout_refusals += 1
        peer.layout_refusals += 1
        if worth_logging(peer.layout_refusals, first=3):
            log.warning("refused a packet from %s for the trainer's sample layout: "
                        "%s; the worker keeps it and sends it again once a trainer "
                        "with its layout connects (%d refused so far)", peer.label,
                        printable(exc.cause), peer.layout_refusals)
        self.send(peer, Message(MsgType.NACK, "server", body={"seqs": [seq], "retry_s": 0, "layout": self.schema.tag,
                                                              "reason": str(exc)}))
        trainer = self.peers.trainer
        if trainer is None:
            return
        if self._noticed[0] != trainer.rid:
            self._noticed = (trainer.rid, set())
        told = self._noticed[1]
        if exc.cause in told or len(told) >= MAX_NOTICES:
            return
        told.add(exc.cause)
        self.send(trainer, Message(MsgType.NOTICE, "server", body={"cause": printable(exc.cause),
                                                                   "reason": printable(str(exc), 2000)}))

    def _over_window(self, peer: Peer, seq: int, nbytes: int, held: int) -> None:
        """A packet beyond the worker's share of the server's memory: a NACK (it resends once
        the server has acknowledged others), and the window that fits the share if it was told
        another. A worker that ignores its window would otherwise take the whole queue, then the
        spool; one that keeps to it sees this only for its first window, before the server has
        seen what its packets cost."""
        peer.over_window += 1
        self.stats.window_refusals += 1
        reason = (f"over this worker's window: its unacknowledged packets take {held} of the "
                  f"{self.window()} bytes of the server's memory it may use; keep to the window of "
                  f"the latest ACK ({self.window_for(peer)} bytes of packets) and wait for ACKs")
        if worth_logging(peer.over_window, first=3):
            log.warning("refused a packet of %d bytes from %s, %s (%d refused so far)",
                        nbytes, peer.label, reason,
                        peer.over_window)
        self.send(peer, Message(MsgType.NACK, "server", body={"seqs": [seq], "retry_s": 1.0, "reason": reason}))
        if peer.window != self.window_for(peer):
            self.tell_worker(peer.session, MsgType.ACK, {"seqs": []})

    def on_heartbeat(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """A peer's heartbeat: its counters for --status and, from a worker, the samples it
        has produced, and whether it is stopping (its packets then go to the spool at
        once, and it is told so)."""
        if msg.body.get("flushing") and peer.role == "worker" and not peer.flushing:
            peer.flushing = True
            moved = self.relay.spool_now(peer.session)
            log.info("%s is stopping: %d of its packets waiting in memory went to the "
                     "spool, and so do the ones it still sends", peer.label, moved)
        stats = msg.body.get("stats")
        if not isinstance(stats, dict):
            return
        ignored = peer.report(stats)
        peer.first_report()
        if ignored:
            peer.bad_reports += 1
            if worth_logging(peer.bad_reports, first=3):
                log.warning("ignored %d heartbeat counters from %s: %s (kept: up to %d short "
                            "lowercase names, each with a finite number within "
                            "+-2**53; %d heartbeats with others so far)", len(ignored),
                            peer.label, ", ".join(ignored[:5]) + (", ..." if len(ignored) > 5 else ""), MAX_REPORTED,
                            peer.bad_reports)
        produced = peer.reported.get("produced")
        if peer.role == "worker" and type(produced) is int and produced > peer.produced:
            # a worker that reconnected to a restarted server: pace it from its
            # real count, not from zero
            peer.produced_up_to(produced)
            self.pace()

    def on_schema(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """The trainer's sample layout: every packet is checked against it from now
        on, also after a restart."""
        try:
            schema = SampleSchema.from_wire(msg.body)
        except ProtocolError as exc:
            self.admission.reject("trainer", peer.rid, peer, str(exc), frames_nbytes(frames))
            return
        if schema != self.schema:
            self.schema = schema
            log.info("sample layout from the trainer: %d fields, checked on every packet",
                     len(schema.leaves))
            save_schema(self.schema_path, msg.body)
        self.relay.trainer_layout(schema.tag)  # the packets held for this layout go to it

    # -- how much each worker may send -------------------------------------------------------------
    def window(self) -> int:
        """Memory each worker's packets may take at the server (their bytes and FRAME_OVERHEAD
        per frame): its share of ``max_queue_bytes`` (:meth:`PeerTable.window`). Beyond it, its
        packets are refused with a NACK."""
        return self.peers.window(self.max_queue_bytes)

    def window_for(self, worker: Peer) -> int:
        """The window told to ``worker``: the bytes of its packets that fit its share of the
        memory, as far as its packets so far tell (the worker counts their bytes, the server
        what holding them costs)."""
        share = self.window()
        return max(1, share * worker.bytes_in // worker.cost_in) if worker.cost_in else share

    def tell_worker(self, session: str, kind: MsgType, body: dict[str, Any]) -> None:
        """The relay's ACK or NACK to a worker; an ACK also tells it its current window."""
        worker = self.peers.workers_by_session.get(session)
        # a worker that left resends after reconnecting; the trainer deduplicates
        if worker is not None:
            if kind is MsgType.ACK:
                body = {**body, "window": self.window_for(worker)}
                worker.window = body["window"]
            self.send(worker, Message(kind, "server", body=body))

    def after_joins(self) -> None:
        """Workers joined since the last pass: everyone's share of the server's memory shrank, and
        the trainer's wanted samples are split between more workers."""
        if not self.workers_joined:
            return
        self.workers_joined = False
        for worker in self.peers.workers():
            # told only once its window shrank by over 1/WINDOW_SLACK (its ACKs carry the exact
            # one): an ACK to every worker at each join was N^2 messages while N workers joined
            if worker.window > self.window_for(worker) * (WINDOW_SLACK + 1) // WINDOW_SLACK:
                self.tell_worker(worker.session, MsgType.ACK, {"seqs": []})
        self.pace()

    def on_progress(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """The trainer's PROGRESS (samples it has and wants): the workers' allowances follow it."""
        wrong = {k: v for k, v in msg.body.items() if not 0 <= v < MAX_COUNT}
        if wrong:  # check_body let through any int64: these feed the pacing arithmetic
            self.admission.reject("trainer", peer.rid, peer,
                                  f"progress counts {wrong} are not between 0 and 2**53",
                                  frames_nbytes(frames))
            return
        self.progress = dict(msg.body)
        self.pace()

    def pace(self) -> None:
        """Raise the workers' PACE allowances to cover the samples the trainer wants
        beyond those on the way."""
        if self.progress is None:
            return
        wanted = self.progress["wanted"] - self.progress["samples"] - self.relay.on_the_way()
        for worker, allowance in self.peers.raised_allowances(wanted, IDLE_HEARTBEATS * self.net.heartbeat_interval_s):
            # kept and sent later if its queue is full (netrl.server.outbound)
            self.send(worker, Message(MsgType.PACE, "server", body={"allowance": allowance,
                                                                    "trainer_samples": self.progress["samples"]}))
            worker.granted(allowance)
