"""CurveZMQ keys: generation, the files each machine needs, and the server's allow-lists.

``python -m netrl --keygen [--workers robot-1,robot-2]`` writes::

    keys/server/server.key, server.key_secret      keep on the server machine
    keys/server/trainers/trainer.key               allow-list: public keys that may connect as the
                                                   trainer
    keys/server/workers/worker.key, robot-1.key    allow-list: public keys that may connect as
                                                   workers
    keys/trainer/trainer.key(_secret), server.key  copy this folder to the GPU box
    keys/workers/<name>/<name>.key(_secret), server.key   copy this folder to worker <name>

A client needs only its own keypair and the server's public key. Secret key files are created
with mode 0600. A worker uses ``keys/workers/<worker_id>/`` when it exists, else the shared
``keys/workers/worker/``; a named worker key may only be used by the worker of that name. Trainer
keys may only connect to the trainer port and worker keys to the worker port, so a captured worker
key can never publish weights.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from netrl.errors import SecurityError
from netrl.protocol.messages import PEER_NAME, PEER_NAME_RULE
from netrl.util import worth_logging

__all__ = ["RESERVED_WORKER_NAMES", "ClientKeys", "KeyRing", "ServerAuth", "ServerKeys", "client_keys", "keygen",
           "server_keys", "worker_name_problem"]

log = logging.getLogger(__name__)

SHARED_WORKER = "worker"
# Names a worker's own key cannot take, and why (a worker *named* "worker" is
# fine: it uses the shared key)
RESERVED_WORKER_NAMES = {SHARED_WORKER: "it names the shared worker key, "
                                        "which --keygen always makes",
                         "server": "a worker's key folder holds the "
                                   "server's public key as server.key"}


@dataclass(frozen=True)
class ServerKeys:
    public: bytes
    secret: bytes
    allow_dir: Path  # keys/server: holds trainers/ and workers/


@dataclass(frozen=True)
class ClientKeys:
    public: bytes
    secret: bytes
    server_public: bytes
    folder: Path


def _create_pair(folder: Path, name: str) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    public, secret = zmq.auth.create_certificates(folder, name)
    # pyzmq writes 0644 (unreachable meanwhile: every folder under keys_dir is 0700)
    os.chmod(secret, 0o600)
    return Path(public), Path(secret)


def _make_private(root: Path) -> None:
    """Make ``root`` and every folder under it 0700."""
    for folder in [root, *root.rglob("*")]:
        if folder.is_dir():
            os.chmod(folder, 0o700)


def _write_public(path: Path, public: bytes) -> None:
    """A public key file as pyzmq writes one (for a public file lost beside its secret one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#   ZeroMQ CURVE Public Certificate, written by netrl '
                    f'--keygen\n\nmetadata\ncurve\n    public-key = "{public.decode()}"\n')


def _holds(path: Path, public: bytes) -> bool:
    """Whether the public key file ``path`` holds ``public`` (False if it is missing,
    damaged or another key's)."""
    try:
        return path.exists() and _load(path, "public key", "")[0] == public
    except SecurityError:
        return False


def _public_of(secret_file: Path) -> bytes:
    public, _ = _load(secret_file, "secret key",
                      "delete the folder it is in and run `python -m netrl --keygen` again")
    return public


