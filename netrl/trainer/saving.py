"""Saving a run: what a Trainer writes to its run folder while it trains (internal).

Calling sequence (the Trainer's, on a built and restored
:class:`~netrl.training.loop.TrainingOffline` and its :class:`~netrl.trainer.link.TrainerLink`)::

    saver = RunSaver(run_dir, model_path, session, config, fsync)
    saver.published = restored.published   # the newest versions this run noted as sent
    saver.note_saved(training, net)        # what the checkpoint on disk (if any) holds
    saver.record_version(v)                # by the link, before it sends weights v
    saver.save(training, net, publish=...) # after each epoch, and when the trainer stops
    saver.unsaved(training, net)           # trained since the last save?

A save writes the policy file first, then the checkpoint: an actor trained since its last
publication gets a version of its own before it is written (no number names two actors), and the
checkpoint records that number. A version is noted in the run folder before it is sent, so that a
restarted trainer numbers after it (:func:`netrl.storage.checkpoint.record_published`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from netrl.errors import CheckpointError, NetrlError
from netrl.protocol.models import POLICY
from netrl.storage import checkpoint
from netrl.storage.weight_files import write_weights_file
from netrl.trainer.delivery import write_failed
from netrl.trainer.link import TrainerLink
from netrl.trainer.resume import agent_state
from netrl.training.loop import TrainingOffline

__all__ = ["RunSaver"]

log = logging.getLogger(__name__)


class RunSaver:
    """The checkpoint, the policy file and the notes of the weight versions sent, of one run
    folder."""

    def __init__(self, run_dir: Path, model_path: Path, session: str,
                 config: dict[str, Any] | None, fsync: bool) -> None:
        self.run_dir, self.model_path, self.session = run_dir, model_path, session
        self.config, self.fsync = config, fsync
        self.published: dict[str, int] = {}  # model -> newest version noted as sent (PUBLISHED)
        # progress() at the last save; None: nothing to save (yet)
        self.saved: tuple[Any, ...] | None = None
        # by this run (the trainer's closing log line must not claim an older file)
        self.policy_saved = False

    def record_version(self, version: int, model: str = POLICY) -> None:
        """Note a weight version (of the policy, or of another ``model``) in the run folder
        before it is sent (see :func:`checkpoint.record_published`)."""
        self.published[model] = version
        others = {name: v for name, v in self.published.items() if name != POLICY}
        try:
            checkpoint.record_published(self.run_dir, self.published.get(POLICY, 0), self.fsync,
                                        **({"models": others} if others else {}))
        except OSError as exc:
            what = write_failed("the newest weight version to", self.run_dir / "checkpoint", exc)
            raise CheckpointError(f"{what}; v{version} was not sent, so no number names two "
                                  "actors") from None

    @staticmethod
    def progress(training: TrainingOffline | None, net: TrainerLink | None) -> tuple[Any, ...]:
        """What a checkpoint and the policy file would hold; equal to the last save's
        means nothing to save."""
        assert training is not None and training.publisher is not None
        return (training.epoch, training.total_updates, training.total_samples,
                training.publisher.version, net.ingested if net is not None else None)

    def note_saved(self, training: TrainingOffline | None, net: TrainerLink | None) -> None:
        """Take what ``training`` and ``net`` hold now as saved."""
        self.saved = self.progress(training, net)

    def unsaved(self, training: TrainingOffline | None, net: TrainerLink | None) -> bool:
        """Trained or received anything since the last save (never, before the first note)."""
        return self.saved is not None and self.progress(training, net) != self.saved

    def save(self, training: TrainingOffline | None, net: TrainerLink | None,
             publish: bool) -> None:
        """The policy file, then the checkpoint; ``publish``: an actor that needs a version of
        its own may be sent to the workers under it (see :meth:`save_policy`)."""
        guards = training.safeguards if training is not None else None
        # stopped mid-round: keep only a finite state
        if guards is not None and training is not None:
            guards.settle(training.total_updates)
        # first: it may number the actor, which the checkpoint then records
        self.save_policy(training, net, publish)
        self.checkpoint(training, net)
        self.policy_saved = True
        self.note_saved(training, net)

    def checkpoint(self, training: TrainingOffline | None, net: TrainerLink | None) -> None:
        """Save agent, counters, weight version, sample-log position and delivery
        state (atomically)."""
        if (training is None or training.agent is None or training.publisher is None
                or net is None):
            return
        memory_len = len(training.memory) if training.memory is not None else 0
        state = {**training.state(), "memory_len": memory_len,
                 "log_position": list(net.ingested) if net.ingested is not None else None,
                 "deliveries": net.delivery_state(), "trainer_session": self.session,
                 "saved_at": time.time(), "config": self.config,
                 "agent_state": "full" if training.agent_has_state else "actor"}
        try:
            path = checkpoint.save_checkpoint(self.run_dir, agent_state(training), state,
                                              self.fsync)
        except OSError as exc:
            what = write_failed("a checkpoint in", self.run_dir / "checkpoint", exc)
            raise CheckpointError(f"{what}; the previous checkpoint is intact") from None
        log.info("checkpoint saved to %s (epoch %d, %d training steps, weights v%d, memory %d)",
                 path,
                 training.epoch, training.total_updates, training.publisher.version,
                 state["memory_len"])

    def save_policy(self, training: TrainingOffline | None, net: TrainerLink | None,
                    publish: bool) -> None:
        """Write the current actor to ``model_path`` (state_dict plus a JSON
        sidecar with its version)."""
        if training is None or training.agent is None or training.publisher is None:
            return
        if training.publisher.published_updates != training.total_updates:  # trained since its last
            self._number_actor(training, net, publish)
        bad = checkpoint.nonfinite_entries(training.agent.get_actor().state_dict())
        # the loop undoes non-finite steps: this agent changed its actor where
        # StateGuard could not see it
        if bad:
            raise CheckpointError(f"not saving the policy: the actor's {', '.join(bad[:3])} hold "
                                  f"NaN or infinity; {self.model_path} keeps the last "
                                  f"finite one. Make the agent's state_tensors() "
                                  f"list every tensor its train() changes")
        meta = {"version": training.publisher.version, "trained_steps": training.total_updates,
                "samples": training.total_samples, "trainer_session": self.session,
                "saved_at": time.time(),
                # whose policy it is (see check_model_path)
                "pid": os.getpid(), "run_dir": str(self.run_dir.resolve())}
        try:
            write_weights_file(self.model_path, training.agent.get_actor(), meta)
        except OSError as exc:
            raise CheckpointError(write_failed("the policy to", self.model_path, exc)) from None

    def _number_actor(self, training: TrainingOffline, net: TrainerLink | None,
                      publish: bool) -> None:
        """Give the actor a version of its own before it is saved, so that no number names two
        actors: published while the network thread runs and ``publish`` allows (after an epoch:
        the workers get it too), else noted like a sent one."""
        if net is not None and publish:
            try:
                training.publish(net)
                return
            except NetrlError:  # the network thread has stopped
                pass
        publisher = training.publisher
        assert publisher is not None
        publisher.version = max(publisher.version, net.taken_version() if net else -1) + 1
        self.record_version(publisher.version)
        publisher.published_updates = training.total_updates
