"""The step of a TorchRL env through netrl's adapter (netrl.interop.envs), conditions alternating:

env     CartPole-v1, --steps steps per run (random actions drawn beforehand), three ways: netrl's
        GenericGymEnv (plain Gymnasium, the reference), TorchRL's GymEnv stepped as TorchRL
        users do (``env.step`` then ``env.step_mdp``), and that GymEnv through TorchRLEnv (the
        worker's env: actions and observations converted, flags and info read). Median over
        --repeats runs of each. The figure is what the adapter adds to TorchRL's own step; on
        a loaded machine the difference of two ~100 us steps is noisy, so the adapter's own
        work is also timed alone, on one step's tensordict.
vector  --envs CartPole-v1 envs in one batch, --steps / --envs batched steps per run: Gymnasium's
        SyncVectorEnv of GenericGymEnv (same-step autoreset), TorchRL's SerialEnv stepped with
        ``step_and_maybe_reset``, and that SerialEnv through TorchRLVectorEnv, as the worker
        builds it (each env's first steps checked from inside the batch).

Target: the adapter adds under 1% of a 20 Hz real-time step (0.5 ms) to TorchRL's own step.
Needs the torchrl extra (pip install -e ".[torchrl]").
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import torch

from benchmarks.results import Row
from benchmarks.settings import positive
from netrl.envs.gym import GenericGymEnv

PERIOD_US = 50_000.0  # a 20 Hz loop
TARGET_SHARE = 0.01  # of its period
ENV_ID = "CartPole-v1"


@dataclasses.dataclass(frozen=True)
class Settings:
    steps: int = 5000  # env steps per run (vector: batched steps x envs)
    repeats: int = 5  # runs per condition, alternating
    envs: int = 8  # envs in the vector rows

    def __post_init__(self) -> None:
        positive("--steps", self.steps, 10, strict=False)
        positive("--repeats", self.repeats, 1, strict=False)
        positive("--envs", self.envs, 2, strict=False)


SMOKE = Settings(steps=100, repeats=1, envs=2)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--steps", type=int, help=f"env steps per run ({d.steps})")
    p.add_argument("--repeats", type=int, help=f"runs per condition, alternating ({d.repeats})")
    p.add_argument("--envs", type=int, help=f"envs in the vector rows ({d.envs})")


def torchrl_cartpole() -> Any:
    from torchrl.envs import GymEnv

    return GymEnv(ENV_ID, categorical_action_encoding=True)


def gym_us(steps: int) -> float:
    return _gymnasium_loop_us(GenericGymEnv(ENV_ID), steps)


def _gymnasium_loop_us(env: Any, steps: int) -> float:
    """Microseconds per step of a Gymnasium-style env, random CartPole actions, reset at episode
    ends; closes ``env``."""
    actions = np.random.default_rng(0).integers(0, 2, steps)
    env.reset(seed=0)
    start = time.perf_counter()
    for a in actions:
        if any(env.step(a)[2:4]):
            env.reset()
    took = time.perf_counter() - start
    env.close()
    return took / steps * 1e6


def torchrl_us(steps: int) -> float:
    env = torchrl_cartpole()
    actions = torch.as_tensor(np.random.default_rng(0).integers(0, 2, steps))
    env.set_seed(0)
    td = env.reset()
    start = time.perf_counter()
    for a in actions:
        td = env.step(td.set("action", a))
        td = env.reset() if bool(td.get(("next", "done"))) else env.step_mdp(td)
    took = time.perf_counter() - start
    env.close()
    return took / steps * 1e6


def adapter_us(steps: int) -> float:
    from netrl.interop.envs import torchrl_env

    return _gymnasium_loop_us(torchrl_env(torchrl_cartpole)(), steps)


def conversion_us(steps: int) -> float:
    """The adapter's own work per step, on one step's tensordict: the action in, the observation,
    reward, flags and info out (what TorchRLEnv.step does beside TorchRL's step and step_mdp)."""
    from netrl.interop.envs import torchrl_env

    env = torchrl_env(torchrl_cartpole)()
    env.reset(seed=0)
    layout, td = env.layout, env._td
    assert td is not None
    nxt = env.torchrl_env.step(td.set("action", torch.tensor(0))).get("next")
    action = np.int64(1)
    start = time.perf_counter()
    for _ in range(steps):
        td.set(layout.action.key, layout.action.to_tensor(action, ()))
        layout.flags(nxt)
        layout.observation(nxt)
        layout.infos(nxt, ())
        float(nxt.get(layout.reward))
    took = time.perf_counter() - start
    env.close()
    return took / steps * 1e6


def vector_us(kind: str, steps: int, n: int) -> float:
    """Microseconds per env step (a batched step over ``n``)."""
    rounds = max(steps // n, 1)
    actions = np.random.default_rng(0).integers(0, 2, (rounds, n))
    if kind == "torchrl":
        from torchrl.envs import SerialEnv

        env = SerialEnv(n, torchrl_cartpole)
        td = env.reset()
        start = time.perf_counter()
        for a in torch.as_tensor(actions):
            _, td = env.step_and_maybe_reset(td.set("action", a))
        took = time.perf_counter() - start
        env.close()
        return took / (rounds * n) * 1e6
    if kind == "adapter":
        from netrl.interop.envs import torchrl_env

        vec: Any = torchrl_env(torchrl_cartpole).make_vector_env(n, "sync")
    else:
        mode = gymnasium.vector.AutoresetMode.SAME_STEP
        vec = gymnasium.vector.SyncVectorEnv([lambda: GenericGymEnv(ENV_ID)] * n, autoreset_mode=mode)
    vec.reset(seed=0)
    start = time.perf_counter()
    for a in actions:
        vec.step(a)
    took = time.perf_counter() - start
    vec.close()
    return took / (rounds * n) * 1e6


def alternate(conditions: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """The median of ``repeats`` runs per condition, conditions alternating."""
    times: dict[str, list[float]] = {name: [] for name in conditions}
    for _ in range(repeats):
        for name, fn in conditions.items():
            times[name].append(fn())
    return {name: statistics.median(v) for name, v in times.items()}


def run(s: Settings) -> list[Row]:
    torch.set_num_threads(1)
    one = alternate({"gymnasium": lambda: gym_us(s.steps), "torchrl": lambda: torchrl_us(s.steps),
                     "adapter": lambda: adapter_us(s.steps),
                     "conversion": lambda: conversion_us(s.steps)}, s.repeats)
    added = one["adapter"] - one["torchrl"]
    print(f"env step: {one['gymnasium']:.1f} us Gymnasium, {one['torchrl']:.1f} us TorchRL's "
          f"GymEnv, {one['adapter']:.1f} us through TorchRLEnv ({added:+.1f} us; the conversion "
          f"alone {one['conversion']:.1f} us)", flush=True)
    vec = alternate({kind: (lambda kind=kind: vector_us(kind, s.steps, s.envs))  # type: ignore[misc]
                     for kind in ("gymnasium", "torchrl", "adapter")}, s.repeats)
    vec_added = vec["adapter"] - vec["torchrl"]
    print(f"vector of {s.envs}, per env step: {vec['gymnasium']:.1f} us SyncVectorEnv, "
          f"{vec['torchrl']:.1f} us SerialEnv, {vec['adapter']:.1f} us through "
          f"TorchRLVectorEnv ({vec_added:+.1f} us)", flush=True)
    target = f"adds < {TARGET_SHARE:.0%} of a 20 Hz step ({PERIOD_US * TARGET_SHARE:g} us)"
    limit = PERIOD_US * TARGET_SHARE
    params = dataclasses.asdict(s)
    return [
        Row("torchrl-envs", "CartPole-v1, TorchRL GymEnv through TorchRLEnv", "time per step",
            one["adapter"], "us", one["torchrl"], "TorchRL's own step + env.step_mdp", added,
            "us added", target, added < limit, params=params, detail=one),
        Row("torchrl-envs", "CartPole-v1, TorchRLEnv's conversion alone", "time per step",
            one["conversion"], "us", None, "", None, "x", target,
            one["conversion"] < limit, params=params, detail=one),
        Row("torchrl-envs", "CartPole-v1, TorchRLEnv against plain Gymnasium", "time per step",
            one["adapter"], "us", one["gymnasium"], "GenericGymEnv",
            one["adapter"] / one["gymnasium"], "x", params=params, detail=one),
        Row("torchrl-envs", f"{s.envs} CartPole-v1, SerialEnv through TorchRLVectorEnv",
            "time per env step", vec["adapter"], "us", vec["torchrl"],
            "SerialEnv.step_and_maybe_reset", vec_added, "us added", target, vec_added < limit,
            params=params, detail=vec),
    ]
