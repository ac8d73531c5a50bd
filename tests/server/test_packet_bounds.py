"""Packets bounded by what a worker can produce: a packet declaring more rows, or more inflated bytes, than its worker
makes (declared at HELLO) or the server's cap allows is refused before anything is inflated, at the server and at the
trainer; and the trainer counts only the rows its memory stored, so its pacing cannot be pushed ahead."""

from __future__ import annotations

from typing import Any

import gymnasium
import msgpack
import numpy as np
import pytest
import zmq
import zstandard

import netrl.protocol.wire
from netrl.agents.sac import MLPActor
from netrl.envs.gym import GenericGymEnv
from netrl.memory.replay import ReplayMemory
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import decode, encode, encode_bundle, samples_message
from netrl.samples import Buffer
from netrl.server.admission import UNDECLARED_ROWS
from netrl.server.server import Server
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.fakes import MakeServer, Peer, sample_buffer, wait_until


def zero_rows(sender: str, session: str, seq: int, n: int) -> list[bytes]:
    """A SAMPLES packet of ``n`` rows of zeros with every array zstd-compressed (floats too, which netrl's own
    encoder leaves raw): a few KB on the wire for hundreds of thousands of rows, each of them a transition."""
    f4 = np.float32
    buf = Buffer(act=np.zeros((n, 2), f4), obs=(np.zeros((n, 3), f4), np.zeros((n, 2), f4)), rew=np.zeros(n, f4),
                 terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), reset=np.zeros(n, bool),
                 context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64))
    frames = encode(samples_message(buf, sender, session, seq, produced=n), "none")
    header = msgpack.unpackb(frames[0], raw=False)
    for spec in header["arrays"]:
        spec["codec"] = "zstd"
    packer = zstandard.ZstdCompressor(level=1)
    return [msgpack.packb(header, use_bin_type=True), *(packer.compress(bytes(memoryview(f))) for f in frames[1:])]


def hello(peer: Peer, **declared: Any) -> Message:
    peer.send(Message(MsgType.HELLO, peer.name, body={"role": "worker", "netrl_version": "0.1.0",
                                                      "worker_id": peer.name, "session": peer.session, **declared}))
    return peer.expect(MsgType.WELCOME, MsgType.REJECT)


def test_packets_beyond_the_servers_row_cap_are_refused_before_inflating_and_the_server_stays_up(
        server: tuple[Server, zmq.Context], monkeypatch: pytest.MonkeyPatch) -> None:
    srv, ctx = server
    inflated: list[int] = []
    real = netrl.protocol.wire.decompress

    def counting(name: str, codec: str, data: memoryview, nbytes: int) -> bytes:
        inflated.append(nbytes)
        return real(name, codec, data, nbytes)

    monkeypatch.setattr(netrl.protocol.wire, "decompress", counting)
    worker = Peer(ctx, srv.worker_port, "worker", "evil")
    assert worker.hello().type is MsgType.WELCOME  # declares nothing: a small default applies, not the server's cap
    for seq in range(1, 6):
        frames = zero_rows("evil", worker.session, seq, 200_000)
        assert sum(len(f) for f in frames) < 100_000  # 200,000 rows in a few KB
        worker.sock.send_multipart(frames)
        nack = worker.expect(MsgType.NACK)
        assert nack.body["seqs"] == [seq] and nack.body["retry_s"] == 0  # never to be resent
        assert f"declares 200000 rows, over the bound of {UNDECLARED_ROWS} rows" in nack.body["reason"]
        assert "no bound was declared at HELLO" in nack.body["reason"]
        assert "server.max_rows_per_packet" in nack.body["reason"]
    assert inflated == []  # not one byte inflated
    assert srv.stats["samples_in"] == 0 and srv.stats["oversized_packets"] == 5 and srv.stats["rejected"] == 5
    worker.send(samples_message(sample_buffer(5), "evil", worker.session, 6, 4))  # the server stays up
    wait_until(lambda: srv.stats["samples_in"] == 4, 5, "a normal packet accepted", poll=0.02)
    assert srv.snapshot()["workers"][0]["oversized"] == 5


