"""Value limits: what the spaces and trainer.max_abs_reward promise, checked with a margin that float rounding never
crosses, sent to the server in the SCHEMA (parsed there as untrusted input) and enforced at its edge."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import pytest

from netrl.envs.checks import value_limits
from netrl.errors import MalformedMessage, SampleRejected
from netrl.memory.action_buffer import ActionBufferCompressor
from netrl.memory.frames import FrameStackCompressor
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import decode, encode, samples_message
from netrl.samples import Buffer
from netrl.samples.value_limits import Bounds, ValueLimits
from tests.fakes import ACT, sample_buffer

OBS = gymnasium.spaces.Tuple((gymnasium.spaces.Box(-3, 3, (3,), np.float32),
                              gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)))  # sample_buffer's layout


def honest(n: int) -> Buffer:
    """sample_buffer's packet, with its actions and first observations within ACT and OBS."""
    buf, rng = sample_buffer(n), np.random.default_rng(1)
    buf.act = rng.uniform(ACT.low, ACT.high, (n, 2)).astype(np.float32)
    buf.obs = (rng.uniform(-3, 3, (n, 3)).astype(np.float32), buf.obs[1])
    return buf


def columns(buf: Buffer) -> dict[str, np.ndarray]:
    return {"act": buf.act, "obs/0": buf.obs[0], "obs/1": buf.obs[1]}


def test_the_spaces_bound_their_leaves_by_name_with_a_margin_only_float_rounding_fits_in() -> None:
    limits = value_limits(OBS, ACT, max_abs_reward=100.0)
    assert sorted(limits.bounds) == ["act", "obs/0"]  # obs/1 is unbounded: only finiteness is checked
    buf = honest(20)
    assert limits.problem(columns(buf), buf.rew, buf.reset) is None
    buf.obs[0][4, 1] = np.nextafter(np.float32(3), np.float32(4))  # one float32 step past the bound: rounding
    buf.obs[1][5, 0] = 3e38  # finite, unbounded
    assert limits.problem(columns(buf), buf.rew, buf.reset) is None
    buf.obs[0][4, 1] = 3.001
    assert limits.problem(columns(buf), buf.rew, buf.reset) == (
        "obs[0] row 4, element 1 is 3.001, outside observation_space[0]'s bounds [-3, 3]: clip it in the env, or "
        "widen the space's bounds")
    buf.obs[0][4, 1] = 0
    buf.rew[9] = -100.5
    assert "rew row 9 is -100.5, beyond trainer.max_abs_reward (100)" in str(
        limits.problem(columns(buf), buf.rew, buf.reset))
    buf.rew[9] = np.nan
    assert limits.problem(columns(buf), buf.rew, buf.reset) == "rew row 9 is nan: rewards must be finite numbers"


def test_a_reset_rows_placeholder_action_is_checked_for_finiteness_only() -> None:
    limits = value_limits(OBS, ACT)
    buf = honest(6)
    buf.act[0] = [7.0, -3.0]  # row 0 is the episode's first observation: its action is a placeholder
    assert limits.problem(columns(buf), buf.rew, buf.reset) is None
    buf.act[3, 1] = 1.5  # ACT's second element is within [0, 1]
    assert limits.problem(columns(buf), buf.rew, buf.reset) == (
        "act row 3, element 1 is 1.5, outside action_space's bounds [0, 1]: the worker's actor chose it: keep actions "
        "within the action space")
    buf.act[3, 1], buf.act[0, 0] = 0.5, np.inf
    assert limits.problem(columns(buf), buf.rew, buf.reset) == "act row 0, element 0 is inf: values must be finite"


def test_integer_and_discrete_leaves_are_bounded_exactly_and_full_range_images_cost_nothing() -> None:
    obs = gymnasium.spaces.Dict({"image": gymnasium.spaces.Box(0, 255, (4, 4), np.uint8),
                                 "gear": gymnasium.spaces.Discrete(5, start=-1),
                                 "buttons": gymnasium.spaces.MultiDiscrete([2, 3]),
                                 "level": gymnasium.spaces.Box(0, 9, (), np.int64)})
    limits = value_limits(obs, ACT)
    assert sorted(limits.bounds) == ["act", "obs/buttons", "obs/gear", "obs/level"]  # not the uint8 image
    ok = {"obs/gear": np.array([-1, 3]), "obs/buttons": np.array([[1, 2], [0, 0]]), "obs/level": np.array([0, 9])}
    assert limits.problem(ok, np.zeros(2)) is None
    assert limits.problem({**ok, "obs/gear": np.array([-1, 4])}, np.zeros(2)) == (
        "obs[gear] row 1 is 4, outside observation_space['gear']'s bounds [-1, 3]: clip it in the env, or widen the "
        "space's bounds")
    assert "obs[buttons] row 0, element 1 is 3" in str(limits.problem({**ok, "obs/buttons": np.array([[1, 3], [0, 0]])},
                                                                      np.zeros(2)))


