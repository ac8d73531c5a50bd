"""A fair share of the trainer's intake per worker: a worker that declares no bounds gets small
ones, not the server's cap; PACE counts rows (reset and context rows take slots in the trainer's
memory as env steps do); being exempt from PACE is granted by the server's configuration
(server.unpaced_workers), never claimed in a HELLO."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
import zstandard

from netrl.net.keys import ClientKeys, client_keys, keygen, server_keys
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import encode, samples_message
from netrl.samples import Buffer
from netrl.server.server import Server
from tests.fakes import NET, MakeServer, Peer, sample_buffer, wait_until

WANTED = 100  # samples the fake trainer wants: each worker's allowance


def blank_rows(sender: str, session: str, seq: int, n: int, reset: bool = False) -> list[bytes]:
    """A SAMPLES packet of ``n`` rows of zeros, every array zstd-compressed (floats too, which
    netrl's own encoder leaves raw): under 2 KB on the wire for 65,536 rows. ``reset``: every row
    an episode's first (no env step)."""
    f4 = np.float32
    buf = Buffer(act=np.zeros((n, 2), f4), obs=(np.zeros((n, 3), f4), np.zeros((n, 2), f4)),
                 rew=np.zeros(n, f4), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                 reset=np.full(n, reset), context=np.zeros(n, bool),
                 policy_version=np.zeros(n, np.int64))
    frames = encode(samples_message(buf, sender, session, seq, produced=0 if reset else n), "none")
    header = msgpack.unpackb(frames[0], raw=False)
    for spec in header["arrays"]:
        spec["codec"] = "zstd"
    packer = zstandard.ZstdCompressor(level=1)
    return [msgpack.packb(header, use_bin_type=True),
            *(packer.compress(bytes(memoryview(f))) for f in frames[1:])]


def hello(peer: Peer, **declared: Any) -> Message:
    peer.send(Message(MsgType.HELLO, peer.name, body={
        "role": "worker", "netrl_version": "0.1.0", "worker_id": peer.name,
        "session": peer.session, **declared}))
    return peer.expect(MsgType.WELCOME, MsgType.REJECT)


def pacing_trainer(srv: Server, trainer: Peer, wanted: int = WANTED) -> None:
    """``trainer`` says HELLO and that it holds no samples and wants ``wanted``: each worker's PACE
    allowance is its share of them."""
    assert trainer.hello().type is MsgType.WELCOME
    trainer.send(Message(MsgType.PROGRESS, "trainer",
                         body={"trained_steps": 0, "samples": 0, "wanted": wanted}))
    wait_until(lambda: srv.intake.progress is not None, 5, "the trainer's PROGRESS", poll=0.02)


def nacks(peer: Peer, count: int) -> list[Message]:
    """The first ``count`` NACKs ``peer`` gets (accepted packets wait for the trainer's ACK)."""
    return [peer.expect(MsgType.NACK) for _ in range(count)]


def accepted(srv: Server, name: str) -> dict[str, Any]:
    """What --status shows of worker ``name`` ({} until the server's thread lists it)."""
    return next((w for w in srv.snapshot()["workers"] if w["name"] == name), {})


def curve_peer(ctx: zmq.Context, port: int, role: str, name: str, keys: ClientKeys) -> Peer:
    """A fake peer connecting with CURVE ``keys``."""
    peer = Peer.__new__(Peer)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_publickey, sock.curve_secretkey = keys.public, keys.secret
    sock.curve_serverkey = keys.server_public
    sock.connect(f"tcp://127.0.0.1:{port}")
    peer.sock, peer.role, peer.name, peer.session = sock, role, name, os.urandom(4).hex()
    return peer


def test_a_worker_claiming_real_time_with_no_bounds_cannot_flood_the_trainer(
        server: tuple[Server, zmq.Context]) -> None:
    # the attack: paced false and no row bound gave 65,536 rows per packet, never held back: 20
    # packets of 809 bytes replaced a 1,000,000-row replay memory
    srv, ctx = server
    pacing_trainer(srv, Peer(ctx, srv.trainer_port, "trainer", "trainer"))
    evil = Peer(ctx, srv.worker_port, "worker", "evil")
    assert hello(evil, paced=False).type is MsgType.WELCOME
    for seq in range(1, 21):
        frames = blank_rows("evil", evil.session, seq, 65_536)
        assert sum(len(f) for f in frames) < 2_000
        evil.sock.send_multipart(frames)
    refused = nacks(evil, 20)
    assert all(m.body["retry_s"] == 0 for m in refused)  # refused for good: too many rows
    assert "over the bound of 1024 rows" in refused[0].body["reason"]
    assert srv.stats["samples_in"] == 0 and srv.stats["oversized_packets"] == 20
    # packets within the default bound are paced all the same: it claimed, nobody granted
    for seq in range(21, 41):
        evil.sock.send_multipart(blank_rows("evil", evil.session, seq, 1024))
    held = nacks(evil, 20 - 4 * WANTED // 1024)
    assert "over this worker's PACE allowance" in held[0].body["reason"]
    assert "server.unpaced_workers does not name 'evil'" in held[0].body["reason"]
    wait_until(lambda: accepted(srv, "evil").get("packets", 0) + srv.stats["pace_refusals"] == 20, 30,
               "all 20 settled", poll=0.02)
    # its share of what the trainer wants, in rows, not 1.3 million
    assert srv.stats["samples_in"] <= 4 * WANTED
    assert accepted(srv, "evil")["paced"] and srv.stats["unpaced_denied"] == 1


def test_reset_rows_count_against_pace(make_server: MakeServer) -> None:
    # the attack: from a plain paced HELLO, packets of 65,536 reset rows (no env step) passed PACE,
    # which counted env steps, and took the trainer's memory from 8,342 transitions to none
    srv, ctx = make_server(network=NET, min_samples_per_server_packet=1, max_packet_delay_s=0.01)
    pacing_trainer(srv, Peer(ctx, srv.trainer_port, "trainer", "trainer"))
    evil = Peer(ctx, srv.worker_port, "worker", "evil")
    assert hello(evil, max_rows=65_536).type is MsgType.WELCOME
    for seq in range(1, 11):
        evil.sock.send_multipart(blank_rows("evil", evil.session, seq, 65_536, reset=True))
    held = nacks(evil, 10)
    assert "over this worker's PACE allowance" in held[0].body["reason"]
    assert "the 65536 rows of this packet" in held[0].body["reason"]
    assert accepted(srv, "evil")["packets"] == 0 and srv.stats["pace_refusals"] == 10
    honest = Peer(ctx, srv.worker_port, "worker", "honest")  # the others' share is untouched
    assert hello(honest, max_rows=16).type is MsgType.WELCOME
    honest.send(samples_message(sample_buffer(5), "honest", honest.session, 1, 4))
    wait_until(lambda: accepted(srv, "honest").get("samples") == 4, 30, "the honest packet", poll=0.02)
    assert srv.stats["pace_refusals"] == 10


def test_a_workers_pace_in_rows_follows_its_own_rows_per_env_step(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    pacing_trainer(srv, Peer(ctx, srv.trainer_port, "trainer", "trainer"))
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    assert hello(worker, max_rows=64).type is MsgType.WELCOME
    peer = srv.peers.workers()[0]
    wait_until(lambda: peer.allowance == WANTED, 5, "its PACE", poll=0.02)
    assert peer.pace_budget == 4 * WANTED  # before any step delivered: the most rows per step
    # 40 env steps after an episode's first row
    worker.send(samples_message(sample_buffer(41), "w", worker.session, 1, 40))
    wait_until(lambda: peer.rows == 41, 5, "the packet accepted", poll=0.02)
    assert peer.rows_per_step() == pytest.approx(41 / 40)
    assert peer.pace_budget == 4 * WANTED - 41


def test_a_hello_that_asks_for_paced_false_is_honoured_only_for_keys_the_server_names(
        tmp_path: Path, make_server: MakeServer) -> None:
    keys = tmp_path / "keys"
    keygen(keys, ["robot-1"])
    srv, ctx = make_server(network=NET, min_samples_per_server_packet=1, max_packet_delay_s=0.01,
                           keys=server_keys(keys), unpaced_workers=["robot-1"])
    trainer = curve_peer(ctx, srv.trainer_port, "trainer", "trainer",
                         client_keys(keys, "trainer", "trainer"))
    pacing_trainer(srv, trainer, wanted=8)
    robot = curve_peer(ctx, srv.worker_port, "worker", "robot-1",
                       client_keys(keys, "worker", "robot-1"))
    claimer = curve_peer(ctx, srv.worker_port, "worker", "robot-2",  # only has the shared key
                         client_keys(keys, "worker", "robot-2"))
    for peer in (robot, claimer):
        assert hello(peer, max_rows=16, paced=False).type is MsgType.WELCOME
    for seq in range(1, 11):  # 40 samples each, five times what the trainer asked for
        robot.send(samples_message(sample_buffer(5), "robot-1", robot.session, seq, 4 * seq))
        claimer.send(samples_message(sample_buffer(5), "robot-2", claimer.session, seq, 4 * seq))
    held = nacks(claimer, 1)
    # the shared key's name: the grant goes to keys, not to the names workers give themselves
    assert "server.unpaced_workers does not name 'worker'" in held[0].body["reason"]
    wait_until(lambda: accepted(srv, "robot-1").get("samples") == 40, 30, "every packet of robot-1",
               poll=0.02)
    assert accepted(srv, "robot-1")["over_pace"] == 0  # granted: never held
    assert accepted(srv, "robot-2")["samples"] < 40 and srv.stats["pace_refusals"] > 0
    assert not accepted(srv, "robot-1")["paced"] and accepted(srv, "robot-2")["paced"]
    assert srv.stats["unpaced_denied"] == 1
