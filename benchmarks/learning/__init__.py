"""Learning: the env steps (and wall time) a run takes to a return, each row's variants on the same
seeds, judged alike by one loop (loop.py), medians over the seeds.

Rows (``--rows``, benchmarks/learning/rows.py says what each runs and why):

  pendulum      Pendulum-v1, SAC, three processes against one (netrl.local); seed 1
  cartpole      CartPole-v1, double DQN, three processes, against SB3's DQN (RL Zoo's values)
  ppo-cartpole  CartPole-v1, PPO, 2 workers x 8 envs, sync collection, against SB3's PPO
  ppo-pendulum  Pendulum-v1, the same, against SB3's PPO (``ppo``: both PPO rows)
  nstep         Pendulum-v1, SAC with 3-step returns and prioritized replay against plain SAC
  weights       Pendulum-v1 with float16 and int8 weights and normalised observations, against
                float32
  pomdp         Pendulum-v1 without its velocity, recurrent SAC beside the MLP SAC
  vector        Pendulum-v1, one worker of worker.num_envs 8 against one of a single env
  torchrl-sac   Pendulum-v1, TorchRL's SACLoss through the three processes against TorchRL's own
                Collector and ReplayBuffer, the same script (needs the torchrl extra)
  drone-pomdp   the rtgym drone at 20 Hz without its action buffer (velocity unobserved),
                recurrent SAC, against the MLP SAC with full observations, by env steps
  image-nstep-per  the image pipeline with 3-step returns and prioritized replay against plain
                replay, by env steps (both: benchmarks/learning/replay_rows.py)
  drone, image  the drone and image pipelines trained for --minutes, then their policy against
                random actions (benchmarks/learning/pipelines.py)

Seeds: 1, 2, 3 (pendulum: 1); ``--seeds 1-20`` or ``1,4,7`` for others. With ``--out DIR`` each
run keeps its folder under DIR, and each result is appended to DIR/runs.jsonl as the run ends (a
long run that is stopped keeps what it measured). The rows against SB3 need
``pip install -e .[bench]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.learning import pipelines
from benchmarks.learning.loop import medians, run_seeds
from benchmarks.learning.rows import LearningRow, Shape, rows, shaped
from benchmarks.results import Row
from benchmarks.settings import choose, names, positive

SEQUENCES = ("pendulum", "cartpole", "ppo-cartpole", "ppo-pendulum", "nstep", "weights", "pomdp",
             "vector", "torchrl-sac", "drone-pomdp", "image-nstep-per")
TIMED = ("drone", "image")
ALIASES = {"ppo": ("ppo-cartpole", "ppo-pendulum")}


@dataclasses.dataclass(frozen=True)
class Settings:
    rows: tuple[str, ...] = ("pendulum",)
    seeds: tuple[int, ...] | None = None  # None: each row's own
    max_steps: int | None = None  # None: each row's own budget
    variants: tuple[str, ...] | None = None  # None: all of a row's
    num_envs: int = 8  # vector row
    vectorization: str = "sync"  # vector row
    start_training: int | None = None  # None: each row's config's
    eval_every: int | None = None  # None: each row's judge's
    eval_episodes: int | None = None  # None: each row's judge's (drone and image: 20)
    minutes: float = 10.0  # drone and image rows
    out: Path | None = None  # keep the runs' folders (and runs.jsonl) here; None: a temporary one

    def __post_init__(self) -> None:
        choose(self.rows, (*SEQUENCES, *ALIASES, *TIMED), "--rows")
        choose((self.vectorization,), ("sync", "async"), "--vectorization")
        positive("--num-envs", self.num_envs, 1, strict=False)
        positive("--minutes", self.minutes)
        for option, value in (("--max-steps", self.max_steps), ("--eval-every", self.eval_every),
                              ("--eval-episodes", self.eval_episodes),
                              ("--start-training", self.start_training)):
            if value is not None:
                positive(option, value, 1, strict=False)


# smoke: a run far too short to learn, with a small trainer, to show every piece runs
SMOKE = Settings(seeds=(1,), max_steps=600, start_training=200, eval_every=300, eval_episodes=1,
                 minutes=0.3)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=names, help="which rows (default pendulum; see above)")
    p.add_argument("--seeds", type=seed_list,
                   help="seeds, e.g. 1,2,3 or 1-20 (default: the row's; 1,2,3 but pendulum's 1)")
    p.add_argument("--max-steps", type=int, help="give up after this many env steps (the row's)")
    p.add_argument("--variants", type=names, help="which of a row's variants (default: all)")
    p.add_argument("--num-envs", type=int, help="vector row: the worker's envs (default 8)")
    p.add_argument("--vectorization", help="vector row: sync (default) or async")
    p.add_argument("--start-training", type=int, help="trainer.start_training (default: the row's)")
    p.add_argument("--eval-every", type=int, help="env steps between evaluations (the row's)")
    p.add_argument("--eval-episodes", type=int, help="episodes per evaluation (the row's)")
    p.add_argument("--minutes", type=float, help="drone and image rows: training time (10)")
    p.add_argument("--out", type=Path,
                   help="keep the runs' folders here, with each result in runs.jsonl")


def seed_list(text: str) -> tuple[int, ...]:
    """``"1-20"`` -> ``(1, ..., 20)``; ``"1,4,7"`` and ``"1-3,9"`` as they read."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        first, dash, last = part.partition("-")
        try:
            seeds += [int(part)] if not dash else list(range(int(first), int(last) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected seeds such as 1,2,3 or 1-20, got {text!r}") from None
        if dash and int(last) < int(first):
            raise argparse.ArgumentTypeError(f"seed range {part!r} runs backwards")
    return tuple(dict.fromkeys(seeds))


def complete(s: Settings) -> Settings:
    """``ppo`` stands for both PPO rows; --variants must name variants of every row chosen."""
    chosen = tuple(dict.fromkeys(r for name in s.rows for r in ALIASES.get(name, (name,))))
    s = dataclasses.replace(s, rows=chosen)
    if s.variants is not None:
        table = rows(shape(s))
        for name in (r for r in chosen if r in table):
            choose(s.variants, table[name]().variants, f"--variants (row {name})")
    return s


def shape(s: Settings) -> Shape:
    return Shape(s.num_envs, s.vectorization, s.start_training, s.eval_every, s.eval_episodes)


def run(s: Settings) -> list[Row]:
    import torch

    torch.set_num_threads(1)  # the evaluations in this process, as the roles: one thread each
    table = rows(shape(s))
    out: list[Row] = []
    for name in s.rows:
        if name in TIMED:
            for seed in s.seeds or (1,):
                out += pipelines.rows(name, s.minutes, seed, s.eval_episodes or 20, s.out)
            continue
        row = shaped(table[name](), shape(s))
        variants = {k: v for k, v in row.variants.items() if s.variants is None or k in s.variants}
        seeds, max_steps = s.seeds or row.seeds, s.max_steps or row.max_steps
        print(f"learning {name}: {row.what}; {row.judge.describe()}; variants "
              f"{', '.join(variants)}; seeds {', '.join(map(str, seeds))}; at most "
              f"{max_steps:,} env steps", flush=True)
        for variant in (v for v in variants if v in row.params):
            print(f"  {name}: {variant} sets {row.params[variant]} over the base config (each "
                  f"run's config.json, kept with --out, has them all)", flush=True)
        with _folder(s.out, name) as d:
            runs = run_seeds(variants, seeds, row.judge, max_steps, d, log=d / "runs.jsonl")
        out += figures(name, row, runs, seeds, max_steps)
    return out


@contextlib.contextmanager
def _folder(out: Path | None, row: str) -> Iterator[Path]:
    """Where a row's runs keep their folders: under ``out`` (kept), or a temporary folder."""
    if out is not None:
        (out / row).mkdir(parents=True, exist_ok=True)
        yield out / row
        return
    with tempfile.TemporaryDirectory(prefix=f"netrl-bench-{row}-") as d:
        yield Path(d)


def figures(name: str, row: LearningRow, runs: list[dict[str, Any]], seeds: tuple[int, ...],
            max_steps: int) -> list[Row]:
    """A row per variant (and per figure, where the target compares wall times): its median
    against the row's reference variant, with the row's target on judged variants."""
    med = medians(runs, max_steps)
    reference = row.reference if row.reference in med else None
    kinds = ("steps", "wall_s") if row.compare == "wall_s" else ("steps",)
    out = []
    for variant, m in med.items():
        mine = [r for r in runs if r["variant"] == variant]
        per_seed = ", ".join(str(r["steps"]) if r["steps"] is not None else f">{max_steps}"
                             for r in mine)
        failed = [r["seed"] for r in mine if r["steps"] is None]
        print(f"  {name}: {variant:<24} median {m['steps']:>9,.0f} env steps, per seed {per_seed}; "
              f"failed {len(failed)} of {len(mine)}"
              + (f" (seeds {', '.join(map(str, failed))})" if failed else ""), flush=True)
        for kind in kinds:
            base = med[reference][kind] if reference is not None else None
            ratio = m[kind] / base if base else None
            target, met = _target(row, variant, kind, mine, ratio)
            figure = row.judge.describe("env steps" if kind == "steps" else "wall time")
            unit = "env steps" if kind == "steps" else "s"
            out.append(Row("learning", f"{name}: {variant}", f"median {figure}", m[kind], unit,
                           base, reference or "", ratio, "x", target, met,
                           {"row": name, "variant": variant, "seeds": list(seeds),
                            "max_steps": max_steps, "judge": dataclasses.asdict(row.judge),
                            **({"config": row.params[variant]} if variant in row.params else {})},
                           {"runs": mine}))
    return out


def _target(row: LearningRow, variant: str, kind: str, mine: list[dict[str, Any]],
            ratio: float | None) -> tuple[str, bool | None]:
    """The row's target on this variant's figure, and whether it is met."""
    if variant not in row.judged:
        return "", None
    parts, met = [], True
    if row.target_ratio is not None and kind == row.compare:
        parts.append(f"<= {row.target_ratio:g}x {row.reference}")
        # a run that never got there counts as the budget: a ratio of budgets says nothing
        met = met and ratio is not None and ratio <= row.target_ratio and all(
            r["steps"] is not None for r in mine)
    if row.target_steps is not None and kind == "steps":
        parts.append(f"median <= {row.target_steps:,} env steps")
        reached = statistics.median(r["steps"] if r["steps"] is not None else float("inf")
                                    for r in mine)
        met = met and reached <= row.target_steps
    if row.all_reached and kind == "steps":
        parts.append("every seed gets there")
        met = met and all(r["steps"] is not None for r in mine)
    return ", ".join(parts), (met if parts else None)
