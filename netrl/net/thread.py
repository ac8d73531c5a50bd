"""A role's network thread: owns a :class:`~netrl.net.transport.ClientLink` and an inproc pipe from the role's main
thread.

ZeroMQ sockets are not thread-safe, so a worker's or trainer's main thread (env steps, training) never touches the
link's socket and never blocks on the network: it hands frames over an inproc PAIR pipe, zero-copy, and reads
results from whatever thread-safe state the subclass (:class:`~netrl.worker.link.WorkerLink`,
:class:`~netrl.trainer.link.TrainerLink`) exposes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import zmq

from netrl.config.sections import NetworkConfig
from netrl.errors import NetrlError
from netrl.net.keys import ClientKeys
from netrl.net.transport import ClientLink
from netrl.protocol.messages import Message

__all__ = ["NetThread"]

log = logging.getLogger(__name__)


class NetThread(threading.Thread):
    """A role's network thread. The main thread sends commands through :meth:`command` and stops it with
    :meth:`halt`; the thread itself may end early with :meth:`stop_soon`. Subclasses implement :meth:`on_message`,
    :meth:`on_command` and optionally :meth:`on_tick`, :meth:`on_ready`, :meth:`on_exit` and :meth:`on_finish`.
    """

    POLL_MS = 20

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

    # -- main-thread side ---------------------------------------------------------------------------------
    def command(self, frames: Sequence[Any], track: bool = False) -> zmq.MessageTracker | None:
        """Hand frames to the network thread (zero-copy, never blocks). With ``track``, the returned tracker is
        done once ZeroMQ no longer holds the frames' memory anywhere (all sends that reused it are complete).

        Raises NetrlError once the network thread has ended (its end of the pipe is closed, so a send would block
        forever)."""
        try:
            if self.ident is not None and not self.is_alive():  # ended: its end of the pipe may still be closing
                raise zmq.Again
            tracker = self._pipe_out.send_multipart(frames, zmq.NOBLOCK, copy=False, track=track)
        except zmq.Again:  # the pipe has no reader any more: SNDHWM 0 never refuses while it does
            why = self.link.fatal or self.error  # e.g. the server's REJECT: the reason to show, not just the symptom
            raise NetrlError(f"{self.link.role} cannot continue: its network thread has stopped"
                             f"{f' ({why})' if why else ''}") from None
        return tracker if track else None

    def halt(self, timeout: float = 5.0) -> None:
        """Stop the thread, wait for it, and free the sockets (also of a thread never started). Idempotent."""
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
        """Network thread: end the loop after this pass, as if halted (the owner still calls halt to join)."""
        self._halt.set()

    # -- network-thread side ------------------------------------------------------------------------------
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
                    for msg in self.link.receive():
                        self.on_message(msg)
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

    def on_ready(self) -> None:
        """Called after every WELCOME (first connect and reconnects)."""

    def on_message(self, msg: Message) -> None:
        raise NotImplementedError

    def on_command(self, frames: list[Any]) -> None:
        raise NotImplementedError

    def on_tick(self) -> None:
        """Called after every poll (at least every POLL_MS milliseconds)."""

    def on_exit(self) -> None:
        """Called once before the link closes on a clean halt (last chance to flush)."""

    def on_finish(self) -> None:
        """Called last, however the thread ends (wake anyone waiting on it)."""
