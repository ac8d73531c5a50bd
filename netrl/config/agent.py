"""The ``agent`` section of config.json: the keys every algorithm shares, and a section of its own
for each algorithm's keys, so that no two keys share a name with different meanings.

Shared at ``agent.*``: ``algorithm`` and ``recurrent`` (which agent runs), ``gamma`` (every agent's
discount, which the memory's n-step returns use too), ``hidden_sizes`` (every network's layers)
and ``polyak`` (soft target averaging, the same wherever an algorithm uses it). Each algorithm's
own keys sit in ``agent.sac``, ``agent.dqn`` and ``agent.ppo``; the recurrent SAC reads
``agent.sac``. The keys they had before are read with a deprecation message
(:mod:`netrl.config.renamed`).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from netrl.agents.registry import NAMES, either, entries
from netrl.config.build import setting
from netrl.config.checks import between, ge, gt, optional, sizes
from netrl.config.renamed import old_attribute

__all__ = ["AgentConfig", "DQNConfig", "PPOConfig", "SACConfig"]


@dataclass(frozen=True)
class SACConfig:
    entropy_coef: float = setting(0.2, "initial entropy coefficient alpha (its value for good with "
                                  "learn_entropy_coef false)", gt(0))
    lr_actor: float = setting(1e-3, "actor learning rate", gt(0))
    lr_critic: float = setting(1e-3, "critic learning rate", gt(0))
    lr_entropy: float = setting(1e-3, "entropy coefficient learning rate", gt(0))
    learn_entropy_coef: bool = setting(True, "tune the entropy coefficient automatically (SAC v2)")
    target_entropy: float | None = setting(None, "target entropy (null: -dim(action))")


@dataclass(frozen=True)
class DQNConfig:
    lr: float = setting(1e-3, "learning rate of the Q network", gt(0))
    target_update_interval: int = setting(128, "training steps between copies of the Q network "
                                          "into its target", ge(1))
    exploration_initial_eps: float = setting(1.0, "chance of a random (allowed) action when "
                                             "training starts", between(0.0, 1.0))
    exploration_final_eps: float = setting(0.04, "chance of a random (allowed) action after "
                                           "exploration_steps", between(0.0, 1.0))
    exploration_steps: int = setting(4000, "training steps over which the chance of a random "
                                     "action falls linearly from exploration_initial_eps to "
                                     "exploration_final_eps (workers follow with each weight "
                                     "version; test episodes act greedily)", ge(0))


@dataclass(frozen=True)
class PPOConfig:
    lr: float = setting(3e-4, "learning rate of its one optimiser (policy and value together)",
                        gt(0))
    epochs: int = setting(10, "passes over each collected batch", ge(1))
    minibatch_size: int = setting(64, "transitions per gradient step within a pass", ge(1))
    clip_range: float = setting(0.2, "epsilon of the clipped surrogate (the policy ratio counts "
                                "within 1 +- this)", gt(0))
    clip_range_vf: float | None = setting(None, "the new value is kept within this of the value "
                                          "recorded at action time (null: no value clipping)",
                                          optional(gt(0)))
    gae_lambda: float = setting(0.95, "lambda of generalised advantage estimation",
                                between(0.0, 1.0))
    ent_coef: float = setting(0.0, "weight of the entropy bonus", ge(0))
    vf_coef: float = setting(0.5, "weight of the value loss", ge(0))
    max_grad_norm: float = setting(0.5, "gradients are clipped to this global norm", gt(0))
    anneal_frames: int | None = setting(None, "lr and clip_range fall linearly to 0 over this many "
                                        "trained env steps (RL Zoo's lin_ schedules; null: "
                                        "constant)", optional(ge(1)))


def _algorithm_help() -> str:
    auto = either([a.supports.label for a in entries("auto", False)], "and")
    return (f"the gym pipeline's agent: auto (the first of {auto} that takes the env's actions), "
            f"{either(NAMES)}; what each needs (actions, trainer.collection, memory) is in "
            "netrl/agents/registry.py")


@dataclass(frozen=True)
class AgentConfig:
    algorithm: Literal["auto", "sac", "dqn", "ppo"] = setting("auto", _algorithm_help())
    gamma: float = setting(0.99, "discount factor", between(0.0, 1.0))
    polyak: float = setting(0.995, "target network averaging factor", between(0.0, 1.0))
    hidden_sizes: list[int] = setting([256, 256], "hidden layer sizes of the agent's networks",
                                      sizes)
    recurrent: Literal["gru", "lstm"] | None = setting(
        None, "SAC: a GRU or LSTM over the actor's encoder, its state kept per env by the worker "
        "and stored with each step (needs memory.sequence_length >= 2; null: MLP SAC)")
    sac: SACConfig = field(default_factory=SACConfig)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)

    if not typing.TYPE_CHECKING:  # mypy still refuses unknown names; old ones read at run time
        def __getattr__(self, name: str) -> Any:
            return old_attribute(self, "agent", name)
