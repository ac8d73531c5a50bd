"""The server's sample relay: where each worker packet waits, when it goes to the
trainer, who acknowledges it.

::

    worker --SAMPLES--> accept() --> queue (memory, unacknowledged) --flush()--> BUNDLE --> trainer
                                 \\-> spool (disk, acknowledged at once) ---/
    trainer --ACK--> trainer_acked() --> the workers get their ACKs

* A trainer is connected and the packets held in memory stay under ``max_queue_bytes`` (counting
  their bytes plus ``FRAME_OVERHEAD`` per frame, for what holding one costs): the packet waits in
  memory, and its worker gets the ACK when the trainer acknowledges the bundle that carried it
  (until then the worker keeps it). If the trainer takes no bundle for ``spool_after_s``,
  waiting packets move to the spool.
* Otherwise it is appended to the spool on disk and acknowledged at once; bundles
  take spooled packets first.
* If the spool is full too, or the disk refuses it (full, too many open files), the packet is
  refused (the server sends the worker a NACK; it resends later). A packet waiting in memory stays
  there until the disk takes it.
* Each connected worker is sure of its share of the spool, ``max_bytes`` split evenly between
  them: a worker past its share spools only into room that the others' unused shares do not need, so
  one fast worker (a simulator beside robots) cannot fill the spool while the trainer is away and
  leave the others refused until it drains.
* A packet the trainer refuses for its sample layout (its ACK names the bundle's parts) goes to
  the spool's ``held`` folder (:mod:`netrl.server.layout_hold`), and back to the spool when a
  trainer of its layout connects; one it refuses for anything else is refused for good. Neither
  counts as delivered (``samples_out``).

Bundles hold at least ``min_samples`` samples (or leave after ``max_delay_s``) and go out only
while the trainer has credit, so a slow trainer never makes the server's memory grow. Beyond
``min_samples``, a bundle also takes the packets already waiting, up to ``max_bundle_bytes``: under
load, one bundle, one trainer ACK and one ACK per worker then cover many packets instead of one
each. Whatever ``min_samples`` asks, a bundle never holds more than ``MAX_BUNDLE_PARTS`` packets, or
more bytes than the trainer accepts (``max_message_bytes``, less room for the header), on
the wire or once decoded (compressed arrays declare their size); packets that cannot reach
``min_samples`` within those limits leave after ``max_delay_s``, and a packet too big to share a
bundle goes alone. Packets are forwarded unchanged.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Collection
from typing import Any, Literal

from netrl.protocol.messages import MsgType
from netrl.protocol.wire import encode_bundle, max_packet_bytes
from netrl.server.counters import ServerCounters
from netrl.server.layout_hold import LayoutHold
from netrl.server.peers import QueuedPacket
from netrl.server.spool import Spool, SpooledPacket
from netrl.server.spool_gate import SpoolGate

__all__ = ["FRAME_OVERHEAD", "SampleRelay", "memory_cost"]

log = logging.getLogger(__name__)

Outcome = Literal["held", "spooled", "refused", "duplicate"]
# far below what a header may list (wire.MAX_EPISODES_PER_PACKET * 4 array items)
MAX_BUNDLE_PARTS = 4096
# Memory a held frame costs beyond its bytes (its zmq.Frame and message, the lists and sets holding
# it): measured at 400-460 bytes with pyzmq 27 on CPython 3.11. Without it, 64 MiB of 560-byte
# packets (9 frames) would take 450 MiB.
FRAME_OVERHEAD = 512
# bundles one flush builds: one of 4,096 packets takes the loop a good part of a second
MAX_BUNDLES_PER_PASS = 1


class SampleRelay:
    """Sample packets between the workers and the trainer. The server owns it and
    supplies the two sends."""

    def __init__(self, spool: Spool, min_samples: int, max_bundle_bytes: int, max_message_bytes: int,
                 max_delay_s: float, max_queue_bytes: int, spool_after_s: float, stats: ServerCounters,
                 send_to_trainer: Callable[[list[Any]], bool],
                 tell_worker: Callable[[str, MsgType, dict[str, Any]], None],
                 workers: Callable[[], Collection[str]]) -> None:
        self.spool = spool
        self.min_samples, self.max_bundle_bytes, self.max_delay = min_samples, max_bundle_bytes, max_delay_s
        # what the trainer accepts, less the header
        self.bundle_limit = max_packet_bytes(max_message_bytes)
        self.max_message_bytes = max_message_bytes  # what the trainer decodes one packet's arrays
                                                    # into, at most
        self.max_queue_bytes, self.spool_after = max_queue_bytes, spool_after_s
        self.stats = stats
        self.send_to_trainer, self.tell_worker = send_to_trainer, tell_worker
        self.queue: collections.deque[QueuedPacket] = collections.deque()  # in memory, not yet sent
        self.held: set[tuple[str, int]] = set()  # (session, seq) of packets in memory,
                                                 # queued or in flight
        self.held_cost: dict[str, int] = {}  # by session: what those packets cost
                                             # (FRAME_OVERHEAD included)
        self.mem_bytes = 0  # what they all cost
        self.queued_steps = 0
        self.credit = 0
        self.bundle_seq = 0
        self.inflight: dict[int, list[QueuedPacket]] = {}
        self.inflight_steps = 0  # samples in bundles the trainer has not acknowledged ...
        self.inflight_spooled = 0  # ... of which the spool still counts these (until the trainer
                                   # acknowledges them)
        self.last_bundle_at = 0.0
        self.cut_short = False  # the last flush stopped at MAX_BUNDLES_PER_PASS with credit left
        self._last_full_warning = 0.0
        # who may spool (workers: the names of the connected workers, who share the spool), and the
        # rest after the disk refused
        self.gate = SpoolGate(spool, stats, workers)
        # spool_stale rests until then after keeping packets past their share
        self._stale_scan_at = 0.0
        # packets the trainer refused for their layout, by layout (the server opens it)
        self.hold = LayoutHold(spool.dir / "held", spool.max_bytes, stats, spool.fsync)
        self.layout = 0  # the connected trainer's layout tag (SCHEMA; 0: none known)

    # -- packets in --------------------------------------------------------------------------------
    def accept(self, packet: QueuedPacket, trainer_connected: bool, spool_now: bool = False) -> Outcome:
        """Hold, spool or refuse a worker's packet, and tell the worker when that
        settles it (ACK or NACK). (Each worker's share of the memory is enforced before:
        :meth:`netrl.server.intake.SampleIntake.on_samples`.) ``spool_now``: the worker is
        stopping, so the packet goes to the spool rather than wait in memory."""
        key = (packet.session, packet.seq)
        # a resend of a packet still held: it is acknowledged with the original
        if key in self.held:
            self.stats.resends_ignored += 1
            return "duplicate"
        cost = memory_cost(packet)
        if trainer_connected and not spool_now and self.mem_bytes + cost <= self.max_queue_bytes:
            self.queue.append(packet)
            self.held.add(key)
            self.held_cost[packet.session] = self.held_cost.get(packet.session, 0) + cost
            self.mem_bytes += cost
            self.queued_steps += packet.steps
            return "held"
        reason = "server queue and spool are full"
        if not self.spool.fits(packet.nbytes):
            self._warn_full(packet.worker)
        elif not self.gate.share_ok(packet):
            reason = self.gate.over_share(packet)
        else:
            if not self.spool.packets:
                log.info("spooling packets to %s: %s", self.spool.dir, "no trainer is connected"
                         if not trainer_connected else f"the memory queue is full "
                                                       f"({self.mem_bytes} bytes)")
            if self.gate.push(packet):  # on disk: the server has it
                self.tell_worker(packet.session, MsgType.ACK, {"seqs": [packet.seq], "spooled": True})
                return "spooled"
            reason = "the server cannot write its spool"
        self.stats.samples_refused += packet.steps
        self.tell_worker(packet.session, MsgType.NACK, {"seqs": [packet.seq], "retry_s": 1.0, "reason": reason})
        return "refused"

    # -- the trainer -------------------------------------------------------------------------------
    def trainer_joined(self) -> None:
        self.credit = 0

    def trainer_layout(self, tag: int) -> None:
        """The connected trainer's sample layout (its SCHEMA): the packets held for it go back to
        the spool, and from there to it."""
        self.layout = tag
        self.hold.release_to(self.layout, self.spool, self.gate)

    def trainer_left(self) -> None:
        """It left without acknowledging some bundles: their packets go back to the front,
        and the spool rewinds."""
        self.credit = 0
        self.layout = 0
        for seq in sorted(self.inflight, reverse=True):
            for packet in reversed(self.inflight.pop(seq)):
                if packet.spool_position is None:
                    self.queue.appendleft(packet)
                    self.queued_steps += packet.steps
        self.inflight_steps = self.inflight_spooled = 0
        self.spool.rewind()

    def add_credit(self, bundles: int) -> None:
        self.credit = min(self.credit + max(0, bundles), 10_000)

    def trainer_acked(self, bundle_seqs: list[int],
                      refused: dict[str, list[int]] | None = None) -> None:
        """The trainer has these bundles (in its sample log): free them and acknowledge their
        workers. ``refused``: the parts of the first bundle the trainer refused, by why
        (``layout_refused``, ``rejected``: its ACK's fields)."""
        acks: dict[str, list[int]] = collections.defaultdict(list)
        spooled_before = self.spool.packets
        for seq in bundle_seqs:
            packets = self.inflight.pop(seq, [])
            if refused and packets:
                packets = self._sort_out(packets, refused)
                refused = None
            for packet in packets:
                self.inflight_steps -= packet.steps
                self.stats.samples_out += packet.steps  # once delivered: resends count once
                if packet.spool_position is not None:
                    self.inflight_spooled -= packet.steps
                    self.spool.ack(packet.spool_position)
                else:
                    self._release(packet)
                    acks[packet.session].append(packet.seq)
        if spooled_before and not self.spool.packets:
            log.info("spool drained: the trainer has every spooled packet")
        for session, seqs in acks.items():
            self.tell_worker(session, MsgType.ACK, {"seqs": seqs})

    def _sort_out(self, packets: list[QueuedPacket],
                  refused: dict[str, list[int]]) -> list[QueuedPacket]:
        """Settle the packets of a bundle that the trainer refused; the others, to deliver. One
        refused for its layout is held for a trainer of its layout; one in memory that cannot be
        goes back to its worker (a NACK naming the layout, as the server's own check sends). One
        refused for anything else is refused for good (a NACK, for one in memory)."""
        layout, rejected = ({i for i in refused.get(why, ()) if type(i) is int}
                            for why in ("layout_refused", "rejected"))
        delivered = []
        for i, packet in enumerate(packets):
            if i not in layout and i not in rejected:
                delivered.append(packet)
                continue
            self.inflight_steps -= packet.steps
            problem = (self.hold.keep_packet(packet, self.layout, self.max_message_bytes)
                       if i in layout else None)
            if i not in layout:  # the trainer logged why; refused for good, as the server would
                self.stats.samples_trainer_rejected += packet.steps
            if packet.spool_position is not None:
                self.inflight_spooled -= packet.steps
                self.spool.ack(packet.spool_position)
                if problem:
                    self.hold.lost(packet, problem)
                continue
            self._release(packet)
            if i in layout and not problem:  # on disk in the held folder: its worker may let it go
                self.tell_worker(packet.session, MsgType.ACK, {"seqs": [packet.seq], "spooled": True})
                continue
            # refused for good (its worker counts it rejected), or kept by its worker for its layout
            why = (f"for its sample layout, and {problem}" if problem else "(its log says why)")
            self.tell_worker(packet.session, MsgType.NACK, {
                "seqs": [packet.seq], "retry_s": 0, "reason": f"the trainer refused it {why}",
                **({"layout": self.layout} if problem else {})})
        return delivered

    # -- bundles out -------------------------------------------------------------------------------
    def next_deadline(self, trainer_connected: bool) -> float | None:
        """When the oldest queued packet must leave even in a small bundle; None while nothing can
        leave (no trainer, or no credit: the message that changes that wakes the server anyway), so
        that a deadline already passed does not make the server's loop spin."""
        if not self.queue or not trainer_connected or self.credit <= 0:
            return None
        return self.queue[0].received + self.max_delay

    def flush(self, now: float, trainer_connected: bool, max_bundles: int | None = None) -> None:
        """Bundle spooled, then queued packets for the trainer while it has credit, at most
        ``max_bundles`` of them (the server's loop builds ``MAX_BUNDLES_PER_PASS`` per pass, so that
        its heartbeats go out on time while it drains a spool); :attr:`cut_short` says whether that
        limit stopped it with credit left."""
        self.cut_short = False
        built = 0
        while trainer_connected and self.credit > 0:
            if max_bundles is not None and built >= max_bundles:
                self.cut_short = True
                return
            built += 1
            spooled = self.spool.pending() and now >= self.gate.retry_at  # a failed spool rests
            if not spooled and (not self.queue or (self.queued_steps < self.min_samples
                                                   and now - self.queue[0].received < self.max_delay)):
                return
            packets: list[QueuedPacket] = []
            steps = nbytes = inflated = 0
            if spooled:
                try:
                    taken = self.spool.take(self._more)
                # cannot read it now (too many open files?): the queue goes on its own terms
                except OSError as exc:
                    self.gate.failed(exc)
                    continue
                for sp in taken:
                    if not self._deliverable(sp):
                        continue
                    packets.append(QueuedPacket(sp.meta["worker"], sp.meta["session"], sp.meta["seq"],
                                                int(sp.meta["steps"]), sp.frames, sp.nbytes, now, sp.position,
                                                int(sp.meta.get("inflated", 0))))
                    steps += packets[-1].steps
                    nbytes += sp.nbytes
                    inflated += packets[-1].trainer_bytes
            while self.queue and (not packets or self._more(len(packets), steps, nbytes, self.queue[0].nbytes,
                                                            inflated, self.queue[0].trainer_bytes)):
                packet = self.queue.popleft()
                self.queued_steps -= packet.steps
                packets.append(packet)
                steps += packet.steps
                nbytes += packet.nbytes
                inflated += packet.trainer_bytes
            # the spool held only damage (reported by its log) or dropped
            # packets; the queue is empty
            if not packets:
                if spooled and self.spool.pending():
                    continue
                return
            self.bundle_seq += 1
            if not self.send_to_trainer(encode_bundle("server", self.bundle_seq, [p.frames for p in packets])):
                # nothing is lost: the bundle is rebuilt when the trainer can take it
                self._untake(packets)
                return
            self.inflight[self.bundle_seq] = packets
            self.inflight_steps += steps
            self.inflight_spooled += sum(p.steps for p in packets if p.spool_position is not None)
            self.credit -= 1
            self.stats.bundles_out += 1
            self.last_bundle_at = now

    def _deliverable(self, sp: SpooledPacket) -> bool:
        """False (logged, counted in ``samples_dropped``, and acknowledged in the spool, so that the
        packets behind it flow) for a packet spooled under a larger ``network.max_message_bytes``
        than this server's, which the trainer would refuse, closing its connection,
        every time it was sent."""
        inflated = int(sp.meta.get("inflated", 0))
        if sp.nbytes <= self.bundle_limit and inflated <= self.max_message_bytes:
            return True
        steps = int(sp.meta["steps"])
        self.stats.samples_dropped += steps
        log.error("spooled packet %d of worker %s (%d samples, %d bytes, %d decoded) is "
                  "over what the trainer takes: network.max_message_bytes is %d (%d bytes "
                  "for one packet, less the bundle header); it was spooled under a "
                  "larger limit. Dropped (%d samples so far): restart the server "
                  "and the trainer with the limit raised to keep such packets",
                  sp.meta["seq"], sp.meta["worker"], steps, sp.nbytes, inflated,
                  self.max_message_bytes, self.bundle_limit, self.stats.samples_dropped)
        self.spool.ack(sp.position)
        return False

    def _more(self, count: int, steps: int, nbytes: int, next_bytes: int, inflated: int, next_inflated: int) -> bool:
        """Whether a bundle of ``count`` packets (``steps`` samples, ``nbytes`` bytes on the wire,
        ``inflated`` once decoded) also takes the next one."""
        if count >= MAX_BUNDLE_PARTS or nbytes + next_bytes > self.bundle_limit:
            return False  # the trainer would refuse the bundle
        if inflated + next_inflated > self.bundle_limit:  # what one bundle may take at the trainer,
                                                          # decoded: blank
            return False  # camera frames shrink 1,000 times, so a few MB on the wire could
                          # take gigabytes there
        return steps < self.min_samples or nbytes + next_bytes <= self.max_bundle_bytes

    def _untake(self, packets: list[QueuedPacket]) -> None:
        for packet in reversed([p for p in packets if p.spool_position is None]):
            self.queue.appendleft(packet)
            self.queued_steps += packet.steps
        spooled = [p.spool_position for p in packets if p.spool_position is not None]
        if spooled:
            self.spool.untake(min(spooled))

    def spool_stale(self, now: float, trainer_connected: bool) -> None:
        """The trainer has taken nothing for ``spool_after_s``: move packets waiting that long to
        disk and acknowledge them, so workers stop holding them. (A trainer that keeps taking
        bundles is left to drain the queue: spooling then would only add disk work, and the workers'
        send windows already bound the queue.) With no trainer connected, every packet waiting
        goes at once, as a new one would: otherwise a worker that stops just after the trainer left
        would wait ``spool_after_s`` for its ACKs, and give up on its last packets first."""
        # the head after the last acknowledgements, and the emptied segments off the disk
        self.spool.tick()
        if self.hold.stores:  # (rarely: a pass of the server's loop pays one look when empty)
            self.hold.tick()
            if trainer_connected:
                self.hold.release_to(self.layout, self.spool, self.gate)
        wait = self.spool_after if trainer_connected else 0.0
        if now - self.last_bundle_at < wait:
            return
        if now < self._stale_scan_at:
            return
        acks: dict[str, list[int]] = collections.defaultdict(list)
        # past their workers' shares of the spool: they stay in memory, unacknowledged
        kept: list[QueuedPacket] = []
        while self.queue and now - self.queue[0].received >= wait and self.spool.fits(self.queue[0].nbytes):
            packet = self.queue.popleft()
            if not self.gate.share_ok(packet):
                kept.append(packet)
                continue
            if not self.spool.packets:
                log.info("spooling packets to %s: %s", self.spool.dir, "the trainer is not keeping up"
                         if trainer_connected else "no trainer is connected")
            if not self.gate.push(packet):
                self.queue.appendleft(packet)
                break  # it stays queued in memory, and its worker keeps it
            self.queued_steps -= packet.steps
            self._release(packet)
            acks[packet.session].append(packet.seq)
        # in their place, at the front; looked at again in a while, not on every
        # pass of the server's loop
        if kept:
            self.queue.extendleft(reversed(kept))
            self._stale_scan_at = now + 0.5
        for session, seqs in acks.items():
            self.tell_worker(session, MsgType.ACK, {"seqs": seqs, "spooled": True})

    def spool_now(self, session: str) -> int:
        """A stopping worker's packets waiting in memory go to the spool at once, and it is told
        they are spooled: otherwise it would wait for the trainer, or for ``spool_after_s``, and
        could stop first, its last packets unconfirmed. Those past its share of the spool, or that
        the disk refuses, stay in memory. Returns how many moved."""
        moved: list[int] = []
        kept: collections.deque[QueuedPacket] = collections.deque()
        for packet in self.queue:
            if (packet.session == session and self.spool.fits(packet.nbytes)
                    and self.gate.share_ok(packet) and self.gate.push(packet)):
                self.queued_steps -= packet.steps
                self._release(packet)
                moved.append(packet.seq)
            else:
                kept.append(packet)
        self.queue = kept
        if moved:
            self.tell_worker(session, MsgType.ACK, {"seqs": moved, "spooled": True})
        return len(moved)

    def _release(self, packet: QueuedPacket) -> None:
        """A packet held in memory is settled (the trainer or the spool has it): its
        worker's window opens."""
        self.held.discard((packet.session, packet.seq))
        cost = memory_cost(packet)
        self.mem_bytes -= cost
        left = self.held_cost.pop(packet.session, 0) - cost
        if left > 0:
            self.held_cost[packet.session] = left

    # -- numbers -----------------------------------------------------------------------------------
    def on_the_way(self) -> int:
        """Samples accepted but not yet acknowledged by the trainer (for pacing):
        spooled ones in flight once."""
        return self.queued_steps + self.inflight_steps - self.inflight_spooled + self.spool.steps

    def held_packets(self) -> int:
        return len(self.queue) + sum(len(b) for b in self.inflight.values())

    def snapshot(self) -> dict[str, Any]:
        spool = self.spool
        return {"queued_samples": self.queued_steps, "queued_bytes": self.mem_bytes,
                "inflight_samples": self.inflight_steps,
                "spool": {"packets": spool.packets, "samples": spool.steps, "bytes": spool.bytes,
                          "max_bytes": spool.max_bytes},
                "held": self.hold.describe()}

    def _warn_full(self, who: str) -> None:
        now = time.monotonic()
        if now - self._last_full_warning > 10:
            self._last_full_warning = now
            log.warning("memory queue (%d bytes) and spool (%d of %d bytes) are full: "
                        "refusing packets from worker %r until the trainer catches up "
                        "(%d samples refused so far)", self.mem_bytes, self.spool.bytes,
                        self.spool.max_bytes, who, self.stats.samples_refused)


def memory_cost(packet: QueuedPacket) -> int:
    """What holding ``packet`` in memory costs, in bytes."""
    return packet.nbytes + FRAME_OVERHEAD * len(packet.frames)
