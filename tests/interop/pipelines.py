"""Pipelines on TorchRL envs for the tests that start the roles as processes (config.json's env.pipeline
"tests.interop.pipelines:<name>"): importable there, as a user's own module is."""

from __future__ import annotations

from typing import Any

from torchrl.envs import GymEnv, ObservationNorm, StepCounter, TransformedEnv

from netrl.interop.envs import torchrl_pipeline
from netrl.samples.info import InfoKey

STEPS = [InfoKey("step_count", "int64")]


def short_pendulum() -> Any:
    """Pendulum-v1 scaled by ObservationNorm, in episodes of 50 steps (StepCounter's truncation)."""
    env = TransformedEnv(GymEnv("Pendulum-v1"), ObservationNorm(loc=0.0, scale=8.0, in_keys=["observation"]))
    return env.append_transform(StepCounter(max_steps=50))


def pendulum(cfg: Any) -> Any:
    return torchrl_pipeline(cfg, make=short_pendulum, info_keys=STEPS)
