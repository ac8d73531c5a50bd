"""Prioritized replay (Schaul et al., "Prioritized Experience Replay", 2016) over a ring's rows.

A row's priority is ``(|td| + eps) ** alpha``; it is drawn with probability
``P(i) = p_i / sum p`` (a :class:`~netrl.memory.sumtree.SumTree`), and its loss is weighted by
``w_i = (N P(i)) ** -beta / max_j w_j`` over the batch (the paper's Algorithm 1), with ``beta``
annealed linearly from its start to 1 over ``beta_steps`` training steps. New rows enter at the
highest priority given so far, so each is seen at least once soon. Rows that end no transition
(resets, context rows, stale rows dropped) and the ring's oldest row (its previous row is gone)
have priority 0 and are never drawn.

Batches name their rows by *absolute* row number (rows appended before them,
``batch.extra["index"]``, TorchRL's key): an update for a row that a newer packet has
overwritten since it was sampled is ignored, so priorities computed from a batch prepared
ahead can never land on other data.

Sequences (R2D2, Kapturowski et al. 2019): the priority of a row is that of the sequence starting
there, drawn the same way; ``extra["index"]`` is ``[B, L]`` and the agent returns one priority per
step (``[B, L]`` |td|: the memory mixes them, :func:`sequence_priority`) or one per sequence
(``[B]``, mixed by the agent). Every step of a sequence carries its importance weight.

The training loop calls :func:`update_from_metrics` after each accepted step: an agent's
``train()`` may return ``metrics["priority"]``, one value per sample (its absolute TD errors,
say); it is never logged as a metric.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from netrl.memory.sumtree import SumTree
from netrl.util import worth_logging

__all__ = ["PRIORITY_KEY", "Priorities", "check_priority_args", "pop_priority", "sequence_priority",
           "update_from_metrics"]

log = logging.getLogger(__name__)

PRIORITY_KEY = "priority"


def check_priority_args(alpha: float, beta: float, beta_steps: int, eps: float) -> list[str]:
    """The problems with these settings, each naming its key and value."""
    problems = []
    if not 0.0 <= alpha <= 1.0:
        problems.append(f"memory.priority_alpha must be within [0, 1] (got {alpha}): 0 samples "
                        "uniformly, 1 fully by priority")
    if not 0.0 <= beta <= 1.0:
        problems.append(f"memory.priority_beta must be within [0, 1] (got {beta}); it is annealed "
                        "to 1")
    if beta_steps < 0:
        problems.append(f"memory.priority_beta_steps must be >= 0 (got {beta_steps}); 0: beta is 1 "
                        "from the start")
    if not eps > 0:
        problems.append(f"memory.priority_eps must be > 0 (got {eps}): a priority of 0 would never "
                        "be sampled again")
    return problems


class Priorities:
    """The sum tree of a ring of ``capacity`` rows, and the rules above."""

    def __init__(self, capacity: int, alpha: float, beta: float, beta_steps: int, eps: float) -> None:
        problems = check_priority_args(alpha, beta, beta_steps, eps)
        if problems:
            raise ValueError("; ".join(problems))
        self.tree = SumTree(capacity)
        self.alpha, self.beta0, self.beta_steps, self.eps = alpha, beta, beta_steps, eps
        self.max_priority = 1.0  # already raised to alpha: new rows enter with it
        self.training_steps = 0  # beta's clock: the training loop sets it, else each
                                 # sample() counts one
        self.refused = 0  # updates skipped for non-finite priorities

    @property
    def beta(self) -> float:
        if self.beta_steps <= 0:
            return 1.0
        return self.beta0 + (1.0 - self.beta0) * min(1.0, self.training_steps / self.beta_steps)

    def written(self, rows: np.ndarray, ends: np.ndarray, oldest: int) -> None:
        """Rows ``rows`` were just written; ``ends`` says which end a transition. The ring's
        ``oldest`` row cannot be sampled any more (its previous row is gone or was never there)."""
        self.tree.update(rows, np.where(ends, self.max_priority, 0.0))
        self.tree.update(np.array([oldest]), 0.0)

    def draw(self, rng: np.random.Generator, n: int, transitions: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` rows by priority and their importance weights (float32, the largest 1)
        among ``transitions``."""
        rows = self.tree.sample(rng, n)
        p = self.tree.get(rows) / self.tree.total
        w = (transitions * p) ** -self.beta
        return rows, (w / w.max()).astype(np.float32)

    def update(self, rows: np.ndarray, priority: np.ndarray) -> int:
        """Set rows' priorities from ``priority`` (``|td|``, say: the absolute value is
        taken); returns how many.

        Non-finite values refuse the whole update (counted and logged): a step whose losses went
        non-finite is undone, and a NaN in the tree would end sampling."""
        priority = np.abs(np.asarray(priority, np.float64).reshape(-1))
        if priority.shape != rows.shape:
            raise ValueError(f"{PRIORITY_KEY} has {priority.size} values for a batch of "
                             f"{rows.size}: return one per sample, in the batch's order")
        if not np.isfinite(priority).all():
            self.refused += 1
            if worth_logging(self.refused):
                log.warning("skipped a priority update: %d of %d priorities "
                            "are not finite (%d updates skipped so far)",
                            int((~np.isfinite(priority)).sum()), priority.size, self.refused)
            return 0
        p = (priority + self.eps) ** self.alpha
        self.tree.update(rows, p)
        if p.size:
            self.max_priority = max(self.max_priority, float(p.max()))
        return int(rows.size)


