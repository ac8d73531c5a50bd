"""A worker's episodes: how many ended, the last training return, the episode log, and, per env, the
running return and length and whether the episode under way is a test episode."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from netrl.monitor.metrics import CsvLog
from netrl.samples.columns import EpisodeStats
from netrl.util import version_label

__all__ = ["Episodes"]

log = logging.getLogger("netrl.worker.worker")  # the worker's own lines, under its logger


class Episodes:
    """The bookkeeping of a worker's ``num_envs`` envs' episodes (``log_path``: its CSV episode log,
    or None)."""

    def __init__(self, worker_id: str, log_path: str | None, num_envs: int) -> None:
        self.worker_id, self.n = worker_id, num_envs
        self.log = CsvLog(Path(log_path)) if log_path else None
        self.level = logging.INFO  # of the line each episode logs (a benchmark lowers it)
        self.done = 0  # episodes ended in this process
        self.last_return: float | None = None  # of the last training episode
        # the episode log's counts before this process (resume)
        self._logged_episodes = self._logged_steps = 0
        # per env (the vector runner's; the one-env runner keeps its own in locals)
        self.ret = np.zeros(num_envs)
        self.length = np.zeros(num_envs, np.int64)
        # whether an env's current episode is a test episode
        self.test = np.zeros(num_envs, np.bool_)
        self.trained = np.zeros(num_envs, np.int64)  # training episodes each env finished
        # run(): a test episode after every this many training episodes of an env
        self.test_interval = 0

    def resume(self) -> None:
        """At start: a worker restarted with the same id appends to the same CSV. It counts episodes
        and env steps on from the last row, so that --plot draws one learning curve rather than two
        on top of each other."""
        if self.log is not None:
            self._logged_episodes, self._logged_steps = self.log.last_ints("episode", "env_steps")

    def ended(self, stats: EpisodeStats, produced: int, version: int) -> None:
        """An episode ended (``produced``: the worker's env steps recorded so far; ``version``: its
        weights)."""
        self.done += 1
        if not stats.test:
            self.last_return = stats.ret
        episode = self._logged_episodes + self.done
        if self.log is not None:
            self.log.write({"time": time.time(), "episode": episode, "env": stats.env,
                            "test": int(stats.test), "return": stats.ret, "length": stats.length,
                            "env_steps": self._logged_steps + produced, "policy_version": version})
        log.log(self.level, "%s episode %d%s: return %.1f over %d steps (policy %s)",
                "test" if stats.test else "training", episode,
                f" (env {stats.env})" if self.n > 1 else "", stats.ret, stats.length,
                version_label(version))

    def next_episode(self, i: int) -> None:
        """Env ``i`` starts its next episode: a test episode after every ``test_interval`` training
        ones."""
        if not self.test[i]:
            self.trained[i] += 1
            self.test[i] = self.test_interval > 0 and self.trained[i] % self.test_interval == 0
        else:
            self.test[i] = False
        self.ret[i], self.length[i] = 0.0, 0
