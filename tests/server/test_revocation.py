"""Revocation (issue 43, item 2): an operator, or the trainer, revokes a worker key on a running
server. Its links are dropped at once (within one heartbeat), it is refused afterwards with a
message naming the reason (across a restart too: the spool folder keeps revoked.json), the revoker
is answered and the trainer told; no worker can revoke."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from netrl.__main__ import main
from netrl.config.load import load_config
from netrl.errors import NetrlError, TransportError
from netrl.net.keys import client_keys, keygen, server_keys
from netrl.protocol.messages import Message, MsgType
from netrl.server.revocation import REVOKED_FILE, ask_revoke
from netrl.server.server import Server
from tests.fakes import NET, MakeServer, Peer, small_config, wait_until
from tests.server.test_fair_share import curve_peer


def revoke(ctx: zmq.Context, srv: Server, worker: str, reason: str = "") -> Message:
    """``--revoke`` by hand: a connection to the trainer port that says no HELLO."""
    operator = Peer(ctx, srv.trainer_port, "trainer", "operator")
    body = {"worker": worker, "reason": reason} if reason else {"worker": worker}
    operator.send(Message(MsgType.REVOKE, "operator", body=body))
    return operator.expect(MsgType.REVOKE, MsgType.REJECT, MsgType.NOTICE)


def test_a_revoked_worker_is_cut_off_within_a_heartbeat_and_refused_with_the_reason(
    server: tuple[Server, zmq.Context],
) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    bad, good = (
        Peer(ctx, srv.worker_port, "worker", "w1"),
        Peer(ctx, srv.worker_port, "worker", "w2"),
    )
    assert bad.hello().type is MsgType.WELCOME and good.hello().type is MsgType.WELCOME
    started = time.monotonic()
    answer = revoke(ctx, srv, "w1", "sent rewards of 1e5")
    assert answer.type is MsgType.REVOKE and answer.body["links"] == 1
    assert "'w1' was revoked by the operator" in answer.body["reason"]
    cut = bad.expect(MsgType.REJECT, timeout=NET.heartbeat_interval_s)
    assert time.monotonic() - started < NET.heartbeat_interval_s
    assert "revoked" in cut.body["reason"] and "sent rewards of 1e5" in cut.body["reason"]
    assert "retry_s" not in cut.body  # for good: a netrl worker stops
    assert [w.name for w in srv.peers.workers()] == ["w2"]  # the other one stays
    told = trainer.expect(MsgType.REVOKE)  # the trainer drops w1's rows
    assert told.body["worker"] == "w1"
    again = Peer(ctx, srv.worker_port, "worker", "w1")  # a new session of it
    refused = again.hello()
    assert (
        refused.type is MsgType.REJECT
        and "'w1' was revoked by the operator" in refused.body["reason"]
    )
    assert "sent rewards of 1e5" in refused.body["reason"]
    stats = srv.snapshot()["stats"]
    assert (stats["revocations"], stats["revoked_links"], stats["revoked_refused"]) == (1, 1, 1)


def test_the_trainer_may_revoke_and_is_answered(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    bad = Peer(ctx, srv.worker_port, "worker", "w1")
    assert bad.hello().type is MsgType.WELCOME
    trainer.send(Message(MsgType.REVOKE, "trainer", body={"worker": "w1", "reason": "implausible"}))
    answer = trainer.expect(MsgType.REVOKE)
    assert answer.body["links"] == 1 and "by the trainer" in answer.body["reason"]
    assert "implausible" in bad.expect(MsgType.REJECT).body["reason"]
    assert srv.peers.worker_count() == 0


def test_a_worker_cannot_revoke(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    attacker, victim = (
        Peer(ctx, srv.worker_port, "worker", "w1"),
        Peer(ctx, srv.worker_port, "worker", "w2"),
    )
    assert attacker.hello().type is MsgType.WELCOME and victim.hello().type is MsgType.WELCOME
    attacker.send(Message(MsgType.REVOKE, "w1", body={"worker": "w2"}))
    refused = attacker.expect(MsgType.NOTICE)
    assert "a worker may not send revoke messages" in refused.body["reason"]
    time.sleep(NET.heartbeat_interval_s)
    assert srv.peers.worker_count() == 2 and srv.snapshot()["stats"]["revocations"] == 0
    # nor as an operator on the worker port: no HELLO, so it is asked to say one
    Peer(ctx, srv.worker_port, "worker", "x").send(
        Message(MsgType.REVOKE, "x", body={"worker": "w2"})
    )
    time.sleep(NET.heartbeat_interval_s)
    assert srv.peers.worker_count() == 2 and srv.stats["revocations"] == 0


def test_a_revocation_of_a_name_that_is_not_one_is_refused_and_says_why(
    server: tuple[Server, zmq.Context],
) -> None:
    srv, ctx = server
    answer = revoke(ctx, srv, "no such\nname")
    assert answer.body["refused"] and "is not a worker key or name" in answer.body["reason"]
    assert srv.stats["revocations"] == 0 and srv.stats["rejected"] == 1


def test_a_revocation_holds_across_a_server_restart(
    tmp_path: Path, make_server: MakeServer
) -> None:
    spool = tmp_path / "spool"
    srv, ctx = make_server(network=NET, spool_dir=spool)
    assert revoke(ctx, srv, "w1", "stolen laptop").body["links"] == 0
    assert (spool / REVOKED_FILE).exists()
    srv.close()
    again, ctx2 = make_server(network=NET, spool_dir=spool)
    refused = Peer(ctx2, again.worker_port, "worker", "w1").hello()
    assert refused.type is MsgType.REJECT and "stolen laptop" in refused.body["reason"]
    assert Peer(ctx2, again.worker_port, "worker", "w2").hello().type is MsgType.WELCOME
    # a trainer that connects later is told, so that it drops w1's rows from its sample log
    trainer = Peer(ctx2, again.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    assert trainer.expect(MsgType.REVOKE).body["worker"] == "w1"


def test_revoke_with_curve_takes_the_trainer_key_and_a_worker_key_gets_nowhere(
    tmp_path: Path, make_server: MakeServer
) -> None:
    keys = tmp_path / "keys"
    keygen(keys, ["robot-1"])
    srv, ctx = make_server(network=NET, keys=server_keys(keys))
    with pytest.raises(TransportError, match="no netrl server answered a REVOKE"):
        # a worker's key never passes the trainer port's handshake
        ask_revoke(
            "127.0.0.1",
            srv.trainer_port,
            "robot-1",
            "",
            client_keys(keys, "worker", "robot-2"),
            timeout_s=1.0,
        )
    assert srv.stats["revocations"] == 0 and not srv.revocations.revoked
    robot = curve_peer(
        ctx, srv.worker_port, "worker", "robot-1", client_keys(keys, "worker", "robot-1")
    )
    assert robot.hello().type is MsgType.WELCOME
    answer = ask_revoke(
        "127.0.0.1",
        srv.trainer_port,
        "robot-1",
        "decommissioned",
        client_keys(keys, "trainer", "trainer"),
    )
    assert answer["links"] == 1
    assert "decommissioned" in robot.expect(MsgType.REJECT).body["reason"]
    # the key: a new session of it, under any worker name it may use, is refused
    back = curve_peer(
        ctx, srv.worker_port, "worker", "robot-1", client_keys(keys, "worker", "robot-1")
    )
    assert "'robot-1' was revoked" in back.hello().body["reason"]
    with pytest.raises(NetrlError, match="refused to revoke"):
        ask_revoke(
            "127.0.0.1", srv.trainer_port, "bad name", "", client_keys(keys, "trainer", "trainer")
        )
    wait_until(lambda: srv.peers.worker_count() == 0, 2, "no worker")


def test_the_command_line_revokes_with_the_trainers_key(
    tmp_path: Path, make_server: MakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    config = small_config(tmp_path)  # CURVE keys in tmp_path/keys
    cfg = load_config(config)
    srv, ctx = make_server(
        network=NET, keys=server_keys(cfg.keys_dir), trainer_port=cfg.network.trainer_port
    )
    robot = curve_peer(
        ctx, srv.worker_port, "worker", "w1", client_keys(cfg.keys_dir, "worker", "w1")
    )
    assert robot.hello().type is MsgType.WELCOME
    assert main(["--revoke", "w1", "--reason", "left the lab", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "revoked 'w1': 1 connection(s) dropped" in out and "left the lab" in out
    assert "left the lab" in robot.expect(MsgType.REJECT).body["reason"]
    assert main(["--revoke", "w 1", "--config", str(config)]) == 2  # a usage error, named
    assert '--revoke "w 1" is not a worker key or name' in capsys.readouterr().err
    assert main(["--status", "--reason", "x", "--config", str(config)]) == 2
    assert "--reason is for --revoke, --unrevoke and --lift; --status does not use it" in capsys.readouterr().err