def test_a_worker_is_held_to_the_rows_and_bytes_it_declared_at_hello(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    assert hello(worker, max_rows=23, max_bytes=23 * 60, paced=False).type is MsgType.WELCOME
    worker.sock.send_multipart(zero_rows("w", worker.session, 1, 24))
    reason = worker.expect(MsgType.NACK).body["reason"]
    assert "declares 24 rows, over the bound of 23 rows" in reason and "declared 23 rows at HELLO" in reason
    big = sample_buffer(20)
    big.obs = (np.zeros((20, 300), np.float32), big.obs[1])  # 20 rows, but 24,000 bytes of observations
    worker.send(samples_message(big, "w", worker.session, 2, 19))
    reason = worker.expect(MsgType.NACK).body["reason"]
    assert "over the bound of 1380 bytes per packet" in reason and "it declared 1380 bytes" in reason
    worker.send(samples_message(sample_buffer(23), "w", worker.session, 3, 41))  # within both
    wait_until(lambda: srv.stats["samples_in"] == 22, 5, "the packet within its bounds", poll=0.02)
    assert srv.stats["oversized_packets"] == 2


def test_a_worker_whose_packets_no_cap_lets_through_is_refused_at_hello(make_server: MakeServer) -> None:
    srv, ctx = make_server(max_rows_per_packet=16)
    reply = hello(Peer(ctx, srv.worker_port, "worker", "w"), max_rows=23)
    assert reply.type is MsgType.REJECT and "retry_s" not in reply.body
    assert "up to 23 rows, over this server's server.max_rows_per_packet (16)" in reply.body["reason"]
    assert "worker.min_samples_per_worker_packet" in reply.body["reason"]


def test_a_worker_declares_the_largest_packet_it_makes_and_whether_it_keeps_to_pace(
        server: tuple[Server, zmq.Context]) -> None:
    srv, _ = server
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           server_ip="127.0.0.1", server_port=srv.worker_port, worker_id="w", seed=0,
                           min_samples_per_worker_packet=7, max_samples_per_episode=30, flush_timeout_s=5.0)
    try:
        worker.start()
        peer = wait_until(lambda: srv.peers.workers(), 5, "the worker's HELLO", poll=0.02)[0]
        # 7 rows, a context row and room for an episode's first observation; Pendulum's rows: 3 + 1 floats, plus
        # at most 22 bytes of sample columns (the env column's 2 included); unthrottled, it asks to be exempt from
        # pacing, which only server.unpaced_workers grants
        assert (peer.max_rows, peer.max_bytes, peer.asked_unpaced, peer.num_envs) == (10, 10 * (16 + 22), True, 1)
        assert peer.paced and srv.stats["unpaced_denied"] == 1
        worker.run_episode()
    finally:
        worker.close()
    assert srv.stats["samples_in"] == 30 and srv.stats["oversized_packets"] == 0


def test_the_trainer_refuses_a_packet_beyond_its_bounds_before_inflating(monkeypatch: pytest.MonkeyPatch) -> None:
    from netrl.config.sections import NetworkConfig
    from netrl.launch import free_port
    from netrl.protocol.wire import PacketLimits
    from netrl.trainer.delivery import Deliveries
    from netrl.trainer.link import TrainerLink

    link = TrainerLink(NetworkConfig(), "trainer", "t" * 16, free_port(), 8, Deliveries(None), None)
    link.packet_limits = PacketLimits(65_536, 65_536 * 60, "server.max_rows_per_packet is 65536")
    inflated: list[int] = []
    real = netrl.protocol.wire.decompress
    monkeypatch.setattr(netrl.protocol.wire, "decompress",
                        lambda *args: inflated.append(args[3]) or real(*args))  # type: ignore[func-returns-value]
    bomb = zero_rows("evil", "s" * 16, 1, 200_000)
    good = encode(samples_message(sample_buffer(5), "good", "g" * 16, 1, 4))
    try:
        link.on_message(decode(encode_bundle("server", 1, [bomb, good])))
    finally:
        link.halt()
    assert link.stats["rejected"] == 1 and inflated == []
    [(bufs, _)] = link.inbox
    assert [b.worker for b in bufs] == ["good/" + "g" * 16]


def test_the_sample_count_and_the_pacing_count_only_the_rows_the_memory_stored() -> None:
    obs, act = gymnasium.spaces.Box(-1, 1, (3,), np.float32), gymnasium.spaces.Box(-1, 1, (1,), np.float32)
    training = TrainingOffline(env_cls=(obs, act), memory_cls=ReplayMemory, memory_size=100, batch_size=8,
                               start_training=50, worker_lead=10, device="cpu")
    training.build()
    n = 5_000
    buf = Buffer(act=np.zeros((n, 1), np.float32), obs=np.zeros((n, 3), np.float32), rew=np.zeros(n, np.float32),
                 terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), reset=np.zeros(n, bool),
                 context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64), worker="w/s", seq=1)
    assert training.add(buf) == 100  # the memory keeps the newest 100 rows: those are the samples it has
    assert training.total_samples == 100 and len(training.memory or []) == 99  # (the oldest lost its predecessor)
    assert training.live()["samples"] == 100  # what PROGRESS reports to the server's pacing
