"""A role's network thread: owns a :class:`~netrl.net.transport.ClientLink` and an inproc pipe from
the role's main thread, and the layout of the commands that cross that pipe.

ZeroMQ sockets are not thread-safe, so a worker's or trainer's main thread (env steps, training)
never touches the link's socket and never blocks on the network: it hands commands over an
inproc PAIR pipe, zero-copy, and reads results from whatever thread-safe state the subclass
(:class:`~netrl.worker.link.WorkerLink`, :class:`~netrl.trainer.link.TrainerLink`) exposes.

A command is one multipart message on the pipe. Its first frame, the head, is the command's kind
(one byte, a :class:`Command`) and a fixed set of little-endian integers; the frames after it
are handed over as they are, zero-copy (a message encoded by :mod:`netrl.protocol.wire`,
for the network thread to send)::

    PACKET     worker    head: u8 1 | u64 seq | u64 steps     then one SAMPLES message: the packet,
                                                              kept until acked
    CREDIT     trainer   head: u8 2                           nothing: the loop took bundles, grant
                                                              credit now
    WEIGHTS    trainer   head: u8 3 | u32 part | i64 version  then one WEIGHTS message: that part of
                                                              the version
    PROGRESS   trainer   head: u8 4                           then one PROGRESS message

:func:`command_head` writes a head and :func:`read_command` reads it back. A head no command
has (an unknown kind, or the wrong size for its kind) is a bug in the role, not input from a
peer: it raises ValueError, and a network thread that meets one stops with it, which the main
thread's next command reports.
"""

from __future__ import annotations

import enum
import logging
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

import zmq

from netrl.config.sections import NetworkConfig
from netrl.errors import NetrlError
from netrl.net.keys import ClientKeys
from netrl.net.transport import ClientLink
from netrl.protocol.messages import Message

__all__ = ["Command", "NetThread", "command_head", "read_command"]

log = logging.getLogger(__name__)


class Command(enum.IntEnum):
    """What a role's main thread asks of its network thread: the first byte of a command's head."""

    PACKET = 1  # worker: send a sample packet, and keep it until the server acknowledges it
    CREDIT = 2  # trainer: the training loop took bundles
    WEIGHTS = 3  # trainer: a part of a weight version to send
    PROGRESS = 4  # trainer: the training loop's progress, for the server's pacing


# Each command's head: its kind, then its integers (the module docstring shows them).
_HEADS = {Command.PACKET: struct.Struct("<BQQ"), Command.CREDIT: struct.Struct("<B"),
          Command.WEIGHTS: struct.Struct("<BIq"), Command.PROGRESS: struct.Struct("<B")}
_BY_BYTE = {int(kind): (kind, head) for kind, head in _HEADS.items()}


def command_head(kind: Command, *values: int) -> bytes:
    """The first frame of a ``kind`` command carrying ``values`` (struct.error if
    they do not fit its head)."""
    return _HEADS[kind].pack(kind, *values)


def read_command(head: Any) -> tuple[Command, tuple[int, ...]]:
    """The kind and integers of a command's head (a zmq.Frame or bytes); ValueError
    for a head no command has."""
    view = memoryview(head)
    known = _BY_BYTE.get(view[0]) if view.nbytes else None
    if known is None or view.nbytes != known[1].size:
        what = f"a {known[0].name} command's head of {view.nbytes} bytes" if known else "an unknown command"
        raise ValueError(f"{what} ({bytes(view[:32]).hex() or 'empty'}) on a network thread's "
                         f"pipe: a bug in its role, which must build commands with command_head()")
    return known[0], known[1].unpack(view)[1:]


