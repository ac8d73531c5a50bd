"""The weights row of scripts/bench_learning.py (issue 34): does a compact weight format, or observation
normalisation, change how fast SAC learns Pendulum-v1?

Every variant runs the pendulum row's config (256x256 SAC, batch 256, update-to-data ratio 1, training from 1,000
samples) through the three processes (server, trainer, worker), because weights travel only over the network:
``netrl.local`` hands the worker the trainer's actor itself. The variants differ in one key each:

* ``float32``: today's exact weights (``network.weight_format`` float32), the reference;
* ``float16`` and ``int8``: the worker acts with weights in that format;
* ``normalize_obs``: float32 weights, ``env.normalize_obs`` on (the trainer's running statistics, published as the
  ``obs_norm`` model, applied on the worker before ``act`` and in the memory's batches).

Each run reports the env steps at which the mean return of its last 10 training episodes first reaches -200; the
row is the median over the seeds. Targets: float16 and int8 within 1.2x the env steps of float32, normalize_obs
within 1.2x of float32 (off).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.common import crossing, env_steps, median_steps, pendulum_config, three_roles
from netrl.launch import stop_processes, write_config

THRESHOLD = -200.0
WINDOW = 10
TARGET = 1.2
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {  # section -> keys changed
    "float32": {},
    "float16": {"network": {"weight_format": "float16"}},
    "int8": {"network": {"weight_format": "int8"}},
    "normalize_obs": {"env": {"normalize_obs": True}},
}


def run_one(tmp: Path, seed: int, variant: str, max_steps: int) -> dict[str, Any]:
    folder = tmp / f"{variant}-{seed}"
    cfg = pendulum_config(folder, seed, VARIANTS[variant])
    path = write_config(cfg, folder / "config.json")
    episodes = cfg.run_dir / "episodes_bench.csv"
    log_path = folder / "roles.log"
    t0 = time.monotonic()
    steps: int | None = None
    with log_path.open("wb") as logs:
        procs = three_roles(path, logs)
        try:
            while True:
                found = crossing(episodes, THRESHOLD, WINDOW)
                if found is not None:
                    steps = found[0]
                    break
                if env_steps(episodes) >= max_steps:
                    break
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a {variant} process exited early; see {log_path}")
                time.sleep(0.5)
        finally:
            stop_processes(procs)
    result = {"variant": variant, "seed": seed, "steps_to_-200": steps, "wall_s": round(time.monotonic() - t0, 1)}
    print(f"  {variant:<14} seed {seed}: {steps if steps is not None else f'> {max_steps}'} env steps "
          f"({result['wall_s']} s)", flush=True)
    return result


def run_row(tmp: Path, seeds: list[int], max_steps: int, variants: list[str] | None = None) -> dict[str, Any]:
    names = variants or list(VARIANTS)
    # seed by seed, the variants in turn: load from other processes falls on all of them alike
    runs = [run_one(tmp, seed, variant, max_steps) for seed in seeds for variant in names]
    row: dict[str, Any] = {"row": "weights", "env": "Pendulum-v1", "threshold": THRESHOLD, "max_steps": max_steps,
                           "seeds": seeds, "runs": runs, "variants": names}
    row.update(median_steps(runs, names, max_steps))
    return row


def report(row: dict[str, Any]) -> None:
    print(f"{row['env']}: env steps to a mean training return >= {row['threshold']:g} (last {WINDOW} episodes), "
          f"three processes, seeds {row['seeds']}")
    for variant in row["variants"]:
        r = row[variant]
        print(f"  {variant:<14} median {r['median_steps']:>8,}   per seed {r['steps']}")
    if "float32" not in row["variants"]:
        return
    base = row["float32"]["median_steps"]
    for variant in row["variants"]:
        if variant != "float32":
            ratio = row[variant]["median_steps"] / base
            print(f"  {variant} / float32: {ratio:.2f}x the env steps (target <= {TARGET}x): "
                  f"{'met' if ratio <= TARGET else 'NOT met'}")
