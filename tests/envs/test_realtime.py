"""StepTimer on a fake clock: a late control path told from an overrun inside the env; rtgym's timeout warnings
counted and summarised."""

from __future__ import annotations

import logging
import re
import time
import warnings
from typing import Any

import gymnasium
import numpy as np
import pytest

from netrl.envs.realtime import StepTimer, TimeoutWarnings, rtgym_timeouts


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


def test_rtgym_timeouts_are_counted_and_summarised_not_printed_once_per_step(
        caplog: pytest.LogCaptureFixture) -> None:
    # rtgym warns once per late time step, each message with its own number, so Python printed every one: on a busy
    # machine most of the tutorial's output was "Time-step timed out" warnings.
    from netrl.envs.gym import GenericGymEnv
    from netrl.pipelines.drone import drone_rtgym_config

    with warnings.catch_warnings(record=True) as shown, caplog.at_level(logging.WARNING, "netrl.envs.realtime"):
        warnings.simplefilter("default")  # as a script runs: a warning printed once per distinct message
        env = GenericGymEnv("rtgym:real-time-gym-ts-v1", {"config": drone_rtgym_config(time_step=0.01)})
        env.reset(seed=0)
        for _ in range(25):
            time.sleep(0.03)  # a control loop three time steps late, every step
            if any(env.step(np.zeros(2, np.float32))[2:4]):
                env.reset()
        env.unwrapped.stop()  # rtgym's last time step (and its warning) done, here
        env.close()
    assert [str(w.message) for w in shown if "Time-step timed out" in str(w.message)] == []  # not printed
    lines = [r.getMessage() for r in caplog.records if r.name == "netrl.envs.realtime"]
    assert 1 <= len(lines) <= 3, lines  # summarised: the first (in this process), at most one each 10 s, at close
    counted = re.search(r"; (\d+) in all$", lines[-1])
    assert counted and int(counted[1]) == rtgym_timeouts().count >= 20, lines  # each late step counted


def test_timeout_summaries_come_at_most_every_interval_and_other_warnings_pass_through(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    hook = TimeoutWarnings(every_s=10.0, clock=lambda: now[0])
    rtgym_file = "/venv/site-packages/rtgym/envs/real_time_env.py"
    with warnings.catch_warnings(record=True) as shown, caplog.at_level(logging.WARNING, "netrl.envs.realtime"):
        warnings.simplefilter("always")
        hook.install()
        hook.install()  # once: a second install does not chain the hook behind itself
        for t in range(25):  # one a second for 25 s
            now[0] = float(t)
            warnings.warn_explicit(f"Time-step timed out. Elapsed since last time-step: 0.0{t % 9 + 1}",
                                   UserWarning, rtgym_file, 261)
        warnings.warn("something else", UserWarning, stacklevel=1)  # not rtgym's: shown as before
        warnings.warn_explicit("Time-step timed out. Elapsed: 1", UserWarning, "/home/me/mine.py", 1)  # not rtgym's
        hook.flush()
        hook.flush()  # nothing more to say
    assert [str(w.message) for w in shown] == ["something else", "Time-step timed out. Elapsed: 1"]
    assert [r.getMessage() for r in caplog.records] == [
        "rtgym: a time step timed out, 10 ms after it should have ended: step() came late (a busy machine, a slow "
        "policy), so rtgym restarted its clock; further timeouts are counted and summarised every 10 s",
        "rtgym: 10 more time steps timed out in the last 10 s (up to 90 ms late); 11 in all",
        "rtgym: 10 more time steps timed out in the last 10 s (up to 90 ms late); 21 in all",
        "rtgym: 4 more time steps timed out in the last 4 s (up to 70 ms late); 25 in all"]
    assert hook.count == 25


def test_a_hook_chained_both_ways_prints_a_warning_once_instead_of_looping(capsys: pytest.CaptureFixture[str]) -> None:
    # another library's hook, installed after this one, passes warnings on to it; a second env installs this one again
    hook = TimeoutWarnings()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        hook.install()
        theirs = warnings.showwarning
        warnings.showwarning = lambda *args: theirs(*args)
        hook.install()
        warnings.warn("passed around", UserWarning, stacklevel=1)
    assert capsys.readouterr().err.count("UserWarning: passed around") == 1
