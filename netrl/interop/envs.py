"""TorchRL envs on netrl's workers: a TorchRL ``EnvBase`` seen as a Gymnasium env (one env) or as a
Gymnasium vector env (a batched ``SerialEnv``/``ParallelEnv``, netrl's vector worker).

A pipeline's ``env_cls`` is a :class:`TorchRLEnvFactory` around a function that builds one
unbatched TorchRL env (``GymEnv``, a ``TransformedEnv`` with ``CatFrames``, ``ObservationNorm``,
``StepCounter``...)::

    pipeline = torchrl_pipeline(cfg, make=make_env, info_keys=[InfoKey("step_count", "int64")])

The worker calls the factory for one env, or (``worker.num_envs`` > 1) its ``make_vector_env``,
which batches ``make`` in a ``SerialEnv`` (``worker.vectorization`` "sync") or a ``ParallelEnv``
("async"; or the ``batch`` function given), stepped with ``step_and_maybe_reset``: Gymnasium's
same-step autoreset, the final observation in ``info["final_obs"]``.

Spaces come from the specs (:mod:`netrl.interop.specs`). The observation is the observation
spec's leaves but the info keys: its ``"observation"`` array where that is the only one, else a
Dict of them. The declared info keys (:mod:`netrl.samples.info`) are read from the same
tensordict, so a transform's key such as ``StepCounter``'s ``"step_count"`` travels as an info
column. ``terminated`` and ``truncated`` are netrl's flags (an env without ``truncated``:
``done and not terminated``).

What ``check_env_specs`` checks is checked on the env's own calls, never with random actions (a
robot must not get them): the first reset, and the first ``check_steps`` steps with the resets
among them, against the specs (keys, shapes, dtypes, values), with a ValueError naming the key.
Afterwards a step costs the conversion alone, so a real-time env stays real time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Literal

import gymnasium
import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase, ParallelEnv, SerialEnv

from netrl.agents.registry import choose, either, entries
from netrl.config.sections import Config
from netrl.errors import ConfigError
from netrl.interop.specs import (
    Key,
    Leaf,
    action_leaf,
    check_reset,
    check_step,
    expected,
    key_label,
    leaves,
    spec_label,
    watch_from_inside,
)
from netrl.pipelines.algorithms import Parts
from netrl.pipelines.base import Pipeline
from netrl.samples.columns import row
from netrl.samples.info import InfoKey, check_info_keys

__all__ = ["TorchRLEnv", "TorchRLEnvFactory", "TorchRLVectorEnv", "torchrl_env",
           "torchrl_pipeline"]


class _Layout:
    """What the adapters read from a TorchRL env's tensordicts: observation leaves, info keys,
    reward and done keys, and the specs a reset's and a step's tensordicts are checked against."""

    def __init__(self, env: EnvBase, info_keys: Sequence[InfoKey], batch: tuple[int, ...]) -> None:
        def one(spec: Any) -> Any:  # one env's spec (a batched env's specs hold its batch dims)
            return spec[(0,) * len(batch)] if batch else spec

        obs_spec = one(env.full_observation_spec)
        known = {k for k in _keys(obs_spec.keys(True, True))}
        self.info: list[tuple[InfoKey, str]] = []
        for info in info_keys:
            key = (info.name,)
            if key not in known:
                raise ValueError(f"info key {info.name!r} is declared, but the TorchRL env's "
                                 f"observation_spec has no key {info.name!r} (it has "
                                 f"{', '.join(sorted(key_label(k) for k in known))}): declare a key the env "
                                 "returns (StepCounter's 'step_count', ...)")
            numel = int(np.prod(obs_spec[info.name].shape))
            if numel != int(np.prod(info.shape)):
                raise ValueError(f"info key {info.name!r} is declared with shape "
                                 f"{info.shape}, but the env's spec of it is "
                                 f"{list(obs_spec[info.name].shape)}: declare a shape of "
                                 f"{numel} values")
            self.info.append((info, info.name))
        self.obs = leaves(obs_spec, skip=[(k,) for _, k in self.info])
        # tensordict's get is quicker with a string than with a 1-tuple: the keys as it takes them
        self.obs_keys = [_td_key(leaf.key) for leaf in self.obs]
        if not self.obs:
            raise ValueError("the TorchRL env has no observation key but the info keys: netrl's "
                             "actors need an observation")
        self.plain = len(self.obs) == 1 and self.obs[0].key == ("observation",)
        self.observation_space = self.obs[0].space if self.plain else _dict_space(self.obs)
        self.action: Leaf = action_leaf(one(env.full_action_spec))
        self.action_key = _td_key(self.action.key)
        rewards = _keys(env.reward_keys)
        if len(rewards) != 1:
            raise ValueError(f"the TorchRL env has {len(rewards)} reward keys "
                             f"({', '.join(key_label(k) for k in rewards)}): netrl records one reward "
                             "per step")
        reward_spec = one(env.full_reward_spec)[rewards[0]]
        if int(np.prod(reward_spec.shape)) != 1:
            raise ValueError(f"the TorchRL env's reward {key_label(rewards[0])} has the spec "
                             f"{spec_label(reward_spec)}: netrl records one number per step")
        self.reward = _td_key(rewards[0])
        done = {k for k in _keys(env.done_keys)}
        if ("done",) not in done:
            raise ValueError(f"the TorchRL env has no root 'done' key (its done keys: "
                             f"{', '.join(sorted(key_label(k) for k in done))}): netrl runs one agent per env")
        self.terminated = "terminated" if ("terminated",) in done else "done"
        self.truncated = "truncated" if ("truncated",) in done else None
        self.expected = expected(env, one)

    def observation(self, td: TensorDictBase) -> Any:
        if self.plain:
            return self.obs[0].to_numpy(td.get(self.obs_keys[0]))
        out: dict[str, Any] = {}
        for leaf, key in zip(self.obs, self.obs_keys, strict=True):
            node = out
            for name in leaf.key[:-1]:
                node = node.setdefault(name, {})
            node[leaf.key[-1]] = leaf.to_numpy(td.get(key))
        return out

    def infos(self, td: TensorDictBase, batch: tuple[int, ...]) -> dict[str, Any]:
        return {info.name: td.get(key).numpy().reshape((*batch, *info.shape))
                for info, key in self.info}

    def flags(self, td: TensorDictBase) -> tuple[np.ndarray, np.ndarray]:
        """terminated, truncated: one bool per env."""
        term = td.get(self.terminated).reshape(-1).numpy()
        if self.truncated is not None:
            return term, td.get(self.truncated).reshape(-1).numpy()
        return term, td.get("done").reshape(-1).numpy() & ~term



def _td_key(key: Key) -> str | Key:
    return key[0] if len(key) == 1 else key


def _keys(keys: Iterable[Any]) -> list[Key]:
    return [(k,) if isinstance(k, str) else tuple(k) for k in keys]


def _dict_space(found: list[Leaf]) -> gymnasium.spaces.Dict:
    tree: dict[str, Any] = {}
    for leaf in found:
        node = tree
        for name in leaf.key[:-1]:
            node = node.setdefault(name, {})
        node[leaf.key[-1]] = leaf.space

    def build(node: dict[str, Any]) -> gymnasium.spaces.Dict:
        return gymnasium.spaces.Dict({k: build(v) if isinstance(v, dict) else v
                                      for k, v in node.items()})

    return build(tree)


class _Adapter:
    """What both adapters share: the env, its layout, the checks still to run."""

    def _adopt(self, env: EnvBase, info_keys: Iterable[Any], check_steps: int,
               batch: tuple[int, ...]) -> None:
        if check_steps < 0:
            raise ValueError(f"check_steps must be >= 0 (got {check_steps})")
        self.torchrl_env, self.batch = env, batch
        self.layout = _Layout(env, check_info_keys(info_keys, "info_keys"), batch)
        self.name = type(env).__name__
        self._checks_left = check_steps
        self._reset_checked = False
        self._td: TensorDictBase | None = None
        self._closed = False

    def _reset(self, seed: int | None, td: TensorDictBase | None = None) -> TensorDictBase:
        if seed is not None:
            self.torchrl_env.set_seed(seed)
        td = self.torchrl_env.reset(td)
        if self._checks_left or not self._reset_checked:  # at start, as the steps
            check_reset(td, self.layout.expected, self.batch, f"TorchRL env {self.name}: reset()")
            self._reset_checked = True
        self._td = td
        return td

    def _act(self, action: Any) -> TensorDictBase:
        td = self._td
        if td is None:
            raise RuntimeError(f"step() before reset() on the TorchRL env {self.name}")
        td.set(self.layout.action_key, self.layout.action.to_tensor(action, self.batch))
        return td

    def _checked(self, td: TensorDictBase) -> None:
        if self._checks_left:  # the first steps only: afterwards a step costs the conversion
            check_step(td.get("next"), self.layout.expected, self.batch,
                       f"TorchRL env {self.name}: step()")
            self._checks_left -= 1

    def close(self, **kwargs: Any) -> None:
        if not self._closed:
            self._closed = True
            self.torchrl_env.close(raise_if_closed=False)


class TorchRLEnv(_Adapter, gymnasium.Env):
    """One unbatched TorchRL env as a Gymnasium env (see the module docstring)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, env: EnvBase, info_keys: Iterable[Any] = (), check_steps: int = 3) -> None:
        if tuple(env.batch_size):
            raise ValueError(f"the TorchRL env {type(env).__name__} has batch_size "
                             f"{list(env.batch_size)}: give TorchRLEnv one unbatched env, and "
                             "batch with worker.num_envs (TorchRLVectorEnv)")
        self._adopt(env, info_keys, check_steps, ())
        self.observation_space = self.layout.observation_space
        self.action_space = self.layout.action.space

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        td = self._reset(seed)
        return self.layout.observation(td), self.layout.infos(td, ())

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        td = self.torchrl_env.step(self._act(action))
        self._checked(td)
        nxt = td.get("next")
        term, trunc = self.layout.flags(nxt)
        obs, info = self.layout.observation(nxt), self.layout.infos(nxt, ())
        reward = float(nxt.get(self.layout.reward))
        self._td = self.torchrl_env.step_mdp(td)  # its precomputed keys: the fast path
        return obs, reward, bool(term[0]), bool(trunc[0]), info


