"""Samplers and transforms that compose, shared by both ring memory families
(:class:`~netrl.memory.replay.ReplayMemory`, :class:`~netrl.memory.history.HistoryMemory`).

A batch is drawn in three independent choices, each a keyword of either memory::

    which rows start an item   uniform (draw_ends), or prioritized=True (priority.py: sum tree,
                               importance weights; R2D2's mixture for sequences)
    what an item is            a transition (sequence_length 1), or a sequence of L transitions
                               following the trajectory links (sequences.py), with burn_in
    what a step holds          its transition, or an n-step return (n_step, gamma: nstep.py),
                               per step inside a sequence too

A memory says which rows end a sampleable transition (``_valid``: ``end`` for ReplayMemory, the
views still stored for HistoryMemory) and gathers the rows :meth:`Sampling._walk` chooses; views,
extras, ``sample_preprocessor`` and ``obs_transform`` apply to every step alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netrl.memory.base import draw_ends
from netrl.memory.nstep import nstep_windows
from netrl.memory.priority import Priorities, sequence_priority
from netrl.memory.sequences import check_sequence_args, sequence_index

__all__ = ["Sampling", "check_sampling_args"]


def check_sampling_args(owner: str, n_step: Any, gamma: float | None, priority_eta: float) -> list[str]:
    """The problems with ``owner``'s n-step and sequence-priority arguments, each naming its key."""
    problems = []
    if not isinstance(n_step, int) or n_step < 1:
        problems.append(f"memory.n_step must be an integer >= 1 (got {n_step!r}); 1: one-step transitions")
    elif n_step > 1 and (gamma is None or not 0.0 <= gamma <= 1.0):
        problems.append(f"{owner}(n_step={n_step}) needs gamma, the agent's discount (agent.gamma), "
                        f"within [0, 1] (got {gamma!r}): the n-step return discounts each reward with it")
    if not 0.0 <= priority_eta <= 1.0:
        problems.append(f"priority_eta must be within [0, 1] (got {priority_eta}): a sequence's "
                        f"priority is eta * max + (1 - eta) * mean of its steps' |td|")
    return problems


