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
folder, so a restarted server refuses them too.

``python -m netrl --unrevoke NAME`` (a REVOKE with ``undo``, the same authority) lifts one: the key
may connect again, the trainer is told (it takes that worker's packets again), and the entry stays
in ``revoked.json`` marked ``unrevoked_at``, so the lift holds across a restart, and a trainer that
connects later (one restored from a checkpoint that still counts the key revoked) is told too.
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

__all__ = ["REVOKED_FILE", "Revocations", "ask_operator", "ask_revoke"]

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
        # revocations lifted (--unrevoke): name -> the entry, with "unrevoked_at" and _by
        self.lifted: dict[str, dict[str, Any]] = {}

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
            kept = {k: v for k, v in entries.items()
                    if isinstance(k, str) and PEER_NAME.fullmatch(k) and isinstance(v, dict)}
            self.lifted = {k: v for k, v in kept.items() if "unrevoked_at" in v}
            self.revoked = {k: v for k, v in kept.items() if k not in self.lifted}
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
        holds (from its sample log, say); and every lifted one, which it may still count."""
        for name, entry in self.revoked.items():
            self.tell_trainer(Message(MsgType.REVOKE, "server", body={
                "worker": name, "links": 0, "reason": self.reason(name, entry)}))
        for name in self.lifted:
            self.tell_trainer(Message(MsgType.REVOKE, "server", body={
                "worker": name, "links": 0, "undo": True}))

    def describe(self, limit: int = 200) -> list[dict[str, Any]]:
        """The revocations in force, newest first (at most ``limit``), for ``--status``."""
        newest = sorted(self.revoked.items(), key=lambda kv: -float(kv[1].get("at", 0)))
        return [{"worker": name, "by": str(e.get("by", "?")), "at": float(e.get("at", 0)),
                 "reason": str(e.get("reason", ""))} for name, e in newest[:limit]]

    def _revoke(self, msg: Message, by: str, answer: Callable[[Message], None]) -> None:
        name = msg.body.get("worker", "")
        reason = printable(msg.body.get("reason", ""), 300)
        undo = msg.body.get("undo", False)
        if not PEER_NAME.fullmatch(name):
            self.stats.rejected += 1
            problem = (f"{'unrevoke' if undo else 'revoke'} 'worker' {name[:64]!r} is not a "
                       f"worker key or name ({PEER_NAME_RULE})")
            log.warning("refused a REVOKE from the %s: %s", by, problem)
            answer(Message(MsgType.REVOKE, "server", body={"worker": name[:64], "links": 0,
                                                          "reason": problem, "refused": True}))
            return
        if undo:
            self._unrevoke(name, by, reason, answer)
            return
        entry = {"by": by, "reason": reason, "at": time.time()}
        self.revoked[name] = entry
        self.lifted.pop(name, None)
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

    def _unrevoke(self, name: str, by: str, reason: str,
                  answer: Callable[[Message], None]) -> None:
        """``--unrevoke``: ``name`` may connect again; the trainer takes its packets again."""
        entry = self.revoked.pop(name, None)
        if entry is None:
            told = (f"worker key {name!r} is not revoked, nothing to undo (revoked now: "
                    f"{', '.join(sorted(self.revoked)[:10]) or 'none'})")
            log.info("an unrevoke from the %s for %r: %s", by, name, told)
            answer(Message(MsgType.REVOKE, "server", body={
                "worker": name, "links": 0, "undo": True, "was": False, "reason": told}))
            return
        self.lifted[name] = {**entry, "unrevoked_at": time.time(), "unrevoked_by": by}
        while len(self.lifted) > MAX_REVOKED:
            self.lifted.pop(next(iter(self.lifted)))
        self.stats.unrevocations += 1
        saved = self._save()
        told = (f"worker key {name!r} may connect again: its revocation by the "
                f"{entry.get('by', '?')} ({entry.get('reason') or 'no reason given'}) was lifted "
                f"by the {by}{f' ({reason})' if reason else ''}; the rows the trainer dropped "
                f"are not restored")
        log.warning("%s%s", told, "" if saved else " (NOT across a restart: see the error above)")
        body = {"worker": name, "links": 0, "undo": True, "was": True, "reason": told}
        answer(Message(MsgType.REVOKE, "server", body=body))
        if by == "operator":  # the trainer takes its packets again
            self.tell_trainer(Message(MsgType.REVOKE, "server", body=body))

    def _save(self) -> bool:
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({**self.lifted, **self.revoked}, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("could not write the revoked worker keys to %s: %s", self.path, exc)
            return False
        return True


def ask_revoke(host: str, port: int, worker: str, reason: str, keys: ClientKeys | None,
               timeout_s: float = 5.0, stop: threading.Event | None = None,
               undo: bool = False) -> dict[str, Any]:
    """``--revoke`` (``--unrevoke`` with ``undo``): ask the server at ``host``:``port`` (its
    trainer port, with the trainer's ``keys`` under CURVE) to revoke ``worker``; the body of its
    answer. Raises TransportError if it does not answer, and NetrlError if it refused the request
    (or ``stop`` was set)."""
    body: dict[str, Any] = {"worker": worker, "reason": reason} if reason else {"worker": worker}
    if undo:
        body["undo"] = True
    return ask_operator(host, port, Message(MsgType.REVOKE, "operator", body=body), keys,
                        timeout_s, stop)


def ask_operator(host: str, port: int, request: Message, keys: ClientKeys | None,
                 timeout_s: float = 5.0, stop: threading.Event | None = None) -> dict[str, Any]:
    """An operator's ``request`` (REVOKE or LIFT) sent to the server's trainer port on a connection
    of its own; the body of the answer of the same type. Raises TransportError if none comes
    within ``timeout_s``, NetrlError if it was refused (or ``stop`` was set)."""
    what, name = request.type.value.upper(), request.body.get("worker", "")
    ctx = zmq.Context()
    try:
        sock = new_socket(ctx, zmq.DEALER, 1 << 16, handshake_s=timeout_s)
        if keys is not None:
            sock.curve_publickey, sock.curve_secretkey = keys.public, keys.secret
            sock.curve_serverkey = keys.server_public
        sock.connect(f"tcp://{host}:{port}")
        sock.send_multipart(encode(request))
        deadline = time.monotonic() + timeout_s
        while True:
            while not sock.poll(50):
                if stop is not None and stop.is_set():
                    raise NetrlError("interrupted while waiting for the server's answer")
                if time.monotonic() >= deadline:
                    raise TransportError(
                        f"no netrl server answered a {what} on {host}:{port} within "
                        f"{timeout_s:.0f} s: is network.server_ip / network.trainer_port (or "
                        f"--server-ip / --trainer-port) the server's trainer port, and, with "
                        f"CURVE, is this machine's keys_dir the trainer's (or an operator key "
                        f"listed in the server's keys/server/trainers/)?")
            reply = decode(sock.recv_multipart(), 1 << 16)
            if reply.type is request.type and not reply.body.get("refused"):
                return reply.body
            if reply.type in (request.type, MsgType.REJECT, MsgType.NOTICE):
                verb = "unrevoke" if request.body.get("undo") else request.type.value
                raise NetrlError(f"the server refused to {verb} {name!r}: "
                                 f"{printable(str(reply.body.get('reason', '')), 300)}")
    finally:
        ctx.destroy(0)
