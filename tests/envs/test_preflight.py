"""The checks on spaces, masks and actions, and the pre-flight check (``--check-env``) that reports every mismatch
of an env at once."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest

from netrl.__main__ import main
from netrl.envs.checks import ACTION_MASK, check_action, check_observation, check_spaces, value_limits
from netrl.envs.gym import GenericGymEnv
from netrl.envs.preflight import preflight
from netrl.memory.replay import ReplayMemory
from netrl.protocol.schema import WireRoute
from netrl.samples import BufferBuilder
from netrl.samples.info import InfoKey, info_spec
from netrl.util import partial

S = gymnasium.spaces


class Broken(gymnasium.Env):
    """Discrete leaves with several faults: a gear outside its space from step 2, float buttons, a mask that allows
    nothing on step 3; ``fine=True`` makes none of them."""

    observation_space = S.Dict({"gear": S.Discrete(3), "buttons": S.MultiBinary(2), ACTION_MASK: S.MultiBinary(4),
                                "pos": S.Box(-1, 1, (2,), np.float32)})
    action_space = S.Discrete(4)

    def __init__(self, fine: bool = False) -> None:
        self.fine, self.t = fine, 0

    def _obs(self) -> dict[str, Any]:
        mask = np.ones(4, np.int8) if self.fine or self.t != 3 else np.zeros(4, np.int8)
        buttons = np.array([0, 1], np.int8) if self.fine else np.array([0.0, 1.0])
        return {"gear": np.int64(1 if self.fine or self.t < 2 else 7), "buttons": buttons, ACTION_MASK: mask,
                "pos": np.zeros(2, np.float32)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 10, {}


def route() -> WireRoute:
    return WireRoute("zstd", value_limits)


def test_a_sound_discrete_env_passes_through_compressor_wire_and_memory() -> None:
    report = preflight(partial(Broken, fine=True), memory_cls=ReplayMemory, steps=60, through_wire=route())
    assert report.ok, report.format()
    text = report.format()
    assert text.startswith("env check passed")
    assert "act uint8 ()" in text and f"obs/{ACTION_MASK} uint8 (4,)" in text and "obs/gear uint8 ()" in text
    assert "60 env steps (6 episodes finished) in 3 packets" in text and "a batch of 16 was sampled" in text


def test_the_pre_flight_check_reports_every_mismatch_at_once_naming_leaf_and_step() -> None:
    report = preflight(Broken, memory_cls=ReplayMemory, steps=30, through_wire=route())
    assert not report.ok
    problems = "\n".join(report.problems)
    assert ("the first observation of episode 1 (env step 0): observation_space['buttons'] is a MultiBinary, whose "
            "values are integers; got float64 ([0. 1.])") in problems
    assert "env step 2: observation_space['gear'] is 7, outside the Discrete's values 0..2" in problems
    assert "env step 3: observation_space['action_mask'] allows no action" in problems
    assert "packet 1: it would be refused: packet from check-env (at the server): field 'obs/buttons' has dtype <f8" \
        in problems  # the packet as it would leave: float buttons
    assert len(report.problems) == 4  # each problem once, where it first showed, with how often it did
    assert "outside the Discrete's values 0..2 (and 26 more times)" in report.format()
    assert report.format().startswith(f"env check found {len(report.problems)} problems")


def test_a_mask_allowing_nothing_is_refused_unless_the_state_is_terminal() -> None:
    obs_space = S.Dict({ACTION_MASK: S.MultiBinary(5)})
    nothing = {ACTION_MASK: np.zeros(5, np.int8)}
    with pytest.raises(ValueError, match=re.escape("observation_space['action_mask'] allows no action: a state that "
                                                   "is not terminal must allow one")):
        check_observation(nothing, obs_space, "the first observation", S.Discrete(5))
    check_observation(nothing, obs_space, "the last observation", S.Discrete(5), True)  # game over: no move left
    part = {ACTION_MASK: np.array([1, 0, 0, 0, 0], np.int8)}  # MultiDiscrete([2, 3]): nothing for part 1
    with pytest.raises(ValueError, match=re.escape("allows no action for part 1 of the action (entries 2..4)")):
        check_observation(part, obs_space, "an observation", S.MultiDiscrete([2, 3]))


@pytest.mark.parametrize(("mask", "action", "problem"), [
    (S.MultiBinary(3), S.Discrete(4), "observation_space['action_mask'] has shape (3,); the action_space Discrete(4) "
                                      "needs a mask of shape (4,), one entry per action"),
    (S.Box(0, 1, (4,), np.float32), S.Discrete(4), "observation_space['action_mask'] is a Box of float32; an action "
                                                   "mask is a MultiBinary(4) or an integer or bool Box of shape (4,)"),
    (S.MultiBinary(2), S.Box(-1, 1, (2,)), "observation_space['action_mask'] is an action mask, but the action_space "
                                          "is a Box: masks are for Discrete and 1-D MultiDiscrete actions"),
    (S.MultiBinary(5), S.MultiDiscrete([2, 3]), None),
    (S.Box(0, 1, (4,), np.bool_), S.Discrete(4), None),
])
def test_an_action_mask_of_the_wrong_shape_or_kind_is_refused_naming_it(
        mask: gymnasium.Space, action: gymnasium.Space, problem: str | None) -> None:
    obs_space = S.Dict({"x": S.Box(-1, 1, (2,)), ACTION_MASK: mask})
    if problem is None:
        check_spaces(obs_space, action)
        return
    with pytest.raises(ValueError, match=re.escape(problem)):
        check_spaces(obs_space, action)


@pytest.mark.parametrize(("space", "action", "problem"), [
    (S.Discrete(3, start=1), 0, "action_space is 0, outside the Discrete's values 1..3"),
    (S.Discrete(3), np.float32(1.0), "action_space is a Discrete, whose values are integers; got float32 (1.)"),
    (S.Discrete(3), np.array([1]), "action_space expects shape (), got shape (1,)"),
    (S.MultiDiscrete([2, 5]), np.array([1, 5]), "action_space element 1 is 5, outside the MultiDiscrete's values "
                                                "0..4"),
    (S.MultiBinary(3), np.array([0, 2, 1]), "action_space element 1 is 2, outside the MultiBinary's values 0..1"),
    (S.Box(-1, 1, (2,), np.float32), np.array([0.5, 3.0], np.float32), "action_space element 1 is 3, outside the "
                                                                       "Box's bounds [-1, 1]"),
    (S.Discrete(3), np.uint8(2), None),
    (S.MultiBinary(3), np.array([True, False, True]), None),
])
def test_an_action_outside_its_space_is_refused_naming_the_element_and_the_values(
        space: gymnasium.Space, action: Any, problem: str | None) -> None:
    if problem is None:
        check_action(action, space, "Mine")
        return
    with pytest.raises(ValueError, match=re.escape(f"ActorModule.act (Mine.act) returned an action that does not fit "
                                                   f"the env's action_space: {problem}")):
        check_action(action, space, "Mine")


def test_a_value_its_small_integer_dtype_cannot_hold_is_refused_rather_than_wrapped() -> None:
    builder = BufferBuilder(8)
    builder.dtypes = {"act": np.dtype(np.uint8), "obs": np.dtype(np.int8)}
    builder.add(np.int64(3), np.int64(-5), 0.0, False, False, True, 0)
    with pytest.raises(ValueError, match=re.escape("act holds 259, which uint8 (0..255), the dtype its space's "
                                                   "values travel in, cannot hold")):
        builder.add(np.int64(259), np.int64(1), 0.0, False, False, False, 0)  # would be stored as 3
    buf = builder.cut()
    assert buf is not None and buf.act.dtype == np.uint8 and buf.obs.dtype == np.int8 and buf.obs[0] == -5


def test_check_env_on_the_command_line_exits_0_for_a_sound_env_and_2_listing_the_problems(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_envs.py").write_text(
        "from netrl.memory import ReplayMemory\nfrom netrl.pipelines.base import Pipeline\nfrom netrl.util import "
        "partial\nfrom tests.envs.test_preflight import Broken\n\n"
        "def build(cfg):\n    return Pipeline(env_cls=partial(Broken, fine=cfg.env.kwargs['fine']), "
        "actor_module_cls=None, memory_cls=ReplayMemory, training_agent_cls=None)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "config.json"
    for fine, code in ((True, 0), (False, 2)):
        config.write_text(json.dumps({"security": "none", "env": {"pipeline": "my_envs:build",
                                                                  "kwargs": {"fine": fine}}}))
        assert main(["--check-env", "--config", str(config)]) == code
        out = capsys.readouterr().out
        assert out.startswith("env check passed" if fine else "env check found")
        assert fine or "observation_space['gear'] is 7, outside the Discrete's values 0..2" in out


@pytest.mark.parametrize("env_id", ["FrozenLake-v1", "Blackjack-v1"])
def test_envs_of_short_episodes_pass_where_two_rows_a_step_once_overflowed_the_packet(env_id: str) -> None:
    # an episode's end adds its step's row and the next episode's first row: with one-step
    # episodes (Blackjack) every step does, and the builder once overflowed ("BufferBuilder is full")
    report = preflight(partial(GenericGymEnv, id=env_id), memory_cls=ReplayMemory, steps=200,
                       through_wire=route())
    assert report.ok, report.format()
    assert "200 env steps" in report.format() and "a batch of 16 was sampled" in report.format()


class Tracked(Broken):
    """A sound env whose step info holds the distance travelled; ``forget`` leaves it out from step 4 on."""

    def __init__(self, forget: bool = False) -> None:
        super().__init__(fine=True)
        self.forget = forget

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, rew, term, trunc, _ = super().step(action)
        return obs, rew, term, trunc, {} if self.forget and self.t >= 4 else {"distance": 0.5 * self.t}


def test_the_info_keys_go_through_the_builder_and_the_wire_and_a_missing_one_is_reported() -> None:
    keys = (InfoKey("distance", "float32", (), 0.0),)
    spec = info_spec(keys)
    report = preflight(Tracked, memory_cls=ReplayMemory, steps=60, info_keys=keys,
                       through_wire=WireRoute("zstd", value_limits, spec))
    assert report.ok, report.format()
    # a trainer that does not declare them refuses every packet: the route says so
    report = preflight(Tracked, steps=60, through_wire=route(), info_keys=keys)
    assert "it carries the info key 'distance', which the trainer's pipeline does not declare" in report.problems[0]
    strict = (InfoKey("distance"),)  # no default: the reset's info lacks it
    report = preflight(Tracked, memory_cls=ReplayMemory, steps=60, info_keys=strict,
                       through_wire=WireRoute("zstd", value_limits, info_spec(strict)))
    assert [p.split(":")[0] for p in report.problems] == ["the first observation of episode 1 (env step 0)"]
    assert "the env's reset() returned an info without 'distance'" in report.problems[0]
    report = preflight(partial(Tracked, forget=True), steps=60, info_keys=keys,
                       through_wire=WireRoute("zstd", value_limits, spec))
    assert report.ok, report.format()  # the default stands in from step 4


def test_check_env_records_the_info_keys_config_json_declares(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tracked_envs.py").write_text(
        "from netrl.memory import ReplayMemory\nfrom netrl.pipelines.base import Pipeline\n"
        "from tests.envs.test_preflight import Tracked\n\n"
        "def build(cfg):\n    return Pipeline(env_cls=Tracked, actor_module_cls=None, memory_cls=ReplayMemory, "
        "training_agent_cls=None)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "config.json"
    for default, code in ((0.0, 0), (None, 2)):
        entry = {"name": "distance", **({"default": default} if default is not None else {})}
        config.write_text(json.dumps({"security": "none", "env": {"pipeline": "tracked_envs:build",
                                                                  "info_keys": [entry]}}))
        assert main(["--check-env", "--config", str(config)]) == code
        out = capsys.readouterr().out
        assert code == 0 or "the env's reset() returned an info without 'distance'" in out, out
