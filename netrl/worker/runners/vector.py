"""Many envs in one worker (``worker.num_envs > 1``): the per-env bookkeeping around one Gymnasium
vector env.

The vector env (``SyncVectorEnv``, or ``AsyncVectorEnv`` with a process per env) steps all ``N``
envs at once, and the actor chooses all ``N`` actions in one batched call
(:meth:`~netrl.actor.ActorModule.act_` with ``batch=True``; one call per group when some envs run a
test episode and others do not). Everything that belongs to an episode stays per env: its return and
length, whether it is a test episode (after every ``test_episode_interval`` of *its* training
episodes), the ``max_samples_per_episode`` truncation, and its own packet maker
(:mod:`netrl.worker.sink`). A real-time env keeps its own clock: the pipeline builds one
``StepTimer`` per env.

Autoreset is Gymnasium's ``AutoresetMode.SAME_STEP``: the step that ends an episode returns the next
episode's first observation, and the final one in ``info["final_obs"]``. So no step is wasted, the
final observation ends the episode's last row, and the first observation becomes the next episode's
reset row: the observation of a finished episode is never taken for the first of the next. An
episode cut by ``max_samples_per_episode`` is reset alone (``reset(options={"reset_mask": ...})``).

A packet is cut when an env has ``min_samples_per_worker_packet`` fresh rows (after that many vector
steps), after ``max_packet_delay_s``, or when an env's columns are full; it holds every env's rows
as env-major segments with the ``env`` column (:func:`~netrl.samples.concat_segments`).
"""

from __future__ import annotations

import threading
from collections.abc import Generator
from functools import partial
from typing import Any

import numpy as np

from netrl.envs.checks import check_action, check_observation
from netrl.errors import EnvFailure
from netrl.samples.columns import EpisodeStats, row, tree_map
from netrl.worker.runners.base import EnvRunner, Parts

__all__ = ["VectorRunner"]


