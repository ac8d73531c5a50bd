"""The server's sockets: a ROUTER per role (CURVE-authenticated unless security is off), a
monitor of each that reports failed handshakes, and a loopback-only status port. The server's loop
polls them; this module opens, secures and closes them, and says why a handshake failed.
"""

from __future__ import annotations

import errno
import logging
import os

import zmq
from zmq.utils.monitor import recv_monitor_message

from netrl.config.sections import NetworkConfig
from netrl.errors import TransportError
from netrl.net.keys import ServerAuth, ServerKeys
from netrl.net.sockets import allow_connections, bind, new_socket

__all__ = ["ServerSockets"]

log = logging.getLogger(__name__)


# Unknown keys (HANDSHAKE_FAILED_AUTH) are counted and logged by the ZAP handler, with
# the key: not monitored here.
_FAILED_HANDSHAKES = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


def handshake_failed(event: int, value: int) -> str:
    """Why a connection to the server failed its handshake, as far as the server can tell."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "its \"security\" differs from the server's (one uses CURVE, the other none)"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "its CURVE handshake did not decrypt (a client with another server's server.key?)"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return f"it broke the ZeroMQ protocol (error {value:#x}; not a netrl client?)"
    if value == errno.EAGAIN:
        return ("it sent nothing before network.handshake_timeout_s (a "
                "port scan, or a client that gave up)")
    return (f"it closed the connection first ({os.strerror(value) if value else 'no detail'}; a "
            f"client that saw a \"security\" mismatch or a "
            f"wrong server key first says which in its own log)")


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


class ServerSockets:
    """``by_role["trainer"]`` and ``by_role["worker"]`` (ROUTER), and ``status`` (REP, or None).
    Construct with no I/O, then :meth:`open`; :meth:`close` is idempotent."""

    def __init__(self, net: NetworkConfig, bind_ip: str, trainer_port: int, worker_port: int,
                 keys: ServerKeys | None, status_port: int | None) -> None:
        self.net, self.bind_ip, self.keys = net, bind_ip, keys
        self.ports = {"trainer": trainer_port, "worker": worker_port}
        self.status_port = status_port
        self.ctx: zmq.Context | None = None
        self.auth: ServerAuth | None = None
        self.by_role: dict[str, zmq.Socket] = {}
        self.monitors: dict[str, zmq.Socket] = {}  # role -> the monitor of that port's socket
        self.status: zmq.Socket | None = None

    def open(self, connections: int = 0) -> None:
        """Bind both ports (TransportError names the config key to change) and, if it is
        free, the status port; first allow ``connections`` open connections (a process's soft
        limit of 1,024 open files would refuse some of 1,000 workers)."""
        if connections:
            allow_connections(connections)
        self.ctx = zmq.Context()
        if self.keys is not None:
            self.auth = ServerAuth(self.ctx, self.keys)
        else:
            log.warning("SECURITY IS OFF (\"security\": \"none\"): traffic on ports %d and %d is "
                        "unencrypted and unauthenticated; anyone who can reach them can send "
                        "samples or connect as the trainer and push weights to every worker%s",
                        self.ports["trainer"], self.ports["worker"],
                        "" if _loopback(self.bind_ip) else f". This server binds "
                                                           f"{self.bind_ip}, beyond loopback")
        for role, port in self.ports.items():
            sock = new_socket(self.ctx, zmq.ROUTER, self.net.max_message_bytes, hwm=1000,
                              handshake_s=self.net.handshake_timeout_s)
            # first: close() closes it even if an option below fails (or term() hangs)
            self.by_role[role] = sock
            if self.auth is not None:
                self.auth.secure(sock, role)
            self.monitors[role] = sock.get_monitor_socket(_FAILED_HANDSHAKES)
            bind(sock, self.bind_ip, port, f"network.{role}_port")
        # never beyond loopback; diagnostics must not stop the relay
        if self.status_port is not None:
            self.status = new_socket(self.ctx, zmq.REP, 1 << 16)
            try:
                bind(self.status, "127.0.0.1", self.status_port, "server.status_port", "server.status_port")
            except TransportError as exc:
                self.status.close(linger=0)
                self.status = None
                log.warning("relaying without a status port (`--status` "
                            "will not reach this server): %s", exc)

    def failed_handshakes(self, role: str) -> list[str]:
        """Why each connection on ``role``'s port that failed its handshake since
        the last call failed."""
        monitor, why = self.monitors[role], []
        while monitor.poll(0):
            event = recv_monitor_message(monitor)
            why.append(handshake_failed(event["event"], event["value"]))
        return why

    def close(self) -> None:
        for role, sock in self.by_role.items():
            sock.disable_monitor()
            monitor = self.monitors.pop(role, None)
            if monitor is not None:
                monitor.close(linger=0)
            sock.close(linger=0)
        self.by_role = {}
        if self.status is not None:
            self.status.close(linger=0)
            self.status = None
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None
