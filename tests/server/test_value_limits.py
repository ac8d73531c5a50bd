"""The server checks the values of every packet against the limits in the trainer's SCHEMA (the bounds of float
leaves, the reward bound) and refuses a packet beyond them for good, telling its worker the field, row and value."""

from __future__ import annotations

import numpy as np

from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import samples_message
from netrl.samples import Buffer
from tests.fakes import MakeServer, Peer, sample_buffer, wait_until

# What a trainer sends for sample_buffer's layout: obs (3 floats in [-3, 3], 2 unbounded), act in [-2, 2] x [0, 1]
SCHEMA = {"act": "act", "obs": ["obs/0", "obs/1"],
          "leaves": [["act", "<f4", [2]], ["obs/0", "<f4", [3]], ["obs/1", "<f4", [2]]],
          "limits": {"max_abs_reward": 1e6,
                     "bounds": [["act", [-2.0, 0.0], [2.0, 1.0], [2], "action_space", False],
                                ["obs/0", -3.0, 3.0, [3], "observation_space[0]", False]]}}


def honest(n: int) -> Buffer:
    buf, rng = sample_buffer(n), np.random.default_rng(1)
    buf.act = rng.uniform([-2, 0], [2, 1], (n, 2)).astype(np.float32)
    buf.obs = (rng.uniform(-3, 3, (n, 3)).astype(np.float32), buf.obs[1])
    return buf


def test_the_server_refuses_a_packet_beyond_the_trainers_limits_and_tells_the_worker_why(
        make_server: MakeServer) -> None:
    srv, ctx = make_server()
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()
    trainer.send(Message(MsgType.SCHEMA, "trainer", body=SCHEMA))
    wait_until(lambda: srv.schema is not None, 5, "the schema", poll=0.02)
    trainer.send(Message(MsgType.BYE, "trainer"))  # the server keeps its schema, and spools (and acknowledges) at once
    wait_until(lambda: srv.peers.trainer is None, 5, "the trainer gone", poll=0.02)
    worker = Peer(ctx, srv.worker_port, "worker", "robot-1")
    worker.hello()
    poisoned = honest(10)
    poisoned.rew[7] = -3e38
    worker.send(samples_message(poisoned, "robot-1", worker.session, 1, 10))
    nack = worker.expect(MsgType.NACK)
    assert nack.body["seqs"] == [1] and nack.body["retry_s"] == 0  # refused for good: resending cannot help
    assert "rew row 7 is -3e+38, beyond trainer.max_abs_reward (1e+06)" in nack.body["reason"]
    poisoned.rew[7], poisoned.obs[0][2, 0] = 0.0, 3e38
    worker.send(samples_message(poisoned, "robot-1", worker.session, 2, 20))
    assert "obs[0] row 2, element 0 is 3e+38, outside observation_space[0]'s bounds [-3, 3]" in worker.expect(
        MsgType.NACK).body["reason"]
    worker.send(samples_message(honest(10), "robot-1", worker.session, 3, 30))
    assert worker.expect(MsgType.ACK).body["seqs"] == [3]  # the server carries on
    assert srv.stats["rejected"] == 2
