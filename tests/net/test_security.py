"""Secure by default: CurveZMQ keys, allow-lists per role, refusals that say why, and checked weights."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zmq
import zmq.auth

from netrl.__main__ import main
from netrl.agents.sac import MLPActor
from netrl.config.sections import NetworkConfig
from netrl.errors import SecurityError
from netrl.launch import free_port
from netrl.monitor.status import format_status
from netrl.net.keys import ClientKeys, KeyRing, ServerKeys, client_keys, keygen, server_keys
from netrl.net.sockets import handshake_failure
from netrl.net.transport import ClientLink, new_session
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.weights import all_finite, check_weights, state_arrays, tensor_views, weight_specs
from netrl.protocol.wire import samples_message
from netrl.server.server import Server
from netrl.server.sockets import ServerSockets
from tests.fakes import ACT, NET, OBS, MakeServer, Peer, sample_buffer, wait_until, weights_message


def curve_peer(ctx: zmq.Context, port: int, role: str, name: str, public: bytes | None, secret: bytes | None,
               server_public: bytes | None) -> Peer:
    peer = Peer.__new__(Peer)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if public is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server_public
    sock.connect(f"tcp://127.0.0.1:{port}")
    peer.sock, peer.role, peer.name, peer.session = sock, role, name, os.urandom(4).hex()
    return peer


@pytest.fixture
def secured(tmp_path: Path, make_server: MakeServer) -> tuple[Server, zmq.Context, Path]:
    keys = tmp_path / "keys"
    keygen(keys, ["robot-1"])
    srv, ctx = make_server(min_samples_per_server_packet=1, network=NET, max_packet_delay_s=0.01,
                           keys=server_keys(keys))
    return srv, ctx, keys


def keyed(ctx: zmq.Context, srv: Server, keys: Path, role: str, name: str) -> Peer:
    k = client_keys(keys, role, name)  # type: ignore[arg-type]
    port = srv.trainer_port if role == "trainer" else srv.worker_port
    return curve_peer(ctx, port, role, name, k.public, k.secret, k.server_public)


def test_keygen_writes_what_each_machine_needs_with_private_secrets(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    written = keygen(keys, ["robot-1"])
    assert {p.relative_to(keys).as_posix() for p in written} >= {
        "server/server.key", "server/server.key_secret", "trainer/trainer.key_secret", "trainer/server.key",
        "workers/worker/worker.key_secret", "workers/robot-1/robot-1.key_secret", "workers/robot-1/server.key"}
    assert sorted(p.name for p in (keys / "server" / "workers").iterdir()) == ["robot-1.key", "worker.key"]
    assert [p.name for p in (keys / "server" / "trainers").iterdir()] == ["trainer.key"]
    for secret in keys.rglob("*.key_secret"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    server_public = (keys / "server" / "server.key").read_bytes()
    assert keygen(keys) == []  # nothing is regenerated: deployed clients keep working
    assert (keys / "server" / "server.key").read_bytes() == server_public
    assert [p.name for p in keygen(keys, ["robot-2"])][:2] == ["robot-2.key", "robot-2.key_secret"]
    assert client_keys(keys, "worker", "robot-2").folder.name == "robot-2"
    assert client_keys(keys, "worker", "someone-else").folder.name == "worker"  # the shared worker key
    with pytest.raises(SecurityError, match="not valid key names"):
        keygen(keys, ["../evil"])


def cut_key(path: Path, field: str) -> None:
    """Drop the last character of a key in a key file, as a bad copy-paste would."""
    text = path.read_text()
    start = text.index(f'{field} = "') + len(f'{field} = "')
    path.write_text(text[:start + 39] + text[start + 40:])


def test_a_damaged_key_is_refused_naming_its_file_and_a_failed_socket_option_leaves_no_socket(
        tmp_path: Path) -> None:
    # Unchecked, a key one character short would pass the loader; ZeroMQ then refuses it with a bare "Invalid
    # argument" while the socket is set up, and a socket never recorded keeps the context from terminating: the
    # server would hang with no output, the worker and the trainer after a traceback.
    keys = tmp_path / "keys"
    keygen(keys)
    cut_key(keys / "server" / "server.key_secret", "secret-key")
    with pytest.raises(SecurityError, match=r"server secret key .*server.key_secret holds a damaged secret key \(39 "
                                            r"characters where a key has 40\): copy the file again"):
        server_keys(keys)
    cut_key(keys / "workers" / "worker" / "server.key", "public-key")
    with pytest.raises(SecurityError, match=r"server public key .*workers/worker/server.key holds a damaged public "
                                            r"key \(39 characters"):
        client_keys(keys, "worker", "w")
    good = client_keys(keys, "trainer", "trainer")
    ctx = zmq.Context()
    link = ClientLink(ctx, NetworkConfig(), "trainer", "trainer", new_session(), free_port(),
                      keys=dataclasses.replace(good, secret=good.secret[:39]))  # past the loader's check
    with pytest.raises(zmq.ZMQError):
        link.open()
    assert link.sock is None
    ctx.term()  # returns: the socket was closed (one left open would hang this for ever)
    server = ServerKeys(good.server_public, b"x" * 39, keys / "server")
    sockets = ServerSockets(NetworkConfig(), "127.0.0.1", free_port(), free_port(), server, None)
    with pytest.raises(zmq.ZMQError) as failed:  # kept, as a server closing while the error propagates keeps it
        sockets.open()
    done = threading.Thread(target=sockets.close, daemon=True)
    done.start()
    done.join(10)
    assert not done.is_alive(), failed  # close() terminated the context (an unrecorded socket would keep it waiting)


def test_keygen_repairs_client_folders_and_allow_lists(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Keygen must not take a client as done once its secret exists: a lost server folder would get a new keypair
    # but no allow-lists, every client would keep the old server key, and a lost server.key would stop keygen with a
    # traceback.
    keys = tmp_path / "keys"
    keygen(keys, ["robot-1"])
    old_server = server_keys(keys).public
    shutil.rmtree(keys / "server")
    with caplog.at_level(logging.WARNING, logger="netrl.net.keys"):
        written = {p.relative_to(keys).as_posix() for p in keygen(keys)}
    assert "copy trainer/ and workers/<name>/ to their machines again" in caplog.text
    assert {"server/trainers/trainer.key", "server/workers/worker.key", "server/workers/robot-1.key",
            "trainer/server.key", "workers/worker/server.key", "workers/robot-1/server.key"} <= written
    server = server_keys(keys)
    assert server.public != old_server
    ring = KeyRing(server.allow_dir)
    for role, name in [("trainer", "trainer"), ("worker", "worker"), ("worker", "robot-1")]:
        client = client_keys(keys, role, name)  # type: ignore[arg-type]
        assert client.server_public == server.public and ring.name(role, client.public) == name
    (keys / "server" / "server.key").unlink()  # the public file alone: rebuilt from the secret one
    (keys / "server" / "workers" / "robot-1.key").unlink()
    written = {p.relative_to(keys).as_posix() for p in keygen(keys, ["robot-9"])}
    assert {"server/server.key", "server/workers/robot-1.key", "server/workers/robot-9.key",
            "workers/robot-9/server.key"} <= written
    assert client_keys(keys, "worker", "robot-9").server_public == server_keys(keys).public == server.public
    assert keygen(keys, ["robot-9"]) == []
    cut_key(keys / "trainer" / "server.key", "public-key")  # a damaged copy is written again, not a traceback
    assert [p.relative_to(keys).as_posix() for p in keygen(keys)] == ["trainer/server.key"]
    assert client_keys(keys, "trainer", "trainer").server_public == server.public


def test_keygen_never_leaves_a_secret_key_readable_by_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pyzmq writes a secret file 0644, which netrl makes 0600 after: in a folder others can enter, it is readable
    # meanwhile.
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o755)
    (keys / "workers").mkdir(mode=0o755)
    real = zmq.auth.create_certificates
    modes: list[int] = []

    def create(folder: Any, name: str) -> Any:
        modes.append(stat.S_IMODE(keys.stat().st_mode))
        return real(folder, name)

    monkeypatch.setattr(zmq.auth, "create_certificates", create)
    keygen(keys, ["robot-1"])
    assert len(modes) == 4 and all(mode == 0o700 for mode in modes)  # nobody else can reach the files meanwhile
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in [keys, *keys.rglob("*")] if p.is_dir())


def test_missing_or_exposed_keys_are_refused_with_instructions(tmp_path: Path) -> None:
    with pytest.raises(SecurityError, match="--keygen"):
        server_keys(tmp_path / "nokeys")
    keygen(tmp_path / "keys")
    with pytest.raises(SecurityError, match=r"copy trainer/ .*; .*elsewhere does not exist: is keys_dir "
                                            r"\(--keys-dir\)"):
        client_keys(tmp_path / "elsewhere", "trainer", "trainer")
    robot = tmp_path / "robot" / "keys" / "workers" / "robot-1"  # only its own folder was copied to the robot
    shutil.copytree(tmp_path / "keys" / "workers" / "worker", robot)
    (robot / "worker.key_secret").rename(robot / "robot-1.key_secret")
    with pytest.raises(SecurityError, match=r"copy workers/worker/ .*, or give this worker the name of the keys it "
                                            r"has: --worker-id robot-1 \(config.json: worker.worker_id; this worker "
                                            r"is 'vm-2'\), or make keys for 'vm-2' on the server's machine: "
                                            r"python -m netrl --keygen --workers vm-2"):
        client_keys(tmp_path / "robot" / "keys", "worker", "vm-2")  # the second worker on a machine, say
    secret = tmp_path / "keys" / "trainer" / "trainer.key_secret"
    os.chmod(secret, 0o644)
    with pytest.raises(SecurityError, match="chmod 600"):
        client_keys(tmp_path / "keys", "trainer", "trainer")
    shutil.copy(tmp_path / "keys" / "trainer" / "trainer.key", secret)  # the public file copied over the secret one
    os.chmod(secret, 0o600)
    with pytest.raises(SecurityError, match=r"trainer.key_secret holds no secret key \(is it a copy of the public"):
        client_keys(tmp_path / "keys", "trainer", "trainer")
    server_secret = tmp_path / "keys" / "server" / "server.key_secret"
    shutil.copy(tmp_path / "keys" / "server" / "server.key", server_secret)
    os.chmod(server_secret, 0o600)
    with pytest.raises(SecurityError, match=r"server\.key_secret holds no secret key"):
        server_keys(tmp_path / "keys")


def test_cli_keygen_and_a_server_without_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(f'{{"keys_dir": "{tmp_path / "k"}", "network": {{"trainer_port": {free_port()}, '
                      f'"worker_port": {free_port()}}}}}')
    assert main(["--server", "--config", str(config)]) == 1  # CURVE by default, and there are no keys
    assert main(["--keygen", "--config", str(config), "--workers", "robot-1"]) == 0
    assert (tmp_path / "k" / "workers" / "robot-1" / "robot-1.key_secret").exists()


def test_clients_without_the_right_keys_can_neither_send_nor_receive(
        secured: tuple[Server, zmq.Context, Path], tmp_path: Path) -> None:
    srv, ctx, keys = secured
    trainer = keyed(ctx, srv, keys, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    trainer.send(weights_message(3))
    trainer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 100}))
    server_public = zmq.auth.load_certificate(keys / "server" / "server.key")[0]
    stranger_public, stranger_secret = zmq.auth.load_certificate(
        zmq.auth.create_certificates(tmp_path, "stranger")[1])
    worker_keys = client_keys(keys, "worker", "worker")
    intruders = {
        "no keys": curve_peer(ctx, srv.worker_port, "worker", "a", None, None, None),
        "unknown key": curve_peer(ctx, srv.worker_port, "worker", "b", stranger_public, stranger_secret, server_public),
        "wrong server key": curve_peer(ctx, srv.worker_port, "worker", "c", worker_keys.public, worker_keys.secret,
                                       stranger_public),
    }
    for peer in intruders.values():
        # A DEALER whose handshake failed may have no pipe until it reconnects, and then a send blocks: these sends
        # wait at most a second (what cannot even be queued cannot get through either).
        peer.sock.setsockopt(zmq.SNDTIMEO, 1000)
        with contextlib.suppress(zmq.Again):
            peer.send(Message(MsgType.HELLO, "intruder", body={"role": "worker", "netrl_version": "0.1.0",
                                                               "worker_id": "intruder", "session": peer.session}))
            peer.sock.send_multipart(encode_samples("intruder", peer.session))
    time.sleep(1.0)  # time passes on purpose: a second in which nothing the intruders sent may be answered
    for name, peer in intruders.items():
        assert peer.recv(0.2) is None, f"{name}: got a reply"  # no WELCOME, no WEIGHTS, nothing at all
    assert srv.stats["samples_in"] == 0 and not [p for p in srv.peers.values() if p.role == "worker"]
    seen = []
    while (msg := trainer.recv(0.3)) is not None:
        seen.append(msg.type)
    assert MsgType.BUNDLE not in seen  # nothing the intruders sent reaches the trainer
    auth = srv.sockets.auth
    assert auth is not None and auth.ring.refused["worker"] >= 1  # the unknown key, refused by ZAP
    snapshot = srv.snapshot()  # and --status shows it
    assert snapshot["unknown_keys"] == {"trainer": 0, "worker": auth.ring.refused["worker"]}
    assert f"{auth.ring.refused['worker']:,} on the worker port" in format_status(snapshot)
    legit = keyed(ctx, srv, keys, "worker", "worker")
    assert legit.hello().type is MsgType.WELCOME and legit.expect(MsgType.WEIGHTS).policy_version == 3


def encode_samples(name: str, session: str) -> list:  # type: ignore[type-arg]
    from netrl.protocol.wire import encode

    return encode(samples_message(sample_buffer(5), name, session, 1, 5))


def test_a_worker_key_cannot_publish_weights(secured: tuple[Server, zmq.Context, Path]) -> None:
    srv, ctx, keys = secured
    worker_keys = client_keys(keys, "worker", "worker")
    on_trainer_port = curve_peer(ctx, srv.trainer_port, "trainer", "fake", worker_keys.public, worker_keys.secret,
                                 worker_keys.server_public)
    on_trainer_port.send(Message(MsgType.HELLO, "fake", body={"role": "trainer", "netrl_version": "0.1.0",
                                                              "worker_id": "fake", "session": "f"}))
    assert on_trainer_port.recv(0.5) is None  # ZAP refuses a worker key on the trainer port
    captured = keyed(ctx, srv, keys, "worker", "worker")
    assert captured.hello().type is MsgType.WELCOME
    victim = keyed(ctx, srv, keys, "worker", "robot-1")
    assert victim.hello().type is MsgType.WELCOME
    captured.send(weights_message(999, session="x", sender="worker", value=0.0))
    wait_until(lambda: srv.stats["rejected"], 5, "the worker's weights refused", poll=0.02)
    assert not srv.weights.parts and srv.stats["rejected"] == 1  # refused and logged as a role violation
    while (msg := victim.recv(0.2)) is not None:
        assert msg.type is not MsgType.WEIGHTS


def test_a_named_worker_key_only_works_for_that_worker(secured: tuple[Server, zmq.Context, Path]) -> None:
    srv, ctx, keys = secured
    robot1 = client_keys(keys, "worker", "robot-1")
    impostor = curve_peer(ctx, srv.worker_port, "worker", "robot-2", robot1.public, robot1.secret,
                          robot1.server_public)
    reply = impostor.hello()
    assert reply.type is MsgType.REJECT and "belongs to worker 'robot-1'" in reply.body["reason"]
    shared = client_keys(keys, "worker", "worker")
    borrowed = curve_peer(ctx, srv.worker_port, "worker", "robot-1", shared.public, shared.secret,
                          shared.server_public)
    reply = borrowed.hello()  # the shared key may not take the name of a worker with a key of its own
    assert reply.type is MsgType.REJECT and "'robot-1' has a key of its own" in reply.body["reason"]
    honest = keyed(ctx, srv, keys, "worker", "robot-1")
    assert honest.hello().type is MsgType.WELCOME
    assert [p.key for p in srv.peers.values()] == ["robot-1"]
    assert keyed(ctx, srv, keys, "worker", "robot-9").hello().type is MsgType.WELCOME  # no key of its own: shared


def test_workers_check_weights_before_loading_them() -> None:
    actor = MLPActor(OBS, ACT, hidden_sizes=(8,))
    good = state_arrays(actor)
    assert check_weights(actor, good) == []
    bad = dict(good)
    bad["mu.weight"] = np.zeros((3, 8), np.float32)
    bad["extra"] = np.zeros(1, np.float32)
    del bad["mu.bias"]
    bad["net.0.bias"] = np.full(8, np.nan, np.float32)
    problems = check_weights(actor, bad)
    assert check_weights(weight_specs(actor), tensor_views(bad)) == problems  # the worker checks tensor views
    assert "missing parameter 'mu.bias'" in problems and "unexpected parameter 'extra'" in problems
    assert any("'mu.weight' has shape (3, 8)" in p for p in problems)
    assert any("'net.0.bias' contains NaN" in p for p in problems)
    huge = dict(good, **{"net.0.bias": np.full(8, 3e38, np.float32)})  # finite, though its float32 sum overflows
    assert check_weights(actor, huge) == []
    wrong_dtype = dict(good, **{"mu.bias": good["mu.bias"].astype(np.float64)})
    assert any("dtype float64" in p for p in check_weights(actor, wrong_dtype))
    before = {k: v.clone() for k, v in actor.state_dict().items()}
    assert all(torch.equal(before[k], v) for k, v in actor.state_dict().items())


@pytest.mark.parametrize("as_tensor", [False, True], ids=["numpy", "torch"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_all_finite_finds_any_bad_element_and_passes_sums_that_overflow(dtype: type, as_tensor: bool) -> None:
    def finite(arr: np.ndarray) -> bool:
        return all_finite(torch.from_numpy(arr) if as_tensor else arr)

    big = float(np.finfo(dtype).max)
    assert finite(np.zeros(0, dtype)) and finite(np.linspace(-1, 1, 1001).astype(dtype))
    assert finite(np.full((4, 5), big, dtype)) and finite(np.array([big, -big, big], dtype))
    for bad in (np.nan, np.inf, -np.inf):
        for at in (0, 500, 1000):
            arr = np.ones(1001, dtype)
            arr[at] = bad
            assert not finite(arr), (bad, at)
            arr[:at] = big  # a sum that also overflows must not hide the bad element
            assert not finite(arr), (bad, at)
    assert not finite(np.array([np.inf, -np.inf], dtype))  # the sum is NaN


def test_every_receiving_socket_caps_message_size(secured: tuple[Server, zmq.Context, Path],
                                                  make_server: MakeServer) -> None:
    srv, _, keys = secured
    assert all(s.getsockopt(zmq.MAXMSGSIZE) == NET.max_message_bytes for s in srv.sockets.by_role.values())
    small, small_ctx = make_server(network=NetworkConfig(max_message_bytes=1 << 16), keys=server_keys(keys))
    k = client_keys(keys, "worker", "worker")
    big = curve_peer(small_ctx, small.worker_port, "worker", "big", k.public, k.secret, k.server_public)
    big.hello()
    dropped = big.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    big.sock.send_multipart([b"x" * (1 << 17)])  # over the cap: libzmq drops the connection, not the server
    assert dropped.poll(5000), "the server kept a connection that sent more than max_message_bytes"
    fine = curve_peer(small_ctx, small.worker_port, "worker", "fine", k.public, k.secret, k.server_public)
    assert fine.hello().type is MsgType.WELCOME


def handshake_error(ctx: zmq.Context, port: int, keys: ClientKeys | None, caplog: pytest.LogCaptureFixture) -> str:
    """What a real client logs when its handshake with the server on ``port`` fails."""
    net = NetworkConfig(trainer_port=port, worker_port=port, heartbeat_interval_s=0.2)
    link = ClientLink(ctx, net, "worker", "robot-1", new_session(), port, keys=keys)
    link.open()
    try:
        deadline = time.monotonic() + 5
        while not link.handshake_failures and time.monotonic() < deadline:
            link.receive()
            link.maintain()
            time.sleep(0.02)
        state = link.state()  # what every status line of the role says, not only the first log line
    finally:
        link.close()
    assert not link.ready
    said = " ".join(r.getMessage() for r in caplog.records if "cannot connect" in r.getMessage())
    assert link.handshake_problem and state == f"unreachable: {link.handshake_problem}"
    assert link.handshake_problem in said
    return said


def test_a_failed_handshake_says_what_to_fix(secured: tuple[Server, zmq.Context, Path], tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture, make_server: MakeServer) -> None:
    srv, ctx, keys = secured
    said = handshake_error(ctx, srv.worker_port, None, caplog)
    assert "disagree on security" in said and "the server uses CURVE" in said and "None" not in said
    deadline = time.monotonic() + 2
    while not (server_said := [r.getMessage() for r in caplog.records if "failed its handshake" in r.getMessage()]):
        assert time.monotonic() < deadline, "the server logs no failed handshake"
        time.sleep(0.02)
    # which side notices the mismatch first is a race:
    assert ("its \"security\" differs from the server's" in server_said[0]
            or "it closed the connection first" in server_said[0]), server_said
    assert "other failed handshakes: 0 on the trainer port" in format_status(srv.snapshot())
    caplog.clear()
    right = client_keys(keys, "worker", "robot-1")
    stranger_public = zmq.auth.load_certificate(zmq.auth.create_certificates(tmp_path, "stranger")[0])[0]
    said = handshake_error(ctx, srv.worker_port, dataclasses.replace(right, server_public=stranger_public), caplog)
    assert f"{right.folder}/server.key is not this server's public key" in said
    open_srv, _ = make_server(network=NET, spool_dir=tmp_path / "open-spool")  # "security": "none"
    caplog.clear()
    said = handshake_error(ctx, open_srv.worker_port, right, caplog)
    assert "the server runs with \"security\": \"none\"" in said or "the server has \"security\": \"none\"" in said


@pytest.mark.parametrize(("event", "value", "keys", "expected"), [
    (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0, None, "disagree on security"),
    (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH, "k", "disagree on security"),
    (zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400, "k", "refused this worker's key"),
    (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0, "k", "is not this server's public key"),
    (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC, "k", "is not this server's"),
])
def test_each_handshake_failure_has_its_own_advice(event: int, value: int, keys: str | None, expected: str,
                                                   tmp_path: Path) -> None:
    client = None
    if keys is not None:
        keygen(tmp_path / "keys")
        client = client_keys(tmp_path / "keys", "worker", "worker")
    assert expected in handshake_failure(event, value, "worker", client)


def test_a_client_on_the_other_roles_port_hears_that_the_port_may_be_wrong(
        secured: tuple[Server, zmq.Context, Path], caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx, keys = secured
    said = handshake_error(ctx, srv.trainer_port, client_keys(keys, "worker", "robot-1"), caplog)  # a worker key
    assert "either this is not the server's worker port (check network.worker_port, --worker-port)" in said
    deadline = time.monotonic() + 2
    while not (server_said := [r.getMessage() for r in caplog.records if "refused a connection on" in r.getMessage()]):
        assert time.monotonic() < deadline, "the server logs no refused key"
        time.sleep(0.02)
    assert "it is a worker's key ('robot-1'), so that worker connects to the trainer port" in server_said[0]
