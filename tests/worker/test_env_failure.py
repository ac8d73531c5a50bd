"""A worker whose env hangs or whose env thread dies stops with the reason (or resets, where the pipeline allows)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from netrl.agents.sac import MLPActor
from netrl.errors import EnvFailure
from netrl.launch import spawn_role
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.envs.test_guard import broken_robot
from tests.fakes import small_config, wait_until

pytestmark = [pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning"),
              pytest.mark.filterwarnings("ignore:.*share an object"), pytest.mark.filterwarnings("ignore:Time-step")]


def standalone(env_cls: Any, **kwargs: Any) -> RolloutWorker:
    return RolloutWorker(env_cls, partial(MLPActor, hidden_sizes=(8,)), standalone=True, worker_id="w1", **kwargs)


@pytest.mark.timeout(30)  # before the fix, the worker waited for rtgym's dead thread for ever
def test_a_worker_whose_rtgym_interface_raises_in_its_thread_stops_with_the_exception() -> None:
    worker = standalone(broken_robot)
    with pytest.raises(EnvFailure, match=r"OSError: camera unplugged.*worker w1 stops"):
        worker.run(nb_episodes=3)


def always_broken() -> Any:
    return broken_robot(fail_at=1)  # every env built fails on its first read


def test_a_pipeline_that_allows_resets_gets_a_new_env_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    builds: list[int] = []

    def flaky() -> Any:  # the first env's sensor fails once; the rebuilt one works
        builds.append(1)
        return broken_robot(fail_at=3 if len(builds) == 1 else 10**9)

    worker = standalone(flaky, on_env_failure="reset")
    worker.run(nb_episodes=2)  # the sensor fails once: the episode is dropped, and two episodes still finish
    assert worker.env_failures == 1 and worker.episodes_done == 2 and len(builds) == 2
    assert "the episode is dropped and the env rebuilt, since the old one is stuck" in caplog.text


def test_resets_end_after_three_failures_in_a_row() -> None:
    worker = standalone(always_broken, on_env_failure="reset")
    with pytest.raises(EnvFailure, match=r"worker w1 stops \(3 failures in a row\)"):
        worker.run(nb_episodes=2)
    assert worker.env_failures == 2


PIPELINE = '''
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.memory import ReplayMemory
from netrl.pipelines.base import Pipeline
from tests.envs.test_guard import broken_robot

def build(cfg):
    return Pipeline(env_cls=broken_robot, actor_module_cls=MLPActor, memory_cls=ReplayMemory,
                    training_agent_cls=SACAgent, realtime=True)
'''


def test_the_worker_process_exits_with_code_1_and_names_the_failure(tmp_path: Path) -> None:
    (tmp_path / "broken_pipeline.py").write_text(PIPELINE)
    config = small_config(tmp_path, env={"pipeline": "broken_pipeline:build"})  # no server: the env fails first
    path = os.pathsep.join([str(tmp_path), str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])
    with (tmp_path / "worker.log").open("wb") as out:
        proc = spawn_role("worker", config, stdout=out, env={"PYTHONPATH": path})
        try:
            assert proc.wait(timeout=60) == 1
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    log = (tmp_path / "worker.log").read_text()
    assert "OSError: camera unplugged" in log and "stops" in log, log[-3000:]


HALTING_PIPELINE = '''
import threading, time
from pathlib import Path
import gymnasium, numpy as np
from netrl.agents.sac import MLPActor, SACAgent
from netrl.memory import ReplayMemory
from netrl.pipelines.base import Pipeline

FOLDER = Path(__file__).parent


class Halting(gymnasium.Env):
    """Steps in a millisecond; step 200 waits for the file "go" (the test stops the process meanwhile), and step 400
    hangs."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    steps = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.steps += 1
        time.sleep(0.001)
        if self.steps == 200:
            (FOLDER / "in_step").write_text("")
            while not (FOLDER / "go").exists():
                time.sleep(0.01)
        if self.steps == 400:
            (FOLDER / "hung").write_text("")
            threading.Event().wait()
        return np.zeros(1, np.float32), 0.0, False, self.steps % 100 == 0, {}


def build(cfg):
    return Pipeline(env_cls=Halting, actor_module_cls=MLPActor, memory_cls=ReplayMemory,
                    training_agent_cls=SACAgent, realtime=True)
'''


@pytest.mark.timeout(180)
def test_a_worker_stopped_for_10_s_inside_a_step_goes_on_and_a_step_that_hangs_still_stops_it(tmp_path: Path) -> None:
    """The whole worker process stopped (SIGSTOP) for 10 s inside a step whose limit is 2 s, then continued: the step
    was starved, not stuck, so the worker warns and goes on; a later step that hangs still stops it at its limit.
    Before the fix the worker stopped with "env.step() has not returned after 10.x s" on its way out of the pause."""
    (tmp_path / "halting_pipeline.py").write_text(HALTING_PIPELINE)
    config = small_config(tmp_path, env={"pipeline": "halting_pipeline:build"},  # no server: the worker steps alone
                          worker={"env_timeout_min_s": 2.0})
    path = os.pathsep.join([str(tmp_path), str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])
    with (tmp_path / "worker.log").open("wb") as out:
        proc = spawn_role("worker", config, stdout=out, env={"PYTHONPATH": path})
        try:
            wait_until(lambda: (tmp_path / "in_step").exists() or proc.poll() is not None, 120, "step 200", poll=0.01)
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(10.0)
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.3)
            (tmp_path / "go").write_text("")
            assert proc.wait(timeout=90) == 1
        finally:
            proc.kill()
    log = (tmp_path / "worker.log").read_text()
    assert (tmp_path / "hung").exists(), log[-3000:]  # it went on after the pause, up to step 400
    # The figures move with the machine's load (late wake-ups count as time without CPU): bounds, not digits.
    warned = re.search(r"env.step\(\) has taken (\d+\.\d) s, beyond its limit of 2\.0 s, but the process could run "
                       r"it for only (\d+\.\d) s of them .*starved, not stuck; waiting for it", log)
    assert warned, log[-3000:]
    assert float(warned[1]) >= 10.0 and float(warned[2]) <= 2.0, warned[0]  # the stopped step, within its limit
    failed = re.search(r"env.step\(\) has not returned after (\d+\.\d) s, beyond 50 times its mean .*; "
                       r"worker \S+ stops", log)
    assert failed and float(failed[1]) >= 2.0, log[-3000:]  # the hung step, at its limit or later
    assert "handed over" not in log, log[-3000:]  # the worker's own thread made the calls, watched by a signal
