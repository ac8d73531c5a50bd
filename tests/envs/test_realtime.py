"""StepTimer on a fake clock: a late control path told from an overrun inside the env."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from netrl.envs.realtime import StepTimer


class ClockedEnv(gymnasium.Env):
    """A fake env on a fake clock: each step advances the clock by the next planned env time."""

    observation_space = gymnasium.spaces.Box(-1, 1, (1,))
    action_space = gymnasium.spaces.Box(-1, 1, (1,))

    def __init__(self, clock: list[float], env_times: list[float]) -> None:
        self.clock, self.env_times = clock, env_times

    def reset(self, **kwargs: Any) -> Any:
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> Any:
        self.clock[0] += self.env_times.pop(0)
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_step_timer_tells_a_late_control_path_from_an_overrun_inside_the_env() -> None:
    clock = [0.0]
    env_times = [0.05, 0.05, 0.12, 0.05]  # the third time step overruns inside the env
    caller_times = [0.001, 0.2, 0.001, 0.002]  # the second call comes late: a stalled control path
    timer = StepTimer(ClockedEnv(clock, env_times), nominal_s=0.05, clock=lambda: clock[0])
    timer.reset()
    for caller in caller_times:
        clock[0] += caller
        timer.step(np.zeros(1, np.float32))
    np.testing.assert_allclose(timer.caller_times, caller_times)
    np.testing.assert_allclose(timer.periods, [0.051, 0.25, 0.121, 0.052])
    assert timer.summary()["overruns"] == 2 and timer.summary()["late_calls"] == 1
