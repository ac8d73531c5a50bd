"""Sequences of consecutive transitions for recurrent agents: batches shaped
``[B, L]``, with a mask.

:class:`~netrl.memory.replay.ReplayMemory` with ``sequence_length`` L > 1 hands out ``batch_size`` B
sequences, each of L consecutive transitions of one env, starting at uniformly drawn transition
ends (TorchRL's ``SliceSampler``). A sequence follows its trajectory
(:mod:`netrl.memory.trajectories`): from transition k it includes k's successor iff that row
is still stored and ends a sampleable transition, and transition k neither terminated nor
truncated. So a sequence crosses packet boundaries (the context rows repeated at a packet's
start are skipped), but never an episode's end, a lost
packet, a worker's restart, a stale row (weight 0), a dropped or quarantined worker's row, nor
the ring's write head. A sequence that stops early is padded with its last valid row and
masked: ``batch.extra["mask"]`` is a bool tensor ``[B, L]``, True at real steps.

Every field of the batch has leading dimensions ``[B, L]``: ``obs`` leaves ``[B, L, ...]``,
``act [B, L, ...]``, ``rew``, ``terminated`` and ``truncated [B, L]``, ``weight`` (when some
rows are down-weighted) and the extras ``[B, L, ...]``. ``obs[:, j + 1]`` is ``next_obs[:, j]``
wherever ``mask[:, j + 1]``. The actor's recurrent state is an extra (``recurrent_state``...):
``batch.extra[name][:, 0]`` is the state the worker fed its actor with ``obs[:, 0]``, where a
recurrent agent starts the sequence. ``burn_in`` steps at the start are the agent's to run without
gradient (R2D2); the memory only checks that ``burn_in < L``.

The index matrix is built with array operations over ``[B, L]``, one pass per packet boundary a
sequence crosses, and each column is gathered once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from netrl.samples.batch import Batch
from netrl.samples.columns import tree_map

__all__ = ["check_sequence_args", "sequence_batch", "sequence_index"]


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


def sequence_index(starts: np.ndarray, length: int, cols: dict[str, np.ndarray], total: int, size: int,
                   joins: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Ring rows ``[B, length]`` of the sequences that start at transition ends ``starts``, and
    their mask.

    Each step follows the previous row's successor (``cols["next"]``, :mod:`netrl.memory.
    trajectories`) while it is stored (``total`` rows appended, ``size`` stored), ends a
    sampleable transition (``joins(rows)``) and the previous transition neither terminated nor
    truncated (``cols["terminated"]``, ``cols["truncated"]``). Masked steps repeat the sequence's
    last valid row.
    """
    term, trunc, nxt_col, run = cols["terminated"], cols["truncated"], cols["next"], cols["run"]
    cap, steps, batch = len(nxt_col), np.arange(length), len(starts)
    # Runs, not steps: a row's packet segment follows it contiguously in the ring (``run`` rows),
    # so a walk takes those at once and jumps only at a segment's end: one pass over the batch per
    # packet boundary a sequence crosses, not per step.
    pos = np.asarray(starts, np.int64) % cap
    filled = np.zeros(batch, np.int64)  # steps placed so far
    end = np.full(batch, length)  # each sequence's first step without a successor to go to
    base = np.zeros((batch, length), np.int64)  # step j of a sequence is ring row base + j
    going = np.ones(batch, np.bool_)
    placed = np.zeros(batch, np.int64)  # base of the run placed last, per sequence
    at = np.arange(batch)
    for _ in range(length):
        b = at[going]
        base[b, filled[b]] += pos[b] - filled[b] - placed[b]  # a change point: cumsum below
        placed[b] = pos[b] - filled[b]
        filled[b] += np.minimum(run[pos[b]].astype(np.int64) + 1, length - filled[b])
        more = b[filled[b] < length]
        if not len(more):
            break
        nxt = nxt_col[(placed[more] + filled[more] - 1) % cap]  # the successor of the run's last row
        ok = nxt >= total - size  # the successor is stored: go there, else the sequence ends
        end[more[~ok]] = filled[more[~ok]]
        going[:] = False
        going[more[ok]] = True
        pos[more[ok]] = nxt[ok] % cap
    rows = (np.cumsum(base, axis=1) + steps) % cap
    stop = term[rows[:, :-1]] | trunc[rows[:, :-1]]
    going = (steps[1:] < end[:, None]) & ~stop
    going[going] = joins(rows[:, 1:][going])
    mask = np.empty(rows.shape, np.bool_)
    mask[:, 0] = True
    np.logical_and.accumulate(going, axis=1, out=mask[:, 1:])  # once stopped, a sequence stays stopped
    last = rows[np.arange(len(rows)), mask.sum(axis=1) - 1]
    return np.where(mask, rows, last[:, None]), mask


def sequence_batch(flat: Batch, mask: np.ndarray, device: Any) -> Batch:
    """A batch of ``B * L`` steps gathered flat, shaped ``[B, L, ...]``, with ``extra["mask"]``."""
    lead = mask.shape

    def shaped(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(*lead, *t.shape[1:])

    extra = {name: shaped(t) for name, t in flat.extra.items()}
    extra["mask"] = torch.from_numpy(mask).to(device)
    fields = [tree_map(shaped, f) if f is not None else None for f in flat]
    return Batch(*fields, extra=extra)
