"""ActorModule: the policy a RolloutWorker runs and the Trainer optimises, as in tmrl.

A subclass is a ``torch.nn.Module`` built from ``(observation_space, action_space)`` that implements
``act(obs, test=False)``, where ``obs`` is already a batch of tensors (or a tuple/dict of them) with a leading
dimension ``B``, on the module's device. The worker never calls ``act`` itself: it calls :meth:`ActorModule.act_`,
which collates raw numpy observations. The calling sequence::

    actor = MyActorModule(env.observation_space, env.action_space).to(device)
    action = actor.act_(obs, test=False)                  # one observation -> one action (B = 1)
    actions = actor.act_(obs_batch, test=False, batch=True)  # N observations (a vector env's) -> N actions

The ``act`` contract, which the built-in agents follow and new ones should:

* ``act`` returns a numpy array of shape ``(B, *action_space.shape)``: one action per observation, for any
  ``B >= 1``. A Discrete action space has shape ``()``, so its batch of actions has shape ``(B,)``.
* ``act_(obs)`` (one observation) unwraps such a ``(1, *action_space.shape)`` result to the single action.
* ``act_(obs, batch=True)`` requires it, and raises ValueError naming the actor when ``act`` returns anything
  else for a batch of ``N > 1``: a worker with ``worker.num_envs > 1`` makes one such call per vector step.
* tmrl-style actors, whose ``act`` returns one action shaped like the action space (``a.squeeze()``, ``a[0]``),
  keep working through ``act_(obs)``, so with ``worker.num_envs = 1``; they need the change above for more envs.
* ``test`` is one flag for the whole batch. A worker whose envs mix test and training episodes calls ``act_``
  once for each group.
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
        """Compute actions from a batch of observations (tensors with a leading dimension ``B``).

        Args:
            obs: a tensor, or a tuple/dict of tensors, shaped ``(B, *obs_shape)`` on this module's device.
            test: True for test episodes, which usually act deterministically.

        Returns:
            ``B`` actions as a numpy array shaped ``(B, *action_space.shape)`` (see the module's docstring; a
            tmrl-style actor may return the one action of a batch of 1 instead, and then serves one env only).
        """

    def act_(self, obs: Any, test: bool = False, batch: bool = False) -> np.ndarray:
        """Collate raw observations to tensors on this module's device and call :meth:`act`.

        Args:
            obs: one observation (``batch=False``), or a tree whose leaves have a leading dimension ``N``, one row
                per env, as Gymnasium's vector envs return them (``batch=True``).
            test: passed on to :meth:`act`.
            batch: whether ``obs`` is a batch.

        Returns:
            one action shaped like the action space, or ``N`` actions shaped ``(N, *action_space.shape)``.

        Raises:
            ValueError: ``batch`` is True and :meth:`act` did not return one action per observation.
        """
        device = self.device
        shape = getattr(self.action_space, "shape", None)
        if not batch:
            batched = tree_map(lambda x: torch.as_tensor(np.asarray(x), device=device).unsqueeze(0), obs)
            with torch.no_grad():
                out = self.act(batched, test=test)
            if shape is not None and np.shape(out) == (1, *shape):
                return np.asarray(out)[0]
            return out  # a tmrl-style actor's single action
        tensors = tree_map(lambda x: torch.as_tensor(np.asarray(x), device=device), obs)
        n = _rows(obs)
        with torch.no_grad():
            out = self.act(tensors, test=test)
        if shape is not None and np.shape(out) != (n, *shape):
            raise ValueError(f"{type(self).__name__}.act returned an array of shape {np.shape(out)} for a batch of {n} "
                             f"observations; a worker with several envs needs one action per observation, shape "
                             f"{(n, *shape)}: make act() return the whole batch (see netrl.actor), or run this actor "
                             "with worker.num_envs = 1")
        return np.asarray(out)


def _rows(tree: Any) -> int:
    """The leading dimension of a batch of observations (that of its first leaf)."""
    found: list[int] = []
    tree_map(lambda x: found.append(int(np.shape(x)[0])) if not found else None, tree)
    return found[0]
