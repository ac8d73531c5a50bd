"""What the layout tests of declared columns (extra outputs, info keys) share: a server that holds
a trainer's schema and refuses each spoiled packet, and a TrainerLink fed bundles by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from netrl.config.sections import NetworkConfig
from netrl.net.transport import new_session
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import encode, samples_message
from netrl.samples import Buffer
from netrl.trainer.delivery import Deliveries
from netrl.trainer.link import TrainerLink
from tests.fakes import MakeServer, Peer, wait_until

Spoil = Callable[[Buffer], None]


def server_nacks(make_server: MakeServer, schema: SampleSchema, bad: list[tuple[Spoil, str]],
                 fits: Callable[[], Buffer]) -> list[dict[str, Any]]:
    """The NACK bodies a server holding ``schema`` (its trainer gone) sends worker 'robot-1' for
    each packet ``fits()`` spoiled by a case of ``bad``, each checked to name the worker and the
    case's reason; then a packet that fits is acknowledged (the server carries on), and every
    refusal but one (a value refused for good) was counted as a layout refusal."""
    srv, ctx = make_server()
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()
    trainer.send(Message(MsgType.SCHEMA, "trainer", body=schema.to_wire()))
    wait_until(lambda: srv.schema is not None, 5, "the schema", poll=0.02)
    trainer.send(Message(MsgType.BYE, "trainer"))  # the server keeps its schema, and spools (and acknowledges) at once
    wait_until(lambda: srv.peers.trainer is None, 5, "the trainer gone", poll=0.02)
    worker = Peer(ctx, srv.worker_port, "worker", "robot-1")
    worker.hello()
    nacks = []
    for seq, (spoil, reason) in enumerate(bad, 1):
        buf = fits()
        spoil(buf)
        worker.send(samples_message(buf, "robot-1", worker.session, seq, seq * 10))
        nack = worker.expect(MsgType.NACK)
        assert nack.body["seqs"] == [seq] and nack.body["retry_s"] == 0
        assert "robot-1" in nack.body["reason"] and reason in nack.body["reason"], nack.body["reason"]
        nacks.append(nack.body)
    worker.send(samples_message(fits(), "robot-1", worker.session, 99, 999))
    assert worker.expect(MsgType.ACK).body["seqs"] == [99]  # the server carries on, and takes a packet that fits
    assert (srv.stats["layout_refusals"], srv.stats["rejected"]) == (len(bad) - 1, 1)
    return nacks


class SilentLink(TrainerLink):
    """A TrainerLink fed bundles by hand: what it would send to the server is kept, not sent."""

    def __init__(self, schema: SampleSchema) -> None:
        super().__init__(NetworkConfig(), "trainer", new_session(), 1, 8, Deliveries(), None, schema, None, 0.0,
                         dict)
        self.sent: list[Any] = []
        self.link.send = self.sent.append  # type: ignore[method-assign,assignment]

    def deliver(self, seq: int, buf: Buffer) -> list[Buffer]:
        part = [bytes(f) for f in encode(samples_message(buf, "robot-1", "s1", seq, seq * 10))]
        self.on_message(Message(MsgType.BUNDLE, "server", seq=seq, parts=[part]))
        bufs, _ = self.inbox.pop()
        return bufs  # type: ignore[no-any-return]
