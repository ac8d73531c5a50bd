"""The one learning-run loop every learning row shares: each variant of a row on each seed, judged
alike, and the medians over the seeds.

A *learner* (learners.py, sb3.py) is one variant learning on one seed: netrl's three processes,
netrl in one process (``netrl.local``), or Stable-Baselines3. It learns until the loop says stop,
and tells the loop every so often how far it got (:class:`Progress`). The row's :class:`Judge`
says when a run has got there, the same way for every variant of the row:

* on the training returns (``every`` None): the mean return of the last ``window`` training
  episodes in the worker's episodes CSV first reaches ``threshold``; the run's env steps and wall
  time are that episode's;
* on a frozen policy: at the first report at or past each multiple of ``every`` env steps
  (counted as the row counts them), the newest policy, loaded once and held fixed, plays
  ``episodes`` deterministic episodes on seeds 1000.. of an env of the judge's own (``env_id``),
  or, with ``env_id`` None, of a new env of the run's own pipeline for each evaluation
  (:attr:`Progress.env`: the drone's and the image's envs are no Gymnasium ids); the run is
  done when their mean reaches ``threshold``. A policy with a state (a recurrent actor) starts
  each episode from its initial state (its ``reset()``). Every evaluation's env steps and mean
  are kept.

Seeds run one after the other, the variants in turn on each (load from other processes falls on
all alike). A run that never gets there within ``max_steps`` counts as ``max_steps`` in the median,
so that the median then says "at least".
"""

from __future__ import annotations

import csv
import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

Act = Callable[[Any], Any]  # one observation -> one action


@dataclasses.dataclass
class Progress:
    """How far a learner got: what the judge reads."""

    steps: int  # env steps so far, as the row counts them
    policy: Callable[[], Act | None]  # the newest policy, loaded now and held fixed; None: none
    episodes: Path | None = None  # the worker's episodes CSV, for a judge of training returns
    env: Callable[[], Any] | None = None  # the env the policy plays where the judge names none


def no_policy() -> Act | None:
    return None


class Learner(Protocol):
    def learn(self, progress: Callable[[Progress], bool]) -> None:
        """Learn until ``progress`` returns True, calling it at least every few seconds."""

    def problems(self) -> list[str]:
        """For a run that never got there: its last warnings and errors, if it keeps any."""


# A variant: a learner for (seed, the run's own folder, the run's env-step budget)
Variant = Callable[[int, Path, int], Learner]


@dataclasses.dataclass(frozen=True)
class Judge:
    threshold: float
    env_id: str | None = "Pendulum-v1"  # the env a frozen policy plays; None: the run's own
    every: int | None = None  # env steps between evaluations; None: judge the training returns
    episodes: int = 10  # deterministic episodes per evaluation
    window: int = 10  # training episodes averaged

    def describe(self, measure: str = "env steps") -> str:
        if self.every is None:
            return (f"{measure} to a mean training return >= {self.threshold:g} (last "
                    f"{self.window} episodes)")
        return (f"{measure} to a deterministic mean >= {self.threshold:g} over {self.episodes} "
                f"episodes (every {self.every:,} env steps"
                + (", on the run's own env)" if self.env_id is None else ")"))


