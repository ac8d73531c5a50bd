"""A custom pipeline for ``python -m netrl``: your own env, trained by netrl's SAC, set up from config.json.

config.json beside this file names it (``"env": {"pipeline": "reach:reach_pipeline"}``); start netrl from this
folder, which it puts on the import path::

    cd examples/custom_pipeline
    python -m netrl --demo                 # server, trainer and worker on this machine
    python -m netrl --plot reach           # the learning curves of weights/reach
    python ../deploy_policy.py weights/reach/policy.pt --config config.json   # run the policy, no server

or the roles one by one (``--server``, ``--trainer``, ``--worker``), on one machine or several: every role builds
the same pipeline from the same config, so a worker and a trainer agree on the env's spaces, the actor and the
sample layout. ``env.kwargs`` reaches the env; ``agent.*`` configures the built-in SAC used here.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from netrl import Config, Pipeline, ReplayMemory, partial
from netrl.agents import MLPActor, MLPActorCritic, SACAgent


class PointReach(gymnasium.Env):
    """A point on the plane moves by ``speed * action`` each step towards a random target.

    Observation: position and target (4 floats); action: a velocity in [-1, 1]^2; reward: minus the distance to
    the target. The episode ends when the point is within ``radius`` of it, or is cut short after ``max_steps``.
    """

    def __init__(self, max_steps: int = 50, speed: float = 0.1, radius: float = 0.05) -> None:
        self.max_steps, self.speed, self.radius = max_steps, speed, radius
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.pos = np.zeros(2, np.float32)
        self.target = np.zeros(2, np.float32)
        self.steps = 0

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.pos, self.target]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        self.target = self.np_random.uniform(-0.8, 0.8, 2).astype(np.float32)
        self.steps = 0
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        move = self.speed * np.clip(np.asarray(action, np.float32), -1.0, 1.0)
        self.pos = np.clip(self.pos + move, -1.0, 1.0).astype(np.float32)
        self.steps += 1
        distance = float(np.linalg.norm(self.pos - self.target))
        return self._obs(), -distance, distance < self.radius, self.steps >= self.max_steps, {"distance": distance}


def reach_pipeline(cfg: Config) -> Pipeline:
    """What ``env.pipeline = "reach:reach_pipeline"`` builds: called with the loaded config in every role."""
    a = cfg.agent
    hidden = tuple(a.hidden_sizes)
    return Pipeline(
        env_cls=partial(PointReach, **cfg.env.kwargs),  # env.kwargs: max_steps, speed, radius
        actor_module_cls=partial(MLPActor, hidden_sizes=hidden),
        memory_cls=ReplayMemory,  # memory.memory_size and memory.batch_size size it
        training_agent_cls=partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=hidden), gamma=a.gamma,
                                   lr_actor=a.sac.lr_actor, lr_critic=a.sac.lr_critic),
        # optional: sample_compressor=..., obs_preprocessor=..., and realtime=True for an env that runs in real
        # time (a robot), which pacing must never pause; this one is simulated, so the trainer paces the worker
    )
