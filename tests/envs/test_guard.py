"""EnvCaller: an env's calls under watch, on the main thread or handed over to a thread of their own, failing
fast when a thread of the env dies or a call hangs, and waiting for a call starved of CPU.

The rtgym case is the one met in the field: rtgym runs the user's interface in its own thread, and when that thread
raises, the next step() waits for ever for an observation.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
from rtgym import DEFAULT_CONFIG_DICT, RealTimeGymInterface

from netrl.envs.guard import EnvCaller
from netrl.envs.gym import GenericGymEnv
from netrl.errors import EnvFailure
from tests.fakes import wait_until

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


BOTH = pytest.mark.parametrize("same_thread", [False, True], ids=["handed over", "on the main thread"])


@BOTH
def test_a_dead_rtgym_interface_thread_fails_the_step_that_waits_for_it(same_thread: bool) -> None:
    calls = EnvCaller(broken_robot, "worker w1", same_thread=same_thread)
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


@BOTH
def test_a_step_past_its_time_limit_fails_and_the_limit_follows_the_mean_duration(same_thread: bool) -> None:
    calls = EnvCaller(lambda: Stall(stall_at=20), "worker w1", timeout_factor=5.0, min_timeout_s=0.2,
                      same_thread=same_thread)
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


@BOTH
def test_a_thread_that_dies_between_two_calls_marks_the_env_for_rebuilding(same_thread: bool) -> None:
    """Found at the start of the next call (not while one waits), the death still means the env is
    not to be used again: a worker on on_env_failure "reset" rebuilds it rather than failing three
    times in a row on the same dead thread (seen under load, when rtgym's thread died between steps)."""
    calls = EnvCaller(Stall, "worker w1", same_thread=same_thread)
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


# -- on the main thread: no hand-over, a stuck call interrupted with a signal -------------------------------------


class Obstinate(Stall):
    """Stalls at ``stall_at`` and swallows the first ``swallow`` interrupts (an env with ``except BaseException``);
    records whether its stack was unwound."""

    def __init__(self, stall_at: int, swallow: int) -> None:
        super().__init__(stall_at)
        self.swallow, self.unwound = swallow, False

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == self.stall_at:
            try:
                while True:
                    try:
                        self.release.wait()
                        break
                    except BaseException:
                        if self.swallow == 0:
                            raise
                        self.swallow -= 1
            finally:
                self.unwound = True
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_on_the_main_thread_the_env_lives_on_the_callers_thread_and_its_errors_come_through_unchanged() -> None:
    calls = EnvCaller(Stall, "worker w1", same_thread=True)
    env = calls.env
    calls.call("reset", env.reset)
    calls.call("step", env.step, np.zeros(1, np.float32))
    env.steps = -5
    with pytest.raises(ValueError, match="never"):
        calls.call("step", env.step, np.zeros(1, np.float32))
    assert not calls.stuck
    calls.close()
    assert env.threads == {threading.get_ident()}  # built, stepped and closed on this thread: nothing handed over
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # the interrupt's handler is gone with the env


def test_a_stuck_call_on_the_main_thread_is_interrupted_and_its_stack_unwound() -> None:
    calls = EnvCaller(lambda: Obstinate(stall_at=5, swallow=0), "worker w1", timeout_factor=5.0,
                      min_timeout_s=0.2, same_thread=True)
    env = calls.env
    for _ in range(4):
        calls.call("step", env.step, np.zeros(1, np.float32))
    started = time.monotonic()
    with pytest.raises(EnvFailure, match=r"worker w1: env.step\(\) has not returned after 0\.\d s, beyond 5 times"):
        calls.call("step", env.step, np.zeros(1, np.float32))
    assert 0.2 <= time.monotonic() - started < 1.5
    assert env.unwound and calls.stuck and env.threads == {threading.get_ident()}
    with pytest.raises(EnvFailure, match="still stuck"):
        calls.call("step", env.step, np.zeros(1, np.float32))
    calls.close()


def test_an_env_that_swallows_an_interrupt_gets_another() -> None:
    calls = EnvCaller(lambda: Obstinate(stall_at=2, swallow=1), "worker w1", timeout_factor=5.0,
                      min_timeout_s=0.2, same_thread=True)
    env = calls.env
    calls.call("step", env.step, np.zeros(1, np.float32))
    started = time.monotonic()
    with pytest.raises(EnvFailure, match=r"env.step\(\) has not returned"):
        calls.call("step", env.step, np.zeros(1, np.float32))
    assert 0.4 <= time.monotonic() - started < 2.5  # the limit, then the grace of min_timeout_s
    assert env.swallow == 0 and env.unwound
    calls.close()


def test_off_the_main_thread_the_calls_are_handed_over_and_that_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "netrl.envs.guard")
    made: list[EnvCaller] = []
    worker = threading.Thread(target=lambda: made.append(EnvCaller(Stall, "worker w1", same_thread=True)))
    worker.start()
    worker.join()
    calls = made[0]
    calls.call("reset", calls.env.reset)
    assert worker.ident not in calls.env.threads and threading.get_ident() not in calls.env.threads
    assert "env calls run on a thread of their own, handed over (not on the main thread" in caplog.text
    calls.close()


def test_a_signal_handled_by_someone_else_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    def theirs(signum: int, frame: Any) -> None:
        pass

    caplog.set_level(logging.INFO, "netrl.envs.guard")
    previous = signal.signal(signal.SIGUSR2, theirs)
    try:
        calls = EnvCaller(Stall, "worker w1", same_thread=True)
        calls.call("reset", calls.env.reset)
        assert threading.get_ident() not in calls.env.threads
        assert "SIGUSR2 has a handler of its own" in caplog.text
        calls.close()
        assert signal.getsignal(signal.SIGUSR2) is theirs
    finally:
        signal.signal(signal.SIGUSR2, previous)