class TorchRLVectorEnv(_Adapter, gymnasium.vector.VectorEnv):
    """A TorchRL env batched on one dim (``SerialEnv``, ``ParallelEnv``) as a Gymnasium vector env
    that autoresets in the same step (see the module docstring)."""

    def __init__(self, env: EnvBase, info_keys: Iterable[Any] = (), check_steps: int = 3) -> None:
        batch = tuple(env.batch_size)
        if len(batch) != 1:
            raise ValueError(f"the TorchRL env {type(env).__name__} has batch_size {list(batch)}: "
                             "TorchRLVectorEnv takes envs batched on one dim (SerialEnv, "
                             "ParallelEnv)")
        self._adopt(env, info_keys, check_steps, batch)
        self.num_envs = batch[0]
        self.single_observation_space = self.layout.observation_space
        self.single_action_space = self.layout.action.space
        self.observation_space = gymnasium.vector.utils.batch_space(
            self.single_observation_space, self.num_envs)
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space,
                                                               self.num_envs)
        self.metadata = {"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP}

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        mask = (options or {}).get("reset_mask")
        td = None
        if mask is not None and self._td is not None:  # the envs of the mask only
            td = self._td.exclude(self.layout.action_key).clone()
            td.set("_reset", torch.as_tensor(np.asarray(mask, np.bool_)).reshape(*self.batch, 1))
        td = self._reset(seed, td)
        td.pop("_reset", None)
        return self.layout.observation(td), self.layout.infos(td, self.batch)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray,
                                          dict[str, Any]]:
        out, nxt = self.torchrl_env.step_and_maybe_reset(self._act(actions))
        self._checked(out)
        last = out.get("next")
        term, trunc = self.layout.flags(last)
        reward = last.get(self.layout.reward).reshape(-1).numpy().astype(np.float64)
        info = self.layout.infos(nxt, self.batch)
        ended = term | trunc
        if ended.any():  # Gymnasium's same-step autoreset: the final ones beside the new ones
            final = self.layout.observation(last)
            final_obs = np.empty(self.num_envs, object)
            for i in np.flatnonzero(ended).tolist():
                final_obs[i] = row(final, i)
            info.update(final_obs=final_obs, _final_obs=ended,
                        final_info=self.layout.infos(last, self.batch))
        self._td = nxt
        return self.layout.observation(nxt), reward, term, trunc, info


