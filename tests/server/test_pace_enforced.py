"""PACE enforced: while the trainer paces, the server holds back (NACKs) a worker's packets beyond its allowance, so a
worker that ignores its allowance cannot take the other workers' share; a real-time worker is never held."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from netrl.net.thread import Command, command_head
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import decode, encode, samples_message, split_bundle
from netrl.server.server import Server
from netrl.worker.link import WorkerLink
from tests.fakes import NET, Peer, sample_buffer, wait_until

LEAD = 60  # samples the fake trainer wants beyond those it has trained on (trainer.worker_lead)
RATE = 300.0  # samples it trains on per second, at most: an update-to-data ratio of 1 at 300 steps/s


class PacingTrainer:
    """A trainer that takes every bundle, acknowledges it, and trains at RATE samples/s on what it has: it wants
    LEAD samples more than it has trained on, as a trainer holding its update-to-data ratio does, so samples that
    arrive faster than it trains leave no allowance for anyone. It counts the samples it got from each worker."""

    def __init__(self, ctx: zmq.Context, port: int) -> None:
        self.peer = Peer(ctx, port, "trainer", "trainer")
        assert self.peer.hello().type is MsgType.WELCOME
        self.got: dict[str, int] = {}
        self.seen: set[tuple[str, int]] = set()
        self.trained, self.clock = 0.0, time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def samples(self) -> int:
        return sum(self.got.values())

    def _progress(self) -> None:
        now = time.monotonic()
        self.trained, self.clock = min(self.samples(), self.trained + RATE * (now - self.clock)), now
        self.peer.send(Message(MsgType.PROGRESS, "trainer", body={"trained_steps": int(self.trained),
                                                                  "samples": self.samples(),
                                                                  "wanted": int(self.trained) + LEAD}))

    def _run(self) -> None:
        self.peer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 8}))
        self._progress()
        while not self.stop.is_set():
            msg = self.peer.recv(0.05)
            if msg is None or msg.type is not MsgType.BUNDLE:
                self._progress()  # also keeps the link alive
                continue
            for part in split_bundle(msg):
                sample = decode(part)
                if (sample.sender, sample.seq) not in self.seen:
                    self.seen.add((sample.sender, sample.seq))
                    steps = int((~(sample.arrays["reset"] | sample.arrays["context"])).sum())
                    self.got[sample.sender] = self.got.get(sample.sender, 0) + steps
            self.peer.send(Message(MsgType.ACK, "trainer", body={"seqs": [msg.seq]}))
            self.peer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 1}))
            self._progress()


class HonestWorker:
    """A throttled worker's delivery path with a synthetic env: it produces only what its PACE allows."""

    def __init__(self, port: int, name: str) -> None:
        self.name, self.session, self.produced = name, f"{name}-session", 0
        self.link = WorkerLink(NET, name, self.session, port, None, 1 << 20, 1 << 20, lambda: self.produced)
        self.link.link.hello_extra = {"max_rows": 5, "paced": True}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        self.link.start()
        seq = 0
        while not self.stop.is_set():
            with self.link.pace_cond:
                self.link.pace_cond.wait_for(lambda: self.link.allowance > self.produced or self.stop.is_set(), 0.05)
                steps = min(4, self.link.allowance - self.produced)
            if steps <= 0:
                continue
            seq += 1
            self.produced += steps  # a packet of `steps` transitions after an episode's first observation
            frames = encode(samples_message(sample_buffer(steps + 1), self.name, self.session, seq, self.produced))
            self.link.hand_over([command_head(Command.PACKET, seq, steps), *frames])


@pytest.fixture
def stoppable() -> Iterator[list[threading.Event]]:
    events: list[threading.Event] = []
    yield events
    for event in events:
        event.set()


@pytest.mark.server(min_samples_per_server_packet=1)
def test_a_worker_that_ignores_its_allowance_cannot_take_the_honest_workers_share(
        server: tuple[Server, zmq.Context], stoppable: list[threading.Event]) -> None:
    srv, ctx = server
    trainer = PacingTrainer(ctx, srv.trainer_port)
    honest = [HonestWorker(srv.worker_port, f"honest{i}") for i in range(2)]
    greedy = Peer(ctx, srv.worker_port, "worker", "greedy")
    assert greedy.hello().type is MsgType.WELCOME
    stoppable.extend([trainer.stop, *(w.stop for w in honest)])
    trainer.thread.start()
    for worker in honest:
        worker.thread.start()
    nacks: list[str] = []
    try:
        wait_until(lambda: len(srv.peers.workers()) == 3, 5, "three workers", poll=0.02)
        seq, deadline = 0, time.monotonic() + 6.0
        while time.monotonic() < deadline and min(w.produced for w in honest) < 3 * LEAD:
            for _ in range(20):  # as fast as it can, whatever its PACE says
                seq += 1
                greedy.send(samples_message(sample_buffer(5), "greedy", greedy.session, seq, 4 * seq))
            while (msg := greedy.recv(0.001)) is not None:
                if msg.type is MsgType.NACK:
                    nacks.append(msg.body["reason"])
        # each honest worker keeps getting its share: many PACE rounds, not a stall at its first allowance
        assert min(w.produced for w in honest) >= 3 * LEAD, [w.produced for w in honest]
        assert any("over this worker's PACE allowance" in reason for reason in nacks)
        assert srv.stats["pace_refusals"] > 0
        got = dict(trainer.got)
        assert got.get("greedy", 0) <= got["honest0"] + got["honest1"]  # its share, not the others'
    finally:
        trainer.stop.set()
        for worker in honest:
            worker.stop.set()
            worker.thread.join(5)
            worker.link.halt()
        trainer.thread.join(5)


@pytest.mark.server(unpaced_workers=["robot"])  # the operator names it (without CURVE, by its name)
def test_a_real_time_worker_is_never_held_for_pacing(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    assert trainer.hello().type is MsgType.WELCOME
    trainer.send(Message(MsgType.PROGRESS, "trainer", body={"trained_steps": 0, "samples": 0, "wanted": 8}))
    robot = Peer(ctx, srv.worker_port, "worker", "robot")
    robot.send(Message(MsgType.HELLO, "robot", body={"role": "worker", "netrl_version": "0.1.0", "worker_id": "robot",
                                                     "session": robot.session, "max_rows": 5, "paced": False}))
    assert robot.expect(MsgType.WELCOME).type is MsgType.WELCOME
    for seq in range(1, 11):  # 40 samples: five times what the trainer asked for
        robot.send(samples_message(sample_buffer(5), "robot", robot.session, seq, 4 * seq))
    wait_until(lambda: srv.stats["samples_in"] == 40, 5, "every sample accepted", poll=0.02)
    assert srv.stats["pace_refusals"] == 0
