"""Declared views at act time: the :class:`~netrl.memory.views.View` declarations a
:class:`~netrl.memory.history.HistoryMemory` assembles for training, built per env from the rows
as they are recorded, so that an actor acts on exactly what the trainer's batch holds for that
row (RLlib's view requirements feed action computation too). No network: a worker
(:class:`~netrl.worker.policy.PolicyHandle`) or a user's own loop drives it::

    views = ActViews(actor.views(), n_envs, observation_space, action_space, "MyActor")
    views.start(i, default_action, obs)        # env i's reset row (reward 0)
    obs_in = views.observe(obs)                # into="obs" leaves replaced by their windows
    action = actor.act_(obs_in, views=views.extra(...))   # into="extra": {name: window}
    views.push(i, action, next_obs, reward)    # the step's row

Per env and view a window holds the last ``length`` values of the view's source column, oldest
first. ``start`` fills it with the reset row's value and ``push`` slides it by one: the memory's
default rule (:func:`~netrl.memory.views.episode_offsets`), whose entries before an episode's
first row repeat that row (the worker's default action, reward 0, the first observation). Values
are kept in the dtypes rows are stored in (:func:`~netrl.samples.spaces.carried_sample`), so the
windows are bit-identical to the batch's ``extra[name]`` (for the row's observation) and
``extra["next_" + name]`` (for the next one).

Refused when built, naming the view (:class:`ValueError`): a view with a rule of its own (such as
:class:`~netrl.memory.action_buffer.ActionBufferMemory`'s carried buffer, whose windows depend on
rows and seams the memory sees per packet), and a source the rows do not hold as the memory stores
it: ``extra/<name>``, a column a memory subclass adds, or an observation leaf that a sample
compressor changes before the rows are stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from netrl.memory.views import View, check_views
from netrl.samples.columns import flatten, unflatten
from netrl.samples.spaces import carried_sample

__all__ = ["ActViews"]


class ActViews:
    """The windows of ``views`` for ``n`` envs (see the module docstring).

    Args:
        views: the actor's declared views.
        n: envs.
        observation_space, action_space: the env's spaces (a leaf's shape and stored dtype).
        owner: named in errors (the actor's class).
        compressed: the rows pass a sample compressor, which may change observation leaves:
            views of observation leaves are refused.
    """

    def __init__(self, views: Sequence[View], n: int, observation_space: Any, action_space: Any,
                 owner: str, compressed: bool = False) -> None:
        self.views = check_views(views, owner)
        self.n = n
        self._obs_spec, obs_leaves = flatten(carried_sample(observation_space), "obs")
        _, act_leaves = flatten(carried_sample(action_space), "act")
        stored = {**dict(obs_leaves), **dict(act_leaves), "rew": np.float32(0)}
        self.windows: dict[str, np.ndarray] = {}
        for view in self.views:
            where = f"{owner}: view {view.name!r}"
            if view.rule is not None:
                raise ValueError(f"{where} has a rule of its own, and the worker builds at act "
                                 f"time only views with the default rule (episode_offsets): "
                                 f"declare it without a rule, or give the actor this input "
                                 f"another way")
            if view.source not in stored:
                raise ValueError(f"{where} reads {view.source!r}, which the worker does not "
                                 f"record as the memory stores it; at act time a view reads "
                                 f"'rew' or a leaf of the action or observation: "
                                 f"{sorted(stored)}")
            if compressed and view.source.startswith("obs"):
                raise ValueError(f"{where} reads the observation leaf {view.source!r}, which "
                                 f"the sample compressor may change before the rows are "
                                 f"stored, so the actor's window could differ from the "
                                 f"batch's: read 'act' or 'rew', or drop the compressor")
            if view.into == "obs" and view.name not in dict(obs_leaves):
                raise ValueError(f"{where} goes into the observation leaf {view.name!r}, but "
                                 f"the observations have the leaves {sorted(dict(obs_leaves))}")
            value = np.asarray(stored[view.source])
            self.windows[view.name] = np.zeros((n, view.length, *value.shape), value.dtype)
        self._reads_obs = any(v.source.startswith("obs") for v in self.views)
        self._reads_act = any(v.source.startswith("act") for v in self.views)
        self._into_obs = [v for v in self.views if v.into == "obs"]
        self._into_extra = [v for v in self.views if v.into == "extra"]

    def _sources(self, act: Any, obs: Any, rew: Any) -> dict[str, Any]:
        found: dict[str, Any] = {"rew": rew}
        if self._reads_act:
            found.update(flatten(act, "act")[1])
        if self._reads_obs:
            found.update(flatten(obs, "obs")[1])
        return found

    def start(self, i: int, act: Any, obs: Any) -> None:
        """Env ``i`` starts an episode with its reset row (``act``: the default action, reward
        0): every entry of its windows is that row's value."""
        found = self._sources(act, obs, 0.0)
        for view in self.views:
            self.windows[view.name][i] = found[view.source]

    def push(self, i: int, act: Any, obs: Any, rew: float) -> None:
        """Env ``i``'s next row: each window slides by one and ends with the row's value."""
        found = self._sources(act, obs, rew)
        for view in self.views:
            w = self.windows[view.name][i]
            w[:-1] = w[1:]  # numpy copies overlapping slices safely
            w[-1] = found[view.source]

    def push_many(self, idx: np.ndarray, acts: Any, obs: Any, rew: np.ndarray) -> None:
        """The rows of envs ``idx`` at once: ``acts``, ``obs`` and ``rew`` are every env's
        (a vector step's batches, leading dimension ``n``)."""
        if not len(idx):
            return
        found = self._sources(acts, obs, rew)
        for view in self.views:
            w = self.windows[view.name]
            w[idx, :-1] = w[idx, 1:]
            w[idx, -1] = np.asarray(found[view.source])[idx]

    def observe(self, obs: Any, idx: np.ndarray | None = None) -> Any:
        """``obs`` with the leaves views go into (``into="obs"``) replaced by their windows:
        one env's observation (``idx`` None: env 0), or a batch of the envs ``idx`` (leading
        dimension ``len(idx)``). ``obs`` itself when no view goes into it."""
        if not self._into_obs:
            return obs
        _, leaves = flatten(obs, "obs")
        named = dict(leaves)
        for view in self._into_obs:
            w = self.windows[view.name]
            named[view.name] = w[0].copy() if idx is None else w[idx]
        return unflatten(self._obs_spec, named)

    def extra(self, idx: np.ndarray | None = None) -> dict[str, np.ndarray] | None:
        """The windows of the views that go into ``batch.extra``: ``(length, *shape)`` for one
        env (``idx`` None: env 0), ``(len(idx), length, *shape)`` for the envs ``idx``; copies.
        None when no view goes there."""
        if not self._into_extra:
            return None
        return {v.name: self.windows[v.name][0].copy() if idx is None else self.windows[v.name][idx]
                for v in self._into_extra}