class NetThread(threading.Thread):
    """A role's network thread. The main thread sends commands through :meth:`command` and stops it
    with :meth:`halt`; the thread itself may end early with :meth:`stop_soon`. Subclasses implement
    :meth:`on_message`, :meth:`on_command` and optionally :meth:`on_tick`, :meth:`on_ready`,
    :meth:`on_exit` and :meth:`on_finish`.
    """

    POLL_MS = 20
    # One pass reads messages for at most this long (and at least one), then heartbeats and liveness
    # get their turn: a backlog of bundles after a stall must not keep them waiting until the
    # peer takes this side for dead.
    READ_BUDGET_S = 0.05

    def __init__(self, net: NetworkConfig, role: str, name: str, session: str, port: int,
                 keys: ClientKeys | None = None) -> None:
        super().__init__(name=f"netrl-{role}-net", daemon=True)
        self.ctx = zmq.Context()
        self.link = ClientLink(self.ctx, net, role, name, session, port, on_ready=self.on_ready, keys=keys)
        addr = f"inproc://netrl-{role}-{session}-{id(self)}"
        self._pipe_in = self.ctx.socket(zmq.PAIR)  # used by the network thread only
        self._pipe_in.setsockopt(zmq.LINGER, 0)
        self._pipe_in.setsockopt(zmq.RCVHWM, 0)
        self._pipe_in.bind(addr)
        self._pipe_out = self.ctx.socket(zmq.PAIR)  # used by the main thread only
        self._pipe_out.setsockopt(zmq.LINGER, 0)
        self._pipe_out.setsockopt(zmq.SNDHWM, 0)  # never blocks the main thread
        self._pipe_out.connect(addr)
        self._halt = threading.Event()
        self.error: BaseException | None = None

    # -- main-thread side --------------------------------------------------------------------------
    def command(self, frames: Sequence[Any], track: bool = False) -> zmq.MessageTracker | None:
        """Hand a command to the network thread: its head (:func:`command_head`), then its frames
        (zero-copy, never blocks). With ``track``, the returned tracker is done once ZeroMQ no
        longer holds the last frame's memory anywhere (all sends that reused it are complete).

        Raises NetrlError once the network thread has ended (its end of the pipe is closed, so a
        send would block forever)."""
        try:
            # ended: its end of the pipe may still be closing
            if self.ident is not None and not self.is_alive():
                raise zmq.Again
            tracker = self._pipe_out.send_multipart(frames, zmq.NOBLOCK, copy=False, track=track)
        except zmq.Again:  # the pipe has no reader any more: SNDHWM 0 never refuses while it does
            why = self.link.fatal or self.error  # e.g. the server's REJECT: the reason to show, not
                                                 # just the symptom
            raise NetrlError(f"{self.link.role} cannot continue: its network thread has stopped"
                             f"{f' ({why})' if why else ''}") from None
        return tracker if track else None

    def halt(self, timeout: float = 5.0) -> None:
        """Stop the thread, wait for it, and free the sockets (also of a thread never
        started). Idempotent."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout)
        if not self._pipe_out.closed:
            self._pipe_out.close(linger=0)
        if self.ident is None:  # never started: run() did not get to close its side
            self.link.close()
            self._pipe_in.close(linger=0)
        if not self.is_alive() and not self.ctx.closed:
            self.ctx.term()

    def stop_soon(self) -> None:
        """Network thread: end the loop after this pass, as if halted (the owner
        still calls halt to join)."""
        self._halt.set()

    # -- network-thread side -----------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.link.open()
            poller, polled = zmq.Poller(), None
            poller.register(self._pipe_in, zmq.POLLIN)
            while not self._halt.is_set() and self.link.fatal is None:
                if polled is not self.link.sock:  # the link reconnected with a new socket
                    if polled is not None and polled in dict(poller.sockets):
                        poller.unregister(polled)
                    polled = self.link.sock
                    if polled is not None:
                        poller.register(polled, zmq.POLLIN)
                events = dict(poller.poll(self.POLL_MS))
                if polled is not None and polled in events:
                    self._read()
                if self._pipe_in in events:
                    while True:
                        try:
                            frames = self._pipe_in.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self.on_command(frames)
                self.link.maintain()
                self.on_tick()
            self.on_exit()
        except BaseException as exc:  # surfaced to the main thread, which stops the role
            self.error = exc
            log.exception("%s network thread failed", self.link.role)
        finally:
            self.link.close()
            self._pipe_in.close(linger=0)
            self.on_finish()

    def _read(self) -> None:
        """Handle waiting messages for at most READ_BUDGET_S; the rest wait for the next pass (the
        poll returns at once while they do)."""
        deadline = time.monotonic() + self.READ_BUDGET_S
        while True:
            for msg in self.link.receive(limit=1):
                self.on_message(msg)
            if time.monotonic() >= deadline or not self.link.input_waiting():
                return

    def on_ready(self) -> None:
        """Called after every WELCOME (first connect and reconnects)."""

    def on_message(self, msg: Message) -> None:
        raise NotImplementedError

    def on_command(self, frames: list[Any]) -> None:
        """A command from the main thread: ``frames[0]`` is its head (:func:`read_command`),
        the rest its frames."""
        raise NotImplementedError

    def on_tick(self) -> None:
        """Called after every poll (at least every POLL_MS milliseconds)."""

    def on_exit(self) -> None:
        """Called once before the link closes on a clean halt (last chance to flush)."""

    def on_finish(self) -> None:
        """Called last, however the thread ends (wake anyone waiting on it)."""