def sequence_priority(priority: np.ndarray, index: np.ndarray, eta: float, burn_in: int = 0
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Sequences' start rows and priorities from a sequence batch's ``index`` (``[B, L]`` absolute
    rows, ``batch.extra["index"]``) and ``priority``: one per sequence (``[B]``), taken as it is,
    or one per step (``[B, L]``, each step's ``|td|``), mixed as R2D2 does: ``eta * max + (1 - eta)
    * mean`` over the sequence's real steps after its first ``burn_in`` (which train nothing). The
    padded steps after a sequence's end repeat its last row, which is how they are told apart here
    (the mask need not come back); a sequence with no real step after its burn-in gets 0."""
    starts = index[:, 0]
    if priority.shape == starts.shape:
        return starts, priority
    if priority.shape != index.shape:
        raise ValueError(f"{PRIORITY_KEY} has shape {priority.shape} for a batch of sequences "
                         f"{index.shape}: return one per sequence {starts.shape} or one per step")
    real = np.ones(index.shape, np.bool_)
    real[:, 1:] = index[:, 1:] != index[:, :-1]
    real[:, :burn_in] = False
    td = np.where(real, np.abs(priority), 0.0)
    mixed = eta * td.max(axis=1) + (1.0 - eta) * td.sum(axis=1) / np.maximum(real.sum(axis=1), 1)
    return starts, mixed


def pop_priority(metrics: dict[str, Any]) -> Any:
    """Take ``metrics["priority"]`` out of an agent's metrics (None if absent): it is
    per sample, not a metric."""
    return metrics.pop(PRIORITY_KEY, None)


def update_from_metrics(memory: Any, batch: Any, priority: Any, training_steps: int) -> None:
    """After an accepted training step: give ``memory`` the per-sample ``priority`` its
    agent returned for ``batch`` (if the memory is prioritized), and the number of training
    steps beta anneals over."""
    update = getattr(memory, "update_priority", None)
    if update is None or not getattr(memory, "prioritized", False):
        return
    memory.training_steps = training_steps
    if priority is None:
        return
    if hasattr(priority, "detach"):
        priority = priority.detach().float().cpu().numpy()
    index = batch.extra.get("index")
    update(priority, None if index is None else index.cpu().numpy())
