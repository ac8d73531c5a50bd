"""The env-runner interface: what steps a worker's envs, built from the worker's parts, never the
worker.

A runner gets what it needs, as Sample Factory's rollout workers hand their env runners a policy
queue and buffers: the env (:class:`~netrl.worker.env_host.EnvHost`), the policy that acts and swaps
weights (:class:`~netrl.worker.policy.PolicyHandle`), the pacer that says when to step
(:class:`~netrl.worker.pacer.Pacer`, with sync collection), the sink rows go to
(:class:`~netrl.worker.sink.PacketSink`) and the episode bookkeeping
(:class:`~netrl.worker.episodes.Episodes`).

Calling sequence, all on the one thread that steps the env::

    runner.run(stop, test_episode_interval, nb_episodes)  # RolloutWorker.run
    stats = runner.episode(test, stop)                    # RolloutWorker.run_episode
    for _ in runner.episode_steps(test, stop): ...        # the single-process mode, a step at a
    time
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Generator

from netrl.errors import EnvFailure
from netrl.samples.columns import EpisodeStats
from netrl.worker.env_host import EnvHost
from netrl.worker.episodes import Episodes
from netrl.worker.pacer import Pacer
from netrl.worker.policy import PolicyHandle
from netrl.worker.sink import PacketSink

__all__ = ["EnvRunner", "Parts"]


class Parts:
    """A worker's parts, as a runner takes them (see the module docstring), and the settings it
    steps by."""

    def __init__(self, host: EnvHost, policy: PolicyHandle, pacer: Pacer, sink: PacketSink,
                 episodes: Episodes, standalone: bool, max_samples_per_episode: float,
                 seed: int | None) -> None:
        self.host, self.policy, self.pacer, self.sink = host, policy, pacer, sink
        self.episodes, self.standalone, self.seed = episodes, standalone, seed
        self.max_samples_per_episode = max_samples_per_episode


class EnvRunner(ABC):
    """Steps a worker's env(s) with its policy and records the rows (see the module docstring)."""

    def __init__(self, parts: Parts) -> None:
        self.host, self.policy, self.pacer = parts.host, parts.policy, parts.pacer
        self.sink, self.episodes, self.sync = parts.sink, parts.episodes, parts.pacer.sync
        self.standalone, self.max_samples = parts.standalone, parts.max_samples_per_episode
        self.seed = parts.seed

    @abstractmethod
    def episode_steps(self, test: bool,
                      stop: threading.Event) -> Generator[None, None, EpisodeStats | None]:
        """Env steps as a generator that yields after each, until an episode ends (its stats) or
        ``stop`` (None)."""

    @abstractmethod
    def run(self, stop: threading.Event, test_episode_interval: int,
            nb_episodes: int | None) -> None:
        """Training episodes (and test episodes, one after every ``test_episode_interval``) until
        ``stop`` or ``nb_episodes`` training episodes ended."""

    @abstractmethod
    def restart(self) -> None:
        """After a failed env call: every env starts a new episode."""

    def episode(self, test: bool, stop: threading.Event) -> EpisodeStats | None:
        """One episode's steps; after a failed env call a new episode, if the pipeline allows it."""
        steps = self.episode_steps(test, stop)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                self.host.ok()
                return done.value
            except EnvFailure as exc:
                self.host.failed(exc)
                self.restart()
                # a new episode: its reset row starts a new trajectory
                steps = self.episode_steps(test, stop)
