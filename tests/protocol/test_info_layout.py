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

from netrl.errors import MalformedMessage
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import buffer_from_message, decode, encode, samples_message
from netrl.samples import Buffer
from netrl.samples.info import InfoKey, check_info_keys, info_spec
from tests.fakes import MakeServer, sample_buffer
from tests.protocol.layout_cases import SilentLink, server_nacks

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
    for (spoil, _), nack in zip(BAD, server_nacks(make_server, SCHEMA, BAD, with_info), strict=True):
        assert ("layout" in nack) == (spoil is not nan_in_row_4), nack
        if spoil in (missing, undeclared):
            assert "same pipeline, with the same env.info_keys" in nack["reason"]


def test_the_trainer_refuses_each_bad_info_column_naming_the_worker_and_field(
        caplog: pytest.LogCaptureFixture) -> None:
    link = SilentLink(SCHEMA)
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