class Sampling:
    """Mixin of a ring memory (module docstring). The memory calls :meth:`_sampling_init` before
    ``MemoryDataloading.__init__`` and :meth:`_sampling_setup` after it, keeps
    ``self._priorities`` informed of its writes, and implements ``_valid`` and
    ``_ordered_ends``."""

    _cols: dict[str, Any]
    _size: int
    _pos: int
    _sampled: np.ndarray | None
    memory_size: int
    batch_size: int
    total_appended: int
    rng: np.random.Generator

    def _sampling_init(self, n_step: int = 1, gamma: float | None = None, prioritized: bool = False,
                       alpha: float = 0.6, beta: float = 0.4, beta_steps: int = 100_000, eps: float = 1e-6,
                       sequence_length: int = 1, burn_in: int = 0, priority_eta: float = 0.9) -> None:
        problems = check_sampling_args(type(self).__name__, n_step, gamma, priority_eta)
        if problems:
            raise ValueError("; ".join(problems))
        self.n_step, self.gamma = n_step, 1.0 if gamma is None else float(gamma)
        self.prioritized = bool(prioritized)
        self._priority_args = (alpha, beta, beta_steps, eps)
        self._priorities: Priorities | None = None
        self.sequence_length, self.burn_in, self.priority_eta = sequence_length, burn_in, float(priority_eta)

    def _sampling_setup(self) -> None:
        problems = check_sequence_args(self.sequence_length, self.burn_in, self.memory_size)
        if self.n_step > self.memory_size:
            problems.append(f"memory.n_step ({self.n_step}) must be <= memory.memory_size ({self.memory_size})")
        if problems:
            raise ValueError(f"{type(self).__name__}: {'; '.join(problems)}")
        if self.prioritized:
            self._priorities = Priorities(self.memory_size, *self._priority_args)

    def _valid(self, idx: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _ordered_ends(self) -> np.ndarray:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def _oldest(self) -> int:
        return self._pos if self._size == self.memory_size else 0

    # -- which rows --------------------------------------------------------------------------------
    def sample_indices(self) -> np.ndarray:
        """Ring rows of ``batch_size`` transition ends, uniformly at random (see
        :func:`~netrl.memory.base.draw_ends`), or by priority."""
        return self._draw()[0]

    def _draw(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Rows of a batch, and their importance weights when prioritized."""
        if self._priorities is None:
            return draw_ends(self.rng, self.batch_size, self._size, len(self), self._valid, self._ordered_ends), None
        if len(self) == 0:
            raise RuntimeError("the replay memory holds no complete transition yet")
        return self._priorities.draw(self.rng, self.batch_size, len(self))

    def _walk(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """The rows of a batch's items: ``[B]`` transition ends, or ``[B, L]`` sequences; the
        sequences' mask (None for transitions) and the importance weights per row (None unless
        prioritized)."""
        # sample_indices is the hook a subclass may override for uniform draws
        starts, importance = self._draw() if self._priorities is not None else (self.sample_indices(), None)
        if self._priorities is not None:
            self._priorities.training_steps += 1  # the training loop sets the true count after each step
        if self.sequence_length == 1:
            self._sampled = starts
            return starts, None, importance
        rows, mask = sequence_index(starts, self.sequence_length, self._cols, self.total_appended, self._size,
                                    self._joins)
        self._sampled = rows.reshape(-1)
        if importance is not None:  # a sequence's weight on each of its steps
            importance = np.repeat(importance[:, None], self.sequence_length, axis=1)
        return rows, mask, importance

    def _joins(self, rows: np.ndarray) -> np.ndarray:
        """Which successor rows a walk may step onto: those that end a sampleable transition."""
        return self._valid(rows)

    def _nstep(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """n-step windows from transition ends ``rows`` (any shape): ``(last, ret, steps)``."""
        return nstep_windows(self._cols, rows, self.n_step, self.gamma, self.total_appended, self._size,
                             self._joins)

    # -- priorities --------------------------------------------------------------------------------
    @property
    def training_steps(self) -> int:
        """The training steps beta has annealed over (prioritized): the training loop sets it,
        else each batch counts one."""
        return self._priorities.training_steps if self._priorities is not None else 0

    @training_steps.setter
    def training_steps(self, steps: int) -> None:
        if self._priorities is not None:
            self._priorities.training_steps = steps

    def _absolute(self, rows: np.ndarray) -> np.ndarray:
        """Physical rows -> absolute row numbers (rows appended before each), which a
        later overwrite changes."""
        return self.total_appended - 1 - (self._pos - 1 - rows) % self.memory_size

    def update_priority(self, priority: Any, index: Any = None) -> int:
        """New priorities (``|td|``: one per sample) for the rows of batch ``index`` (its
        ``extra["index"]``, absolute row numbers), by default the last batch sampled; for
        sequences, one per sequence or one per step (:func:`~netrl.memory.priority.
        sequence_priority`). Rows overwritten since, or no longer sampleable, keep theirs.
        Returns how many rows were updated (0 when any priority is not finite: the update is
        skipped)."""
        if self._priorities is None:
            raise RuntimeError(f"update_priority needs {type(self).__name__}(prioritized=True) "
                               "(config.json: memory.prioritized)")
        if index is None:
            if self._sampled is None:
                raise RuntimeError("update_priority before any batch was sampled: nothing to update")
            index = self._absolute(self._sampled)
            if self.sequence_length > 1:
                index = index.reshape(-1, self.sequence_length)
        index, priority = np.asarray(index, np.int64), np.asarray(priority, np.float64)
        if index.ndim == 2:  # sequences: their start rows get R2D2's mixture of their steps'
            index, priority = sequence_priority(priority, index, self.priority_eta, self.burn_in)
        index, priority = index.reshape(-1), priority.reshape(-1)
        if priority.shape != index.shape:
            raise ValueError(f"priority has {priority.size} values for a batch of "
                             f"{index.size}: return one per sample, in the batch's order")
        rows = index % self.memory_size
        keep = (index >= self.total_appended - self.memory_size) & (index < self.total_appended)
        keep[keep] = self._valid(rows[keep])
        return self._priorities.update(rows[keep], priority[keep])
