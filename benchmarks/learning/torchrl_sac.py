"""The ``torchrl-sac`` row: TorchRL's SAC script (examples/torchrl_sac.py) through netrl's three
processes against the same script on TorchRL's own ``Collector`` and ``ReplayBuffer`` (issue 45's
learning claim).

Both variants run the example's models, loss, optimisers and target updater with its
hyperparameters (``Hyper``: 256x256 nets, Adam 3e-4 per loss term, gamma 0.99, polyak 0.995,
batch 256, random actions and no training for the first 1,000 env steps, one gradient step per
env step, batches of 20 frames). netrl's worker sends packets of 20 rows, its trainer pulls them
and publishes the policy every 20 gradient steps, and its env steps are the server's count;
TorchRL's collector hands 20 frames to its loop, which takes 20 gradient steps on its buffer, its
policy being the one it trains (no lag). One difference the knobs cannot remove: netrl's trainer
counts its update-to-data ratio over every env step, TorchRL's loop over those past
``init_random_frames``, so netrl takes up to 1,000 gradient steps more (at once, when training
starts). Both are judged alike: every 500 env steps the newest policy, frozen, plays 10
deterministic episodes of Pendulum-v1 on seeds 1000..; target: netrl's median within 1.2x
TorchRL's env steps to a mean of -200.

Needs the ``torchrl`` extra; run from the repository root (the roles import the example by
``env.pipeline`` "examples.torchrl_sac:sac_pipeline").
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.learning.learners import Acting
from benchmarks.learning.loop import Act, Judge, Learner, Progress, Variant
from benchmarks.learning.rows import PENDULUM, Changes, LearningRow, processes

PIPELINE = "examples.torchrl_sac:sac_pipeline"


def torchrl_sac_row(start_training: int | None) -> LearningRow:
    """The row, with ``start_training`` (--start-training, the smoke run's) as both sides'
    ``init_random_frames`` where given."""
    from examples.torchrl_sac import HP, netrl_settings

    hp = HP if start_training is None else dataclasses.replace(
        HP, init_random_frames=start_training)
    settings: Changes = netrl_settings(hp, PIPELINE)
    return LearningRow(
        "Pendulum-v1, TorchRL's SACLoss through netrl's three processes against TorchRL's own "
        "Collector and ReplayBuffer, the same script", Judge(-200.0, "Pendulum-v1", 500, 10),
        {"netrl": processes(PENDULUM, settings, count="server"), "torchrl": collector(hp)},
        30_000, "torchrl", judged=("netrl",), target_ratio=1.2,
        params={"netrl": settings, "torchrl": dataclasses.asdict(hp)})


def collector(hp: Any) -> Variant:
    def make(seed: int, folder: Path, max_steps: int) -> Learner:
        return TorchRLCollector(hp, seed, max_steps)
    return make


class TorchRLCollector:
    """The example's SAC on TorchRL's ``Collector`` and ``ReplayBuffer``, in this process: env
    steps are the collector's frames, reported after each batch, and the policy is a copy of the
    actor it trains, taken when the judge asks."""

    def __init__(self, hp: Any, seed: int, max_steps: int) -> None:
        self.hp, self.seed, self.max_steps = hp, seed, max_steps

    def learn(self, progress: Callable[[Progress], bool]) -> None:
        import gymnasium
        import torch

        from examples.torchrl_sac import run_torchrl
        from netrl.interop.policies import TensorDictActor

        spaces = gymnasium.make(self.hp.env_id)

        def on_batch(frames: int, actor: torch.nn.Module, _: dict[str, float]) -> bool:
            def policy() -> Act:
                # played as netrl's worker plays it: the same TensorDictActor, deterministic
                frozen = TensorDictActor(spaces.observation_space, spaces.action_space,
                                         policy=copy.deepcopy(actor), extra_keys=[])
                return Acting(frozen)
            return progress(Progress(frames, policy))

        run_torchrl(self.hp, self.max_steps, self.seed, on_batch)

    def problems(self) -> list[str]:
        return []