def run_one(variant: str, seed: int, learner: Learner, judge: Judge,
            max_steps: int) -> dict[str, Any]:
    """One variant on one seed, until the judge says it got there or ``max_steps`` are spent."""
    import gymnasium

    on_policy = judge.every is not None
    env = gymnasium.make(judge.env_id) if on_policy and judge.env_id is not None else None
    t0 = time.time()
    seen: dict[str, Any] = {"steps": 0, "next": judge.every, "reached": None, "episodes": None,
                            "evaluations": []}

    def progress(p: Progress) -> bool:
        seen["steps"], seen["episodes"] = p.steps, p.episodes
        every = judge.every
        if not on_policy or every is None:  # on the training returns
            found = crossing(p.episodes, judge.threshold, judge.window)
            if found is not None:
                seen["reached"] = {"steps": found[0], "wall_s": round(found[1] - t0, 1)}
        elif p.steps >= seen["next"]:
            act = p.policy()
            if act is not None:  # (none before the worker's first weights)
                wall = time.time() - t0
                score = evaluate(act, env, judge.episodes) if env is not None else own(p, act)
                print(f"  {variant} seed {seed}: {p.steps} env steps, policy's mean {score:.1f}",
                      flush=True)
                seen["evaluations"].append([p.steps, round(score, 2)])
                if score >= judge.threshold:
                    seen["reached"] = {"steps": p.steps, "wall_s": round(wall, 1)}
                # the next multiple: every variant is evaluated at the same env steps, as
                # closely as its reports allow, however long an evaluation took
                seen["next"] = (p.steps // every + 1) * every
        return seen["reached"] is not None or p.steps >= max_steps

    def own(p: Progress, act: Act) -> float:
        """The policy's mean on a new env of the run's own, closed after: a real-time env (the
        drone) would otherwise run on between evaluations, and its first step come late."""
        if p.env is None:
            raise ValueError(f"{variant}: the judge plays the run's own env, but its learner "
                             f"gives none (Progress.env)")
        own_env = p.env()
        try:
            return evaluate(act, own_env, judge.episodes)
        finally:
            own_env.close()

    try:
        learner.learn(progress)
    finally:
        if env is not None:
            env.close()
    reached = seen["reached"]
    wall = reached["wall_s"] if reached else round(time.time() - t0, 1)  # (else: as it ran)
    result: dict[str, Any] = {"variant": variant, "seed": seed,
                              "steps": reached["steps"] if reached else None, "wall_s": wall,
                              "env_steps_run": seen["steps"]}
    result.update(_more(learner, judge, seen))
    steps = result["steps"] if reached else f"> {max_steps}"
    print(f"  {variant} seed {seed}: {steps} env steps ({result['wall_s']} s)", flush=True)
    if not reached:
        problems = learner.problems()
        if problems:
            print(f"  {variant} seed {seed}: not reached; its last warnings and errors:",
                  *problems[-20:], sep="\n    ", flush=True)
    return result


def _more(learner: Learner, judge: Judge, seen: dict[str, Any]) -> dict[str, Any]:
    """What a run's result keeps beside its figure: every evaluation, what its trainer did, and
    how its training returns went."""
    out: dict[str, Any] = {}
    if judge.every is not None:
        out["evaluations"] = seen["evaluations"]  # [env steps, the policy's mean] each
    trainer = getattr(learner, "trainer_summary", None)
    if trainer is not None:  # what the trainer did with the env steps (its update-to-data ratio)
        out["trainer"] = trainer()
    if seen["episodes"] is not None:
        out["best_mean_return"] = best_mean(seen["episodes"], judge.window)
        if judge.every is not None:  # judged on the policy: where the training returns got there
            found = crossing(seen["episodes"], judge.threshold, judge.window)
            out["training_returns_steps"] = None if found is None else found[0]
    return out


def run_seeds(variants: Mapping[str, Variant], seeds: Iterable[int], judge: Judge, max_steps: int,
              folder: Path, log: Path | None = None) -> list[dict[str, Any]]:
    """Every variant on every seed: seed by seed, the variants in turn. Each result is appended
    to ``log`` (one JSON line) as its run ends, so a long run that is stopped keeps them."""
    runs = []
    for seed in seeds:
        for name, make in variants.items():
            result = run_one(name, seed, make(seed, folder / f"{name}-seed{seed}", max_steps),
                             judge, max_steps)
            if log is not None:
                with log.open("a") as f:
                    f.write(json.dumps(result) + "\n")
            runs.append(result)
    return runs


def medians(runs: list[dict[str, Any]], max_steps: int) -> dict[str, dict[str, float]]:
    """Per variant, the median env steps (a run that never got there counts as ``max_steps``)
    and the median wall time (of the runs as they ended)."""
    out = {}
    for variant in dict.fromkeys(r["variant"] for r in runs):
        mine = [r for r in runs if r["variant"] == variant]
        out[variant] = {"steps": statistics.median(r["steps"] or max_steps for r in mine),
                        "wall_s": statistics.median(r["wall_s"] for r in mine)}
    return out


def env_steps(episodes_csv: Path) -> int:
    """Env steps a worker's episodes CSV has logged so far (0 before its first episode)."""
    if not episodes_csv.exists():
        return 0
    with episodes_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return int(rows[-1]["env_steps"]) if rows else 0


def training_returns(episodes_csv: Path | None) -> list[dict[str, str]]:
    """The training episodes (test episodes left out) of a worker's episodes CSV."""
    if episodes_csv is None or not episodes_csv.exists():
        return []
    with episodes_csv.open(newline="") as f:
        return [row for row in csv.DictReader(f) if row.get("test") != "1"]


def crossing(episodes_csv: Path | None, threshold: float,
             window: int = 10) -> tuple[int, float] | None:
    """``(env_steps, time)`` of the training episode at which the mean of the last ``window``
    training returns first reached ``threshold``; None before that."""
    returns: list[float] = []
    for row in training_returns(episodes_csv):
        returns.append(float(row["return"]))
        if len(returns) >= window and sum(returns[-window:]) / window >= threshold:
            return int(row["env_steps"]), float(row["time"])
    return None


def best_mean(episodes_csv: Path, window: int = 10) -> float | None:
    """The best mean of ``window`` consecutive training returns (how close a run came)."""
    returns = [float(row["return"]) for row in training_returns(episodes_csv)]
    means = [sum(returns[i - window:i]) / window for i in range(window, len(returns) + 1)]
    return round(max(means), 1) if means else None


def evaluate(act: Act, env: Any, episodes: int) -> float:
    """Mean return of ``episodes`` deterministic episodes on seeds 1000..; a policy with a
    ``reset()`` (a recurrent actor's state) is reset before each."""
    returns = []
    reset = getattr(act, "reset", None)
    for k in range(episodes):
        if reset is not None:
            reset()
        obs, _ = env.reset(seed=1000 + k)
        done, ret = False, 0.0
        while not done:
            obs, r, terminated, truncated, _ = env.step(act(obs))
            ret, done = ret + float(r), terminated or truncated
        returns.append(ret)
    return sum(returns) / len(returns)
