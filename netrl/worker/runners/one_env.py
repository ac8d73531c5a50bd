"""The control path's one-env episode loop (a worker with several envs steps them in
:mod:`netrl.worker.runners.vector` instead)."""

from __future__ import annotations

import threading
from collections.abc import Generator

import numpy as np

from netrl.envs.checks import check_observation
from netrl.samples.columns import EpisodeStats
from netrl.worker.runners.base import EnvRunner

__all__ = ["OneEnvRunner"]


class OneEnvRunner(EnvRunner):
    """Steps one env, an episode at a time, and a test episode after every
    ``test_episode_interval``."""

    # the first observations were checked against the spaces (the first action: the policy)
    checked = False

    def run(self, stop: threading.Event, test_episode_interval: int,
            nb_episodes: int | None) -> None:
        train_episodes = 0
        while not stop.is_set() and (nb_episodes is None or train_episodes < nb_episodes):
            if self.episode(False, stop) is None:
                break
            train_episodes += 1
            if test_episode_interval > 0 and train_episodes % test_episode_interval == 0:
                self.episode(True, stop)

    def restart(self) -> None:
        """Nothing to do: the next episode starts with a reset."""

    def episode_steps(self, test: bool,
                      stop: threading.Event) -> Generator[None, None, EpisodeStats | None]:
        """One episode, yielding after every env step; its stats, or None when ``stop`` interrupted
        it."""
        policy, sink, sync, calls = self.policy, self.sink, self.sync, self.host.calls
        assert calls is not None
        env = calls.env
        collect = not test and not self.standalone
        obs, info = calls.call("reset", env.reset,
                               seed=self.seed if self.episodes.done == 0 else None)
        if not self.checked:
            check_observation(obs, env.observation_space,
                              "the first observation from the env's reset()", env.action_space)
        if collect:
            sink.record(self.host.default_action(), obs, 0.0, False, False, info, True,
                        policy.version)
        if policy.recurrent is not None:
            policy.recurrent.reset(0)
        views = policy.views  # the actor's declared views (netrl.memory.act_views)
        if views is not None:
            views.start(0, self.host.default_action(), obs)
        pace, act_space, max_samples = self.pacer.pace, env.action_space, self.max_samples
        ret, length = 0.0, 0
        while True:
            if not pace(stop, collect):
                return None
            sync.swap()  # after any wait for the trainer, which trained and published meanwhile
            version = policy.version  # the version that chooses this action
            act, extra = policy.act(obs, test, act_space)
            obs, rew, terminated, truncated, info = calls.call("step", env.step, act)
            if not self.checked:
                check_observation(obs, env.observation_space,
                                  "the observation from the env's first step()", act_space,
                                  bool(terminated))
                self.checked = True
            length += 1
            ret += float(rew)
            if length >= max_samples and not terminated:
                truncated = True  # a forced reset is a time limit: the trainer still bootstraps
            stats = EpisodeStats(ret, length, test,
                                 policy.version) if terminated or truncated else None
            # before the last row: they leave in the same packet
            if stats is not None and not self.standalone:
                sink.episode_ended(stats)
            if collect:
                sink.record(act, obs, rew, terminated, truncated, info, False, version, extra)
                if sync.version is not None:  # sync collection: the fragment may be complete
                    sync.after_step(np.array([terminated or truncated]))
            elif sink.due():  # rows from before a test episode still leave after max_packet_delay_s
                sink.send()
            if terminated or truncated:
                break
            if views is not None:  # the row just recorded (or not, in a test episode)
                views.push(0, act, obs, rew)
            yield
        assert stats is not None  # the loop ends only with an episode's end
        self.episodes.ended(stats, sink.produced, policy.version)
        yield
        return stats
