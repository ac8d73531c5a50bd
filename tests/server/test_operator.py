"""What an operator needs from revocation, quarantine and the replay share (issue 43, items 1 and 2,
as an outside check found them): a revocation undone from the command line (and the undoing kept
across a restart), a quarantine lifted through the server, both with the authority of --revoke and
answered; --status showing revocations, quarantines and each worker's rows against its share; and
a worker told when the trainer refuses its packets over that share, without amplification."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from netrl.__main__ import main
from netrl.config.load import load_config
from netrl.errors import NetrlError
from netrl.monitor.status import format_status, query_status
from netrl.net.keys import client_keys, server_keys
from netrl.protocol.messages import Message, MsgType
from netrl.server.revocation import REVOKED_FILE, ask_operator, ask_revoke
from netrl.server.server import Server
from tests.fakes import NET, MakeServer, Peer, small_config, wait_until
from tests.server.test_fair_share import curve_peer
from tests.server.test_revocation import revoke


def operator(ctx: zmq.Context, srv: Server, msg: Message, *types: MsgType) -> Message:
    """An operator's request by hand: a connection to the trainer port that says no HELLO."""
    peer = Peer(ctx, srv.trainer_port, "trainer", "operator")
    peer.send(msg)
    return peer.expect(*types, MsgType.REJECT, MsgType.NOTICE)


def notices(peer: Peer, seconds: float) -> list[Message]:
    """The NOTICEs ``peer`` gets within ``seconds`` (heartbeats pass by)."""
    got, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        msg = peer.recv(left)
        if msg is not None and msg.type is MsgType.NOTICE:
            got.append(msg)
    return got


def unrevoke(ctx: zmq.Context, srv: Server, worker: str) -> Message:
    return operator(ctx, srv, Message(MsgType.REVOKE, "operator",
                                      body={"worker": worker, "undo": True}), MsgType.REVOKE)


def test_an_unrevoke_lets_the_key_connect_again_and_holds_across_a_restart(
    tmp_path: Path, make_server: MakeServer
) -> None:
    spool = tmp_path / "spool"
    srv, ctx = make_server(network=NET, spool_dir=spool)
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    assert revoke(ctx, srv, "w1", "stolen laptop").body["links"] == 0
    assert trainer.expect(MsgType.REVOKE).body["worker"] == "w1"
    assert Peer(ctx, srv.worker_port, "worker", "w1").hello().type is MsgType.REJECT
    answer = unrevoke(ctx, srv, "w1")
    assert answer.body["was"] and "'w1' may connect again" in answer.body["reason"]
    assert "stolen laptop" in answer.body["reason"]  # which revocation was lifted
    told = trainer.expect(MsgType.REVOKE)  # the trainer takes its packets again
    assert told.body["worker"] == "w1" and told.body["undo"]
    assert Peer(ctx, srv.worker_port, "worker", "w1").hello().type is MsgType.WELCOME
    assert srv.stats["unrevocations"] == 1
    # a key that is not revoked: said so, nothing changes
    again = unrevoke(ctx, srv, "w1")
    assert again.body["was"] is False and "'w1' is not revoked" in again.body["reason"]
    assert srv.stats["unrevocations"] == 1
    srv.close()
    restarted, ctx2 = make_server(network=NET, spool_dir=spool)
    assert (spool / REVOKED_FILE).exists()
    assert Peer(ctx2, restarted.worker_port, "worker", "w1").hello().type is MsgType.WELCOME
    # a trainer that connects later (one restored from a checkpoint that still counts w1
    # revoked) is told the revocation was lifted
    trainer2 = Peer(ctx2, restarted.trainer_port, "trainer", "trainer")
    assert trainer2.hello().type is MsgType.WELCOME
    assert trainer2.expect(MsgType.REVOKE).body == {"worker": "w1", "links": 0, "undo": True}
    assert restarted.snapshot()["revoked"] == []


