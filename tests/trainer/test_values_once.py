"""A packet's values are checked once on the trainer: on arrival, by its network thread, which
never logs or keeps a packet it refuses; the training loop checks only what no one checked with
its limits (packets replayed from the sample log, other sources)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest

from netrl.envs.checks import value_limits
from netrl.errors import SampleRejected
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import decode, encode, samples_message
from netrl.samples import BufferBuilder
from netrl.samples.value_limits import ValueLimits
from tests.trainer.test_trainer import Links, make_trainer
from tests.trainer.test_trainer import links as links  # the fixture


def test_a_trainer_checks_each_live_packets_values_once_and_each_replayed_one_again(
        tmp_path: Path, links: type[Links], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    problem = ValueLimits.problem

    def counted(self: ValueLimits, *args: Any, **kwargs: Any) -> str | None:
        calls.append(1)
        return problem(self, *args, **kwargs)

    monkeypatch.setattr(ValueLimits, "problem", counted)
    make_trainer(tmp_path, epochs=1).run()
    (link,) = links.made
    assert link.bundles > 3 and len(calls) == link.bundles  # once each, on arrival
    calls.clear()
    make_trainer(tmp_path, epochs=2).run()  # replays the sample log: checked again, then live ones
    replayed_and_live = link.bundles + links.made[1].bundles
    assert len(calls) == replayed_and_live


def test_the_trainers_arrival_check_covers_integer_leaves_the_servers_leaves_to_it() -> None:
    obs, act = gymnasium.spaces.Box(-1, 1, (3,), np.float32), gymnasium.spaces.Discrete(3)
    schema = SampleSchema.from_spaces(obs, act, limits=value_limits(obs, act))
    b = BufferBuilder(4, 1)
    b.add(np.zeros((), np.uint8), np.zeros(3, np.float32), 0.0, False, False, True, 0)
    for a in (1, 7, 2):  # action 7 of a Discrete(3)
        b.add(np.array(a, np.uint8), np.zeros(3, np.float32), 0.0, False, False, False, 0)
    buf = b.cut()
    assert buf is not None
    msg = decode([bytes(f) for f in encode(samples_message(buf, "w", "s" * 16, 1, 3))])
    schema.check(msg.body, msg.arrays, "w")  # the server's: integer arrays may arrive compressed
    with pytest.raises(SampleRejected, match=r"act row 2 is 7, outside action_space's bounds"):
        schema.check(msg.body, msg.arrays, "w", inflated=True)
