"""``worker.init_random_frames``: uniformly random actions until the trainer
holds that many samples.

TorchRL's collectors (``init_random_frames``) and Stable-Baselines3 (``learning_starts``) fill
the replay memory with random actions before the policy acts. A worker cannot count for the
trainer (other workers add samples too), so it asks what the server last told it: every PACE
carries the samples the trainer holds (``trainer_samples``, from the trainer's PROGRESS),
and so do the server's heartbeats to a worker whose link is idle. Once the trainer held enough,
the worker acts with its policy for good: a trainer restarted on an empty run folder does not
bring random actions back. Random actions keep to the observation's action mask (Gymnasium's
``action_mask``), as the actor does.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import gymnasium
import numpy as np

from netrl.envs.checks import ACTION_MASK
from netrl.samples.columns import row

__all__ = ["RandomFrames"]

log = logging.getLogger("netrl.worker.worker")  # the worker's own lines, under its logger


class RandomFrames:
    """Random actions for a worker until the trainer holds ``frames`` samples
    (then :attr:`done`)."""

    def __init__(self, frames: int, action_space: gymnasium.Space, seed: int | None, worker_id: str) -> None:
        self.frames, self.worker_id = frames, worker_id
        self.space = copy.deepcopy(action_space)  # seeded on its own: the env's space may be
                                                  # sampled elsewhere
        self.space.seed(seed)  # this worker's seed: reproducible, and unlike other workers'
        self.trainer_samples: int | None = None  # as last told (None: not yet)
        self.done = False
        log.info("worker %s acts at random until the trainer "
                 "holds %d samples (worker.init_random_frames)",
                 worker_id, frames)

    def told(self, *counts: Any) -> None:
        """What the server said the trainer holds (a PACE's and a heartbeat's counts; anything
        not an int is ignored). The larger one counts: random actions end as soon as either says
        the trainer holds enough."""
        ints = [c for c in counts if type(c) is int]
        if ints:
            self.trainer_samples = max(ints)
        if not self.done and self.trainer_samples is not None and self.trainer_samples >= self.frames:
            self.done = True
            log.info("worker %s: the trainer holds %d samples (worker.init_random_frames is "
                     "%d): acting with the policy from now on",
                     self.worker_id, self.trainer_samples, self.frames)

    def actions(self, obs: Any, n: int | None = None) -> Any:
        """One random action for ``obs``, or ``n`` stacked for a batch of
        observations (a vector env's)."""
        if n is None:
            return self._sample(obs)
        return np.stack([self._sample(row(obs, i)) for i in range(n)])

    def _sample(self, obs: Any) -> Any:
        mask = obs.get(ACTION_MASK) if isinstance(obs, dict) else None
        space = self.space
        if mask is None or not isinstance(space, (gymnasium.spaces.Discrete, gymnasium.spaces.MultiDiscrete)):
            return space.sample()
        discrete = isinstance(space, gymnasium.spaces.Discrete)
        sizes = ([int(space.n)] if isinstance(space, gymnasium.spaces.Discrete)
                 else [int(n) for n in np.ravel(space.nvec)])
        starts = np.ravel(np.asarray(space.start, np.int64))
        allowed = np.asarray(mask) != 0
        choice = []
        for k, part in enumerate(np.split(allowed, np.cumsum(sizes)[:-1])):
            options = np.flatnonzero(part)
            if not options.size:  # gymnasium's sample(mask=...) would return a masked action here
                raise ValueError(f"worker {self.worker_id}: the observation's "
                                 f'"{ACTION_MASK}" allows no action'
                                 f"{f' in action dimension {k}' if len(sizes) > 1 else ''}, so no "
                                 f"random action (worker.init_random_frames) can be chosen: an "
                                 f"env must allow one in every state that is not terminal")
            choice.append(starts[k] + space.np_random.choice(options))
        if discrete:
            return np.int64(choice[0])
        return np.array(choice, space.dtype).reshape(space.shape)
