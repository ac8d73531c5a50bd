"""ZeroMQ sockets as every netrl role makes them: their options, binding, and handshake failures.

Every socket has ``linger=0``, a maximum message size and high-water marks
(:func:`new_socket`). A port that cannot be bound, and a ZeroMQ handshake that
fails (a CURVE key the server refuses, security set on one side only), raise or log a
message that names the setting to change (:func:`bind`, :func:`handshake_failure`).
The server's ports are opened by :class:`~netrl.server.sockets.ServerSockets`, a
client's by :class:`~netrl.net.transport.ClientLink`.
"""

from __future__ import annotations

import errno
import logging
import resource

import zmq

from netrl.config.sections import flag_for
from netrl.errors import TransportError
from netrl.net.keys import ClientKeys

log = logging.getLogger(__name__)

__all__ = ["FD_MARGIN", "HANDSHAKE_EVENTS", "allow_connections", "bind", "handshake_failure",
           "new_socket", "open_files_for"]

# descriptors beside the connections: ZeroMQ's own (its threads' mailboxes, the sockets), the log,
# the spool's files, the status port, the key folder's reads
FD_MARGIN = 256

# what a client's socket monitor reports: a connection made, and its handshake's outcome
HANDSHAKE_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)


def new_socket(ctx: zmq.Context, kind: int, max_bytes: int, hwm: int = 10_000,
               handshake_s: float | None = None) -> zmq.Socket:
    """A socket with the options every netrl socket needs (``handshake_s``: how long a new
    connection may take to finish its ZeroMQ handshake before it is closed; ZeroMQ's default is
    30 s)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if handshake_s is not None:
        sock.setsockopt(zmq.HANDSHAKE_IVL, max(1, int(handshake_s * 1000)))
    sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    if kind == zmq.ROUTER:
        # raise instead of silently dropping to unknown peers
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    return sock


def bind(sock: zmq.Socket, host: str, port: int, port_key: str,
         host_key: str = "server.bind_ip") -> str:
    """Bind or raise a :class:`TransportError` that says which setting to change: the port
    (``port_key``) when it is taken or not allowed, else the address (``host_key``)."""
    endpoint = f"tcp://{host}:{port}"

    def setting(key: str) -> str:  # the user may have set it with its flag: name both
        flag = flag_for(key)
        return f"`{key}` (or {flag})" if flag else f"`{key}`"

    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        if exc.errno == zmq.EADDRINUSE:
            hint = f"is another netrl server running? change {setting(port_key)}"
        elif exc.errno == errno.EACCES:
            hint = f"ports below 1024 need privileges; change {setting(port_key)}"
        else:
            hint = (f"is {host} an address of this machine? change {setting(host_key)} (0.0.0.0 "
                    "binds every interface)")
        raise TransportError(f"could not bind {endpoint} ({exc.strerror}): {hint}") from None
    return endpoint


def handshake_failure(event: int, value: int, role: str, keys: ClientKeys | None) -> str:
    """Why a client's ZeroMQ handshake failed, in words that say what to fix.

    Which event a security mismatch raises is a race: the side that notices first sends an error
    and closes, and the other side then often sees HANDSHAKE_FAILED_NO_DETAIL. Only a CURVE client
    can have the wrong server key.
    """
    sides = ("the server uses CURVE and this process has \"security\": \"none\"" if keys is None
             else "this process uses CURVE and the server has \"security\": \"none\"")
    mismatch = (f"the server and this {role} disagree on security: {sides}; set the same "
                "\"security\" in both configs")
    if keys is None or (event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                        and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH):
        return mismatch
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        port_key = f"network.{role}_port"
        return (f"the server refused this {role}'s key: either this is not the server's {role} "
                f"port (check {port_key}, {flag_for(port_key)}), or add {keys.folder}/*.key to the "
                f"server's keys/server/{role}s/ allow-list, or use keys made by the server's "
                "--keygen")
    return (f"the CURVE handshake failed: either {keys.folder}/server.key is not this server's "
            "public key (copy it from the server's keys/server/server.key), or the server runs "
            "with \"security\": \"none\" (set the same security on both)")


def allow_connections(connections: int) -> None:
    """:func:`open_files_for` ``connections``, logged: a warning when they still do not fit."""
    files, short = open_files_for(connections)
    if short is not None:
        log.warning("%s", short)
    else:
        log.debug("open files allowed: %s", files)


def open_files_for(connections: int) -> tuple[int, str | None]:
    """Raise this process's soft limit on open files (RLIMIT_NOFILE) so that ``connections`` TCP
    connections fit beside :data:`FD_MARGIN`, up to the hard limit. Returns the soft limit now
    and, when it is still too low, what to do (None when it fits).

    Every connection holds a descriptor; past the limit ZeroMQ cannot accept another and the
    client only sees its handshake time out. Many systems start processes at a soft limit of
    1,024, which a server with ``server.max_workers`` 1,000 passes: the soft limit may be raised
    up to the hard one without privileges."""
    needed = connections + FD_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # a platform that refuses: the limit stays, and is named
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft, None
    return soft, (f"this process may open {soft} files (RLIMIT_NOFILE, hard limit {hard}), too "
                  f"few for {connections} connections and {FD_MARGIN} more descriptors: "
                  f"connections beyond about {max(0, soft - FD_MARGIN)} would fail their "
                  f"handshake. Raise the limit (`ulimit -n {needed}` before starting, or "
                  f"LimitNOFILE= in a systemd unit), or lower server.max_workers")
