"""Worker keys revoked on a running server: ``python -m netrl --revoke NAME``, or the trainer's
``trainer.implausible`` set to ``refuse``.

Who may revoke: whoever may connect to the trainer port. With CURVE that is a key in the server's
``keys/server/trainers/`` allow-list (the trainer's own key, or an operator key placed there);
a worker key never passes that port's handshake, and a REVOKE on the worker port is refused as
outside a worker's role. The trainer sends REVOKE as a peer; ``--revoke`` sends it on a connection
of its own with no HELLO (it must not replace the trainer), and is answered on it.

A revocation names a worker key (with CURVE) or a worker name (the shared worker key's users, and
every worker without CURVE, are told apart by name only). At once, every connected worker it
names is sent a REJECT that gives the reason (a netrl worker stops on it) and forgotten; the
revoker gets a REVOKE back with the links dropped, and the trainer a REVOKE naming the worker, on
which it drops that worker's rows from its replay memory. A later HELLO from that key or name is
refused with the same reason. Revocations are kept in ``revoked.json`` in the server's spool
folder, so a restarted server refuses them too; deleting a line there (server stopped) lifts one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from netrl.errors import NetrlError, TransportError
from netrl.net.keys import ClientKeys
from netrl.net.sockets import new_socket
from netrl.protocol.messages import PEER_NAME, PEER_NAME_RULE, Message, MsgType, printable
from netrl.protocol.wire import decode, encode
from netrl.server.admission import Admission
from netrl.server.counters import ServerCounters
from netrl.server.peers import Peer, PeerTable

__all__ = ["REVOKED_FILE", "Revocations", "ask_revoke"]

log = logging.getLogger(__name__)

REVOKED_FILE = "revoked.json"
MAX_REVOKED = 100_000  # entries kept: far beyond any fleet, and the file stays a few MiB


class Revocations:
    """The revoked keys and names, the REVOKE handlers, and the check a HELLO goes through."""

    def __init__(self, folder: str | Path, peers: PeerTable, stats: ServerCounters,
                 admission: Admission, forget: Callable[[Peer], None],
                 tell_trainer: Callable[[Message], None]) -> None:
        self.path = Path(folder) / REVOKED_FILE
        self.peers, self.stats, self.admission = peers, stats, admission
        self.forget, self.tell_trainer = forget, tell_trainer
        self.revoked: dict[str, dict[str, Any]] = {}  # name -> {"by", "reason", "at"}

    def open(self) -> None:
        """Read the revocations a previous server run kept (the spool folder is locked by now)."""
        try:
            entries = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            # refusing to serve would stop every worker; serving without the list is said loudly
            log.error("could not read the revoked worker keys in %s (%s): keys revoked before "
                      "this start are NOT refused until revoked again", self.path, exc)
            return
        if isinstance(entries, dict):
            self.revoked = {k: v for k, v in entries.items()
                            if isinstance(k, str) and PEER_NAME.fullmatch(k)
                            and isinstance(v, dict)}
        if self.revoked:
            log.info("%d worker keys or names revoked (%s): %s", len(self.revoked), self.path,
                     ", ".join(sorted(self.revoked)[:20]))

    def refusal(self, peer: Peer) -> str | None:
        """Why ``peer`` (a worker saying HELLO) may not connect: its key or name was revoked."""
        for name in (peer.key, peer.name):
            entry = self.revoked.get(name) if name else None
            if entry is not None:
                self.stats.revoked_refused += 1
                return self.reason(name, entry)
        return None

    @staticmethod
    def reason(name: str, entry: dict[str, Any]) -> str:
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(entry.get("at", 0))))
        return (f"worker key {name!r} was revoked by the {entry.get('by', '?')} at {at}: "
                f"{entry.get('reason') or 'no reason given'}; ask the server's operator (its "
                f"{REVOKED_FILE} lists revocations)")

    def on_trainer(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """A REVOKE from the connected trainer (trainer.implausible: refuse)."""
        self._revoke(msg, "trainer", self.tell_trainer)

    def on_operator(self, rid: bytes, msg: Message) -> None:
        """A REVOKE on the trainer port from a connection that said no HELLO: ``--revoke``."""
        self._revoke(msg, "operator", lambda reply: self.admission.send("trainer", rid, reply))

    def trainer_joined(self, trainer: Peer) -> None:
        """A trainer (re)connected: it is told every revocation, and drops those workers' rows it
        holds (from its sample log, say)."""
        for name, entry in self.revoked.items():
            self.tell_trainer(Message(MsgType.REVOKE, "server", body={
                "worker": name, "links": 0, "reason": self.reason(name, entry)}))

    def _revoke(self, msg: Message, by: str, answer: Callable[[Message], None]) -> None:
        name = msg.body.get("worker", "")
        reason = printable(msg.body.get("reason", ""), 300)
        if not PEER_NAME.fullmatch(name):
            self.stats.rejected += 1
            problem = (f"revoke 'worker' {name[:64]!r} is not a worker key or name "
                       f"({PEER_NAME_RULE})")
            log.warning("refused a REVOKE from the %s: %s", by, problem)
            answer(Message(MsgType.REVOKE, "server", body={"worker": name[:64], "links": 0,
                                                          "reason": problem, "refused": True}))
            return
        entry = {"by": by, "reason": reason, "at": time.time()}
        self.revoked[name] = entry
        while len(self.revoked) > MAX_REVOKED:  # the oldest go first
            self.revoked.pop(next(iter(self.revoked)))
        self.stats.revocations += 1
        told = self.reason(name, entry)
        cut = [w for w in self.peers.workers() if name in (w.key, w.name)]
        for worker in cut:  # no retry_s: a netrl worker gives up, with the reason in its log
            self.admission.reply("worker", worker.rid, told)
            self.forget(worker)
        self.stats.revoked_links += len(cut)
        saved = self._save()
        log.warning("worker key %r revoked by the %s (%s): %d connection(s) dropped; its HELLOs "
                    "are refused from now on%s", name, by, reason or "no reason given", len(cut),
                    "" if saved else " (NOT across a restart: see the error above)")
        body = {"worker": name, "links": len(cut), "reason": told}
        answer(Message(MsgType.REVOKE, "server", body=body))
        if by == "operator":  # the trainer drops the rows it holds from that worker
            self.tell_trainer(Message(MsgType.REVOKE, "server", body=body))

    def _save(self) -> bool:
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(self.revoked, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("could not write the revoked worker keys to %s: %s", self.path, exc)
            return False
        return True


def ask_revoke(host: str, port: int, worker: str, reason: str, keys: ClientKeys | None,
               timeout_s: float = 5.0, stop: threading.Event | None = None) -> dict[str, Any]:
    """``--revoke``: ask the server at ``host``:``port`` (its trainer port, with the trainer's
    ``keys`` under CURVE) to revoke ``worker``; the body of its answer. Raises TransportError if
    it does not answer, and NetrlError if it refused the request (or ``stop`` was set)."""
    ctx = zmq.Context()
    try:
        sock = new_socket(ctx, zmq.DEALER, 1 << 16, handshake_s=timeout_s)
        if keys is not None:
            sock.curve_publickey, sock.curve_secretkey = keys.public, keys.secret
            sock.curve_serverkey = keys.server_public
        sock.connect(f"tcp://{host}:{port}")
        body = {"worker": worker, "reason": reason} if reason else {"worker": worker}
        sock.send_multipart(encode(Message(MsgType.REVOKE, "operator", body=body)))
        deadline = time.monotonic() + timeout_s
        while True:
            while not sock.poll(50):
                if stop is not None and stop.is_set():
                    raise NetrlError("interrupted while waiting for the server's answer")
                if time.monotonic() >= deadline:
                    raise TransportError(
                        f"no netrl server answered a REVOKE on {host}:{port} within "
                        f"{timeout_s:.0f} s: is network.server_ip / network.trainer_port (or "
                        f"--server-ip / --trainer-port) the server's trainer port, and, with "
                        f"CURVE, is this machine's keys_dir the trainer's (or an operator key "
                        f"listed in the server's keys/server/trainers/)?")
            reply = decode(sock.recv_multipart(), 1 << 16)
            if reply.type is MsgType.REVOKE and not reply.body.get("refused"):
                return reply.body
            if reply.type in (MsgType.REVOKE, MsgType.REJECT, MsgType.NOTICE):
                raise NetrlError(f"the server refused to revoke {worker!r}: "
                                 f"{printable(str(reply.body.get('reason', '')), 300)}")
    finally:
        ctx.destroy(0)
