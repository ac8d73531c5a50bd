"""Pipelines on TorchRL envs for the tests that start the roles as processes (config.json's env.pipeline
"tests.interop.pipelines:<name>"): importable there, as a user's own module is."""

from __future__ import annotations

from typing import Any

import torch
from torchrl.envs import GymEnv, ObservationNorm, StepCounter, TransformedEnv
from torchrl.objectives import SoftUpdate

from netrl.interop.envs import torchrl_env, torchrl_pipeline
from netrl.interop.loss_agent import TorchRLAgent
from netrl.interop.policies import TensorDictActor
from netrl.memory.replay import ReplayMemory
from netrl.pipelines.base import Pipeline
from netrl.samples.info import InfoKey
from netrl.util import partial

STEPS = [InfoKey("step_count", "int64")]


def short_pendulum() -> Any:
    """Pendulum-v1 scaled by ObservationNorm, in episodes of 50 steps (StepCounter's truncation)."""
    env = TransformedEnv(GymEnv("Pendulum-v1"), ObservationNorm(loc=0.0, scale=8.0, in_keys=["observation"]))
    return env.append_transform(StepCounter(max_steps=50))


def pendulum(cfg: Any) -> Any:
    return torchrl_pipeline(cfg, make=short_pendulum, info_keys=STEPS)


def adam(loss: Any) -> Any:
    return torch.optim.Adam(loss.parameters(), 3e-4)


def torchrl_sac(cfg: Any) -> Pipeline:
    """TorchRL all through: the TorchRL env on the workers, its SAC policy acting there (TensorDictActor) and
    TorchRL's SACLoss training it (TorchRLAgent)."""
    from tests.interop.nets import sac_loss, tanh_normal_policy

    return Pipeline(env_cls=torchrl_env(short_pendulum, info_keys=STEPS),
                    actor_module_cls=partial(TensorDictActor, policy=tanh_normal_policy), memory_cls=ReplayMemory,
                    training_agent_cls=partial(TorchRLAgent, loss=sac_loss, updater=partial(SoftUpdate, tau=0.01),
                                               optimizer=adam),
                    info_keys=tuple(STEPS))
