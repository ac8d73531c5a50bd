"""Many envs per worker through the real server: every env's rows reach the trainer's memory as segments of their
own, and a packet with rows of an env its worker never declared, or one that would join two envs, is refused while
the server stays up."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import zmq

from netrl.memory.replay import ReplayMemory
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import buffer_from_message, decode, samples_message, split_bundle
from netrl.samples import Buffer
from netrl.server.server import Server
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, Counter, Peer, TagActor, wait_until


@pytest.fixture(autouse=True)
def fresh_counters() -> None:
    Counter.made = []


def segments(env: list[int], reset: list[int], context: list[int]) -> Buffer:
    """A packet of ``len(env)`` rows of Counter-like observations with these env, reset and context columns."""
    n = len(env)
    return Buffer(act=np.zeros((n, 1), np.float32), obs=np.zeros((n, 3), np.float32), rew=np.ones(n, np.float32),
                  terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), reset=np.array(reset, bool),
                  context=np.array(context, bool), policy_version=np.zeros(n, np.int64),
                  env=np.array(env, np.uint16))


def test_a_vector_workers_envs_reach_the_trainers_memory_each_stitched_apart(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    trainer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 1000}))
    memory = ReplayMemory(memory_size=10_000, batch_size=4)
    episodes = []
    done = threading.Event()

    def take() -> None:  # the trainer's side: bundles -> packets -> memory, acknowledged
        while not done.is_set():
            msg = trainer.recv(0.05)
            if msg is None or msg.type is not MsgType.BUNDLE:
                continue
            for part in split_bundle(msg):
                buf = buffer_from_message(decode(part))
                memory.append_buffer(buf)
                episodes.extend(buf.episodes)
            trainer.send(Message(MsgType.ACK, "trainer", body={"seqs": [msg.seq]}))

    taker = threading.Thread(target=take)
    taker.start()
    worker = RolloutWorker(Counter, TagActor, num_envs=3, server_ip="127.0.0.1", server_port=srv.worker_port,
                           worker_id="vec", network=NET, seed=0, min_samples_per_worker_packet=4,
                           max_packet_delay_s=0.05, flush_timeout_s=5.0)
    try:
        worker.start()
        peer = wait_until(lambda: srv.peers.workers(), 5, "the worker's HELLO", poll=0.02)[0]
        # HELLO declares its envs, and bounds three segments of 4 rows, a context row and room for a reset row
        assert (peer.num_envs, peer.max_rows, peer.max_bytes) == (3, 3 * 7, 3 * 7 * (16 + 22))
        worker.run(0, nb_episodes=9)  # it closes, flushing its last packet
        wait_until(lambda: len(memory) == worker.produced, 5, "every transition in the memory", poll=0.02)
    finally:
        done.set()
        taker.join()
        worker.close()
    assert worker.samples_unacknowledged == 0
    for k in range(len(memory)):
        o, a, _r, o2, *_ = memory.get_transition(k)
        assert (o2[0], o2[1], o2[2]) == (o[0], o[1], o[2] + 1) and a[0] == o[0], (o, a, o2)
    assert set(memory._cols["env"][:memory._size].tolist()) == {0, 1, 2}
    assert {e.env for e in episodes} == {0, 1, 2} and len(episodes) >= 9


def test_packets_naming_an_undeclared_env_or_joining_two_envs_are_refused_and_the_server_stays_up(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    worker = Peer(ctx, srv.worker_port, "worker", "w")
    worker.send(Message(MsgType.HELLO, "w", body={"role": "worker", "netrl_version": "0.1.0", "worker_id": "w",
                                                  "session": worker.session, "num_envs": 2, "paced": False}))
    assert worker.expect(MsgType.WELCOME, MsgType.REJECT).type is MsgType.WELCOME
    assert srv.peers.workers()[0].num_envs == 2
    # env 2 of a worker that declared 2 envs (0 and 1)
    worker.send(samples_message(segments([0, 0, 2, 2], [1, 0, 1, 0], [0, 0, 0, 0]), "w", worker.session, 1, 2))
    reason = worker.expect(MsgType.NACK).body["reason"]
    assert "has rows of env 2 (row 2), but the worker declared 2 envs at HELLO" in reason and "'w'" in reason
    # env 1's first row ends a transition: its previous row is env 0's
    worker.send(samples_message(segments([0, 0, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]), "w", worker.session, 2, 3))
    wait_until(lambda: srv.stats["rejected"] >= 2, 5, "the joining packet refused", poll=0.02)
    assert srv.stats["samples_in"] == 0
    worker.send(samples_message(segments([0, 0, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]), "w", worker.session, 3, 2))
    wait_until(lambda: srv.stats["samples_in"] == 2, 5, "a packet of two proper segments accepted", poll=0.02)
