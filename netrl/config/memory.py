"""The ``memory`` section of config.json: the replay memory's size, its sampling (n-step returns,
prioritized replay, sequences), where its columns live (``device``, ``storage``) and each worker's
share of it."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

from netrl.config.build import setting as _f
from netrl.config.checks import between, ge, gt, home, optional_folder
from netrl.config.renamed import old_attribute

__all__ = ["MemoryConfig"]


@dataclass(frozen=True)
class MemoryConfig:
    memory_size: int = _f(1_000_000, "capacity of the replay memory in rows (each episode's "
                                     "reset row and each packet's context rows take slots "
                                     "too, so a full memory holds somewhat fewer transitions)",
                          ge(1))
    batch_size: int = _f(256, "transitions per training batch", ge(1))
    n_step: int = _f(1, "n-step returns: each sampled transition sums up to this "
                        "many discounted rewards (agent.gamma) of its episode before "
                        "bootstrapping (1: one-step; every pipeline, per step of a sequence "
                        "too)", ge(1))
    prioritized: bool = _f(False, "prioritized replay: transitions (or sequence starts, R2D2) "
                                  "drawn by their agent's |TD error|, with importance weights")
    priority_alpha: float = _f(0.6, "prioritized replay: priority exponent (0: uniform, 1: fully "
                               "by priority)", between(0.0, 1.0))
    priority_beta: float = _f(0.4, "prioritized replay: importance-weight exponent at the start, "
                              "annealed linearly to 1", between(0.0, 1.0))
    priority_beta_steps: int = _f(100_000, "prioritized replay: training steps over which "
                                  "priority_beta reaches 1 (0: 1 at once)", ge(0))
    priority_eps: float = _f(1e-6, "prioritized replay: added to each |TD error| so that no "
                             "transition's priority is 0", gt(0))
    device: Literal["cpu", "cuda"] = _f("cpu", "where the replay memory's columns live: cpu (host "
                                               "memory; batches are copied to a CUDA trainer "
                                               "from page-locked buffers) or cuda (the training "
                                               "device's memory, if memory_size fits: packets "
                                               "are copied in once and batches gathered there)")
    storage: Literal["ram", "disk"] = _f("ram", "where the replay memory's columns live: ram, or "
                                                "disk (each column of more than one value per row, "
                                                "camera frames above all, in a memory-mapped file "
                                                "with its blocks reserved in storage_folder, so a replay "
                                                "larger than RAM works; ReplayMemory, "
                                                "HistoryMemory and the memories built on them)")
    storage_folder: str | None = _f(None, "memory.storage disk: the folder of the column files, "
                                          "one trainer at a time; they are removed when the "
                                          "trainer stops (null: <weights_folder>/<run_name>/"
                                          "replay)", optional_folder, home)
    storage_resident_mib: int = _f(1024, "memory.storage disk: MiB of the column files' pages the "
                                         "trainer keeps mapped (they count in its resident "
                                         "memory) before it unmaps them; they stay in the page "
                                         "cache (0: no bound)", ge(0))
    sequence_length: int = _f(1, "consecutive transitions of one env per batch item, for recurrent "
                                 "agents: batches are [batch_size, sequence_length] with a mask; a "
                                 "sequence follows its trajectory across packets and stops at an "
                                 "episode's end (1: single transitions)", ge(1))
    burn_in: int = _f(0, "first steps of each sequence that only warm up the recurrent "
                         "state, without gradient (R2D2); must be < sequence_length", ge(0))
    max_worker_share: float = _f(0.0, "most of the replay memory's rows one worker key may hold "
                                      "(a fraction; its packets beyond it are refused, counted "
                                      "and logged). 0: an equal share of the workers that "
                                      "stored packets in the last 30 s, plus a quarter, at "
                                      "least min_worker_share",
                                 between(0.0, 1.0))
    min_worker_share: float = _f(0.05, "the least share of the replay memory a worker may hold "
                                       "when max_worker_share is 0, however many workers there are",
                                 between(0.0, 1.0))

    if not typing.TYPE_CHECKING:  # mypy still refuses unknown names; old ones read at run time
        def __getattr__(self, name: str) -> Any:
            return old_attribute(self, "memory", name)