def worker_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as the name of a worker's own key (keygen's
    ``workers``), or None."""
    if not PEER_NAME.fullmatch(name):
        return f"is not a valid worker name: it must be {PEER_NAME_RULE}"
    why = RESERVED_WORKER_NAMES.get(name)
    return f"is reserved: {why}; give this worker another name" if why else None


def keygen(keys_dir: str | Path, workers: list[str] | None = None, force: bool = False) -> list[Path]:
    """Create the server, trainer and shared worker keys (if missing) plus one key per named
    worker, and repair what a client folder or the server's allow-lists lack: a missing or outdated
    copy of the server's public key (written again: copy that client's folder to its machine
    again), a missing allow-list entry.

    Existing keypairs are kept (regenerating the server key would lock out every deployed client)
    unless ``force``. Every folder under ``keys_dir`` is made private (0700) before a secret is
    written. Returns the files written.
    """
    root = Path(keys_dir)
    bad = [f"{name!r} {problem}" for name in workers or [] if (problem := worker_name_problem(name))]
    if bad:
        raise SecurityError(f"worker names that are not valid key names: {'; '.join(bad)}")
    names = [SHARED_WORKER, *(workers or [])]
    written: list[Path] = []
    server_dir = root / "server"
    if force and root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    _make_private(root)  # first: a secret file is 0644 for a moment as pyzmq writes it
    server_public_file = server_dir / "server.key"
    if not (server_dir / "server.key_secret").exists():
        if any(root.glob("*/*.key_secret")) or any(root.glob("workers/*/*.key_secret")):
            log.warning("%s has no server secret key: making a new server keypair; the "
                        "clients' copies of the server's public key are updated, so copy "
                        "trainer/ and workers/<name>/ to their machines again", server_dir)
        written += _create_pair(server_dir, "server")
    server_public = _public_of(server_dir / "server.key_secret")
    if not _holds(server_public_file, server_public):
        _write_public(server_public_file, server_public)
        written.append(server_public_file)
    existing = sorted(p.parent.name for p in root.glob("workers/*/*.key_secret") if p.stem == p.parent.name)
    names = list(dict.fromkeys([*names, *existing]))  # workers made before are repaired too
    clients = [("trainer", root / "trainer", "trainers")] + [(n, root / "workers" / n, "workers") for n in names]
    for name, folder, allow in clients:
        if not (folder / f"{name}.key_secret").exists():
            written += _create_pair(folder, name)
        public = _public_of(folder / f"{name}.key_secret")
        copies = [(folder / f"{name}.key", public), (folder / "server.key", server_public),
                  (server_dir / allow / f"{name}.key", public)]
        for path, key in copies:
            if not _holds(path, key):
                _write_public(path, key)
                written.append(path)
    _make_private(root)  # and the folders made since
    return written


def _load(path: Path, what: str, hint: str) -> tuple[bytes, bytes | None]:
    if not path.exists():
        raise SecurityError(f"{what} {path} is missing: {hint}")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except Exception as exc:
        raise SecurityError(f"{what} {path} is not a valid CURVE key file ({exc})") from None
    for kind, key in (("public", public), ("secret", secret)):
        problem = _z85_problem(key) if key is not None else None
        # ZeroMQ would refuse it with a bare "Invalid argument" once the socket is set up
        if problem:
            raise SecurityError(f"{what} {path} holds a damaged {kind} key ({problem}): copy the "
                                f"file again from the machine where `python -m netrl --keygen` ran")
    return public, secret


def _z85_problem(key: bytes) -> str | None:
    """Why ``key`` is not a CURVE key in Z85 (40 characters for 32 bytes), or None."""
    if len(key) != 40:
        return f"{len(key)} characters where a key has 40"
    try:
        z85.decode(key)
    except (ValueError, KeyError, TypeError):
        return "characters outside Z85"
    return None


def _check_private(path: Path) -> None:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise SecurityError(f"{path} is readable by other users (mode "
                            f"{oct(mode)}); run `chmod 600 {path}`")


def server_keys(keys_dir: str | Path) -> ServerKeys:
    root = Path(keys_dir)
    secret_file = root / "server" / "server.key_secret"
    hint = ("run `python -m netrl --keygen` on the server, or "
            "set \"security\": \"none\" (unencrypted)")
    public, secret = _load(secret_file, "server secret key", hint)
    _check_private(secret_file)
    return ServerKeys(public, _secret(secret, secret_file), root / "server")


def _secret(secret: bytes | None, path: Path) -> bytes:
    if secret is None:  # e.g. the public .key copied over the .key_secret
        raise SecurityError(f"{path} holds no secret key (is it a copy of the public .key file?): "
                            f"copy the .key_secret file that `python -m netrl --keygen` made")
    return secret


def client_keys(keys_dir: str | Path, role: Literal["trainer", "worker"], name: str) -> ClientKeys:
    """The keypair and server public key a trainer or a worker connects with."""
    root = Path(keys_dir)
    if role == "trainer":
        folder, key_name = root / "trainer", "trainer"
    elif (root / "workers" / name / f"{name}.key_secret").exists():
        folder, key_name = root / "workers" / name, name
    else:
        folder, key_name = root / "workers" / SHARED_WORKER, SHARED_WORKER
    hint = (f"copy {folder.relative_to(root) if folder.is_relative_to(root) else folder}/ "
            f"from the machine where `python -m netrl --keygen` ran (it "
            f"holds this client's keypair and the server's public key)")
    # e.g. keys/workers/robot-1/ copied, but no --worker-id
    if role == "worker" and key_name == SHARED_WORKER:
        named = sorted(p.parent.name for p in (root / "workers").glob("*/*.key_secret") if p.parent.name != name)
        if named:
            hint += (f", or give this worker the name of the keys it has: --worker-id {named[0]} "
                     f"(config.json: worker.worker_id; this worker is {name!r}), or make keys for "
                     f"{name!r} on the server's machine: python -m netrl --keygen --workers {name}")
    if not root.exists():
        hint += f"; {root} does not exist: is keys_dir (--keys-dir) right?"
    public, secret = _load(folder / f"{key_name}.key_secret", f"{role} secret key", hint)
    _check_private(folder / f"{key_name}.key_secret")
    server_public, _ = _load(folder / "server.key", "server public key", hint)
    return ClientKeys(public, _secret(secret, folder / f"{key_name}.key_secret"), server_public, folder)


class KeyRing:
    """The server's allow-lists: z85 public key -> key name, per role. Re-read when an
    unknown key shows up, so a worker key added to ``keys/server/workers/`` is accepted
    without restarting the server."""

    def __init__(self, allow_dir: Path) -> None:
        self.allow_dir = allow_dir
        self.keys: dict[str, dict[bytes, str]] = {}
        self.refused: dict[str, int] = {"trainer": 0, "worker": 0}
        self._loaded_at = 0.0
        self.reload()

    def reload(self) -> None:
        keys: dict[str, dict[bytes, str]] = {"trainer": {}, "worker": {}}
        for role, sub in (("trainer", "trainers"), ("worker", "workers")):
            folder = self.allow_dir / sub
            for path in sorted(folder.glob("*.key")) if folder.exists() else []:
                try:
                    public, _ = zmq.auth.load_certificate(path)
                    problem = _z85_problem(public)
                    if problem:
                        raise ValueError(problem)
                except Exception as exc:
                    log.warning("ignoring unreadable public key %s: %s", path, exc)
                    continue
                keys[role][public] = path.stem
        self.keys = keys
        self._loaded_at = time.monotonic()

    def name(self, role: str, z85_key: bytes) -> str | None:
        name = self.keys.get(role, {}).get(z85_key)
        if name is None and time.monotonic() - self._loaded_at > 1.0:
            self.reload()
            name = self.keys.get(role, {}).get(z85_key)
        return name

    def provider(self, role: str) -> Any:
        """A pyzmq credentials provider for the ZAP domain of ``role``'s port."""
        ring = self

        class _Provider:
            def callback(self, domain: str, key: bytes) -> bool:
                if ring.name(role, key) is not None:
                    return True
                ring.refused[role] += 1
                count = ring.refused[role]
                if worth_logging(count, every=100):
                    other = "worker" if role == "trainer" else "trainer"
                    wrong_port = (f": it is a {other}'s key "
                                  f"({ring.keys.get(other, {})[key]!r}), so "
                                  f"that {other} connects to the "
                                  f"{role} port" if key in ring.keys.get(other, {}) else "")
                    log.warning("refused a connection on the %s port: public "
                                "key %s is not in %s/%ss/%s (%d refused)",
                                role, key.decode(errors="replace"), ring.allow_dir, role, wrong_port,
                                count)
                return False

        return _Provider()


