"""The layout checks cover extra actor outputs: the server (the trainer's SCHEMA) and the trainer refuse a packet
missing a declared extra, carrying an undeclared one, with one of another dtype or shape, or a non-finite one, naming
the worker, the field and the row; the wire refuses a malformed extra name."""

from __future__ import annotations

import logging
from collections.abc import Callable

import gymnasium
import numpy as np
import pytest

from netrl.errors import MalformedMessage
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import buffer_from_message, decode, encode, samples_message
from netrl.samples import Buffer
from netrl.samples.value_limits import ValueLimits
from netrl.training.safeguards import Safeguards
from tests.fakes import MakeServer, sample_buffer
from tests.protocol.layout_cases import SilentLink, server_nacks

DECLARED = {"action_log_prob": ((), "float32"), "state_value": ((), "float32")}
# sample_buffer's layout: act 2 floats, obs a tuple of 3 and 2 floats
SCHEMA = SampleSchema.from_spaces(
    gymnasium.spaces.Tuple((gymnasium.spaces.Box(-9, 9, (3,)), gymnasium.spaces.Box(-9, 9, (2,)))),
    gymnasium.spaces.Box(-9, 9, (2,)), extra=DECLARED)


def with_extras(n: int = 10) -> Buffer:
    buf = sample_buffer(n)
    buf.extra = {"action_log_prob": np.linspace(-3, 0, n, dtype=np.float32),
                 "state_value": np.arange(n, dtype=np.float32)}
    return buf


def missing(buf: Buffer) -> None:
    del buf.extra["state_value"]  # type: ignore[union-attr]


def undeclared(buf: Buffer) -> None:
    buf.extra["entropy"] = np.ones(len(buf), np.float32)  # type: ignore[index]


def float64(buf: Buffer) -> None:
    buf.extra["state_value"] = buf.extra["state_value"].astype(np.float64)  # type: ignore[index]


def per_row_pair(buf: Buffer) -> None:
    buf.extra["state_value"] = np.zeros((len(buf), 2), np.float32)  # type: ignore[index]


def nan_in_row_6(buf: Buffer) -> None:
    buf.extra["action_log_prob"][6] = np.nan  # type: ignore[index]


BAD: list[tuple[Callable[[Buffer], None], str]] = [
    (missing, "it lacks the extra output 'state_value', which the trainer's actor declares"),
    (undeclared, "it carries the extra output 'entropy', which the trainer's actor does not declare"),
    (float64, "field 'extra/state_value' has dtype <f8 and row shape (); the trainer expects <f4 and ()"),
    (per_row_pair, "field 'extra/state_value' has dtype <f4 and row shape (2,); the trainer expects <f4 and ()"),
    (nan_in_row_6, "extra[action_log_prob] row 6 is nan: values must be finite"),
]


def test_the_schema_lists_the_extras_as_leaves_and_survives_the_wire() -> None:
    assert SCHEMA.leaves["extra/action_log_prob"] == ("<f4", ())
    assert SampleSchema.from_wire(SCHEMA.to_wire()) == SCHEMA
    body = SCHEMA.to_wire()
    body["leaves"].append(["extra/Not-A-Name", "<f4", []])
    with pytest.raises(MalformedMessage, match="schema leaves do not match"):
        SampleSchema.from_wire(body)


def test_the_server_refuses_each_bad_extra_naming_the_worker_field_and_row(make_server: MakeServer) -> None:
    for (spoil, _), nack in zip(BAD, server_nacks(make_server, SCHEMA, BAD, with_extras), strict=True):
        # another layout than the trainer's is the trainer's to fix: the NACK names the layout, and the worker keeps
        # the packet for a trainer with its own; bad values are refused for good
        assert ("layout" in nack) == (spoil is not nan_in_row_6), nack


def test_the_trainer_refuses_each_bad_extra_naming_the_worker_field_and_row(caplog: pytest.LogCaptureFixture) -> None:
    link = SilentLink(SCHEMA)
    try:
        with caplog.at_level(logging.WARNING, logger="netrl.trainer.link"):
            for seq, (spoil, reason) in enumerate(BAD, 1):
                buf = with_extras()
                spoil(buf)
                assert link.deliver(seq, buf) == []
                assert "'robot-1' (via the server)" in caplog.records[-1].getMessage()
                assert reason in caplog.records[-1].getMessage()
        (kept,) = link.deliver(99, with_extras())
    finally:
        link.halt()
    # the layout's four go back to the server for a trainer of theirs (the ACK names them), the NaN
    # is refused for good
    assert link.stats["layout_refused"] == len(BAD) - 1 and link.stats["rejected"] == 1
    acks = [decode(frames).body for frames in link.sent[-len(BAD) - 1:]]
    assert acks == [*({"seqs": [seq], "layout_refused": [0]} for seq in range(1, len(BAD))),
                    {"seqs": [len(BAD)], "rejected": [0]}, {"seqs": [99]}]
    assert kept.extra is not None and (kept.extra["state_value"] == np.arange(10)).all()


@pytest.mark.parametrize("name", ["extra/Bad", "extra/" + "x" * 33, "extra/"])
def test_the_wire_refuses_an_extra_whose_name_is_not_an_identifier(name: str) -> None:
    msg = samples_message(with_extras(), "robot-1", "s1", 4, 40)
    msg.arrays[name] = np.zeros(10, np.float32)
    with pytest.raises(MalformedMessage, match=r"samples packet 4 from 'robot-1': array .* names an extra output that "
                                               "is not a lowercase identifier of at most 32 characters"):
        decode(encode(msg))


def test_extras_round_trip_the_wire_and_a_packet_without_them_has_none() -> None:
    buf = with_extras()
    back = buffer_from_message(decode(encode(samples_message(buf, "w", "s", 1, 0))))
    assert back.extra is not None and back.extra.keys() == buf.extra.keys()  # type: ignore[union-attr]
    for name, col in back.extra.items():
        assert col.dtype == np.float32 and (col == buf.extra[name]).all()  # type: ignore[index]
    assert buffer_from_message(decode(encode(samples_message(sample_buffer(4), "w", "s", 1, 0)))).extra is None


def test_the_training_loop_refuses_a_non_finite_extra_also_from_the_sample_log(
        caplog: pytest.LogCaptureFixture) -> None:
    # Safeguards check every packet the loop stores, those replayed from the sample log too (which no schema sees)
    guards = Safeguards(ValueLimits(), agent=None, max_nonfinite_steps=0)
    buf = with_extras()
    buf.extra["state_value"][3] = -np.inf  # type: ignore[index]
    with caplog.at_level(logging.WARNING):
        assert guards.refuse(buf, new=False)
    assert "extra[state_value] row 3 is -inf: values must be finite" in caplog.text
    assert not guards.refuse(with_extras(), new=True) and guards.refused == 0