def test_a_leaf_a_sample_compressor_changes_loses_its_bounds_and_keeps_the_finiteness_check() -> None:
    frames = gymnasium.spaces.Box(0, 255, (4, 16, 16), np.uint8)
    stacked = SampleSchema.from_spaces(frames, ACT, FrameStackCompressor(), value_limits(frames, ACT))
    assert sorted(stacked.limits.bounds) == ["act"]
    # rtgym's action buffer: the core leaves pass unchanged, the buffer becomes a one-byte seam flag
    buffered = gymnasium.spaces.Tuple((gymnasium.spaces.Box(-1, 1, (2,), np.float32), ACT, ACT))
    schema = SampleSchema.from_spaces(buffered, ACT, ActionBufferCompressor(2), value_limits(buffered, ACT))
    assert sorted(schema.limits.bounds) == ["act", "obs/0"]

    def rescale(act, obs, rew, terminated, truncated, info):  # type: ignore[no-untyped-def]
        return act, obs * 100, rew, terminated, truncated, info

    box = gymnasium.spaces.Box(-1, 1, (3,), np.float32)
    assert sorted(SampleSchema.from_spaces(box, ACT, rescale, value_limits(box, ACT)).limits.bounds) == ["act"]


def schema(max_abs_reward: float = 1e6) -> SampleSchema:
    return SampleSchema.from_spaces(OBS, ACT, None, value_limits(OBS, ACT, max_abs_reward))


def test_the_schema_carries_float_bounds_and_the_reward_bound_to_the_server_and_back() -> None:
    sent = schema(50.0)
    wire = decode(encode(Message(MsgType.SCHEMA, "trainer", body=sent.to_wire())))  # through msgpack and body checks
    got = SampleSchema.from_wire(wire.body)
    assert got == sent and got.limits.max_abs_reward == 50.0 and sorted(got.limits.bounds) == ["act", "obs/0"]
    assert got.limits.bounds["act"].high.tolist() == [2.0, 1.0]
    msg = samples_message(honest(10), "w", "s", 1, 10)
    msg.arrays["rew"][3] = 51.0
    with pytest.raises(SampleRejected, match=r"packet from 'w': rew row 3 is 51, beyond trainer.max_abs_reward"):
        got.check(msg.body, msg.arrays, "'w'")
    old = {k: v for k, v in sent.to_wire().items() if k != "limits"}  # an older trainer's: finiteness only
    assert SampleSchema.from_wire(old).limits == ValueLimits()


@pytest.mark.parametrize("limits", [
    [], {"max_abs_reward": -1.0, "bounds": []}, {"max_abs_reward": "big", "bounds": []},
    {"max_abs_reward": None, "bounds": [["obs/9", 0.0, 1.0, [3], "s", False]]},  # no such leaf
    {"max_abs_reward": None, "bounds": [["act", 0.0, 1.0, [5], "s", False]]},  # another shape
    {"max_abs_reward": None, "bounds": [["act", [0.0], 1.0, [2], "s", False]]},  # one value for two elements
    {"max_abs_reward": None, "bounds": [["act", 2.0, 1.0, [2], "s", False]]},  # low above high
    {"max_abs_reward": None, "bounds": [["act", float("nan"), 1.0, [2], "s", False]]},
    {"max_abs_reward": None, "bounds": [["act", 0.0, 1.0, [2], "s", False]] * 2},
    {"max_abs_reward": None, "bounds": [["act", [0.0] * 5000, 1.0, [2], "s", False]]},
])
def test_a_hostile_schemas_limits_are_refused_as_malformed(limits: object) -> None:
    body = {**schema().to_wire(), "limits": limits}
    with pytest.raises(MalformedMessage, match="schema limits are malformed"):
        SampleSchema.from_wire(body)


def test_unbounded_sides_travel_as_null_and_large_leaves_with_uneven_bounds_stay_with_the_trainer() -> None:
    half = ValueLimits({"act": Bounds(np.array([0.0, -math.inf]), np.array([math.inf, 1.0]), "action_space")})
    leaves = {"act": ("<f4", (2,))}
    assert half.to_wire()["bounds"][0][1:3] == [[0.0, None], [None, 1.0]]
    assert ValueLimits.from_wire(half.to_wire(), leaves) == half
    big = np.arange(5000.0)
    wide = ValueLimits({"obs": Bounds(-big, big, "observation_space"),
                        "act": Bounds(np.full(5000, -1.0), np.full(5000, 1.0), "action_space")})
    assert [b[0] for b in wide.to_wire()["bounds"]] == ["act"]  # uniform: one number each way
