"""EnvCaller: an env's calls on a thread of their own, failing fast when a thread of the env dies or a call hangs.

The rtgym case is the one met in the field: rtgym runs the user's interface in its own thread, and when that thread
raises, the next step() waits for ever for an observation.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import gymnasium
import numpy as np
import pytest
from rtgym import DEFAULT_CONFIG_DICT, RealTimeGymInterface

from netrl.envs.guard import EnvCaller
from netrl.envs.gym import GenericGymEnv
from netrl.errors import EnvFailure

pytestmark = [pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning"),
              pytest.mark.filterwarnings("ignore:.*share an object")]


class BrokenSensor(RealTimeGymInterface):  # type: ignore[misc]
    """A robot whose sensor read raises on its ``fail_at``-th observation (in rtgym's thread)."""

    fail_at = 3
    reads = 0

    def get_observation_space(self) -> Any:
        return gymnasium.spaces.Tuple((gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32),))

    def get_action_space(self) -> Any:
        return gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def get_default_action(self) -> np.ndarray:
        return np.zeros(1, np.float32)

    def send_control(self, control: Any) -> None:
        pass

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return [np.zeros(1, np.float32)], {}

    def get_obs_rew_terminated_info(self) -> Any:
        type(self).reads += 1
        if type(self).reads == type(self).fail_at:
            raise OSError("camera unplugged")
        return [np.zeros(1, np.float32)], 0.0, False, {}


def broken_robot(fail_at: int = 3) -> Any:
    BrokenSensor.reads, BrokenSensor.fail_at = 0, fail_at
    config = dict(DEFAULT_CONFIG_DICT)
    config.update(interface=BrokenSensor, time_step_duration=0.005, start_obs_capture=0.005, act_buf_len=1,
                  time_step_timeout_factor=1.0, ep_max_length=50, benchmark=False)
    return GenericGymEnv("rtgym:real-time-gym-ts-v1", {"config": config})


class Stall(gymnasium.Env):
    """Steps instantly until ``stall_at``, then blocks until released; records the thread of every call."""

    observation_space = gymnasium.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gymnasium.spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self, stall_at: int = 10**9) -> None:
        self.stall_at, self.steps = stall_at, 0
        self.release = threading.Event()
        self.threads = {threading.get_ident()}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.threads.add(threading.get_ident())
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> Any:
        self.threads.add(threading.get_ident())
        self.steps += 1
        if self.steps == self.stall_at:
            self.release.wait()
        if self.steps < 0:
            raise ValueError("never")
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def close(self) -> None:
        self.threads.add(threading.get_ident())


def test_a_dead_rtgym_interface_thread_fails_the_step_that_waits_for_it() -> None:
    calls = EnvCaller(broken_robot, "worker w1")
    env = calls.env
    calls.call("reset", env.reset)
    started = time.monotonic()
    with pytest.raises(EnvFailure) as failure:
        for _ in range(10):
            calls.call("step", env.step, np.zeros(1, np.float32))
    assert time.monotonic() - started < 2.0  # not the time limit (the first step's is 250 s): the dead thread
    message = str(failure.value)
    assert "worker w1" in message and "OSError: camera unplugged" in message and "env.step()" in message
    assert isinstance(failure.value.__cause__, OSError)
    assert calls.stuck  # rtgym's step still waits for the observation: the env is not used again
    with pytest.raises(EnvFailure, match="still stuck"):
        calls.call("step", env.step, np.zeros(1, np.float32))
    calls.close()  # returns: the stuck thread is a daemon, left behind


def test_a_step_past_its_time_limit_fails_and_the_limit_follows_the_mean_duration() -> None:
    calls = EnvCaller(lambda: Stall(stall_at=20), "worker w1", timeout_factor=5.0, min_timeout_s=0.2)
    env = calls.env
    calls.call("reset", env.reset)
    for _ in range(19):
        calls.call("step", env.step, np.zeros(1, np.float32))
    assert calls._limit("step") == pytest.approx(0.2)  # 5 x microseconds: the floor
    started = time.monotonic()
    with pytest.raises(EnvFailure, match=r"env.step\(\) has not returned after 0\.\d s, beyond 5 times its mean"):
        calls.call("step", env.step, np.zeros(1, np.float32))
    assert 0.2 <= time.monotonic() - started < 1.5
    assert calls.stuck
    env.release.set()
    calls.close()


def test_the_first_call_of_each_kind_gets_factor_times_the_minimum() -> None:
    calls = EnvCaller(Stall, "worker w1", timeout_factor=4.0, min_timeout_s=0.5)
    assert calls._limit("reset") == calls._limit("step") == pytest.approx(2.0)
    calls.close()
    unlimited = EnvCaller(Stall, "w", timeout_factor=0.0)
    assert unlimited._limit("step") is None
    unlimited.close()


def test_the_env_lives_on_one_thread_and_its_own_errors_come_through_unchanged() -> None:
    calls = EnvCaller(Stall, "worker w1")
    env = calls.env
    calls.call("reset", env.reset)
    calls.call("step", env.step, np.zeros(1, np.float32))
    env.steps = -5
    with pytest.raises(ValueError, match="never"):  # the env's own error, as a direct call would raise it
        calls.call("step", env.step, np.zeros(1, np.float32))
    assert not calls.stuck
    calls.close()
    assert len(env.threads) == 1 and threading.get_ident() not in env.threads  # built, stepped, closed there


def test_an_env_whose_constructor_raises_raises_from_the_caller() -> None:
    def broken() -> Any:
        raise RuntimeError("no such device")

    with pytest.raises(RuntimeError, match="no such device"):
        EnvCaller(broken, "worker w1")


def test_with_no_time_limit_the_calls_run_on_the_callers_thread_and_a_dead_thread_still_fails_them() -> None:
    calls = EnvCaller(Stall, "worker w1", timeout_factor=0.0)
    calls.call("reset", calls.env.reset)
    assert calls.env.threads == {threading.get_ident()}
    dying = threading.Thread(target=lambda: 1 / 0, name="sensor")
    dying.start()
    dying.join()
    with pytest.raises(EnvFailure, match="thread 'sensor' ended with ZeroDivisionError"):
        calls.call("step", calls.env.step, np.zeros(1, np.float32))
    calls.close()


def test_a_thread_that_dies_between_two_calls_marks_the_env_for_rebuilding() -> None:
    """Found at the start of the next call (not while one waits), the death still means the env is
    not to be used again: a worker on on_env_failure "reset" rebuilds it rather than failing three
    times in a row on the same dead thread (seen under load, when rtgym's thread died between steps)."""
    calls = EnvCaller(Stall, "worker w1")
    calls.call("reset", calls.env.reset)
    dying = threading.Thread(target=lambda: 1 / 0, name="sensor")
    dying.start()
    dying.join()
    assert not calls.stuck
    with pytest.raises(EnvFailure, match=r"thread 'sensor' ended with ZeroDivisionError.*during env\.step"):
        calls.call("step", calls.env.step, np.zeros(1, np.float32))
    assert calls.stuck
    with pytest.raises(EnvFailure, match="still stuck in an earlier call"):
        calls.call("step", calls.env.step, np.zeros(1, np.float32))
    calls.close()
