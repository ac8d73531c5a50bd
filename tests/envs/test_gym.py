"""GenericGymEnv names the thread-safe rtgym env when given the other one."""

from __future__ import annotations

import logging

import pytest

from netrl.envs.gym import GenericGymEnv
from netrl.pipelines.drone import drone_rtgym_config


@pytest.mark.parametrize("env_id", ["rtgym:real-time-gym-v1", "real-time-gym-v1"])
def test_rtgyms_env_that_is_not_thread_safe_gets_a_hint_towards_the_ts_env(
        env_id: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="netrl.envs.gym"):
        env = GenericGymEnv(env_id, {"config": drone_rtgym_config()})  # it still runs: a hint, not a refusal
    env.close()
    assert caplog.messages == [
        f"{env_id} is rtgym's env that is not thread-safe, and a RolloutWorker runs threads beside it (its network "
        f"thread; the env's calls run on a thread of their own): use \"{env_id.replace('-v1', '-ts-v1')}\", the "
        "thread-safe one, with the same config"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="netrl.envs.gym"):
        GenericGymEnv("rtgym:real-time-gym-ts-v1", {"config": drone_rtgym_config()}).close()
    assert caplog.messages == []
