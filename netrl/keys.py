"""CurveZMQ keys: generation, the files each machine needs, and the server's allow-lists.

``python -m netrl --keygen [--workers robot-1,robot-2]`` writes::

    keys/server/server.key, server.key_secret      keep on the server machine
    keys/server/trainers/trainer.key               allow-list: public keys that may connect as the trainer
    keys/server/workers/worker.key, robot-1.key    allow-list: public keys that may connect as workers
    keys/trainer/trainer.key(_secret), server.key  copy this folder to the GPU box
    keys/workers/<name>/<name>.key(_secret), server.key   copy this folder to worker <name>

A client needs only its own keypair and the server's public key. Secret key files are created with mode 0600.
A worker uses ``keys/workers/<worker_id>/`` when it exists, else the shared ``keys/workers/worker/``; a named
worker key may only be used by the worker of that name. Trainer keys may only connect to the trainer port and
worker keys to the worker port, so a captured worker key can never publish weights.
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

from netrl.errors import SecurityError
from netrl.status import worth_logging
from netrl.wire import PEER_NAME, PEER_NAME_RULE

__all__ = ["ClientKeys", "KeyRing", "ServerAuth", "ServerKeys", "client_keys", "keygen", "server_keys"]

log = logging.getLogger(__name__)

SHARED_WORKER = "worker"


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
    public, secret = zmq.auth.create_certificates(folder, name)
    os.chmod(secret, 0o600)  # pyzmq writes 0644
    return Path(public), Path(secret)


def keygen(keys_dir: str | Path, workers: list[str] | None = None, force: bool = False) -> list[Path]:
    """Create the server, trainer and shared worker keys (if missing) plus one key per named worker.

    Existing keys are kept (regenerating the server key would lock out every deployed client) unless ``force``.
    Returns the files written.
    """
    root = Path(keys_dir)
    names = [SHARED_WORKER, *(workers or [])]
    bad = [n for n in names if not PEER_NAME.fullmatch(n)]
    if bad:
        raise SecurityError(f"worker names {bad} are not valid key names ({PEER_NAME_RULE})")
    written: list[Path] = []
    server_dir = root / "server"
    if force and root.exists():
        shutil.rmtree(root)
    if not (server_dir / "server.key_secret").exists():
        written += _create_pair(server_dir, "server")
    server_public = server_dir / "server.key"
    clients = [("trainer", root / "trainer", "trainers")] + [(n, root / "workers" / n, "workers") for n in names]
    for name, folder, allow in clients:
        if (folder / f"{name}.key_secret").exists():
            continue
        public, secret = _create_pair(folder, name)
        shutil.copyfile(server_public, folder / "server.key")
        (server_dir / allow).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(public, server_dir / allow / f"{name}.key")
        written += [public, secret, folder / "server.key"]
    for folder in [root, *root.rglob("*")]:
        if folder.is_dir():
            os.chmod(folder, 0o700)
    return written


def _load(path: Path, what: str, hint: str) -> tuple[bytes, bytes | None]:
    if not path.exists():
        raise SecurityError(f"{what} {path} is missing: {hint}")
    try:
        return zmq.auth.load_certificate(path)
    except Exception as exc:
        raise SecurityError(f"{what} {path} is not a valid CURVE key file ({exc})") from None


def _check_private(path: Path) -> None:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise SecurityError(f"{path} is readable by other users (mode {oct(mode)}); run `chmod 600 {path}`")


def server_keys(keys_dir: str | Path) -> ServerKeys:
    root = Path(keys_dir)
    secret_file = root / "server" / "server.key_secret"
    hint = "run `python -m netrl --keygen` on the server, or set \"security\": \"none\" (unencrypted)"
    public, secret = _load(secret_file, "server secret key", hint)
    _check_private(secret_file)
    return ServerKeys(public, _secret(secret, secret_file), root / "server")


def _secret(secret: bytes | None, path: Path) -> bytes:
    if secret is None:  # e.g. the public .key copied over the .key_secret
        raise SecurityError(f"{path} holds no secret key (is it a copy of the public .key file?): copy the "
                            ".key_secret file that `python -m netrl --keygen` made")
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
    hint = (f"copy {folder.relative_to(root) if folder.is_relative_to(root) else folder}/ from the machine where "
            "`python -m netrl --keygen` ran (it holds this client's keypair and the server's public key)")
    if role == "worker" and key_name == SHARED_WORKER:  # e.g. keys/workers/robot-1/ copied, but no --worker-id
        named = sorted(p.parent.name for p in (root / "workers").glob("*/*.key_secret") if p.parent.name != name)
        if named:
            hint += (f", or give this worker the name of the keys it has: --worker-id {named[0]} (config.json: "
                     f"worker.worker_id; this worker is {name!r}), or make keys for {name!r} on the server's machine: "
                     f"python -m netrl --keygen --workers {name}")
    if not root.exists():
        hint += f"; {root} does not exist: is keys_dir (--keys-dir) right?"
    public, secret = _load(folder / f"{key_name}.key_secret", f"{role} secret key", hint)
    _check_private(folder / f"{key_name}.key_secret")
    server_public, _ = _load(folder / "server.key", "server public key", hint)
    return ClientKeys(public, _secret(secret, folder / f"{key_name}.key_secret"), server_public, folder)


class KeyRing:
    """The server's allow-lists: z85 public key -> key name, per role. Re-read when an unknown key shows up,
    so a worker key added to ``keys/server/workers/`` is accepted without restarting the server."""

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
                    wrong_port = (f": it is a {other}'s key ({ring.keys.get(other, {})[key]!r}), so that {other} "
                                  f"connects to the {role} port" if key in ring.keys.get(other, {}) else "")
                    log.warning("refused a connection on the %s port: public key %s is not in %s/%ss/%s (%d "
                                "refused)", role, key.decode(errors="replace"), ring.allow_dir, role, wrong_port,
                                count)
                return False

        return _Provider()


class ServerAuth:
    """CURVE on the server's ports: a ZAP authenticator thread and one allow-list (:class:`KeyRing`) per port."""

    def __init__(self, ctx: zmq.Context, keys: ServerKeys) -> None:
        self.keys = keys
        self.ring = KeyRing(keys.allow_dir)
        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger("netrl.zap"))
        self._auth.start()

    def secure(self, sock: zmq.Socket, role: str) -> None:
        """Make ``sock`` (before it binds) a CURVE server that admits only ``role``'s allow-listed keys."""
        sock.curve_server = True
        sock.curve_secretkey = self.keys.secret
        sock.curve_publickey = self.keys.public
        sock.zap_domain = f"netrl-{role}".encode()  # each port has its own allow-list
        self._auth.configure_curve_callback(f"netrl-{role}", self.ring.provider(role))

    def key_name(self, role: str, rid_frame: Any) -> str:
        """The name of the key a peer connected with (ZAP put its public key in the frame's User-Id)."""
        return self.ring.name(role, (rid_frame.get("User-Id") or "").encode()) or "?"

    def worker_name_problem(self, key: str, worker_id: str) -> str | None:
        """Why a worker that connected with key ``key`` may not call itself ``worker_id`` (None: it may). A named
        key works only for its worker, and the shared key never for a worker that has a key of its own."""
        if key not in (SHARED_WORKER, worker_id):
            return f"key {key!r} belongs to worker {key!r}; this worker calls itself {worker_id!r}"
        if key == SHARED_WORKER != worker_id and worker_id in self.ring.keys["worker"].values():
            return (f"worker {worker_id!r} has a key of its own (keys/workers/{worker_id}/): connect with it, not "
                    "with the shared worker key")
        return None

    def stop(self) -> None:
        self._auth.stop()