class ServerAuth:
    """CURVE on the server's ports: a ZAP authenticator thread and one allow-list
    (:class:`KeyRing`) per port."""

    def __init__(self, ctx: zmq.Context, keys: ServerKeys) -> None:
        self.keys = keys
        self.ring = KeyRing(keys.allow_dir)
        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger("netrl.zap"))
        self._auth.start()

    def secure(self, sock: zmq.Socket, role: str) -> None:
        """Make ``sock`` (before it binds) a CURVE server that admits only ``role``'s
        allow-listed keys."""
        sock.curve_server = True
        sock.curve_secretkey = self.keys.secret
        sock.curve_publickey = self.keys.public
        sock.zap_domain = f"netrl-{role}".encode()  # each port has its own allow-list
        self._auth.configure_curve_callback(f"netrl-{role}", self.ring.provider(role))

    def key_name(self, role: str, rid_frame: Any) -> str:
        """The name of the key a peer connected with (ZAP put its public key in
        the frame's User-Id)."""
        return self.ring.name(role, (rid_frame.get("User-Id") or "").encode()) or "?"

    def worker_name_problem(self, key: str, worker_id: str) -> str | None:
        """Why a worker that connected with key ``key`` may not call itself ``worker_id`` (None: it
        may). A named key works only for its worker, and the shared key never for a worker
        that has a key of its own."""
        if key not in (SHARED_WORKER, worker_id):
            return f"key {key!r} belongs to worker {key!r}; this worker calls itself {worker_id!r}"
        if key == SHARED_WORKER != worker_id and worker_id in self.ring.keys["worker"].values():
            return (f"worker {worker_id!r} has a key of its own (keys/workers/{worker_id}/): "
                    f"connect with it, not with the shared worker key")
        return None

    def stop(self) -> None:
        self._auth.stop()
