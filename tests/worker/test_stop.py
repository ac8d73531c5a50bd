"""Stops that tell the truth: a packet the server has on its disk spool is safe, the server says so, and a stopping
worker counts it as safe; a worker stopped while the trainer lags exits 0 and says its samples are spooled."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import zmq

from netrl.config.load import load_config
from netrl.net.liveness import Liveness
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import decode, split_bundle
from netrl.server.counters import ServerCounters
from netrl.server.outbound import Outbound
from netrl.server.peers import Peer as ServerPeer
from netrl.server.weight_cache import WeightCache
from tests.fakes import Peer, running_server, small_config, wait_until


def test_a_worker_stopped_while_the_trainer_lags_exits_0_and_its_samples_reach_the_trainer_later(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from netrl.__main__ import main

    config = small_config(tmp_path, security="none", worker={"throttle": False, "flush_timeout_s": 2.0,
                                                             "max_samples_per_episode": 60})
    cfg = load_config(config)
    net = cfg.network
    # a trainer that took one bundle and then nothing: the server holds the rest for it, spooling them only after
    # spool_after_s, far beyond the worker's flush_timeout_s
    with running_server(trainer_port=net.trainer_port, worker_port=net.worker_port, network=net,
                        spool_dir=tmp_path / "spool", spool_after_s=30.0,
                        min_samples_per_server_packet=1) as (srv, ctx):
        trainer = Peer(ctx, net.trainer_port, "trainer", "trainer")
        assert trainer.hello().type is MsgType.WELCOME
        trainer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 1}))
        got: dict[tuple[str, int], int] = {}
        stop = threading.Event()

        def take() -> None:  # the lagging trainer's network thread: it acknowledges what it gets
            while not stop.is_set():
                msg = trainer.recv(0.05)
                if msg is None or msg.type is not MsgType.BUNDLE:
                    trainer.send(Message(MsgType.HEARTBEAT, "trainer"))
                    continue
                for part in split_bundle(msg):
                    sample = decode(part)
                    got[(sample.sender, sample.seq)] = int((~(sample.arrays["reset"] | sample.arrays["context"])).sum())
                trainer.send(Message(MsgType.ACK, "trainer", body={"seqs": [msg.seq]}))

        thread = threading.Thread(target=take)
        thread.start()
        try:
            assert main(["--worker", "--config", str(config), "--episodes", "1"]) == 0
            out = capfd.readouterr()
            text = out.out + out.err
            assert "60 samples produced" in text and "0 unacknowledged" in text, text[-3000:]
            assert "of the acknowledged samples are spooled at the server" in text
            assert "exited cleanly" in text and "lost" not in text
            assert srv.stats["samples_spooled"] > 0
            trainer.send(Message(MsgType.CREDIT, "trainer", body={"bundles": 100}))  # it catches up
            wait_until(lambda: sum(got.values()) == 60, 10, "every sample at the trainer", poll=0.05)
        finally:
            stop.set()
            thread.join(5)


def test_spooled_and_delivered_acknowledgements_are_never_merged_into_one() -> None:
    # a worker whose queue is full gets its ACKs later, merged: "spooled" must stay apart from "the trainer has it"
    class FullSocket:
        def send_multipart(self, frames: list[Any], flags: int = 0, copy: bool = True) -> None:
            raise zmq.Again()

    sockets = type("Sockets", (), {"by_role": {"worker": FullSocket()}})()
    out = Outbound(sockets, ServerCounters(), WeightCache(1 << 20), lambda peer, why: None)  # type: ignore[arg-type]
    peer = ServerPeer(b"w1", "worker", "w1", "s" * 16, "127.0.0.1", Liveness(1.0, 3))
    for seq, spooled in ((1, False), (2, False), (3, True), (4, True), (5, False)):
        out.must_send(peer, Message(MsgType.ACK, "server", body={"seqs": [seq], **({"spooled": True} if spooled
                                                                                   else {})}))
    assert [(m.body["seqs"], bool(m.body.get("spooled"))) for m in out.outboxes[b"w1"]] == [
        ([1, 2], False), ([3, 4], True), ([5], False)]