def test_no_worker_may_unrevoke_or_lift_and_is_told_why(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    revoke(ctx, srv, "w9", "gone rogue")
    attacker = Peer(ctx, srv.worker_port, "worker", "w1")
    assert attacker.hello().type is MsgType.WELCOME
    attacker.send(Message(MsgType.REVOKE, "w1", body={"worker": "w9", "undo": True}))
    assert "a worker may not send revoke messages" in attacker.expect(MsgType.NOTICE).body["reason"]
    time.sleep(NET.heartbeat_interval_s)  # one answer per heartbeat interval: no amplification
    attacker.send(Message(MsgType.LIFT, "w1", body={"worker": "w1"}))
    assert "a worker may not send lift messages" in attacker.expect(MsgType.NOTICE).body["reason"]
    assert "w9" in srv.revocations.revoked and srv.stats["lifts"] == 0


def test_a_lift_goes_to_the_trainer_and_its_answer_to_the_operator(
    server: tuple[Server, zmq.Context],
) -> None:
    srv, ctx = server
    lift = Message(MsgType.LIFT, "operator", body={"worker": "w2", "reason": "a sensor fixed"})
    refused = operator(ctx, srv, lift, MsgType.LIFT)  # no trainer: quarantine is the trainer's
    assert refused.body["refused"] and "no trainer is connected" in refused.body["reason"]
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    asking = Peer(ctx, srv.trainer_port, "trainer", "operator")
    asking.send(lift)
    asked = trainer.expect(MsgType.LIFT)
    assert asked.body["worker"] == "w2" and asked.body["reason"] == "a sensor fixed"
    trainer.send(Message(MsgType.LIFT, "trainer", body={
        "worker": "w2", "ask": asked.body["ask"], "was": True, "packets": 2, "rows": 80,
        "hidden": 400, "gone": 0, "reason": "quarantine of worker 'w2' lifted"}))
    answer = asking.expect(MsgType.LIFT)
    assert answer.body["was"] and answer.body["rows"] == 80 and "ask" not in answer.body
    assert srv.stats["lifts"] == 1
    bad = operator(ctx, srv, Message(MsgType.LIFT, "operator", body={"worker": "no such"}),
                   MsgType.LIFT)
    assert bad.body["refused"] and "is not a worker key or name" in bad.body["reason"]


def test_a_lift_the_trainer_does_not_answer_is_answered_by_the_server(
    server: tuple[Server, zmq.Context], monkeypatch: pytest.MonkeyPatch
) -> None:
    import netrl.server.standing

    monkeypatch.setattr(netrl.server.standing, "LIFT_TIMEOUT_S", 0.3)
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    answer = operator(ctx, srv, Message(MsgType.LIFT, "operator", body={"worker": "w2"}),
                      MsgType.LIFT)
    assert answer.body["refused"] and "the trainer did not answer" in answer.body["reason"]


def test_status_shows_revocations_quarantines_and_each_workers_replay_share(
    server: tuple[Server, zmq.Context],
) -> None:
    srv, ctx = server
    revoke(ctx, srv, "w9", "stolen laptop")
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    trainer.send(Message(MsgType.PROGRESS, "trainer", body={
        "trained_steps": 5, "samples": 100, "wanted": 200,
        "workers": {"w1": [4000, 6250, 0, 0], "w2": [6250, 6250, 3, 600]},
        "quarantined": {"w3": [120, "reward 100000 in row 0 is 6000 robust scales from ..."]}}))
    wait_until(lambda: srv.snapshot().get("reported_at"), 2, "the trainer's report")
    assert srv.sockets.status_port is not None
    snap = query_status(srv.sockets.status_port)  # as --status gets it, through the status port
    assert [r["worker"] for r in snap["revoked"]] == ["w9"]
    assert snap["revoked"][0]["reason"] == "stolen laptop" and snap["revoked"][0]["by"] == "operator"
    assert snap["quarantined"] == {"w3": {"rows": 120, "reason": "reward 100000 in row 0 is 6000 "
                                                               "robust scales from ..."}}
    assert snap["replay"]["w2"] == {"rows": 6250, "cap": 6250, "refused_packets": 3,
                                    "refused_rows": 600}
    assert srv.snapshot()["progress"] == {"trained_steps": 5, "samples": 100, "wanted": 200}
    text = format_status(snap)
    assert "revoked worker keys: 1" in text and "w9 since" in text and "stolen laptop" in text
    assert "quarantined by the trainer: 1" in text and "w3: 120 rows kept aside" in text
    assert "replay memory per worker" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("w2 "))
    assert "6,250" in line and "3 (600 rows)" in line


