"""worker.init_random_frames through the network: the server tells workers how many samples the trainer holds, and a
worker acts at random until that reaches its init_random_frames, then with its actor for good."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import zmq

from netrl.actor import ActorModule
from netrl.envs.gym import GenericGymEnv
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import buffer_from_message, decode, split_bundle
from netrl.server.server import Server
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, Peer, wait_until

POLICY = 0.5  # the actor's one action: a random action in [-2, 2] is never exactly this


class SlowPendulum(GenericGymEnv):
    """Pendulum at about 1000 steps/s at most: an unthrottled worker makes a few hundred rows per wait, not 100,000."""

    def step(self, action: Any) -> Any:
        time.sleep(0.001)
        return super().step(action)


class FixedActor(ActorModule):
    def act(self, obs: Any, test: bool = False) -> Any:
        return np.full(1, POLICY, np.float32)


class FakeTrainer(Peer):
    """Takes bundles (and acknowledges them) and tells the server how many samples it holds (a PROGRESS)."""

    def __init__(self, ctx: zmq.Context, port: int) -> None:
        super().__init__(ctx, port, "trainer", "trainer")
        assert self.hello().type is MsgType.WELCOME
        self.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 10_000}))
        self.actions: list[np.ndarray] = []  # every transition's action, in the order they arrived
        self.beat = time.monotonic()

    def holds(self, samples: int, wanted: int) -> None:
        """A PROGRESS: the trainer holds ``samples`` and wants ``wanted`` in all (the throttled worker's pace)."""
        self.send(Message(MsgType.PROGRESS, "trainer", body={"trained_steps": 0, "samples": samples,
                                                             "wanted": wanted}))

    def take(self) -> None:
        """What has arrived (waiting up to 50 ms for a first message): a worker that streams never leaves a gap."""
        self._beat()
        msg = self.recv(0.05)
        while msg is not None:
            if msg.type is MsgType.BUNDLE:
                self.send(Message(MsgType.ACK, "trainer", body={"seqs": [msg.seq]}))
                for part in split_bundle(msg):
                    buf = buffer_from_message(decode(part))
                    self.actions += list(buf.act[~(buf.reset | buf.context)])
            msg = self.recv(0)

    def _beat(self) -> None:
        if time.monotonic() - self.beat > 0.1:  # a silent peer is lost after 1 s (NET), even while bundles stream in
            self.send(Message(MsgType.HEARTBEAT, "trainer"))
            self.beat = time.monotonic()

    def received(self, n: int) -> bool:
        self.take()
        return len(self.actions) >= n


@pytest.mark.parametrize("throttle", [True, False])
def test_a_worker_acts_at_random_until_the_trainer_holds_init_random_frames_then_with_its_actor_for_good(
        server: tuple[Server, zmq.Context], throttle: bool) -> None:
    srv, ctx = server
    worker = RolloutWorker(partial(SlowPendulum, id="Pendulum-v1"), FixedActor, server_ip="127.0.0.1",
                           server_port=srv.worker_port, network=NET, min_samples_per_worker_packet=10,
                           max_packet_delay_s=0.05, worker_id="w1", seed=3, init_random_frames=100,
                           throttle=throttle)
    worker.start()  # (builds the env first: the fake trainer's heartbeats start with the waits below)
    trainer = FakeTrainer(ctx, srv.trainer_port)
    trainer.holds(0, 200)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, kwargs={"stop": stop})
    thread.start()
    try:
        wait_until(lambda: trainer.received(150), 20, "150 samples at the trainer", poll=0.01)
        before = np.array(trainer.actions)
        assert np.all(before != POLICY) and np.all(np.abs(before) <= 2)  # the trainer holds 0 < 100: all random
        trainer.holds(100, 400)  # what a trainer's PROGRESS says once its memory holds them
        wait_until(lambda: trainer.received(1) and trainer.actions[-1] == POLICY, 20,
                   "the actor's actions at the trainer", poll=0.01)
        trainer.holds(0, 600)  # e.g. a trainer restarted on an empty run folder: no going back to random actions
        n = len(trainer.actions)
        wait_until(lambda: trainer.received(n + 100), 20, "100 more samples", poll=0.01)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    after = np.array(trainer.actions)
    switch = int(np.argmax(after == POLICY))
    assert switch >= 150 and np.all(after[:switch] != POLICY) and np.all(after[switch:] == POLICY)
    assert worker.random_frames is not None and worker.random_frames.done
    assert worker.random_frames.trainer_samples == 100  # the restarted trainer's 0 came too late to matter