# -- starved, not stuck: the process stopped, or its thread kept off the CPU ----------------------------------------

# An env in a process of its own: steps instantly, except step 20, which waits for the file "go", and step 30, which
# hangs. Prints what happened as JSON. argv: mode (signal, thread or hog), folder.
SCRIPT = r'''
import json, os, sys, threading, time, subprocess
from pathlib import Path
from netrl.envs.guard import EnvCaller
from netrl.errors import EnvFailure

mode, folder = sys.argv[1], Path(sys.argv[2])

class Env:
    steps = 0
    def step(self, action):
        self.steps += 1
        if mode == "hog" and self.steps > 10:  # 10 ms of CPU a step
            spent = time.thread_time()
            while time.thread_time() - spent < 0.01:
                pass
        if self.steps == 20 and mode != "hog":
            (folder / "in_step").write_text("")
            while not (folder / "go").exists():
                time.sleep(0.01)
        if self.steps == 30:
            threading.Event().wait()
        return self.steps
    def close(self):
        pass

# spins once told to, for 20 s at most (never left behind)
HOG = "import sys, time\nsys.stdin.read(1)\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass"
hog = None
if mode == "hog":  # this process and a CPU hog on one core, the hog first in line (at nice 0)
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    hog = subprocess.Popen([sys.executable, "-c", HOG],
                           stdin=subprocess.PIPE)
    os.nice(19)
calls = EnvCaller(Env, "worker w1", timeout_factor=5.0, min_timeout_s=0.5 if mode == "hog" else 1.5,
                  same_thread=mode != "thread")
report = {}
try:
    for i in range(40):
        if mode == "hog" and i == 10:
            hog.stdin.write(b"x")
            hog.stdin.flush()
            time.sleep(0.3)
        started = time.monotonic()
        calls.call("step", calls.env.step, 0)
        report.setdefault("took", []).append(round(time.monotonic() - started, 3))
        if mode == "hog" and i == 11:
            hog.kill()
            report["mean_ms"] = calls._means["step"] * 1000
            break
except EnvFailure as exc:
    report["error"] = str(exc)
finally:
    if hog is not None:
        hog.kill()
report.update(steps=calls.env.steps, starved=calls.starved)
print(json.dumps(report), flush=True)
calls.close()
'''


def run_script(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    path = os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, "-c", SCRIPT, mode, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": path})


def stop_for(proc: subprocess.Popen[str], folder: Path, seconds: float) -> None:
    """Stop ``proc`` with SIGSTOP once it is inside step 20, continue it after ``seconds``, and let the step end."""
    wait_until(lambda: (folder / "in_step").exists() or proc.poll() is not None, 60, "step 20", poll=0.01)
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(seconds)
    os.kill(proc.pid, signal.SIGCONT)
    time.sleep(0.3)
    (folder / "go").write_text("")


@pytest.mark.parametrize("mode", ["signal", "thread"])
def test_a_call_of_a_stopped_process_is_waited_for_and_a_stuck_one_still_fails(tmp_path: Path, mode: str) -> None:
    """Stopped for 4 s inside a step whose limit is 1.5 s, the process runs on (a warning, the step waited for);
    the step that then hangs still fails at its limit. Before the fix the stopped step failed, on either thread."""
    proc = run_script(tmp_path, mode)
    try:
        stop_for(proc, tmp_path, 4.0)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    report = json.loads(out.strip().splitlines()[-1])
    assert report["steps"] == 30 and report["starved"] == 1, err[-3000:]
    # The figures move with the machine's load (late wake-ups count as time without CPU): bounds, not digits.
    failed = re.search(r"env.step\(\) has not returned after (\d+\.\d) s", report["error"])
    assert failed and float(failed[1]) >= 1.5, report  # the hung step, at its limit or later
    warned = re.search(r"env.step\(\) has taken (\d+\.\d) s, beyond its limit of 1\.5 s, but the process could "
                       r"run it for only (\d+\.\d) s of them .*starved, not stuck; waiting for it", err)
    assert warned, err[-3000:]
    assert float(warned[1]) >= 4.0 and float(warned[2]) <= 1.5, warned[0]  # the stopped step, within its limit


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins to a core with sched_setaffinity (Linux)")
def test_a_call_starved_by_a_cpu_hog_on_its_core_is_waited_for(tmp_path: Path) -> None:
    """At nice 19 on one core beside a busy process, a step of 10 ms of CPU takes over a second, past its limit of
    0.5 s: starved, not stuck, and its duration stays out of the mean the limit follows."""
    proc = run_script(tmp_path, "hog")
    out, err = proc.communicate(timeout=120)
    report = json.loads(out.strip().splitlines()[-1])
    assert "error" not in report and report["steps"] == 12, (report, err[-3000:])
    assert max(report["took"]) > 0.5, report  # past the limit: starved indeed
    assert report["starved"] >= 1 and report["mean_ms"] < 100, (report, err[-3000:])
    assert "starved, not stuck; waiting for it" in err


def test_a_call_that_ignores_every_interrupt_ends_the_process(tmp_path: Path) -> None:
    script = r'''
import time
from netrl.envs.guard import EnvCaller

class Deaf:
    def step(self):
        while True:
            try:
                time.sleep(10)
            except BaseException:
                pass

calls = EnvCaller(Deaf, "worker w1", timeout_factor=5.0, min_timeout_s=0.2, same_thread=True)
calls.call("step", calls.env.step)
'''
    path = os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 1, done.stderr[-3000:]
    assert "env.step() has not returned after" in done.stderr and "ignored 3 interrupts" in done.stderr