def test_a_worker_over_its_replay_share_is_told_once_a_report_naming_the_cap_and_the_key(
    server: tuple[Server, zmq.Context],
) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    w1, w2 = Peer(ctx, srv.worker_port, "worker", "w1"), Peer(ctx, srv.worker_port, "worker", "w2")
    assert w1.hello().type is MsgType.WELCOME and w2.hello().type is MsgType.WELCOME

    def report(refused: int, rows: int) -> None:
        trainer.send(Message(MsgType.PROGRESS, "trainer", body={
            "trained_steps": 0, "samples": 0, "wanted": 0,
            "workers": {"w1": [6250, 6250, refused, rows], "w2": [100, 6250, 0, 0]}}))

    report(2, 400)  # a new trainer's first report: its counts as they stand (a restart's)
    report(7, 1400)  # five more refused since: told, with the cap and the key
    notice = w1.expect(MsgType.NOTICE)
    assert notice.body["cause"] == "replay_share" and "refused" not in notice.body
    assert (notice.body["packets"], notice.body["rows"]) == (5, 1000)
    assert "6,250 rows" in notice.body["reason"] and "memory.max_worker_share" in notice.body["reason"]
    report(7, 1400)  # none more: nothing said
    report(9, 1800)
    assert w1.expect(MsgType.NOTICE).body["packets"] == 2
    assert notices(w1, 0.3) == [] and notices(w2, 0.1) == []
    assert srv.stats["share_notices"] == 2


def test_the_command_line_unrevokes_and_lifts_with_the_trainers_key(
    tmp_path: Path, make_server: MakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    config = small_config(tmp_path)  # CURVE keys in tmp_path/keys
    cfg = load_config(config)
    srv, ctx = make_server(network=NET, keys=server_keys(cfg.keys_dir),
                           trainer_port=cfg.network.trainer_port)
    trainer_keys = client_keys(cfg.keys_dir, "trainer", "trainer")
    ask_revoke("127.0.0.1", srv.trainer_port, "w1", "left the lab", trainer_keys)
    assert main(["--unrevoke", "w1", "--reason", "back", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "'w1' may connect again" in out and "left the lab" in out
    robot = curve_peer(ctx, srv.worker_port, "worker", "w1",
                       client_keys(cfg.keys_dir, "worker", "w1"))
    assert robot.hello().type is MsgType.WELCOME
    assert main(["--unrevoke", "w1", "--config", str(config)]) == 1  # not revoked: said so
    assert "'w1' is not revoked" in capsys.readouterr().out
    assert main(["--lift", "w1", "--config", str(config)]) == 1  # refused: no trainer
    assert "no trainer is connected" in capsys.readouterr().out  # logged, as every error
    assert main(["--lift", "w 1", "--config", str(config)]) == 2  # a usage error, named
    assert '--lift "w 1" is not a worker key or name' in capsys.readouterr().err
    with pytest.raises(NetrlError, match="refused to lift"):  # the client's own error
        ask_operator("127.0.0.1", srv.trainer_port,
                     Message(MsgType.LIFT, "operator", body={"worker": "w1"}), trainer_keys)
