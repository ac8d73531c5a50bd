"""The worker network thread's packets out: each one kept until the server acknowledges it.

:class:`BacklogThread` is the sending half of :class:`~netrl.worker.link.WorkerLink`, and the
only code that knows the backlog's rules. The control path hands it encoded packets through an
inproc pipe (:meth:`BacklogThread.hand_over`, as PACKET commands of :mod:`netrl.net.thread`);
the network thread keeps each in the backlog, sends it within the send window, and settles it by
what the server answers::

    ACK                        acknowledged (on the server's disk spool or in the trainer's
                               sample log): forgotten
    NACK, retry_s > 0          the server is full: sent again after retry_s
    NACK, retry_s = 0          invalid: rejected, counted and logged, never sent again
    over the server's limit    more than its network.max_message_bytes: rejected, as above
    NACK naming a layout       refused for the trainer's sample layout: held until the server's
                               heartbeats name another layout, then sent again
    reconnect                  everything unacknowledged is sent again
    past max_backlog_bytes     the oldest packets not in flight, held ones included, are dropped,
                               counted and reported loudly
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections import OrderedDict
from typing import Any, NamedTuple

from netrl.config.sections import NetworkConfig
from netrl.net.keys import ClientKeys
from netrl.net.thread import Command, NetThread, read_command
from netrl.protocol.messages import Message, MsgType, printable
from netrl.protocol.wire import frames_nbytes, max_packet_bytes
from netrl.util import worth_logging

__all__ = ["BacklogThread"]

log = logging.getLogger("netrl.worker.link")  # the link's own lines, under its logger as before


class _Outgoing(NamedTuple):
    frames: list[Any]
    nbytes: int
    steps: int


def _packet(head: Any) -> tuple[int, int]:
    """The seq and transitions of a PACKET command's head: the only command a worker's
    network thread takes."""
    kind, values = read_command(head)
    if kind is not Command.PACKET:
        raise ValueError(f"a {kind.name} command on a worker's network "
                         f"thread, which takes PACKET commands only")
    seq, steps = values
    return seq, steps


class BacklogThread(NetThread):
    """A worker's network thread as far as its packets go: in from the control path, out to the
    server, kept until acknowledged.

    At most ``send_window_bytes`` are in flight, and no more than the server's share of its memory
    for this worker (sent in WELCOME and every ACK). A misconfigured trainer costs no samples: the
    packets it refuses are held for another. :meth:`flush` waits for the last packets of a worker
    that stops. Messages other than ACK and NACK go to :meth:`on_other_message`.
    """

    def __init__(self, network: NetworkConfig, worker_id: str, session: str, port: int,
                 keys: ClientKeys | None, max_backlog_bytes: int, send_window_bytes: int) -> None:
        super().__init__(network, "worker", worker_id, session, port, keys=keys)
        self.worker_id = worker_id
        self.max_backlog_bytes, self.send_window_bytes = max_backlog_bytes, send_window_bytes
        # every unacknowledged packet, by seq
        self.backlog: OrderedDict[int, _Outgoing] = OrderedDict()
        # backlog packets to send on this connection
        self.unsent: OrderedDict[int, None] = OrderedDict()
        self.waiting: dict[int, float] = {}  # NACKed packets: seq -> monotonic time to resend
        self.held: dict[int, int] = {}  # packets refused for the trainer's layout: seq -> the
                                        # tag of that layout
        self._held_reasons: set[str] = set()  # why, as logged (once each)
        self.inflight: set[int] = set()
        # the share of the server's memory it grants this worker
        self.server_window: int | None = None
        self.backlog_bytes = self.inflight_bytes = 0
        self.settled = threading.Condition()  # notified whenever the backlog shrinks or a
                                              # packet arrives
        self.last_seq = 0  # newest packet this thread took from the control path
        self.handed_seq = 0  # newest packet the control path handed over (written by it only)
        # bytes, packets and samples the control path handed over (hand_over; written by it only),
        # and those of them this thread took off the pipe (written by this thread only)
        self.piped_bytes = self.piped_packets = self.piped_samples = 0
        self.taken_bytes = self.taken_packets = self.taken_samples = 0
        # the control path's, see hand_over; its keys exist from the start, so this
        # thread can read it meanwhile
        self.pipe_drops = collections.Counter({"dropped_packets": 0, "dropped_samples": 0})
        self._last_pipe_warning = 0.0
        self.flushing = threading.Event()  # set by flush(): the worker is stopping, so reconnect
                                           # without back-off
        self.counts: collections.Counter[str] = collections.Counter()
        self.last_rejection = ""  # why the newest rejected packet was refused (the status
                                  # line repeats it)
        self.last_held_reason = ""  # why the newest held packet was refused
        self._last_drop_warning = 0.0

    def dropped(self) -> collections.Counter[str]:
        """This thread's counts, with the packets the control path dropped at the pipe
        added to the dropped ones."""
        # Counter addition keeps the positive counts, which all are
        return self.counts + self.pipe_drops

    # -- the control path's side -------------------------------------------------------------------
    def hand_over(self, frames: list[Any]) -> bool:
        """Control path: hand this thread a packet, as a PACKET command: its head (seq and
        transitions, see :mod:`netrl.net.thread`) and the message's frames. Never blocks.

        The pipe is bounded too: while ``max_backlog_bytes`` of packets wait in it (this
        thread is so short of CPU that it does not even take them), a further packet is dropped
        here, counted with the dropped ones and logged, rather than taking memory without limit; the
        backlog drops packets beyond the same limit. Returns False for a dropped packet."""
        nbytes, waiting = frames_nbytes(frames[1:]), self.piped_bytes - self.taken_bytes
        seq, steps = _packet(frames[0])
        if waiting and waiting + nbytes > self.max_backlog_bytes:
            self.pipe_drops["dropped_packets"] += 1
            self.pipe_drops["dropped_samples"] += steps
            now = time.monotonic()
            if now - self._last_pipe_warning > 10:
                self._last_pipe_warning = now
                # pipe_drops, not counts: counts is the network thread's, and may grow
                # while this thread reads it
                log.warning("worker %s network thread is behind: %d bytes of packets wait "
                            "for it (limit worker.max_backlog_bytes = %d), so the newest "
                            "packet was dropped; %d samples dropped here so far. The "
                            "machine is short of CPU for this worker", self.worker_id, waiting,
                            self.max_backlog_bytes, self.pipe_drops["dropped_samples"])
            return False
        self.handed_seq = seq
        self.piped_bytes += nbytes
        self.piped_packets += 1
        self.piped_samples += steps
        self.command(frames)
        return True

    def unacknowledged(self) -> tuple[int, int]:
        """Packets and samples not acknowledged: the backlog's, and those still in the pipe (a
        stopped thread never took them)."""
        return (len(self.backlog) + self.piped_packets - self.taken_packets,
                sum(p.steps for p in self.backlog.values()) + self.piped_samples
                - self.taken_samples)

    def flush(self, upto_seq: int, timeout: float) -> bool:
        """Main thread: wait until packets up to ``upto_seq`` reached this thread and all are
        acknowledged (a link waiting out its reconnect back-off reconnects at once)."""
        self.flushing.set()
        with self.settled:  # held packets wait for another trainer: no use waiting for them here
            self.settled.wait_for(lambda: (self.last_seq >= upto_seq
                                           and len(self.backlog) <= len(self.held))
                                  or not self.is_alive(), timeout)
            # a stopped thread may have left some in the pipe
            return self.last_seq >= upto_seq and not self.backlog

    # -- the network thread's side -----------------------------------------------------------------
    def on_command(self, frames: list[Any]) -> None:
        seq, steps = _packet(frames[0])
        packet = _Outgoing(frames[1:], frames_nbytes(frames[1:]), steps)
        self.taken_bytes += packet.nbytes
        self.taken_packets += 1
        self.taken_samples += steps
        self.backlog[seq] = packet
        self.unsent[seq] = None
        self.backlog_bytes += packet.nbytes
        with self.settled:
            self.last_seq = seq
            self.settled.notify_all()
        while self.backlog_bytes > self.max_backlog_bytes and self._drop_oldest():
            pass
        self._pump()

    def _drop_oldest(self) -> bool:
        """Drop the oldest packet that is not in flight (one in flight may still be
        delivered and acknowledged)."""
        seq = next((s for s in self.backlog if s not in self.inflight), None)
        if seq is None:
            return False
        packet = self.backlog.pop(seq)
        self._forget(seq, packet)
        self.counts["dropped_packets"] += 1
        self.counts["dropped_samples"] += packet.steps
        now = time.monotonic()
        if now - self._last_drop_warning > 10:
            self._last_drop_warning = now
            log.warning("worker %s backlog is full (%d bytes unacknowledged, "
                        "limit worker.max_backlog_bytes = %d): dropped its oldest "
                        "packets; %d samples in %d packets dropped so far", self.worker_id,
                        self.backlog_bytes, self.max_backlog_bytes,
                        self.dropped()["dropped_samples"], self.dropped()["dropped_packets"])
        return True

    def _forget(self, seq: int, packet: _Outgoing) -> None:
        self.backlog_bytes -= packet.nbytes
        self.unsent.pop(seq, None)
        self.waiting.pop(seq, None)
        self.held.pop(seq, None)
        if seq in self.inflight:
            self.inflight.discard(seq)
            self.inflight_bytes -= packet.nbytes
        with self.settled:
            self.settled.notify_all()

    def _pump(self) -> None:
        """Send unsent packets, oldest first, within the window."""
        while self.unsent and self.link.ready:
            seq = next(iter(self.unsent))
            packet = self.backlog[seq]
            limit = self.link.welcome.get("max_message_bytes")
            # ZeroMQ would drop the connection
            if limit is not None and packet.nbytes > max_packet_bytes(limit):
                self._reject(seq, packet, f"a packet of {packet.nbytes} bytes is more than the "
                                          f"server relays (its network.max_message_bytes is "
                                          f"{limit}): set the same value on every machine")
                continue
            window = min(self.send_window_bytes, self.server_window or self.send_window_bytes)
            if self.inflight and self.inflight_bytes + packet.nbytes > window:
                return
            if not self.link.send(packet.frames):
                return
            del self.unsent[seq]
            self.inflight.add(seq)
            self.inflight_bytes += packet.nbytes

    def on_ready(self) -> None:
        """(Re)connected: the server may have lost anything unacknowledged, so send it all again."""
        if self.backlog and self.counts["connections"]:
            log.info("resending %d unacknowledged packets (%d bytes)",
                     len(self.backlog), self.backlog_bytes)
        self.counts["connections"] += 1
        self.server_window = self.link.welcome.get("window")
        self.inflight.clear()
        self.inflight_bytes = 0
        self.waiting.clear()
        # maybe another server, or a trainer with their layout: they go again with the rest
        self.held.clear()
        self.unsent = OrderedDict.fromkeys(self.backlog)
        self._pump()

    def on_tick(self) -> None:
        """Send again what waited out its ``retry_s``, and what was held for a layout the server
        no longer checks packets against."""
        if self.flushing.is_set() and self.backlog:
            self.link.reconnect_now()  # the flush timeout is shorter than the longest back-off
        ready: list[int] = []
        if self.waiting:
            now = time.monotonic()
            ready = [seq for seq, t in self.waiting.items() if t <= now]
            for seq in ready:
                del self.waiting[seq]
        layout = self.link.server_stats.get("layout") if self.link.ready else None
        if self.held and layout:  # (0: news from before the server had the layout
                                  # that refused them)
            # refused by a layout now gone
            released = [seq for seq, tag in self.held.items() if tag != layout]
            for seq in released:
                del self.held[seq]
            if released:
                log.info("worker %s sends again %d packets the server refused for the trainer's "
                         "sample layout: it checks packets against another layout now",
                         self.worker_id, len(released))
            ready += released
        if ready:
            self.unsent.update(dict.fromkeys(ready))
            self.unsent = OrderedDict.fromkeys(sorted(self.unsent))
        self._pump()

    def on_finish(self) -> None:
        with self.settled:
            self.settled.notify_all()

    # -- the server's answers ----------------------------------------------------------------------
    def on_message(self, msg: Message) -> None:
        if msg.type is MsgType.ACK:  # the most frequent message: handled here, no call deeper
            self.server_window = msg.body.get("window", self.server_window)
            # on the server's disk: safe, though the trainer lacks them
            spooled = msg.body.get("spooled") is True
            for seq in msg.body["seqs"]:
                packet = self.backlog.pop(seq, None) if isinstance(seq, int) else None
                if packet is not None:
                    self.counts["acked_packets"] += 1
                    self.counts["acked_samples"] += packet.steps
                    if spooled:
                        self.counts["spooled_packets"] += 1
                        self.counts["spooled_samples"] += packet.steps
                    self._forget(seq, packet)
            self._pump()
        elif msg.type is MsgType.NACK:
            self._nack(msg)
        else:
            self.on_other_message(msg)

    def on_other_message(self, msg: Message) -> None:
        """A message that is not about packets (WorkerLink takes weights and pace)."""
        log.debug("ignored a %s message from the server", msg.type.value)

    def _nack(self, msg: Message) -> None:
        """Refused packets: resend after ``retry_s``, or never when ``retry_s`` is 0 (the
        packet is invalid), or, when the NACK names a sample layout, once the server checks
        packets against another."""
        retry_s, layout = float(msg.body["retry_s"]), msg.body.get("layout")
        for seq in msg.body["seqs"]:
            packet = self.backlog.get(seq) if isinstance(seq, int) else None
            if packet is None or seq not in self.inflight:
                continue
            if layout is not None:
                self._hold(seq, packet, layout, msg.body["reason"])
                continue
            if retry_s <= 0:
                self._reject(seq, packet, f"the server rejected it: {msg.body['reason']}")
                continue
            self.inflight.discard(seq)
            self.inflight_bytes -= packet.nbytes
            self.waiting[seq] = time.monotonic() + min(max(retry_s, 0.05), 30.0)
            self.counts["nacked_packets"] += 1

    def _reject(self, seq: int, packet: _Outgoing, reason: str) -> None:
        """A packet that can never be delivered: dropped, counted and logged (it
        would fail every time)."""
        self.backlog.pop(seq)
        self._forget(seq, packet)
        self.counts["rejected_packets"] += 1
        self.counts["rejected_samples"] += packet.steps
        self.last_rejection = reason
        if worth_logging(self.counts["rejected_packets"], first=5, every=100):
            log.error("packet %d of %d samples is dropped (%d rejected so far): %s",
                      seq, packet.steps,
                      self.counts["rejected_packets"], reason)

    def _hold(self, seq: int, packet: _Outgoing, layout: int, reason: str) -> None:
        """Keep a packet the server refused for the trainer's sample layout, until it
        names another layout."""
        self.inflight.discard(seq)
        self.inflight_bytes -= packet.nbytes
        self.held[seq] = layout
        # a packet refused again after a resend counts again
        self.counts["layout_refused_packets"] += 1
        self.counts["layout_refused_samples"] += packet.steps
        self.last_held_reason = reason = printable(reason)
        if reason not in self._held_reasons and len(self._held_reasons) < 16:
            self._held_reasons.add(reason)
            log.warning("worker %s keeps the packets the server refuses for the trainer's "
                        "sample layout (%s): they are sent again once a trainer with "
                        "their layout connects, up to worker.max_backlog_bytes (%d) of "
                        "packets; beyond it the oldest are dropped", self.worker_id, reason,
                        self.max_backlog_bytes)
        with self.settled:  # a flush need not wait for it
            self.settled.notify_all()
