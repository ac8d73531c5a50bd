"""Weights out: the training loop's actor, and the further models synced to the workers, as
numbered versions.

Calling sequence (the loop's)::

    publisher = Publisher(agent, safeguards, update_model_interval, sync, memory)
    publisher.add_models(agent.extra_models(), "...")   # and Trainer(models=...), obs_norm
    publisher.start(source, trained)                    # the first version of each
    publisher.publish_due(source, trained)              # before each training step
    publisher.publish(source, trained)                  # the actor now (sync: each batch; a save)

Versions are numbered after any the source says are taken (an earlier trainer session's weights,
still with the server or the workers): a number never names two actors, and a taken one is
published over at once. Each extra model has a version counter of its own and is published every
``ModelSpec.every`` training steps. An actor whose weights are not finite is never published
(:meth:`Safeguards.publishable`).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

from netrl.agents.base import ModelSpec, TrainingAgent
from netrl.memory.base import MemoryDataloading
from netrl.training.safeguards import Safeguards
from netrl.training.source import SampleSource
from netrl.training.sync import SyncBatches

__all__ = ["Publisher"]

log = logging.getLogger(__name__)


def _publishes_models(source: Any) -> bool:
    """Whether ``source.publish`` takes a ``model`` (the Trainer's link does; simpler sources
    publish the policy only)."""
    try:
        return "model" in inspect.signature(source.publish).parameters
    except (TypeError, ValueError):
        return False


class Publisher:
    """The loop's weights out (module docstring), made by ``TrainingOffline.build``."""

    def __init__(self, agent: TrainingAgent, safeguards: Safeguards, interval: int,
                 sync: SyncBatches | None, memory: MemoryDataloading) -> None:
        self.agent, self.safeguards, self.interval = agent, safeguards, interval
        self.sync, self.memory = sync, memory  # sync: each version opens a batch, memory cleared
        self.version = 0  # the actor's newest published version
        self.published_updates = -1  # training steps when the actor was published as ``version``
        # further models synced to the workers (TrainingAgent.extra_models, Trainer(models=...)):
        # each published every ModelSpec.every training steps under a version counter of its own
        self.models: dict[str, ModelSpec] = {}
        self.model_versions: dict[str, int] = {}  # name -> its newest version (checkpoints keep it)
        self._published_at: dict[str, int] = {}  # name -> training steps when it was last published
        self._unsent_logged = False

    def add_models(self, models: dict[str, ModelSpec], owner: str) -> None:
        """Publish ``models`` too (the Trainer checks their names: it knows the wire's rules)."""
        for name, spec in models.items():
            if name in self.models:
                raise ValueError(f"{owner} declares the model {name!r}, which is already "
                                 "published (by the agent's extra_models() or "
                                 "Trainer(models=...)): give it another name")
            if not isinstance(spec, ModelSpec) or not isinstance(spec.module, torch.nn.Module):
                raise ValueError(f"{owner}[{name!r}] is {spec!r:.80}, not a "
                                 "ModelSpec(module, every) of a torch.nn.Module")
            if isinstance(spec.every, bool) or not isinstance(spec.every, int) or spec.every < 1:
                raise ValueError(f"{owner}[{name!r}].every must be an integer >= 1: the "
                                 f"gradient steps between two publications (got {spec.every!r})")
            self.models[name] = spec
            self.model_versions.setdefault(name, 0)

    def start(self, source: SampleSource, trained: int) -> None:
        """The actor's first version, then every model's: a worker has them all before any is
        due."""
        self.publish(source, trained)
        for name in self.models:
            self._publish_model(source, name, trained)

    def publish(self, source: SampleSource, trained: int) -> None:
        """Send the actor under the next free number (above any the source says is taken: see
        :meth:`renumber`)."""
        actor = self.agent.get_actor()
        if not self.safeguards.publishable(actor):
            return
        self.version = max(self.version, source.taken_version()) + 1
        if self.sync is not None:  # the batch under collection takes this version only
            self.memory.clear()  # type: ignore[attr-defined]  # (checked in TrainingOffline.build)
            self.sync.open(self.version)
            announce = getattr(source, "announce", None)
            if announce is None:
                raise ValueError("trainer.collection is sync, but the sample source "
                                 f"{type(source).__name__} cannot tell the workers (it has no "
                                 "announce()): sync collection needs the networked Trainer")
            announce(self.sync.announcement())
        source.publish(actor, self.version, trained)
        self.published_updates = trained

    def publish_due(self, source: SampleSource, trained: int) -> None:
        """Before a training step: the actor every ``interval`` training steps (not again after a
        step was undone) or when its number is taken, and the models that are due."""
        if not self.renumber(source, trained) and (trained % self.interval == 0 and trained > 0
                                                   and self.published_updates != trained):
            self.publish(source, trained)
        if self.models:
            self.publish_models(source, trained)

    def renumber(self, source: SampleSource, trained: int) -> bool:
        """Publish the actor again after a version the source says is taken; True if it did."""
        taken = source.taken_version()
        # Equal is taken too: the number this loop published last may also name other weights.
        if taken < self.version:
            return False
        log.info("weight versions up to v%d may hold an earlier trainer session's weights "
                 "(workers or the server have them): publishing the current actor as v%d", taken,
                 taken + 1)
        self.version = taken
        self.publish(source, trained)
        return True

    def publish_models(self, source: SampleSource, trained: int) -> None:
        """Publish each extra model that is due (every ``ModelSpec.every`` training steps) or
        whose number the source says is taken (an earlier trainer session's, as
        :meth:`renumber` for the policy)."""
        taken = getattr(source, "taken_model_version", None)
        for name, spec in self.models.items():
            renumber = taken is not None and taken(name) >= self.model_versions.get(name, 0)
            due = (trained % spec.every == 0 and trained > 0
                   and self._published_at.get(name) != trained)
            if renumber or due:
                self._publish_model(source, name, trained)

    def _publish_model(self, source: SampleSource, name: str, trained: int) -> None:
        if not _publishes_models(source):
            if not self._unsent_logged:
                self._unsent_logged = True
                log.warning("the sample source %s publishes the policy only: the models %s are "
                            "not sent to the workers", type(source).__name__, sorted(self.models))
            return
        taken = getattr(source, "taken_model_version", None)
        newest = max(self.model_versions.get(name, 0), taken(name) if taken is not None else -1)
        version = newest + 1
        self.model_versions[name] = version
        source.publish(self.models[name].module, version, trained,  # type: ignore[call-arg]
                       model=name)
        self._published_at[name] = trained

    def number_after(self, version: int, where: str) -> None:
        """Continue the actor's numbering after ``version`` if it is newer: no number may name
        two actors."""
        if version > self.version:
            log.info("weight versions continue after v%d, the newest %s, not after v%d", version,
                     where, self.version)
            self.version = version
