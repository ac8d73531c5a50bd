"""The TrainingAgent interface (tmrl's name and meaning); the Batch it
trains on is in :mod:`netrl.samples`.

Calling sequence, as the Trainer drives it::

    agent = MyTrainingAgent(observation_space, action_space, device)
    for each training step:
        metrics = agent.train(memory.sample())     # Batch of tensors on `device`
                                                    # -> {"loss_actor": 0.3, ...}
    actor = agent.get_actor()                       # an ActorModule; its state_dict is sent to the
                                                    # workers
    agent.state_dict() / agent.load_state_dict(d)   # optional, for checkpoints: tensors only,
                                                    # loaded with weights_only=True; without them a
                                                    # checkpoint keeps the actor only
    agent.state_tensors()                           # what a training step may change, for the loop
                                                    # to undo a step that went non-finite
                                                    # (netrl.agents.guard); found by default
    agent.views()                                   # what its inputs read from earlier rows
                                                    # (netrl.memory.views): by default its actor's,
                                                    # which the workers build at act time
    agent.extra_models()                            # optional: {name: ModelSpec(module, every)},
                                                    # further modules synced to the workers besides
                                                    # the actor (default: none)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, NamedTuple

import gymnasium
import torch

from netrl.actor import ActorModule
from netrl.agents.guard import find_state_tensors
from netrl.agents.registry import Supports
from netrl.memory.views import View
from netrl.samples.batch import Batch

__all__ = ["Batch", "ModelSpec", "TrainingAgent", "has_state_dict"]


class ModelSpec(NamedTuple):
    """A module synced to the workers besides the actor, e.g. an observation normaliser: published
    every ``every`` gradient steps under a version counter of its own. A worker loads it into its
    target of the same name (``RolloutWorker(models={name: module})``), and each sample row records
    the version it used (``batch.extra ["<name>_version"]``)."""

    module: torch.nn.Module
    every: int


class TrainingAgent(ABC):
    """An RL algorithm. Subclasses take at least ``observation_space``, ``action_space`` and
    ``device``.

    ``supports`` declares what it trains with (:mod:`netrl.agents.registry`), which
    ``make_pipeline`` checks against the config. None (the default, as tmrl's agents): nothing is
    declared, and nothing checked."""

    supports: ClassVar[Supports | None] = None

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

    def views(self) -> list[View]:
        """What the batch's inputs read from earlier rows (:mod:`netrl.memory.views`), assembled
        by a :class:`~netrl.memory.history.HistoryMemory`. By default the actor's
        (:meth:`~netrl.actor.ActorModule.views`), which the workers build at act time; an agent
        may add views for training only, but must keep its actor's."""
        method = getattr(self.get_actor(), "views", None)  # a tmrl-style actor may have none
        return list(method()) if method is not None else []

    def extra_models(self) -> dict[str, ModelSpec]:
        """Further modules to sync to the workers, by name (a lower-case identifier of at most 24
        characters, not "policy"): the training loop publishes each every ``ModelSpec.every``
        gradient steps. None by default."""
        return {}

    def state_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` for every tensor a training step may change. The training loop copies
        them after each finite step and copies them back when a step's losses or state are not
        finite. The default finds the ``nn.Module``s, optimisers and tensors among this agent's
        attributes (:func:`~netrl.agents.guard. find_state_tensors`); override it if the agent keeps
        them elsewhere, or changes state that is not a tensor."""
        return find_state_tensors(self)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume training: nested dicts of tensors and plain numbers only."""
        raise NotImplementedError(f"{type(self).__name__} does not implement "
                                  f"state_dict(); it cannot checkpoint")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        raise NotImplementedError(f"{type(self).__name__} does not implement "
                                  f"load_state_dict(); it cannot resume")


def has_state_dict(agent: Any) -> bool:
    """Whether ``agent`` implements both ``state_dict`` and ``load_state_dict``
    (tmrl's agents need not)."""
    for name in ("state_dict", "load_state_dict"):
        method = getattr(type(agent), name, None)
        if method is None or method is getattr(TrainingAgent, name):
            return False
    return True
