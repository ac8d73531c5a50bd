"""The TrainingAgent interface (tmrl's name and meaning); the Batch it trains on is in :mod:`netrl.samples`.

Calling sequence, as the Trainer drives it::

    agent = MyTrainingAgent(observation_space, action_space, device)
    for each training step:
        metrics = agent.train(memory.sample())     # Batch of tensors on `device` -> {"loss_actor": 0.3, ...}
    actor = agent.get_actor()                       # an ActorModule; its state_dict is sent to the workers
    agent.state_dict() / agent.load_state_dict(d)   # optional, for checkpoints: tensors only, loaded with
                                                    # weights_only=True; without them a checkpoint keeps the actor only
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import gymnasium

from netrl.actor import ActorModule
from netrl.samples import Batch

__all__ = ["Batch", "TrainingAgent", "has_state_dict"]


class TrainingAgent(ABC):
    """An RL algorithm. Subclasses take at least ``observation_space``, ``action_space`` and ``device``."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space, device: str) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.device = device

    @abstractmethod
    def train(self, batch: Batch) -> dict[str, float]:
        """Run one training step and return the metrics to log, e.g. ``{"loss_actor": 0.3}``."""

    @abstractmethod
    def get_actor(self) -> ActorModule:
        """The current actor; the Trainer publishes its ``state_dict`` to the workers."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume training: nested dicts of tensors and plain numbers only."""
        raise NotImplementedError(f"{type(self).__name__} does not implement state_dict(); it cannot checkpoint")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        raise NotImplementedError(f"{type(self).__name__} does not implement load_state_dict(); it cannot resume")


def has_state_dict(agent: Any) -> bool:
    """Whether ``agent`` implements both ``state_dict`` and ``load_state_dict`` (tmrl's agents need not)."""
    for name in ("state_dict", "load_state_dict"):
        method = getattr(type(agent), name, None)
        if method is None or method is getattr(TrainingAgent, name):
            return False
    return True
