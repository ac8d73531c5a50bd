"""Sequences of consecutive transitions for recurrent agents: batches shaped
``[B, L]``, with a mask.

:class:`~netrl.memory.replay.ReplayMemory` with ``sequence_length`` L > 1 hands out ``batch_size`` B
sequences, each of L consecutive transitions of one env, starting at uniformly drawn transition
ends (TorchRL's ``SliceSampler``). A sequence going forward from transition k includes k+1 iff
row k+1 continues row k (it ends a transition, and it is stored: never past the ring's newest
row) and transition k neither terminated nor truncated. So a sequence never crosses an episode's
end, another env's segment or a packet boundary (both start with context rows, which end no
transition), a stale row (weight 0: no transition end) or the ring's write head. A sequence that
stops early is padded with its last valid row and masked: ``batch.extra["mask"]`` is a bool tensor
``[B, L]``, True at real steps.

Every field of the batch has leading dimensions ``[B, L]``: ``obs`` leaves ``[B, L, ...]``,
``act [B, L, ...]``, ``rew``, ``terminated`` and ``truncated [B, L]``, ``weight`` (when some
rows are down-weighted) and the extras ``[B, L, ...]``. ``obs[:, j + 1]`` is ``next_obs[:, j]``
wherever ``mask[:, j + 1]``. The actor's recurrent state is an extra (``recurrent_state``...):
``batch.extra[name][:, 0]`` is the state the worker fed its actor with ``obs[:, 0]``, where a
recurrent agent starts the sequence. ``burn_in`` steps at the start are the agent's to run without
gradient (R2D2); the memory only checks that ``burn_in < L``.

The index matrix is built with a few array operations over ``[B, L]``, and
each column is gathered once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from netrl.samples.batch import Batch
from netrl.samples.columns import tree_map

__all__ = ["check_sequence_args", "sample_sequences", "sequence_index"]


def check_sequence_args(sequence_length: int, burn_in: int, memory_size: int) -> list[str]:
    """The problems with a memory's sequence arguments, each naming the argument and its value."""
    problems = []
    if sequence_length < 1:
        problems.append(f"sequence_length must be >= 1 (got "
                        f"{sequence_length}; 1: single transitions)")
    elif sequence_length > memory_size:
        problems.append(f"sequence_length ({sequence_length}) must be <= memory_size "
                        f"({memory_size}): a sequence cannot be longer than the memory")
    if burn_in < 0:
        problems.append(f"burn_in must be >= 0 (got {burn_in})")
    elif burn_in and burn_in >= sequence_length:
        problems.append(f"burn_in ({burn_in}) must be < sequence_length ({sequence_length}): a "
                        f"sequence needs a step left to learn from after its burn-in")
    return problems


def sequence_index(starts: np.ndarray, length: int, end: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                   oldest: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Physical rows ``[B, length]`` of the sequences that start at transition ends
    ``starts``, and their mask.

    ``end``, ``terminated`` and ``truncated`` are the ring's columns; ``oldest`` its oldest row and
    ``size`` the rows it stores. Masked steps repeat the sequence's last valid row.
    """
    capacity = len(end)
    steps = np.arange(length)
    rows = starts[:, None] + steps
    rows[rows >= capacity] -= capacity  # the ring wraps (cheaper than %)
    stop = terminated[rows]
    stop |= truncated[rows]
    continues = end[rows[:, 1:]] & ~stop[:, :-1]
    logical = (starts - oldest) % capacity
    # a sequence may reach the newest row: never read past it
    if int(logical.max()) + length > size:
        continues &= logical[:, None] + steps[1:] < size
    mask = np.empty(rows.shape, np.bool_)
    mask[:, 0] = True
    # once broken, a sequence stays stopped
    np.logical_and.accumulate(continues, axis=1, out=mask[:, 1:])
    last = rows[np.arange(len(rows)), mask.sum(1) - 1]
    return np.where(mask, rows, last[:, None]), mask


def sample_sequences(memory: Any) -> Batch:
    """A batch of ``memory.batch_size`` sequences of ``memory.sequence_length`` transitions
    (see the module), from ``memory``, a :class:`~netrl.memory.replay.ReplayMemory` (typed
    Any: it imports this module)."""
    cols = memory._cols
    starts = memory.sample_indices()
    oldest = memory._pos if memory._size == memory.memory_size else 0
    idx, mask = sequence_index(starts, memory.sequence_length, cols["end"], cols["terminated"], cols["truncated"],
                               oldest, memory._size)
    memory._sampled = idx.reshape(-1)
    flat = memory._batch(memory._sampled)  # one gather per column, over all B * L rows
    lead = idx.shape

    def shaped(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(*lead, *t.shape[1:])

    extra = {name: shaped(t) for name, t in flat.extra.items()}
    extra["mask"] = torch.from_numpy(mask).to(memory.device)
    fields = [tree_map(shaped, f) if f is not None else None for f in flat]
    return Batch(*fields, extra=extra)
