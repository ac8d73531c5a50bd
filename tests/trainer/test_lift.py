"""--lift end to end (issue 43, item 1, after an outside check): the operator's request goes to a
real server, on to the trainer's link, into the training loop's ingest, and the answer comes back
naming what was released; the trainer's report then reaches the server's --status."""

from __future__ import annotations

import threading
from typing import Any

import zmq

from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import samples_message
from netrl.server.revocation import ask_operator
from netrl.server.server import Server
from netrl.trainer.delivery import Deliveries
from netrl.trainer.link import TrainerLink
from tests.fakes import NET, Peer, wait_until
from tests.trainer.test_revocation import sampled_workers
from tests.training.test_plausibility import WARM, packet, training


def test_lift_on_a_running_trainer_releases_the_quarantined_rows_and_answers(
    server: tuple[Server, zmq.Context],
) -> None:
    srv, ctx = server
    t = training()
    assert t.memory is not None
    link = TrainerLink(NET, "trainer", "t" * 16, srv.trainer_port, 8, Deliveries(), None)
    link.start()
    try:
        wait_until(lambda: link.link.ready, 5, "the trainer connected", poll=0.02)
        workers = [Peer(ctx, srv.worker_port, "worker", name) for name in ("w1", "w2")]
        for worker in workers:
            assert worker.hello().type is MsgType.WELCOME
        for seq in range(1, WARM + 1):
            for worker in workers:
                worker.send(samples_message(packet(seq, worker.name), worker.name,
                                            worker.session, seq, 40 * seq))
        w2 = workers[1]
        w2.send(samples_message(packet(WARM + 1, "w2", reward=1e5), "w2", w2.session,
                                WARM + 1, 40 * (WARM + 1)))
        wait_until(lambda: t.ingest(link) >= 0 and t.ingester is not None
                   and t.ingester.plausibility.workers.get("w2") is not None
                   and t.ingester.plausibility.workers["w2"].quarantined,
                   10, "w2 quarantined", poll=0.05)

        def reported(check: Any) -> bool:
            """The loop's ingest makes a report once a second; its next PROGRESS carries it."""
            t.ingest(link)
            link.progress(0, 0, 0)
            return bool(check(srv.snapshot()))

        wait_until(lambda: reported(lambda s: "w2" in s.get("quarantined", {})), 5, "the report",
                   poll=0.1)
        assert srv.snapshot()["quarantined"]["w2"]["rows"] == 40
        assert sampled_workers(t) == {"w1"}
        answers: list[dict[str, Any]] = []
        asking = threading.Thread(target=lambda: answers.append(ask_operator(
            "127.0.0.1", srv.trainer_port,
            Message(MsgType.LIFT, "operator", body={"worker": "w2"}), None, timeout_s=10)))
        asking.start()
        wait_until(lambda: t.ingest(link) >= 0 and bool(answers), 10, "the answer", poll=0.05)
        asking.join()
        assert answers[0]["was"] and (answers[0]["packets"], answers[0]["rows"]) == (1, 40)
        assert answers[0]["hidden"] == WARM * 40 and "lifted" in answers[0]["reason"]
        assert sampled_workers(t) == {"w1", "w2"}
        wait_until(lambda: reported(lambda s: s.get("quarantined") == {}), 5, "the next report",
                   poll=0.1)
        assert srv.snapshot()["replay"]["w2"]["rows"] == (WARM + 1) * 40
    finally:
        link.halt()
