"""The collector's link to the server: a :class:`~netrl.trainer.link.TrainerLink` that
acknowledges a bundle only once the collector has yielded every packet in it.

A trainer acknowledges a bundle once its packets are in its sample log on disk. The collector keeps
no log: it yields its packets' frames to the caller. Until then the server keeps the bundle (in
memory or in its spool) and the workers keep its packets, so a collector killed with frames in
hand loses none: a new collector, started from :meth:`RemoteCollector.state_dict`, gets them again.

Bookkeeping, all on the network thread (the collector's thread only queues what it yielded)::

    bundle b arrives: packets p1, p2 (new), p3 (a resend of a packet still held)
    waiting[b] = {p1, p2, p3}          held = {..., p1, p2}
    collector yields p1, p2, p3's first copy -> done(...) -> ACK b

A resend of a packet already yielded waits for nothing. Bundle numbers are the server process's:
after a reconnect the old ones are forgotten (a new server numbers from 1 again, and an ACK must
never name a bundle of the new server that was not yielded); their packets come again, as resends.
"""

from __future__ import annotations

import collections
from typing import Any

from netrl.net.thread import Command, command_head
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import encode
from netrl.samples.columns import Buffer
from netrl.trainer.link import TrainerLink

__all__ = ["CollectorLink", "PacketKey"]

PacketKey = tuple[str, int]  # (worker stream, sequence number)


class CollectorLink(TrainerLink):
    """A TrainerLink whose ACKs wait for :meth:`done` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._done: collections.deque[list[PacketKey]] = collections.deque()  # collector -> here
        self._held: dict[PacketKey, int] = {}  # received, not yet yielded: its frames
        # bundle -> its packets not yet yielded, its refused parts, its frames yielded so far
        self._waiting: dict[int, tuple[set[PacketKey], dict[str, list[int]], list[int]]] = {}
        self.acked = 0  # bundles acknowledged
        # Frames yielded whose bundles wait for others: the server counts them on the way to
        # the collector still, and the collector's PROGRESS adds them back to what it wants, or
        # the workers' pacing would stall on frames already yielded.
        self.yielded_unacked = 0

    # -- collector thread --------------------------------------------------------------------------
    def done(self, keys: list[PacketKey]) -> None:
        """The collector has yielded (or settled: left out, counted) these packets."""
        if keys:
            self._done.append(keys)
            self.command([command_head(Command.CREDIT)])  # wakes the network thread

    # -- network thread ----------------------------------------------------------------------------
    def _acknowledge(
        self,
        bundle: int,
        refused: dict[str, list[int]],
        bufs: list[Buffer],
        duplicates: list[PacketKey],
    ) -> None:
        for b in bufs:
            self._held[(b.worker, b.seq)] = int((~(b.reset | b.context)).sum())
        # a resend of a packet the collector still holds waits for it
        wait = {(b.worker, b.seq) for b in bufs} | {k for k in duplicates if k in self._held}
        if wait:
            self._waiting[bundle] = (wait, refused, [0])
        else:
            self._ack(bundle, refused)

    def _ack(self, bundle: int, refused: dict[str, list[int]]) -> None:
        self.link.send(
            encode(Message(MsgType.ACK, self.link.name, body={"seqs": [bundle], **refused}))
        )
        self.acked += 1

    def on_command(self, frames: list[Any]) -> None:
        super().on_command(frames)
        while self._done:
            keys = self._done.popleft()
            frames_of = {k: self._held.pop(k, 0) for k in keys}
            for bundle, (wait, refused, yielded) in list(self._waiting.items()):
                for k in wait & frames_of.keys():
                    wait.discard(k)
                    yielded[0] += frames_of[k]
                if not wait:
                    del self._waiting[bundle]
                    self._ack(bundle, refused)
            self.yielded_unacked = sum(y[0] for _, _, y in self._waiting.values())

    @property
    def held_bundles(self) -> int:
        return len(self._waiting)

    def on_ready(self) -> None:
        # another connection (maybe another server process): its bundle numbers are new
        self._waiting.clear()
        self.yielded_unacked = 0
        super().on_ready()