class TorchRLEnvFactory:
    """A pipeline's ``env_cls`` for TorchRL envs: called, one :class:`TorchRLEnv` of ``make()``;
    :meth:`make_vector_env`, ``num_envs`` of them batched (the worker's hook for
    ``worker.num_envs`` > 1). Picklable where ``make`` is (``ParallelEnv`` sends it to its
    processes).

    Args:
        make: builds one unbatched TorchRL env.
        info_keys: the pipeline's info keys, read from the env's tensordicts.
        check_steps: steps checked against the specs at start (and the resets among them; the
            first reset always).
        batch: ``batch(num_envs, make)`` builds the batched env (default: ``SerialEnv`` for
            ``worker.vectorization`` "sync", ``ParallelEnv`` for "async"), e.g. to put a
            transform over the batch.
    """

    def __init__(self, make: Callable[[], EnvBase], info_keys: Iterable[Any] = (),
                 check_steps: int = 3,
                 batch: Callable[[int, Callable[[], EnvBase]], EnvBase] | None = None) -> None:
        if not callable(make):
            raise ValueError(f"make must be a function that builds a TorchRL env (got {make!r})")
        self.make, self.check_steps, self.batch = make, check_steps, batch
        self.info_keys = check_info_keys(info_keys, "info_keys")

    def __call__(self) -> TorchRLEnv:
        env = self.make()
        if not isinstance(env, EnvBase):
            raise ValueError(f"make() returned a {type(env).__name__}, not a TorchRL EnvBase")
        if tuple(env.batch_size):
            env.close(raise_if_closed=False)
            raise ValueError(f"make() returned {type(env).__name__} with batch_size "
                             f"{list(env.batch_size)}: give make for one unbatched env; netrl "
                             "batches it with worker.num_envs (SerialEnv for "
                             "worker.vectorization \"sync\", ParallelEnv for \"async\")")
        try:
            return TorchRLEnv(env, self.info_keys, self.check_steps)
        except BaseException:  # specs without a mapping: the env is let go of, closed
            env.close(raise_if_closed=False)
            raise

    def make_vector_env(self, num_envs: int,
                        vectorization: Literal["sync", "async"]) -> TorchRLVectorEnv:
        # each env checked inside the batch, whose buffers would cast a wrong dtype and keep zeros
        # for a missing key
        make = partial(checked, self.make, self.check_steps)
        if self.batch is not None:
            env = self.batch(num_envs, make)
        elif vectorization == "async":
            env = ParallelEnv(num_envs, make)
        else:
            env = SerialEnv(num_envs, make)
        if tuple(env.batch_size) != (num_envs,):
            env.close(raise_if_closed=False)
            raise ValueError(f"batch({num_envs}, make) returned {type(env).__name__} with "
                             f"batch_size {list(env.batch_size)}, not [{num_envs}] "
                             "(worker.num_envs)")
        try:
            return TorchRLVectorEnv(env, self.info_keys, self.check_steps)
        except BaseException:
            env.close(raise_if_closed=False)
            raise

    def __repr__(self) -> str:
        return f"TorchRLEnvFactory({getattr(self.make, '__name__', self.make)!r})"


