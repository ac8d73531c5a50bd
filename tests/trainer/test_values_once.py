"""A packet's values are checked once on the trainer: by its training loop (every packet, those
replayed from the sample log included), not also by its network thread."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from netrl.config.sections import NetworkConfig
from netrl.envs.checks import value_limits
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import decode, encode
from netrl.trainer.delivery import Deliveries
from netrl.trainer.link import TrainerLink
from tests.trainer.test_trainer import ACT, OBS, FakeLink, Links, make_trainer, packet
from tests.trainer.test_trainer import links as links  # the fixture

BAD = "obs row 2, element 1 is 3e+38, outside observation_space's bounds [-1, 1]"


def extreme(session: str, seq: int, version: int) -> list[bytes]:
    """A packet that fits the layout, with one observation of 3e38."""
    msg = decode(packet(session, seq, version))
    msg.arrays = {name: np.array(arr) for name, arr in msg.arrays.items()}
    msg.arrays["obs"][2, 1] = 3e38
    return [bytes(f) for f in encode(msg)]


def test_a_trainers_link_leaves_values_to_its_loop_which_refuses_a_bad_packet_by_name(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    def send_bad(link: FakeLink) -> None:
        link.bundles += 1
        parts = [extreme(link.worker_session, link.bundles, link.version)]
        link.on_message(Message(MsgType.BUNDLE, "server", seq=link.bundles, parts=parts))

    links.at[3] = send_bad
    trainer = make_trainer(tmp_path, epochs=1)
    with caplog.at_level(logging.WARNING):
        trainer.run()
    (link,) = links.made
    assert not link.check_values and link.stats["rejected"] == 0  # not checked twice
    assert trainer.training is not None and trainer.training.safeguards is not None
    assert trainer.training.safeguards.refused == 1
    assert BAD in caplog.text


def test_a_link_without_a_loop_behind_it_still_checks_values(caplog: pytest.LogCaptureFixture) -> None:
    schema = SampleSchema.from_spaces(OBS, ACT, limits=value_limits(OBS, ACT))
    link = TrainerLink(NetworkConfig(), "trainer", "t" * 16, 1, 8, Deliveries(), None, schema)
    sent: list[Message] = []
    link.link.send = lambda frames: sent.append(decode(frames)) or True  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING):
            link.on_message(Message(MsgType.BUNDLE, "server", seq=1,
                                    parts=[extreme("s" * 16, 1, 0)]))
    finally:
        link.halt()
    assert link.check_values and link.stats["rejected"] == 1 and BAD in caplog.text
    assert sent[0].body["rejected"] == [0]  # told back in the bundle's ACK
