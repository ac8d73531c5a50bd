"""A worker's env, built and called under watch (:mod:`netrl.envs.guard`), rebuilt when a call
hangs.

One env, or ``num_envs`` of them in one Gymnasium vector env that autoresets in the same step (see
:mod:`netrl.worker.runners.vector`). A failed env call (a hung one, a dead env thread) stops the
worker, or, with the pipeline's ``on_env_failure`` "reset", drops the episode and starts a new one,
on a new env if the old one is stuck; three failures in a row stop it all the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

import gymnasium

from netrl.envs.guard import EnvCaller
from netrl.errors import EnvFailure
from netrl.samples.spaces import default_value
from netrl.worker.settings import Vectorization, same_step_autoreset

__all__ = ["EnvHost", "make_vector_env"]

log = logging.getLogger("netrl.worker.worker")  # the worker's own lines, under its logger


def make_vector_env(env_cls: Callable[[], Any], num_envs: int, vectorization: Vectorization) -> Any:
    """``num_envs`` envs from ``env_cls`` in one Gymnasium vector env that autoresets in the same
    step; an ``env_cls`` with a ``make_vector_env(num_envs, vectorization)`` of its own batches its
    envs itself (TorchRL's batched envs, :mod:`netrl.interop.envs`)."""
    mode = same_step_autoreset()
    own = getattr(env_cls, "make_vector_env", None)
    if own is not None:
        env = own(num_envs, vectorization)
        if env.num_envs != num_envs or env.metadata.get("autoreset_mode") != mode:
            raise ValueError(f"{env_cls!r}.make_vector_env({num_envs}, {vectorization!r}) "
                             f"returned {env.num_envs} envs autoresetting in mode "
                             f"{env.metadata.get('autoreset_mode')}: a worker needs "
                             f"{num_envs} (worker.num_envs) in {mode}")
        return env
    fns = [env_cls] * num_envs
    if vectorization == "async":
        return gymnasium.vector.AsyncVectorEnv(fns, autoreset_mode=mode)
    return gymnasium.vector.SyncVectorEnv(fns, autoreset_mode=mode)


class EnvHost:
    """The env a worker steps (``calls.env``), and what happens when a call to it fails."""

    def __init__(self, env_cls: Callable[[], Any], num_envs: int, vectorization: Vectorization,
                 worker_id: str, timeout_factor: float, timeout_min_s: float,
                 on_failure: Literal["stop", "reset"]) -> None:
        self.env_cls, self.num_envs, self.worker_id = env_cls, num_envs, worker_id
        self._make = env_cls if num_envs == 1 else partial(make_vector_env, env_cls, num_envs,
                                                           vectorization)
        self.timeout = (timeout_factor, timeout_min_s)
        self.on_failure = on_failure
        # runs the env's calls under watch (open)
        self.calls: EnvCaller | None = None
        self.env: Any = None
        # env calls that hung or met a dead thread, and were reset (on_failure "reset")
        self.failures = 0
        self._in_a_row = 0

    def open(self) -> None:
        """Build the env (a new one after a stuck call)."""
        # on the worker's thread where it is the main one: no hand-over per call
        self.calls = EnvCaller(self._make, f"worker {self.worker_id}", *self.timeout,
                               same_thread=True)
        self.env = self.calls.env

    def close(self, forget: bool = False) -> None:
        """Close the env (and, with ``forget``, let go of it: a failed start leaves no env)."""
        calls = self.calls
        if forget:
            self.calls = self.env = None
        if calls is not None:
            calls.close()

    @property
    def observation_space(self) -> Any:
        """One env's observation space (a vector env's ``single_observation_space``)."""
        return getattr(self.env, "single_observation_space", None) or self.env.observation_space

    @property
    def action_space(self) -> Any:
        return getattr(self.env, "single_action_space", None) or self.env.action_space

    def default_action(self) -> Any:
        """The action of an episode's reset row: the env's ``default_action``, else the space's
        default."""
        # async: none
        env = self.env if self.num_envs == 1 else (getattr(self.env, "envs", None) or [None])[0]
        default = getattr(env, "default_action", None)
        return default_value(self.action_space) if default is None else default

    def ok(self) -> None:
        """An episode or a vector step went through."""
        self._in_a_row = 0

    def failed(self, exc: EnvFailure) -> None:
        """Reset after a failed env call if the pipeline allows it (on a new env if the old one is
        stuck); raise otherwise, or after three failures in a row."""
        self._in_a_row += 1
        if self.on_failure != "reset" or self._in_a_row >= 3:
            more = "" if self.on_failure != "reset" else f" ({self._in_a_row} failures in a row)"
            raise EnvFailure(f"{exc}; worker {self.worker_id} stops{more}") from exc.__cause__
        self.failures += 1
        old = self.calls
        assert old is not None
        log.error("%s; the episode is dropped and the env %s (the pipeline's on_env_failure is "
                  "\"reset\")", exc,
                  "rebuilt, since the old one is stuck" if old.stuck else "reset")
        if old.stuck:
            self.open()
            old.close()