class VectorRunner(EnvRunner):
    """A worker's ``N`` envs: steps them together, and keeps every episode, packet and clock per
    env."""

    def __init__(self, parts: Parts, num_envs: int) -> None:
        super().__init__(parts)
        self.n = num_envs
        self.obs: Any = None  # the envs' current observations (None: reset them all first)
        self._checked = False
        # sync collection's envs that waited for the next fragment
        self.sync.reset_parked = self.reset_envs

    def run(self, stop: threading.Event, test_episode_interval: int,
            nb_episodes: int | None) -> None:
        self.episodes.test_interval = test_episode_interval
        train_episodes = 0
        while not stop.is_set() and (nb_episodes is None or train_episodes < nb_episodes):
            ended = self._guarded(stop)
            train_episodes += sum(not e.test for e in ended or ())

    def _guarded(self, stop: threading.Event) -> list[EpisodeStats] | None:
        """One vector step (None on stop), after a failed env call restarting every env if the
        pipeline allows it."""
        try:
            out = self.step() if self._pace(stop) else None
        except EnvFailure as exc:
            self.host.failed(exc)
            self.restart()
            return None
        self.host.ok()
        return out

    def _pace(self, stop: threading.Event) -> bool:
        """Before a vector step: wait until PACE allows a row from every env that collects (a
        step cannot be taken in part); False on stop."""
        eps = self.episodes  # (no test episodes, the default: no count on the hot loop)
        rows = self.n - int(np.count_nonzero(eps.test)) if eps.test_interval else self.n
        return self.pacer.pace(stop, rows=rows)

    def restart(self) -> None:
        """After a failed env call: every env starts a new episode (its rows so far stay; a reset
        row follows)."""
        self.obs = None

    def episode_steps(self, test: bool,
                      stop: threading.Event) -> Generator[None, None, EpisodeStats | None]:
        """Vector steps until an episode of one of the envs ends, which it returns (the envs'
        episodes go on in the next call); test episodes then come from
        ``run(test_episode_interval)`` alone."""
        if test:
            raise ValueError(f"worker {self.policy.worker_id} runs {self.n} envs: each runs its "
                             "own test episodes, one after every test_episode_interval of its "
                             "training episodes (run()); run_episode(test=True) is for one env")
        return self._steps(stop)

    def _steps(self, stop: threading.Event) -> Generator[None, None, EpisodeStats | None]:
        while True:
            if not self._pace(stop):
                return None
            ended = self.step()
            yield
            if ended:
                return ended[0]

    def step(self) -> list[EpisodeStats]:
        """One step of every env (resetting them all first if needed); the episodes that ended in
        it."""
        calls, policy, sink, sync = self.host.calls, self.policy, self.sink, self.sync
        eps = self.episodes
        assert calls is not None
        env = calls.env
        if self.obs is None:
            self._reset_all()
        sync.swap()  # after any wait for the trainer, which trained and published meanwhile
        version = policy.version  # the version that chooses these actions
        acts, extras = self._act(self.obs)
        space = self.host.action_space
        if not self._checked:
            for i in range(self.n):
                check_action(acts[i], space, f"{type(policy.actor).__name__} (env {i})")
        obs, rew, terminated, truncated, info = calls.call("step", env.step, acts)
        final, has_final = info.get("final_obs"), info.get("_final_obs")
        final_info = info.get("final_info")  # the ending steps' infos (info: the resets')
        ended: list[EpisodeStats] = []
        cut_short = np.zeros(self.n, np.bool_)
        ended_mask = np.zeros(self.n, np.bool_)
        in_sync = sync.version is not None
        eps.length += 1
        eps.ret += rew
        for i in range(self.n):
            # complete_episodes: done with this fragment, steps dropped
            if in_sync and not sync.collecting(i):
                continue
            term, trunc = bool(terminated[i]), bool(truncated[i])
            autoreset = term or trunc
            closed = autoreset and has_final is not None and bool(has_final[i])  # reset in the step
            last = final[i] if closed else row(obs, i)
            if not self._checked:
                check_observation(last, self.host.observation_space,
                                  f"the observation from env {i}'s first " "step()", space, term)
            if eps.length[i] >= self.max_samples and not autoreset:
                # a forced reset is a time limit: the trainer still bootstraps
                trunc = cut_short[i] = True
            stats = (EpisodeStats(float(eps.ret[i]), int(eps.length[i]), bool(eps.test[i]),
                                  policy.version, i)
                     if term or trunc else None)
            ended_mask[i] = stats is not None
            # before the last row: they leave in the same packet
            if stats is not None and not self.standalone:
                sink.episode_ended(stats, i)
            if self._collects(i):
                extra = None if extras is None else {k: v[i] for k, v in extras.items()}
                step_info = final_info if closed and final_info is not None else info
                sink.record_env(i, row(acts, i), last, float(rew[i]), term, trunc,
                                _env_info(step_info, i), version, extra=extra)
            if stats is not None:
                ended.append(stats)
                eps.ended(stats, sink.produced, policy.version)
                eps.next_episode(i)
                if not autoreset:
                    continue  # recorded once it is reset, below
                self._start(i, row(obs, i), _env_info(info, i))
        self._checked = True
        if policy.views is not None:  # the envs whose episodes go on: their rows slide the views
            policy.views.push_many(np.flatnonzero(~ended_mask), acts, obs, rew)
        self.obs = self._reset_cut(cut_short, obs)
        sync.after_step(ended_mask)  # sync collection: the fragment may be complete, and leave
        if sink.due():
            sink.send()
        return ended

    def _reset_cut(self, cut_short: np.ndarray, obs: Any) -> Any:
        """The envs whose episodes ``max_samples_per_episode`` cut: reset, each a new episode;
        every env's observations after it."""
        if not cut_short.any():
            return obs
        calls = self.host.calls
        assert calls is not None
        obs, info = calls.call("reset", calls.env.reset, options={"reset_mask": cut_short})
        for i in np.flatnonzero(cut_short).tolist():
            self._start(i, row(obs, i), _env_info(info, i))
        return obs

    def reset_envs(self, mask: np.ndarray) -> None:
        """Reset the envs of ``mask`` (sync collection's parked envs): each starts a new episode,
        recorded."""
        calls = self.host.calls
        assert calls is not None
        obs, info = calls.call("reset", calls.env.reset, options={"reset_mask": mask})
        for i in np.flatnonzero(mask).tolist():
            self.episodes.ret[i], self.episodes.length[i] = 0.0, 0
            self._start(i, row(obs, i), _env_info(info, i))
        self.obs = obs  # (every env's: the others' unchanged)

    def _reset_all(self) -> None:
        calls, eps = self.host.calls, self.episodes
        assert calls is not None
        obs, info = calls.call("reset", calls.env.reset, seed=self.seed if eps.done == 0 else None)
        eps.ret[:], eps.length[:] = 0.0, 0
        for i in range(self.n):
            if not self._checked:
                check_observation(row(obs, i), self.host.observation_space,
                                  f"the first observation from env {i}'s reset()",
                                  self.host.action_space)
            self._start(i, row(obs, i), _env_info(info, i))
        self.obs = obs

    def _start(self, i: int, obs: Any, info: dict[str, Any]) -> None:
        """Env ``i``'s new episode begins with ``obs``: its reset row, unless the episode is not
        recorded."""
        if self.policy.recurrent is not None:
            self.policy.recurrent.reset(i)
        if self.policy.views is not None:
            self.policy.views.start(i, self.host.default_action(), obs)
        if self._collects(i):
            self.sink.record_env(i, self.host.default_action(), obs, 0.0, False, False, info,
                                 self.policy.version, reset=True)

    def _collects(self, i: int) -> bool:
        return not self.episodes.test[i] and not self.standalone

    def _act(self, obs: Any) -> tuple[np.ndarray, dict[str, np.ndarray] | None]:
        """All envs' actions, and the actor's extra outputs (None when it declares none): one
        batched call, or one per group when test and training episodes mix."""
        policy, test = self.policy, self.episodes.test
        if policy.views is not None:  # views into the observation: their windows replace leaves
            obs = policy.views.observe(obs, np.arange(self.n))
        if policy.obs_preprocessor is not None:  # it takes one observation, as in tmrl
            obs = _stack([policy.obs_preprocessor(row(obs, i)) for i in range(self.n)])
        obs = policy.obs(obs)  # env.normalize_obs
        if test.all() or not test.any():
            return self._choose(obs, bool(test[0]), np.arange(self.n))
        out: np.ndarray | None = None
        extras = policy.zero_extras(self.n)
        for flag in (False, True):
            idx = np.flatnonzero(test == flag)
            part, part_extras = self._choose(tree_map(partial(_take, idx=idx), obs), flag, idx)
            if out is None:
                out = np.empty((self.n, *part.shape[1:]), part.dtype)
            out[idx] = part
            if extras is not None and part_extras is not None:
                for k, v in part_extras.items():
                    extras[k][idx] = v
        assert out is not None
        return out, extras

    def _choose(self, obs: Any, test: bool,
                idx: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray] | None]:
        """Envs ``idx``'s actions and extra outputs: random ones for training episodes while
        worker.init_random_frames asks for them (extras: zeros, but a recurrent state, which
        advances, is the one that entered), else the actor's (its first batch checked, also when
        random ones came first)."""
        policy = self.policy
        n = len(idx)
        views = policy.views.extra(idx) if policy.views is not None else None
        acts = None if test else policy.random_actions(obs, n)
        if acts is not None:
            if policy.recurrent is not None:
                chosen = policy.recurrent.act(policy.actor, obs, test, idx, views)[1]
                return np.asarray(acts), policy.recurrent.random_extras(chosen)
            return np.asarray(acts), policy.zero_extras(n)
        extras = None
        if policy.recurrent is not None:
            acts, extras = policy.recurrent.act(policy.actor, obs, test, idx, views)
        else:
            acts = policy.actor.act_(obs, test=test, batch=True, views=views)
            if policy.extra_spec:
                acts, extras = acts
        acts = np.asarray(acts)
        # (the first step checks every env's action itself)
        if not policy.actor_checked and self._checked:
            for i in range(n):
                check_action(acts[i], self.host.action_space,
                             f"{type(policy.actor).__name__} (env {i})")
            policy.actor_checked = True
        return acts, extras


def _env_info(info: dict[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s entries of a vector env's info (Gymnasium keeps each key's per-env mask under
    ``_key``)."""
    out = {}
    for key, value in info.items():
        if key.startswith("_") or key in ("final_obs", "final_info"):
            continue
        mask = info.get("_" + key)
        if mask is None or mask[i]:
            out[key] = value[i] if isinstance(value, np.ndarray) else value
    return out


def _take(x: Any, idx: np.ndarray) -> np.ndarray:
    return np.asarray(x)[idx]


def _stack(rows: list[Any]) -> Any:
    first = rows[0]
    if isinstance(first, (tuple, list)):
        return type(first)(_stack([r[k] for r in rows]) for k in range(len(first)))
    if isinstance(first, dict):
        return {k: _stack([r[k] for r in rows]) for k in first}
    return np.stack([np.asarray(r) for r in rows])
