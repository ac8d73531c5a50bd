"""A worker whose env hangs or whose env thread dies stops with the reason (or resets, where the pipeline allows)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from netrl.agents.sac import MLPActor
from netrl.errors import EnvFailure
from netrl.launch import spawn_role
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.envs.test_guard import broken_robot
from tests.fakes import small_config

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
