"""Pacing that holds at the source: a throttled worker takes a step only when the trainer's PACE allows every row
it makes, one env or many (a vector step is one row per env that collects), and the server grants a vector worker
whole steps, so it never waits for an allowance that cannot come; close() then leaves nothing unacknowledged."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import zmq

from netrl.net.liveness import Liveness
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import decode, split_bundle
from netrl.server.peers import Peer as ServerPeer
from netrl.server.peers import PeerTable
from netrl.server.server import Server
from netrl.worker.link import WorkerLink
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, Counter, Peer, TagActor, wait_until


@pytest.fixture(autouse=True)
def fresh_counters() -> None:
    Counter.made = []


def grant(net: WorkerLink, allowance: int) -> None:
    """A PACE, as the network thread takes it."""
    with net.pace_cond:
        net.allowance, net.paced = allowance, True
        net.pace_cond.notify_all()


def paced_worker(monkeypatch: pytest.MonkeyPatch, num_envs: int, **settings: Any) -> RolloutWorker:
    monkeypatch.setattr(WorkerLink, "start", lambda self: None)  # the test plays the network thread
    worker = RolloutWorker(Counter, TagActor, server_ip="127.0.0.1", worker_id="w", seed=0, throttle=True,
                           num_envs=num_envs, min_samples_per_worker_packet=1000, **settings)
    worker.start()
    return worker


@pytest.mark.parametrize("num_envs", [1, 4])
def test_a_throttled_worker_never_makes_a_sample_beyond_its_allowance(monkeypatch: pytest.MonkeyPatch,
                                                                       num_envs: int) -> None:
    # 10 allowed: 4 envs take two vector steps (8 rows) and wait, where a third would make 12; one env makes 10
    worker = paced_worker(monkeypatch, num_envs)
    net = worker.net
    assert net is not None
    stop = threading.Event()
    runner = threading.Thread(target=worker.runner.run, args=(stop, 0, None))
    runner.start()
    try:
        for allowance in (10, 13, 16):
            grant(net, allowance)
            expected = allowance // num_envs * num_envs
            wait_until(lambda: net.waiting_for_pace and worker.produced == expected, 10,  # noqa: B023
                       f"{expected} samples, then a wait", poll=0.01)
            assert worker.produced == expected  # still: it waits, and stepped no further meanwhile
    finally:
        stop.set()
        runner.join(10)
        worker.close()
    assert not runner.is_alive()


def test_a_vector_step_waits_for_a_row_of_each_env_that_collects_and_not_for_those_in_a_test_episode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    worker = paced_worker(monkeypatch, 4)
    asked: list[int] = []

    def pace(stop: threading.Event, collect: bool = True, rows: int = 1) -> bool:
        asked.append(rows)
        stop.set()  # and the worker stops before its step
        return False

    monkeypatch.setattr(worker.pacer, "pace", pace)
    try:
        worker.episodes.test[:] = [True, False, True, False]  # two envs run a test episode: their rows are not sent
        worker.runner.run(threading.Event(), 3, None)  # (a test episode after every 3 training ones)
        worker.episodes.test[:] = True  # all of them: nothing to wait for
        worker.runner.run(threading.Event(), 3, None)
    finally:
        worker.close()
    assert asked == [2, 0]


def test_the_server_grants_a_vector_worker_whole_steps_and_paces_it_once_a_step_no_longer_fits() -> None:
    table = PeerTable()
    peers = {}
    for name, envs in (("one", 1), ("eight", 8)):
        peer = peers[name] = ServerPeer(name.encode(), "worker", name, name, "?", Liveness(1.0, 3))
        peer.num_envs = envs
        table.add(peer)
    # 6 wanted, 3 each: the vector worker gets room for a row of each of its 8 envs, or it would wait for ever
    raised = {p.name: a for p, a in table.raised_allowances(6, idle_after_s=10.0)}
    assert raised == {"one": 3, "eight": 8}
    for peer in peers.values():
        peer.granted(raised[peer.name])
    assert table.raised_allowances(0, idle_after_s=10.0) == []  # nothing wanted: no step granted
    # the vector worker made 5 and cannot make 8 more with 3 left: it is out of allowance, and shares what is wanted
    # with the worker that used up its own (an idle worker, with allowance left for long, would not)
    peers["eight"].produced_up_to(5)
    peers["one"].produced_up_to(3)
    peers["eight"].produced_at -= 60  # long ago: only being out of allowance makes it busy
    raised = {p.name: a for p, a in table.raised_allowances(4, idle_after_s=10.0)}
    assert raised == {"one": 3 + 2, "eight": 5 + 8}


class SlowTrainer:
    """A trainer's network side that trains RATE samples a second on what it got, wants LEAD beyond, and takes
    every bundle: far slower than the worker's envs, so the worker waits for PACE most of the time."""

    RATE, LEAD = 200.0, 30

    def __init__(self, ctx: zmq.Context, port: int) -> None:
        self.peer = Peer(ctx, port, "trainer", "trainer")
        assert self.peer.hello().type is MsgType.WELCOME
        self.got: dict[tuple[str, int], int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        self.peer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 8}))
        trained, clock = 0.0, time.monotonic()
        while not self.stop.is_set():
            msg = self.peer.recv(0.02)
            if msg is not None and msg.type is MsgType.BUNDLE:
                for part in split_bundle(msg):
                    sample = decode(part)
                    self.got[(sample.sender, sample.seq)] = int((~(sample.arrays["reset"]
                                                                   | sample.arrays["context"])).sum())
                self.peer.send(Message(MsgType.ACK, "trainer", body={"seqs": [msg.seq]}))
                self.peer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 1}))
            now, samples = time.monotonic(), sum(self.got.values())
            trained, clock = min(samples, trained + self.RATE * (now - clock)), now
            self.peer.send(Message(MsgType.PROGRESS, "trainer", body={
                "trained_steps": int(trained), "samples": samples, "wanted": int(trained) + self.LEAD}))


@pytest.mark.server(min_samples_per_server_packet=1)
def test_close_stops_a_paced_vector_worker_with_every_sample_acknowledged_and_none_held_back(
        monkeypatch: pytest.MonkeyPatch, server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer = SlowTrainer(ctx, srv.trainer_port)
    trainer.thread.start()
    worker = RolloutWorker(Counter, TagActor, server_ip="127.0.0.1", server_port=srv.worker_port, network=NET,
                           worker_id="v", seed=0, throttle=True, num_envs=4, min_samples_per_worker_packet=3)
    runner = threading.Thread(target=worker.run)
    try:
        runner.start()
        wait_until(lambda: worker.produced >= 400, 30, "400 samples, paced", poll=0.05)
        worker.close()  # from another thread: it stops the run and delivers what is left
        runner.join(10)
        assert not runner.is_alive()
        assert worker.samples_unacknowledged == 0
        assert worker.net is not None and worker.net.counts["acked_samples"] == worker.produced
        assert srv.stats["pace_refusals"] == 0  # it never made a sample beyond its allowance
        wait_until(lambda: sum(trainer.got.values()) == worker.produced, 10, "every sample at the trainer",
                   poll=0.05)
    finally:
        trainer.stop.set()
        trainer.thread.join(5)
