"""A worker's or the trainer's connection to the server: :class:`ClientLink`.

The server binds two ROUTER sockets (trainer port, worker port). Each worker and the trainer hold
one DEALER :class:`ClientLink` to it, which follows the ZeroMQ Guide's Paranoid Pirate pattern:

* the first message on every connection is HELLO (role, protocol and netrl versions, name,
  session);
* whoever has sent nothing for a heartbeat interval sends HEARTBEAT, and *any* message counts as
  one;
* a peer silent for ``heartbeat_interval_s * heartbeat_liveness`` is lost, or for longer on a link
  whose measured round trip needs it (:class:`~netrl.net.liveness.Liveness`): the client closes its
  socket and reconnects with exponential back-off (:class:`~netrl.net.liveness.Backoff`), then says
  HELLO again; the server forgets it. Messages waiting unread, and a connection's handshake, count
  as the peer talking.

Every socket has ``linger=0``, a maximum message size and high-water marks
(:func:`~netrl.net.sockets.new_socket`); every poll has a finite timeout.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from netrl import __version__
from netrl.config.sections import NetworkConfig, flag_for
from netrl.errors import ProtocolError, VersionMismatch
from netrl.net.keys import ClientKeys
from netrl.net.liveness import Backoff, Liveness
from netrl.net.sockets import HANDSHAKE_EVENTS, handshake_failure, new_socket
from netrl.protocol.messages import Message, MsgType, printable
from netrl.protocol.wire import decode, encode
from netrl.util import worth_logging

__all__ = ["ClientLink", "new_session"]

log = logging.getLogger(__name__)


def new_session() -> str:
    """A random id for one process run: (worker name, session, seq) identifies
    every sample packet."""
    return os.urandom(8).hex()


class ClientLink:
    """A worker's or trainer's connection to the server.

    Calling sequence (from one thread, the link's owner; :class:`NetThread` does this)::

        link = ClientLink(ctx, net, "worker", "robot-1", new_session(), port, on_ready=resend)
        link.open()
        while not stop.is_set():
            poll link.sock (and other sockets) with a finite timeout
            for msg in link.receive():             # WELCOME/REJECT/HEARTBEAT/BYE are handled inside
                handle(msg)
            link.send(encode(...))                 # returns False unless the link is ready
            link.maintain()                        # heartbeats, liveness, reconnect with back-off
        link.close()
    """

    def __init__(self, ctx: zmq.Context, net: NetworkConfig, role: str, name: str, session: str,
                 port: int, on_ready: Callable[[], None] | None = None, keys: ClientKeys | None = None) -> None:
        self.ctx = ctx
        self.net = net
        self.role = role
        self.name = name
        self.session = session
        self.endpoint = f"tcp://{net.server_ip}:{port}"
        self.on_ready = on_ready
        self.keys = keys  # None: no encryption (security "none")
        self.sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self.handshake_failures = 0
        # why the newest handshake failed, until one succeeds
        self.handshake_problem: str | None = None
        self._last_handshake_log = 0.0
        self.ready = False
        self.welcome: dict[str, Any] = {}  # the body of the last WELCOME
        self.fatal: str | None = None  # set when the server refused us for good (e.g.
                                       # version mismatch)
        self.rejected_messages = 0
        self._liveness = Liveness(net.heartbeat_interval_s, net.heartbeat_liveness)
        self._backoff = Backoff(net.reconnect_initial_s, net.reconnect_max_s)
        self._reconnect_at: float | None = None
        self._connections = 0
        self._was_ready = False
        # connection attempts without a WELCOME in a row
        self._unanswered, self._last_unanswered_log = 0, 0.0
        # extra HEARTBEAT fields, e.g. counters
        self.heartbeat_body: Callable[[], dict[str, Any]] | None = None
        self.hello_extra: dict[str, Any] = {}  # extra HELLO fields, e.g. a worker's packet bounds
        self.server_stats: dict[str, Any] = {}  # the stats of the server's last HEARTBEAT
        self._reported_at = 0.0  # when a HEARTBEAT last carried them
        self._hello_at: float | None = None  # when a HELLO no WELCOME or REJECT has answered
                                             # yet went out
        self._connecting_since: float | None = None  # the first attempt of the connection
                                                     # being made
        self.connect_s: float | None = None  # how long the last connection took to be made,
                                             # retries included
        self._handshaking_since: float | None = None  # when the TCP connection whose handshake
                                                      # runs was made
        self._tcp_connected_at: float | None = None  # when this socket's TCP connection was made

    def open(self) -> None:
        """Create the socket, connect and say HELLO."""
        self._connections += 1
        sock = new_socket(self.ctx, zmq.DEALER, self.net.max_message_bytes, handshake_s=self.net.handshake_timeout_s)
        # first: _close_socket() closes it even if an option below fails (or term() hangs)
        self.sock = sock
        sock.setsockopt(zmq.ROUTING_ID, f"{self.role}:{self.session}:{self._connections}".encode())
        if self.keys is not None:
            try:
                sock.curve_publickey = self.keys.public
                sock.curve_secretkey = self.keys.secret
                sock.curve_serverkey = self.keys.server_public
            except zmq.ZMQError:
                self._close_socket()
                raise
        # retries spread over the fleet (Backoff.socket_interval), at a fixed rate: no doubling
        sock.setsockopt(zmq.RECONNECT_IVL, max(1, int(1000 * self._backoff.socket_interval())))
        # to explain a failed handshake, and to wait for one
        self._monitor = sock.get_monitor_socket(HANDSHAKE_EVENTS)
        try:
            sock.connect(self.endpoint)
        except zmq.ZMQError:
            self._close_socket()  # or the context could never terminate
            raise
        self.ready = False
        self._liveness = Liveness(self.net.heartbeat_interval_s, self.net.heartbeat_liveness)
        self._send_hello()

    def _send_hello(self) -> None:
        # (a retry after a lost HELLO keeps the first attempt's time)
        if self._connecting_since is None:
            self._connecting_since = time.monotonic()
        body = {"role": self.role, "netrl_version": __version__, "worker_id": self.name, "session": self.session,
                **self.hello_extra}
        sent = self._send_raw(encode(Message(MsgType.HELLO, self.name, body=body)))
        self._hello_at = time.monotonic() if sent else None

    def _send_raw(self, frames: Sequence[Any]) -> bool:
        if self.sock is None:
            return False
        try:
            self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False  # high-water mark reached: the caller keeps the data and retries later
        self._liveness.sent()
        return True

    def send(self, frames: Sequence[Any]) -> bool:
        """Send a message if the link is ready; False means the caller must keep it and retry."""
        return self.ready and self._send_raw(frames)

    def send_tracked(self, frames: Sequence[Any]) -> zmq.MessageTracker | None:
        """:meth:`send`, returning a tracker that is done once ZeroMQ has written the message to
        the connection (or dropped it with its socket); None: not sent. Frames received with
        ``copy=False`` are sent without a copy."""
        if not self.ready or self.sock is None:
            return None
        last = frames[-1]
        tracked = zmq.Frame(last.buffer if isinstance(last, zmq.Frame) else last, track=True)
        try:
            for frame in frames[:-1]:  # only a message's first frame can meet the high-water mark
                self.sock.send(frame, zmq.SNDMORE | zmq.NOBLOCK, copy=False)
            tracker = self.sock.send(tracked, zmq.NOBLOCK, copy=False, track=True)
        except zmq.Again:
            return None
        self._liveness.sent()
        return tracker

    def maintain(self) -> None:
        """Heartbeat when idle, notice a silent server, and reconnect once the
        back-off delay has passed."""
        self._check_handshakes()
        now = time.monotonic()
        if self.sock is None:
            if self._reconnect_at is not None and now >= self._reconnect_at and self.fatal is None:
                self._reconnect_at = None
                self.open()
            return
        # Messages waiting unread prove the server alive: an owner busy with a backlog must
        # not drop a healthy link. Nor does a handshake under way, which ZeroMQ itself ends
        # after handshake_timeout_s.
        handshaking = (self._handshaking_since is not None
                       and now - self._handshaking_since < self.net.handshake_timeout_s)
        if self._liveness.expired(now) and not handshaking and not self.input_waiting():
            self._lose(f"no message from the server for {self._liveness.window:.1f} s")
        elif self._liveness.heartbeat_due(now) or (self.heartbeat_body is not None and self.ready
                                                   and now - self._reported_at >= self._liveness.interval):
            # A busy link never falls idle, but its counters (a worker's drops) must reach --status
            # all the same: a heartbeat that carries them goes out every interval either way.
            body = {**(self.heartbeat_body() if self.heartbeat_body else {}), **self._liveness.stamp()}
            if self._send_raw(encode(Message(MsgType.HEARTBEAT, self.name, body=body))):
                self._reported_at = now

    def reconnect_now(self) -> None:
        """Skip what is left of the reconnect back-off (for a worker delivering its last
        packets before it stops)."""
        if self.sock is None and self._reconnect_at is not None:
            self._reconnect_at = min(self._reconnect_at, time.monotonic())

    def input_waiting(self) -> bool:
        """Whether messages from the server wait, unread, on the socket."""
        return self.sock is not None and bool(int(self.sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)

    def keepalive(self) -> None:
        """Send a heartbeat if one is due, for an owner in the middle of a long piece of work (the
        server must not take a busy client for a dead one)."""
        if self.sock is not None and self._liveness.heartbeat_due(time.monotonic()):
            self._send_raw(encode(Message(MsgType.HEARTBEAT, self.name, body=self._liveness.stamp())))

    def receive(self, limit: int | None = None) -> list[Message]:
        """Read up to ``limit`` waiting messages (all of them by default); returns
        those the role must handle."""
        out: list[Message] = []
        read = 0
        while self.sock is not None and (limit is None or read < limit):
            read += 1
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self._liveness.heard()
            try:
                msg = decode(frames, self.net.max_message_bytes)
            except VersionMismatch as exc:
                # the server itself speaks another version: nothing will ever work
                if not self.ready:
                    self._rejected(f"{exc}; install the same netrl version on "
                                   f"the server and this {self.role}")
                    continue
                self._malformed(exc)
                continue
            except ProtocolError as exc:
                self._malformed(exc)
                continue
            if msg.type is MsgType.WELCOME:
                self._welcome(msg)
            elif msg.type is MsgType.REJECT:
                self._rejected(printable(msg.body["reason"]), msg.body.get("retry_s"))
            elif msg.type is MsgType.BYE:
                self._lose(f"the server said goodbye "
                           f"({printable(msg.body.get('reason', 'no reason'))})")
            elif msg.type is MsgType.HEARTBEAT:
                self._liveness.on_heartbeat(msg.body)
                stats = msg.body.get("stats")
                # what the server says of itself, e.g. whether a trainer is connected
                if isinstance(stats, dict):
                    self.server_stats = stats
            else:
                out.append(msg)
        return out

    def _malformed(self, exc: Exception) -> None:
        self.rejected_messages += 1
        if worth_logging(self.rejected_messages):
            log.warning("dropped a malformed message from the server at %s (%d so far): %s",
                        self.endpoint,
                        self.rejected_messages, exc)

    def _welcome(self, msg: Message) -> None:
        self.ready = True
        self._hello_at = None
        self.server_stats = {}  # maybe another server process: what the last one said is stale
        self._unanswered = 0
        self.welcome = msg.body
        self._backoff.reset()
        interval = float(msg.body["heartbeat_interval_s"])
        # both sides must expect heartbeats at the same pace
        if interval != self._liveness.interval:
            log.warning("the server's network.heartbeat_interval_s is %g s and this "
                        "%s's is %g s: using the server's; set the same value on every machine",
                        interval, self.role, self._liveness.interval)
            self._liveness.set_interval(interval)
        self._check_handshakes()  # the TCP connection's time, if its event is still unread
        if self._tcp_connected_at is not None:
            self._liveness.handshake(time.monotonic() - self._tcp_connected_at)
        verb = "reconnected to" if self._was_ready else "connected to"
        self._was_ready = True
        if self._connecting_since is not None:
            self.connect_s, self._connecting_since = time.monotonic() - self._connecting_since, None
        log.info("%s %s server at %s (server session %s) in %.2f s", verb, self.role, self.endpoint,
                 printable(msg.body["server_session"], 64), self.connect_s or 0.0)
        server_max = msg.body.get("max_message_bytes", self.net.max_message_bytes)
        # ZeroMQ resets a connection over a message above its limit
        if server_max != self.net.max_message_bytes:
            log.error("the server's network.max_message_bytes is %d and this %s's is %d: set "
                      "the same value on every machine; a message larger than the receiver's "
                      "limit is never delivered (ZeroMQ drops the connection instead)",
                      server_max, self.role, self.net.max_message_bytes)
        if self.on_ready:
            self.on_ready()

    def _rejected(self, reason: str, retry_s: float | None = None) -> None:
        if reason.startswith("unknown peer"):
            # The server restarted and forgot us: introduce ourselves again right away, once. Every
            # message sent before the new server heard our HELLO comes back with this REJECT, and
            # each HELLO more would make it drop and re-admit this peer again. A HELLO unanswered
            # for a heartbeat interval was lost (the server restarted again): these REJECTs keep the
            # link alive, so only a new HELLO gets it in.
            if self._hello_at is not None and time.monotonic() - self._hello_at < self._liveness.interval:
                return
            log.info("server at %s does not know this %s any more; saying HELLO again",
                     self.endpoint, self.role)
            self.ready = False
            self._send_hello()
            return
        if retry_s is not None:  # refused for now (e.g. the server is full): not for good
            log.warning("server at %s refused this %s for now: %s; trying again in %.1f s",
                        self.endpoint, self.role,
                        reason, retry_s)
            self.ready = False
            self._close_socket()
            self._reconnect_at = time.monotonic() + retry_s
            return
        log.error("server at %s refused this %s: %s", self.endpoint, self.role, reason)
        self.fatal = reason
        self._close_socket()

    def _lose(self, why: str) -> None:
        delay = self._backoff.next()
        if self.ready:
            self._unanswered = 0
            log.warning("lost the server at %s (%s); reconnecting in %.1f s",
                        self.endpoint, why, delay)
        # this connection never got a WELCOME: say so once, then every 30 s, not on every retry
        else:
            self._unanswered += 1
            now = time.monotonic()
            if self._unanswered == 1 or now - self._last_unanswered_log >= 30:
                self._last_unanswered_log = now
                log.warning("no answer from the server at %s (%s; attempt %d); trying "
                            "again in %.1f s, then waiting up to %.0f s between attempts: %s",
                            self.endpoint, why, self._unanswered, delay,
                            self.net.reconnect_max_s, self._where_to_look())
        self._close_socket()
        self._reconnect_at = time.monotonic() + delay

    def _where_to_look(self) -> str:
        """What to check when no server answers: a name that does not resolve, or
        the server and its port."""
        host = self.net.server_ip
        try:
            socket.getaddrinfo(host, None)  # only when logging: at most every 30 s
        except OSError as exc:
            return (f"{host!r} is not an address or a name this "
                    f"machine can resolve ({exc}); check --server-ip")
        port_key = "network.trainer_port" if self.role == "trainer" else "network.worker_port"
        return (f"is a netrl server running at {host} and reachable from here? check "
                f"--server-ip, {port_key} ({flag_for(port_key)}) and the server's "
                f"server.bind_ip (it must listen on an interface this machine reaches)")

    def _check_handshakes(self) -> None:
        """Turn ZeroMQ's handshake events into log lines that say what to fix."""
        while self._monitor is not None and self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            # The connection and its handshake are the server talking: a handshake of
            # several round trips over a long link (7 with CURVE) must not make the link
            # give up on a server that answers.
            if event["event"] == zmq.EVENT_CONNECTED:
                self._handshaking_since = self._tcp_connected_at = time.monotonic()
                self._liveness.heard()
                continue
            self._handshaking_since = None
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.handshake_problem = None
                self._liveness.heard()
                continue
            self.handshake_failures += 1
            why = handshake_failure(event["event"], event["value"], self.role, self.keys)
            self.handshake_problem = why
            now = time.monotonic()
            if now - self._last_handshake_log < 30 and self.handshake_failures > 1:
                continue
            self._last_handshake_log = now
            log.error("cannot connect to %s: %s (%d failed handshakes)",
                      self.endpoint, why, self.handshake_failures)

    @property
    def liveness(self) -> Liveness:
        """This connection's liveness: its window and the round trip measured so far."""
        return self._liveness

    def state(self) -> str:
        """The connection in a few words, for status lines: a failing handshake says
        why in every one of them."""
        if self.ready:
            return "connected"
        return f"unreachable: {self.handshake_problem}" if self.handshake_problem else "unreachable"

    def _close_socket(self) -> None:
        self.ready = False
        self._hello_at = None
        self._handshaking_since = self._tcp_connected_at = None
        if self.sock is not None:
            self.sock.disable_monitor()
            self.sock.close(linger=0)
            self.sock = None
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None

    def close(self, reason: str = "shutting down") -> None:
        """Say BYE and close, giving queued messages (last acknowledgements, BYE) up to 1 s to
        leave. Idempotent."""
        if self.sock is not None and self.ready:
            self._send_raw(encode(Message(MsgType.BYE, self.name, body={"reason": reason})))
            self.sock.disable_monitor()
            self.sock.close(linger=1000)
            self.sock = None
        self._close_socket()
        self._reconnect_at = None