def checked(make: Callable[[], EnvBase], steps: int) -> EnvBase:
    """``make()``'s env with its resets and first ``steps`` steps checked against its specs from
    inside a batch."""
    return watch_from_inside(make(), steps)


def torchrl_env(make: Callable[[], EnvBase], info_keys: Iterable[Any] = (),
                check_steps: int = 3) -> TorchRLEnvFactory:
    """``env_cls`` for a pipeline or a RolloutWorker: the TorchRL envs ``make`` builds."""
    return TorchRLEnvFactory(make, info_keys, check_steps)


def torchrl_pipeline(cfg: Config, make: Callable[[], EnvBase], info_keys: Iterable[Any] = (),
                     check_steps: int = 3,
                     batch: Callable[[int, Callable[[], EnvBase]], EnvBase] | None = None,
                     realtime: bool = False) -> Pipeline:
    """The gym pipeline's agent (``agent.algorithm``; "auto": the one the action space needs) on
    the TorchRL envs ``make`` builds; for ``env.pipeline`` "module:function" with ``function(cfg)``
    returning it. ``info_keys`` (and config.json's ``env.info_keys``) are read from the env's
    tensordicts; ``realtime`` marks an env that runs in real time (a robot, rtgym): the worker
    never pauses it (``worker.throttle`` is ignored). ConfigError when the agent cannot take the
    env's actions."""
    declared = check_info_keys(info_keys, "info_keys")
    from_config = tuple(InfoKey(**k) for k in cfg.env.info_keys)  # make_pipeline adds them
    env_cls = TorchRLEnvFactory(make, (*declared, *from_config), check_steps, batch)
    env = env_cls()  # once, to see its action space (and that its specs map)
    try:
        actions = env.action_space
    finally:
        env.close()
    name, recurrent = cfg.agent.algorithm, cfg.agent.recurrent is not None
    algorithm = choose(name, recurrent, actions)
    if algorithm is None:
        takes = either([a.supports.spaces_text() for a in entries(name, recurrent)])
        raise ConfigError([f'agent.algorithm "{name}" needs {takes} actions, but the TorchRL '
                           f"env has {actions} (from its action_spec): choose another "
                           "agent.algorithm, or another action spec"])
    if cfg.memory.sequence_length > 1 and algorithm.supports.memory != "sequences":
        raise ConfigError([f"memory.sequence_length is {cfg.memory.sequence_length}, but "
                           f"{algorithm.supports.label} learns from single transitions: set "
                           "agent.recurrent, or memory.sequence_length to 1"])
    module_name, _, function = algorithm.build.partition(":")
    parts: Parts = getattr(importlib.import_module(module_name), function)(cfg)
    return Pipeline(env_cls=env_cls, info_keys=declared, realtime=realtime, **parts._asdict())
