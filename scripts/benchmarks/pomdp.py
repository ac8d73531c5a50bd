"""The partially observed row of scripts/bench_learning.py (issue 32): Pendulum-v1 without its angular velocity
(``env.hide_obs: [2]``), the recurrent SAC (``agent.recurrent``, sequences of ``memory.sequence_length``) through the
three processes beside the MLP SAC with the same env-step budget, median of the seeds.

Each run is judged on its training episodes, as the default row is: the env steps at which the mean return of the
last ``WINDOW`` episodes first reaches ``THRESHOLD`` (-300), within ``--max-steps`` (50,000). The target: the recurrent
SAC's median gets there; the MLP SAC, which sees one angle at a time and cannot know the velocity, is shown beside
it. A run that never gets there counts as the budget in the median.

Sizes are chosen for a 2-core machine (a seed of each in about 10 minutes): the recurrent SAC has a 64-unit encoder,
a GRU of 64 and a 64-unit head, with critics of 128x128 on (features, action); batches of 32 sequences of 16 steps,
4 of them burn-in; one training step per two env steps (``max_training_steps_per_env_step`` 0.5, both agents).
Workers send packets of 200 rows (a Pendulum episode), since a sequence stops at a packet boundary.
"""

from __future__ import annotations

import csv
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import crossing, env_steps, three_roles
from netrl.config.load import config_from_dict, config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port, stop_processes, write_config
from netrl.net.keys import keygen

THRESHOLD = -300.0
WINDOW = 10
BUDGET = 50_000
AGENTS = ("recurrent", "mlp")


def bench_config(tmp: Path, seed: int, agent: str) -> Config:
    data = config_to_dict(Config())
    keygen(tmp / "keys")
    data.update(run_name="bench", weights_folder=str(tmp), seed=seed, keys_dir=str(tmp / "keys"))
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"].update(status_port=free_port(), min_samples_per_server_packet=100)
    data["env"]["hide_obs"] = [2]
    data["worker"].update(test_episode_interval=0, min_samples_per_worker_packet=200, max_packet_delay_s=10.0,
                          worker_id="bench")
    data["trainer"].update(epochs=1000, rounds=1, steps=500, update_model_interval=20, update_buffer_interval=20,
                           start_training=2000, worker_lead=200, max_training_steps_per_env_step=0.5)
    if agent == "recurrent":
        data["agent"].update(recurrent="gru", hidden_sizes=[64, 64])
        data["memory"].update(sequence_length=16, burn_in=4, batch_size=32)
    data["wandb"]["mode"] = "disabled"
    return config_from_dict(data)


def best_mean(episodes_csv: Path) -> float | None:
    """The best mean of WINDOW consecutive training returns (how close a run that never crossed came)."""
    if not episodes_csv.exists():
        return None
    with episodes_csv.open(newline="") as f:
        returns = [float(row["return"]) for row in csv.DictReader(f)]
    means = [sum(returns[i - WINDOW:i]) / WINDOW for i in range(WINDOW, len(returns) + 1)]
    return round(max(means), 1) if means else None


def run_one(tmp: Path, seed: int, agent: str, max_steps: int) -> dict[str, Any]:
    name = f"{agent}-seed{seed}"
    cfg = bench_config(tmp / name, seed, agent)
    path = write_config(cfg, tmp / f"{name}.json")
    episodes = cfg.run_dir / "episodes_bench.csv"
    log_path = tmp / f"{name}.log"
    t0 = time.time()
    with log_path.open("wb") as logs:
        procs = three_roles(path, logs)
        try:
            while True:
                found = crossing(episodes, THRESHOLD, WINDOW)
                result = None if found is None else {"steps": found[0], "wall_s": round(found[1] - t0, 1)}
                steps = env_steps(episodes)
                if result or steps >= max_steps:
                    break
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a pipeline process exited early; see {log_path}:\n"
                                       f"{log_path.read_text()[-3000:]}")
                time.sleep(1.0)
        finally:
            stop_processes(procs)
    out = {"agent": agent, "seed": seed, "steps_to_-300": result["steps"] if result else None,
           "wall_s": result["wall_s"] if result else round(time.time() - t0, 1), "env_steps_run": steps,
           "best_mean_return": best_mean(episodes)}
    print(f"  {agent} SAC, seed {seed}: {out}", flush=True)
    return out


def run_row(tmp: Path, seeds: list[int], max_steps: int | None) -> dict[str, Any]:
    budget = max_steps or BUDGET
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in AGENTS}
    for seed in seeds:
        for agent in AGENTS:
            runs[agent].append(run_one(tmp, seed, agent, budget))
    medians = {a: statistics.median([r["steps_to_-300"] or budget for r in rs]) for a, rs in runs.items()}
    met = sum(r["steps_to_-300"] is not None for r in runs["recurrent"]) * 2 > len(seeds)
    return {"row": "pomdp", "seeds": seeds, "budget": budget, "runs": runs, "median_steps": medians, "met": met}


def report(row: dict[str, Any]) -> None:
    budget = row["budget"]
    print(f"Pendulum-v1 without its angular velocity: env steps to a mean return >= {THRESHOLD:g} (last {WINDOW} "
          f"episodes), budget {budget:,}")
    print(f"{'agent':<16} {'median':>8} {'per seed':>28} {'best mean return per seed':>30}")
    for agent, rs in row["runs"].items():
        per_seed = ", ".join(str(r["steps_to_-300"]) if r["steps_to_-300"] else f">{budget}" for r in rs)
        best = ", ".join(str(r["best_mean_return"]) for r in rs)
        label = "recurrent SAC" if agent == "recurrent" else "MLP SAC"
        print(f"{label:<16} {row['median_steps'][agent]:>8,.0f} {per_seed:>28} {best:>30}")
    print(f"target (recurrent SAC's median within {budget:,} env steps): {'met' if row['met'] else 'NOT met'}")
