"""Many envs in one worker (``worker.num_envs > 1``): the per-env bookkeeping around one Gymnasium vector env.

The vector env (``SyncVectorEnv``, or ``AsyncVectorEnv`` with a process per env) steps all ``N`` envs at once, and
the actor chooses all ``N`` actions in one batched call (:meth:`~netrl.actor.ActorModule.act_` with
``batch=True``; one call per group when some envs run a test episode and others do not). Everything that belongs
to an episode stays per env: its return and length, whether it is a test episode (after every
``test_episode_interval`` of *its* training episodes), the ``max_samples_per_episode`` truncation, and its own
:class:`~netrl.worker.packets.PacketMaker`, so its own row columns, context rows and copy of the sample compressor
(frame stacks and action buffers never mix envs). A real-time env keeps its own clock: the pipeline builds one
``StepTimer`` per env.

Autoreset is Gymnasium's ``AutoresetMode.SAME_STEP``: the step that ends an episode returns the next episode's first
observation, and the final one in ``info["final_obs"]``. So no step is wasted, the final observation ends the
episode's last row, and the first observation becomes the next episode's reset row: the observation of a finished
episode is never taken for the first of the next. An episode cut by ``max_samples_per_episode`` is reset alone
(``reset(options={"reset_mask": ...})``).

A packet is cut when an env has ``min_samples_per_worker_packet`` fresh rows (after that many vector steps), after
``max_packet_delay_s``, or when an env's columns are full; it holds every env's rows as env-major segments with the
``env`` column (:func:`~netrl.samples.concat_segments`).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Generator
from functools import partial
from typing import Any, Literal

import gymnasium
import numpy as np

from netrl.envs.checks import check_action, check_observation
from netrl.samples.columns import Buffer, EpisodeStats, concat_segments, row, tree_map
from netrl.worker.packets import PacketMaker

__all__ = ["VectorEnvs", "make_vector_env"]

Vectorization = Literal["sync", "async"]


def make_vector_env(env_cls: Callable[[], Any], num_envs: int, vectorization: Vectorization) -> Any:
    """``num_envs`` envs from ``env_cls`` in one Gymnasium vector env that autoresets in the same step."""
    mode = gymnasium.vector.AutoresetMode.SAME_STEP
    fns = [env_cls] * num_envs
    if vectorization == "async":
        return gymnasium.vector.AsyncVectorEnv(fns, autoreset_mode=mode)
    return gymnasium.vector.SyncVectorEnv(fns, autoreset_mode=mode)


class VectorEnvs:
    """A worker's ``N`` envs: steps them together, and keeps every episode, packet and clock per env."""

    def __init__(self, worker: Any, num_envs: int) -> None:  # a RolloutWorker (which imports this module)
        self.worker, self.n = worker, num_envs
        w = worker
        self.makers = [PacketMaker(w.worker_id, w.session, w.min_samples, w.overlap, w.max_delay, w.compression,
                                   w.network.max_message_bytes, _own_copy(w.sample_compressor, i), num_envs)
                       for i in range(num_envs)]
        self.test_interval = 0  # run(): a test episode after every this many training episodes of an env
        self.obs: Any = None  # the envs' current observations (None: reset them all first)
        self.ret = np.zeros(num_envs)
        self.length = np.zeros(num_envs, np.int64)
        self.test = np.zeros(num_envs, np.bool_)  # whether an env's current episode is a test episode
        self.trained = np.zeros(num_envs, np.int64)  # training episodes each env finished
        self._checked = False

    # -- packets ------------------------------------------------------------------------------------------------
    def follow(self, schema: Any) -> None:
        for m in self.makers:
            m.follow(schema)

    def bounds(self) -> dict[str, int]:
        """HELLO's packet bounds: one env's, times the envs (a packet holds a segment of each)."""
        return {**{k: v * self.n for k, v in self.makers[0].bounds().items()}, "num_envs": self.n}

    @property
    def unsent_transitions(self) -> int:
        return sum(m.unsent_transitions for m in self.makers)

    @property
    def pending_episodes(self) -> list[EpisodeStats]:
        return [e for m in self.makers for e in m.pending_episodes]

    def due(self) -> bool:
        return any(len(m) and m.due() for m in self.makers)

    def cut(self) -> Buffer | None:
        """Every env's unsent rows as one packet of env-major segments, or None."""
        segments = [(i, buf) for i, m in enumerate(self.makers) if (buf := m.cut()) is not None]
        return concat_segments(segments) if segments else None

    # -- stepping ----------------------------------------------------------------------------------------------
    def restart(self) -> None:
        """After a failed env call: every env starts a new episode (its rows so far stay; a reset row follows)."""
        self.obs = None

    def steps(self, stop: threading.Event) -> Generator[None, None, EpisodeStats | None]:
        """Vector steps until an episode of some env ends (the single-process mode and ``run_episode`` drive it);
        returns the first that ended, or None when ``stop`` interrupted."""
        while True:
            if not self.worker.pace(stop):
                return None
            ended = self.step()
            yield
            if ended:
                return ended[0]

    def step(self) -> list[EpisodeStats]:
        """One step of every env (resetting them all first if needed); the episodes that ended in it."""
        w = self.worker
        calls, env = w.env_calls, w.env
        assert calls is not None
        if self.obs is None:
            self._reset_all()
        w._swap_weights()  # after any wait for the trainer, which trained and published meanwhile
        version = w.version  # the version that chooses these actions
        acts, extras = self._act(self.obs)
        if not self._checked:
            for i in range(self.n):
                check_action(acts[i], w.action_space, f"{type(w.actor).__name__} (env {i})")
        obs, rew, terminated, truncated, info = calls.call("step", env.step, acts)
        final, has_final = info.get("final_obs"), info.get("_final_obs")
        ended: list[EpisodeStats] = []
        cut_short = np.zeros(self.n, np.bool_)
        ended_mask = np.zeros(self.n, np.bool_)
        sync = w.sync.version is not None
        self.length += 1
        self.ret += rew
        for i in range(self.n):
            if sync and not w.sync.collecting(i):  # complete_episodes: done with this fragment, its steps dropped
                continue
            term, trunc = bool(terminated[i]), bool(truncated[i])
            autoreset = term or trunc
            last = final[i] if autoreset and has_final is not None and has_final[i] else row(obs, i)
            if not self._checked:
                check_observation(last, w.observation_space, f"the observation from env {i}'s first step()",
                                  w.action_space, term)
            if self.length[i] >= w.max_samples_per_episode and not autoreset:
                trunc = cut_short[i] = True  # a forced reset is a time limit: the trainer still bootstraps
            stats = (EpisodeStats(float(self.ret[i]), int(self.length[i]), bool(self.test[i]), w.version, i)
                     if term or trunc else None)
            ended_mask[i] = stats is not None
            if stats is not None and not w.standalone:  # before the last row: they leave in the same packet
                self.makers[i].pending_episodes.append(stats)
            if self._collects(i):
                self._record(i, row(acts, i), last, float(rew[i]), term, trunc, _env_info(info, i), version,
                             extra=None if extras is None else {k: v[i] for k, v in extras.items()})
            if stats is not None:
                ended.append(stats)
                w._episode_done(stats)
                self._next_episode(i)
                if not autoreset:
                    continue  # recorded once it is reset, below
                self._start(i, row(obs, i), _env_info(info, i))
        self._checked = True
        if cut_short.any():
            obs, info = calls.call("reset", env.reset, options={"reset_mask": cut_short})
            for i in np.flatnonzero(cut_short).tolist():
                self._start(i, row(obs, i), _env_info(info, i))
        self.obs = obs
        w.sync.after_step(ended_mask)  # sync collection: the fragment may be complete, and leave
        if w.packets_due():
            w._send_packet()
        return ended

    def reset_envs(self, mask: np.ndarray) -> None:
        """Reset the envs of ``mask`` (sync collection's parked envs): each starts a new episode, recorded."""
        w = self.worker
        assert w.env_calls is not None
        obs, info = w.env_calls.call("reset", w.env.reset, options={"reset_mask": mask})
        for i in np.flatnonzero(mask).tolist():
            self.ret[i], self.length[i] = 0.0, 0
            self._start(i, row(obs, i), _env_info(info, i))
        self.obs = obs  # (every env's: the others' unchanged)

    def _reset_all(self) -> None:
        w = self.worker
        assert w.env_calls is not None
        first = w.episodes_done == 0
        obs, info = w.env_calls.call("reset", w.env.reset, seed=w.seed if first else None)
        self.ret[:], self.length[:] = 0.0, 0
        for i in range(self.n):
            if not self._checked:
                check_observation(row(obs, i), w.observation_space, f"the first observation from env {i}'s reset()",
                                  w.action_space)
            self._start(i, row(obs, i), _env_info(info, i))
        self.obs = obs

    def _start(self, i: int, obs: Any, info: dict[str, Any]) -> None:
        """Env ``i``'s new episode begins with ``obs``: its reset row, unless the episode is not recorded."""
        if self.worker.recurrent is not None:
            self.worker.recurrent.reset(i)
        if self._collects(i):
            self._record(i, self.worker._default_action(), obs, 0.0, False, False, info, self.worker.version,
                         reset=True)

    def _next_episode(self, i: int) -> None:
        if not self.test[i]:
            self.trained[i] += 1
            self.test[i] = self.test_interval > 0 and self.trained[i] % self.test_interval == 0
        else:
            self.test[i] = False
        self.ret[i], self.length[i] = 0.0, 0

    def _collects(self, i: int) -> bool:
        return not self.test[i] and not self.worker.standalone

    def _record(self, i: int, act: Any, obs: Any, rew: float, terminated: bool, truncated: bool,
                info: dict[str, Any], version: int, reset: bool = False, extra: dict[str, Any] | None = None) -> None:
        networked = i == 0 and self.worker.local_packets is None and self.worker.net is not None  # checks for all
        self.makers[i].add(act, obs, rew, terminated, truncated, info, reset, version, networked=networked,
                           extra=extra)
        if not reset:
            self.worker.produced += 1

    def _act(self, obs: Any) -> tuple[np.ndarray, dict[str, np.ndarray] | None]:
        """All envs' actions, and the actor's extra outputs (None when it declares none): one batched call, or one
        per group when test and training episodes mix."""
        w = self.worker
        if w.obs_preprocessor is not None:  # it takes one observation, as in tmrl
            obs = _stack([w.obs_preprocessor(row(obs, i)) for i in range(self.n)])
        obs = w.policy_obs(obs)  # env.normalize_obs
        if self.test.all() or not self.test.any():
            return self._choose(obs, bool(self.test[0]), np.arange(self.n))
        out: np.ndarray | None = None
        extras = self._zero_extras(self.n)
        for flag in (False, True):
            idx = np.flatnonzero(self.test == flag)
            part, part_extras = self._choose(tree_map(partial(_take, idx=idx), obs), flag, idx)
            if out is None:
                out = np.empty((self.n, *part.shape[1:]), part.dtype)
            out[idx] = part
            if extras is not None and part_extras is not None:
                for k, v in part_extras.items():
                    extras[k][idx] = v
        assert out is not None
        return out, extras

    def _zero_extras(self, n: int) -> dict[str, np.ndarray] | None:
        spec = self.worker.extra_spec
        return {k: np.zeros((n, *shape), dtype) for k, (shape, dtype) in spec.items()} if spec else None

    def _choose(self, obs: Any, test: bool, idx: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray] | None]:
        """Envs ``idx``'s actions and extra outputs: random ones for training episodes while worker.init_random_frames
        asks for them (extras: zeros, but a recurrent state, which advances, is the one that entered), else the
        actor's (its first batch checked, also when random ones came first)."""
        w = self.worker
        n = len(idx)
        acts = None if test else w.random_actions(obs, n)
        if acts is not None:
            if w.recurrent is not None:
                return np.asarray(acts), w.recurrent.random_extras(w.recurrent.act(w.actor, obs, test, idx)[1])
            return np.asarray(acts), self._zero_extras(n)
        extras = None
        if w.recurrent is not None:
            acts, extras = w.recurrent.act(w.actor, obs, test, idx)
        else:
            acts = w.actor.act_(obs, test=test, batch=True)
            if w.extra_spec:
                acts, extras = acts
        acts = np.asarray(acts)
        if not w.actor_checked and self._checked:  # (the first step checks every env's action itself)
            for i in range(n):
                check_action(acts[i], w.action_space, f"{type(w.actor).__name__} (env {i})")
            w.actor_checked = True
        return acts, extras


def _own_copy(compressor: Callable[..., Any] | None, i: int) -> Callable[..., Any] | None:
    """Env ``i``'s own copy of the sample compressor: one such as FrameStackCompressor keeps state per env."""
    if compressor is None or i == 0:
        return compressor
    try:
        return copy.deepcopy(compressor)
    except Exception as exc:  # e.g. it holds a lock or a file
        raise ValueError(f"the sample compressor {compressor!r} cannot be copied ({exc}), and each of the "
                         "worker.num_envs envs needs its own: make it copyable, or set worker.num_envs = 1") from None


def _env_info(info: dict[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s entries of a vector env's info (Gymnasium keeps each key's per-env mask under ``_key``)."""
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
