"""ActorModule: the policy a RolloutWorker runs and the Trainer optimises, as in tmrl.

A subclass is a ``torch.nn.Module`` built from ``(observation_space, action_space)`` that implements
``act(obs, test=False)``, where ``obs`` is already a batch of tensors (or a tuple of them) on the module's
device. The worker calls :meth:`ActorModule.act_`, which does that collation for one observation::

    actor = MyActorModule(env.observation_space, env.action_space).to(device)
    action = actor.act_(obs, test=False)        # numpy array, ready for env.step
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import gymnasium
import numpy as np
import torch

from netrl.samples import tree_map

__all__ = ["ActorModule"]


class ActorModule(torch.nn.Module, ABC):
    """Interface of the policy shared by the RolloutWorker and the TrainingAgent."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space) -> None:
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space

    @property
    def device(self) -> torch.device:
        for p in self.parameters():
            return p.device
        return torch.device("cpu")

    @abstractmethod
    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        """Compute one action from a batch of one observation (tensors with a leading dimension of 1).

        Args:
            obs: a tensor, or a tuple of tensors, shaped ``(1, *obs_shape)`` on this module's device.
            test: True for test episodes, which usually act deterministically.

        Returns:
            the action for ``env.step``, as a numpy array shaped like the action space.
        """

    def act_(self, obs: Any, test: bool = False) -> np.ndarray:
        """Collate one raw observation to tensors on this module's device and call :meth:`act`."""
        device = self.device
        batched = tree_map(lambda x: torch.as_tensor(np.asarray(x), device=device).unsqueeze(0), obs)
        with torch.no_grad():
            return self.act(batched, test=test)
