"""The layout checks cover env info entries (``info/<name>``): the server (the trainer's SCHEMA) and the trainer
refuse a packet missing a declared info key, carrying an undeclared one, with one of another dtype or shape, or a
non-finite one, naming the worker and the field, and stay up; the wire refuses a malformed info name."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import pytest

from netrl.config.sections import NetworkConfig
from netrl.errors import MalformedMessage
from netrl.net.transport import new_session
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import buffer_from_message, decode, encode, samples_message
from netrl.samples import Buffer
from netrl.samples.info import InfoKey, check_info_keys, info_spec
from netrl.trainer.delivery import Deliveries
from netrl.trainer.link import TrainerLink
from tests.fakes import MakeServer, Peer, sample_buffer, wait_until

KEYS = check_info_keys([InfoKey("distance", "float32"), InfoKey("is_success", "bool"),
                        InfoKey("contacts", "int16", (2,))], "test")
# sample_buffer's layout: act 2 floats, obs a tuple of 3 and 2 floats
SCHEMA = SampleSchema.from_spaces(
    gymnasium.spaces.Tuple((gymnasium.spaces.Box(-9, 9, (3,)), gymnasium.spaces.Box(-9, 9, (2,)))),
    gymnasium.spaces.Box(-9, 9, (2,)), info=info_spec(KEYS))


def with_info(n: int = 10) -> Buffer:
    buf = sample_buffer(n)
    buf.info = {"distance": np.linspace(0, 1, n, dtype=np.float32), "is_success": np.arange(n) % 3 == 0,
                "contacts": np.arange(2 * n, dtype=np.int16).reshape(n, 2)}
    return buf


def missing(buf: Buffer) -> None:
    del buf.info["is_success"]  # type: ignore[union-attr]


def undeclared(buf: Buffer) -> None:
    buf.info["lives"] = np.ones(len(buf), np.int64)  # type: ignore[index]


def float64(buf: Buffer) -> None:
    buf.info["distance"] = buf.info["distance"].astype(np.float64)  # type: ignore[index]


def one_contact(buf: Buffer) -> None:
    buf.info["contacts"] = np.zeros(len(buf), np.int16)  # type: ignore[index]


def nan_in_row_4(buf: Buffer) -> None:
    buf.info["distance"][4] = np.nan  # type: ignore[index]


BAD: list[tuple[Callable[[Buffer], None], str]] = [
    (missing, "it lacks the info key 'is_success', which the trainer's pipeline declares"),
    (undeclared, "it carries the info key 'lives', which the trainer's pipeline does not declare"),
    (float64, "field 'info/distance' has dtype <f8 and row shape (); the trainer expects <f4 and ()"),
    (one_contact, "field 'info/contacts' has dtype <i2 and row shape (); the trainer expects <i2 and (2,)"),
    (nan_in_row_4, "info[distance] row 4 is nan: values must be finite"),
]


def test_the_schema_lists_the_info_keys_as_leaves_and_survives_the_wire() -> None:
    assert SCHEMA.leaves["info/distance"] == ("<f4", ())
    assert SCHEMA.leaves["info/is_success"] == ("|b1", ())
    assert SCHEMA.leaves["info/contacts"] == ("<i2", (2,))
    assert SampleSchema.from_wire(SCHEMA.to_wire()) == SCHEMA
    assert SampleSchema.of_packet(*_decoded(with_info())).tag == SCHEMA.tag  # a fitting packet: the same layout
    body = SCHEMA.to_wire()
    body["leaves"].append(["info/Not-A-Name", "<f4", []])
    with pytest.raises(MalformedMessage, match="schema leaves do not match"):
        SampleSchema.from_wire(body)


def _decoded(buf: Buffer) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    msg = decode(encode(samples_message(buf, "w", "s", 1, 0)))
    return msg.body, msg.arrays


def test_the_server_refuses_each_bad_info_column_naming_the_worker_and_field(make_server: MakeServer) -> None:
    srv, ctx = make_server()
    trainer = Peer(ctx, srv.trainer_port, "trainer", "trainer")
    trainer.hello()
    trainer.send(Message(MsgType.SCHEMA, "trainer", body=SCHEMA.to_wire()))
    wait_until(lambda: srv.schema is not None, 5, "the schema", poll=0.02)
    trainer.send(Message(MsgType.BYE, "trainer"))  # the server keeps its schema, and spools (and acknowledges) at once
    wait_until(lambda: srv.peers.trainer is None, 5, "the trainer gone", poll=0.02)
    worker = Peer(ctx, srv.worker_port, "worker", "robot-1")
    worker.hello()
    for seq, (spoil, reason) in enumerate(BAD, 1):
        buf = with_info()
        spoil(buf)
        worker.send(samples_message(buf, "robot-1", worker.session, seq, seq * 10))
        nack = worker.expect(MsgType.NACK)
        assert nack.body["seqs"] == [seq] and nack.body["retry_s"] == 0
        assert "robot-1" in nack.body["reason"] and reason in nack.body["reason"], nack.body["reason"]
        assert ("layout" in nack.body) == (spoil is not nan_in_row_4), nack.body
        if spoil in (missing, undeclared):
            assert "same pipeline, with the same env.info_keys" in nack.body["reason"]
    worker.send(samples_message(with_info(), "robot-1", worker.session, 99, 999))
    assert worker.expect(MsgType.ACK).body["seqs"] == [99]  # the server carries on, and takes a packet that fits
    assert (srv.stats["layout_refusals"], srv.stats["rejected"]) == (len(BAD) - 1, 1)


class SilentLink(TrainerLink):
    """A TrainerLink fed bundles by hand: what it would send to the server is kept, not sent."""

    def __init__(self) -> None:
        super().__init__(NetworkConfig(), "trainer", new_session(), 1, 8, Deliveries(), None, SCHEMA, None, 0.0,
                         dict)
        self.sent: list[Any] = []
        self.link.send = self.sent.append  # type: ignore[method-assign,assignment]

    def deliver(self, seq: int, buf: Buffer) -> list[Buffer]:
        part = [bytes(f) for f in encode(samples_message(buf, "robot-1", "s1", seq, seq * 10))]
        self.on_message(Message(MsgType.BUNDLE, "server", seq=seq, parts=[part]))
        bufs, _ = self.inbox.pop()
        return bufs  # type: ignore[no-any-return]


def test_the_trainer_refuses_each_bad_info_column_naming_the_worker_and_field(
        caplog: pytest.LogCaptureFixture) -> None:
    link = SilentLink()
    try:
        with caplog.at_level(logging.WARNING, logger="netrl.trainer.link"):
            for seq, (spoil, reason) in enumerate(BAD, 1):
                buf = with_info()
                spoil(buf)
                assert link.deliver(seq, buf) == []
                assert "'robot-1' (via the server)" in caplog.records[-1].getMessage()
                assert reason in caplog.records[-1].getMessage()
                if reason.startswith(("it ", "field")):  # a column of the info keys: their hint
                    assert "the pipeline's info_keys declare them" in caplog.records[-1].getMessage()
        (kept,) = link.deliver(99, with_info())
    finally:
        link.halt()
    assert link.stats["layout_refused"] == len(BAD) - 1 and link.stats["rejected"] == 1
    assert kept.info is not None and (kept.info["contacts"] == np.arange(20).reshape(10, 2)).all()
    assert kept.info["is_success"].dtype == np.bool_ and kept.info["is_success"][[0, 3]].all()


@pytest.mark.parametrize("name", ["info/Bad", "info/" + "x" * 33, "info/", "info/a/b"])
def test_the_wire_refuses_an_info_column_whose_name_is_not_an_identifier(name: str) -> None:
    msg = samples_message(with_info(), "robot-1", "s1", 4, 40)
    msg.arrays[name] = np.zeros(10, np.float32)
    with pytest.raises(MalformedMessage, match=r"samples packet 4 from 'robot-1': array .* names an info key that "
                                               "is not a lowercase identifier of at most 32 characters"):
        decode(encode(msg))


def test_the_wire_refuses_more_info_columns_than_a_pipeline_may_declare() -> None:
    msg = samples_message(sample_buffer(3), "robot-1", "s1", 4, 40)
    msg.arrays.update((f"info/k{i}", np.zeros(3, np.float32)) for i in range(17))
    with pytest.raises(MalformedMessage, match="17 info keys, over 16"):
        decode(encode(msg))


def test_info_round_trips_the_wire_and_a_packet_without_it_has_none() -> None:
    buf = with_info()
    back = buffer_from_message(decode(encode(samples_message(buf, "w", "s", 1, 0))))
    assert back.info is not None and back.info.keys() == buf.info.keys()  # type: ignore[union-attr]
    for name, col in back.info.items():
        assert col.dtype == buf.info[name].dtype and (col == buf.info[name]).all()  # type: ignore[index]
    assert buffer_from_message(decode(encode(samples_message(sample_buffer(4), "w", "s", 1, 0)))).info is None


def test_the_wire_refuses_an_info_column_of_another_row_count() -> None:
    msg = samples_message(with_info(), "robot-1", "s1", 4, 40)
    msg.arrays["info/distance"] = np.zeros(3, np.float32)
    with pytest.raises(MalformedMessage, match=r"samples leaf 'info/distance' must have 10 rows"):
        decode(encode(msg))
