"""What the training loop refuses and undoes, so that no input can poison training for good.

* A packet whose values break what the spaces and the config promise
  (:class:`~netrl.samples.value_limits.ValueLimits`) is refused whole, named and counted; it was
  delivered (acknowledged, and kept in the sample log), so nobody resends it.
* A training step whose metrics or resulting state are not finite is undone
  (:class:`~netrl.agents.guard. StateGuard`), counted and logged with the workers
  whose samples were in its batch; after ``max_nonfinite_steps`` of them in a row,
  :class:`~netrl.errors.TrainingDiverged` stops the trainer (exit code 1).
* An actor with non-finite weights is never published (and :mod:`netrl.storage.checkpoint`
  never saves one).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch

from netrl.agents.guard import StateGuard
from netrl.errors import TrainingDiverged
from netrl.samples.columns import Buffer
from netrl.samples.value_limits import ValueLimits
from netrl.storage.checkpoint import nonfinite_entries
from netrl.util import count_of, worth_logging

__all__ = ["KEEP_EVERY", "Safeguards"]

log = logging.getLogger(__name__)

MAX_NAMED = 8  # workers named in a message
KEEP_EVERY = 10  # steps between checks of the agent's whole state (each one copies it:
                 # see netrl.agents.guard)


def _names(workers: list[str]) -> str:
    shown = ", ".join(workers[:MAX_NAMED])
    return shown + (f" and {len(workers) - MAX_NAMED} more" if len(workers) > MAX_NAMED else "")



class BatchWorkers(Protocol):
    """What names the workers behind the batch just trained on: a memory, or the
    batches it gathers ahead."""

    def batch_workers(self) -> list[str] | None: ...

class Safeguards:
    """The training loop's refusals and undos (module docstring), with their counters."""

    def __init__(self, limits: ValueLimits | None, agent: Any, max_nonfinite_steps: int) -> None:
        self.limits = limits
        self.guard = StateGuard(agent) if max_nonfinite_steps > 0 else None
        self.max_nonfinite_steps = max_nonfinite_steps
        self.refused = 0  # packets refused for their values (new ones: the sample log's replays
                          # were counted before)
        self.nonfinite_steps = 0  # training steps undone
        self.in_a_row = 0
        self.unpublished = 0  # publications refused: the actor was not finite
        self._suspects: dict[str, None] = {}  # workers in the batches of the steps in a
                                              # row, in order
        self._recent: dict[str, None] = {}  # workers of the packets stored lately, for memories
                                            # that do not track
        self._warned = False

    # -- packets -----------------------------------------------------------------------------------
    def checked_by(self, source: Any) -> bool:
        """True if ``source`` checks every packet's values with these very limits as it takes
        it (the trainer's link: on arrival, so that it never logs or keeps a refused packet):
        its packets need no second check."""
        return self.limits is not None and getattr(source, "value_limits", None) is self.limits

    def refuse(self, buf: Buffer, new: bool, checked: bool = False) -> bool:
        """True if ``buf`` breaks the value limits: then it is logged (rate-limited)
        and, if ``new``, counted. ``checked``: its source checked them already (False)."""
        if self.limits is None:
            return False
        problem = None if checked else self.limits.buffer_problem(buf)
        if problem is None:
            self._recent.pop(buf.worker, None)
            self._recent[buf.worker] = None
            if len(self._recent) > MAX_NAMED:
                del self._recent[next(iter(self._recent))]
            return False
        self.refused += new
        if worth_logging(self.refused if new else 1):
            log.warning("refused packet %d of worker %s (%d rows)%s: %s (%d refused so "
                        "far; it was delivered, so it is not sent again)",
                        buf.seq, buf.worker or "(unnamed)", len(buf),
                        "" if new else " from the sample log", problem, self.refused)
        return True

    # -- training steps ----------------------------------------------------------------------------
    def begin(self) -> None:
        """Before training: the agent's state (a checkpoint's, say) is the one to go
        back to; it must be finite."""
        if self.guard is None:
            return
        bad = self.guard.begin()
        if not self.guard.tensors and not self._warned:
            self._warned = True
            name = type(self.guard.agent).__name__
            log.warning("found no tensors on %s: a training step whose losses are not "
                        "finite is skipped, but what it changed cannot be undone. "
                        "Implement %s.state_tensors() to list them", name, name)
        if bad:
            raise TrainingDiverged(f"the agent's state is not finite before training "
                                   f"({', '.join(bad[:3])}): no step can make it finite "
                                   f"again. Start a new run (--run-name, config.json: "
                                   f"run_name), or check the agent's initialisation")

    def accept(self, metrics: dict[str, Any], memory: BatchWorkers | None, step: int,
               check_state: bool = False, settling: bool = False) -> bool:
        """After training step ``step``: True if it is finite (its metrics; every :data:`KEEP_EVERY`
        steps, or with ``check_state``, the agent's whole state, then kept to go back to). Otherwise
        the agent goes back to the state last kept, the step is counted and logged, and after
        ``max_nonfinite_steps`` in a row :class:`TrainingDiverged` is raised."""
        if self.guard is None:
            return True
        check_state = check_state or self.guard.since + 1 >= KEEP_EVERY
        if self.guard.accept(metrics, check_state, step=not settling):
            if check_state:
                self.in_a_row = 0
                self._suspects.clear()
            return True
        self.nonfinite_steps += 1
        self.in_a_row += 1
        workers = memory.batch_workers() if memory is not None else None
        known = workers is not None
        for w in workers if workers is not None else list(self._recent):
            self._suspects[w or "(unnamed)"] = None
        who = (f"with samples from {_names(workers)}" if workers else
               f"(packets came lately from {_names(list(self._recent))})")
        what = (f"the agent's state after training step {step} was not finite" if settling else
                f"training step {step} was not finite")
        undone = self.guard.undone
        if worth_logging(self.nonfinite_steps):
            log.warning("%s (%s) %s: the agent and its optimisers are back at their "
                        "last finite state, %s (%s so far, %d in a row; the trainer "
                        "stops after trainer.max_nonfinite_steps = %d in a row)", what,
                        self.guard.problem, who, "undoing this step" if undone == 1 else
                        f"undoing the last {undone} training steps",
                        count_of(self.nonfinite_steps, "time"),
                        self.in_a_row, self.max_nonfinite_steps)
        if self.in_a_row >= self.max_nonfinite_steps:
            reward = (f"trainer.max_abs_reward ({self.limits.max_abs_reward:g}) bounds rewards"
                      if self.limits is not None else "rewards are not bounded")
            raise TrainingDiverged(
                f"{self.in_a_row} training steps in a row were not finite (the "
                f"last: {self.guard.problem}), each undone; nothing non-finite "
                f"was published or saved. Their batches held samples from "
                f"{_names(list(self._suspects))}{'' if known else ' (packets stored lately)'}. "
                f"Look at what those workers send ({reward}; observations and "
                f"actions are checked against the spaces), and at the learning rates "
                f"(agent.sac.lr_actor, agent.sac.lr_critic, agent.sac.lr_entropy, agent.dqn.lr, "
                f"agent.ppo.lr): lower them, or scale the rewards down. Then start the "
                f"trainer again: it resumes from its last checkpoint, which is finite")
        return False

    def settle(self, step: int) -> None:
        """Check the agent's whole state now (before a save, at the end of a round), and go
        back if it is not finite; counted and logged like a step."""
        self.accept({}, None, step, check_state=True, settling=True)

    # -- publishing --------------------------------------------------------------------------------
    def publishable(self, actor: torch.nn.Module) -> bool:
        """True if the actor's weights are finite; else the publication is refused,
        counted and logged."""
        bad = nonfinite_entries(actor.state_dict())
        if not bad:
            return True
        self.unpublished += 1
        if worth_logging(self.unpublished):
            log.error("not publishing the actor: %s %s not finite (%d publications "
                      "refused so far); the workers keep the weights they have",
                      ", ".join(bad[:3]), "is" if len(bad) == 1 else "are", self.unpublished)
        return False

    def state(self) -> dict[str, int]:
        return {"refused_packets": self.refused, "nonfinite_steps": self.nonfinite_steps}

    def load_state(self, state: dict[str, Any]) -> None:
        self.refused = int(state.get("refused_packets", 0))
        self.nonfinite_steps = int(state.get("nonfinite_steps", 0))
