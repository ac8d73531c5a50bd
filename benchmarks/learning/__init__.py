"""Learning speed: the three-process pipeline against the same SAC in one process, in the same run.

Both runs use the same config (Pendulum-v1, 256x256 SAC, batch 256, update-to-data ratio 1, no test episodes)
and the same worker, memory, agent and training loop; the single-process run replaces the network with
netrl.local. For each run this prints the env steps and the wall time until the mean return of the last 10
episodes first reaches -200. Target on a 2-core machine: the pipeline gets there within 10,000 env steps and
within 1.5x the single-process wall time.

The last line of output is one JSON object:
{"pipeline": {"steps_to_-200": N, "wall_s": S}, "single": {"steps_to_-200": N, "wall_s": S}}

``--row cartpole`` runs the discrete row instead (scripts/benchmarks/cartpole.py): CartPole-v1 with netrl's double
DQN through the three processes beside Stable-Baselines3's DQN (RL Zoo hyperparameters), median of 3 seeds. Target:
a mean return >= 475 over 20 greedy episodes within 100,000 env steps and within 1.5x SB3's env steps. It needs
``pip install -e .[bench]`` (stable-baselines3).

``--row ppo-cartpole`` and ``--row ppo-pendulum`` (``--row ppo``: both, one after the other) run the PPO rows of issue
33 (scripts/benchmarks/ppo.py): netrl's PPO with version-synced collection from 2 workers x 8 envs, three processes,
beside SB3's PPO with RL Zoo's hyperparameters, median of 3 seeds. Targets: CartPole-v1 to a deterministic mean
return >= 475 within 1.3x SB3's env steps; Pendulum-v1's env steps to -250 are reported beside SB3's.

``--row nstep`` runs issue 32's row (scripts/benchmarks/nstep.py): SAC with 3-step returns and prioritized replay
beside plain SAC on Pendulum-v1, one process each, median of 3 seeds of the env steps to a mean training return of
-200.
``--row weights`` runs issue 34's row (scripts/benchmarks/weights.py): Pendulum-v1 through the three processes with
``network.weight_format`` float32, float16 and int8, and with ``env.normalize_obs`` on, median of 3 seeds. Targets:
float16, int8 and normalize_obs each within 1.2x the env steps of float32.
``--row pomdp`` runs the partially observed row of issue 32 (scripts/benchmarks/pomdp.py): Pendulum-v1 without its
angular velocity, the recurrent SAC through the three processes beside the MLP SAC, median of 3 seeds. Target: the
recurrent SAC reaches a mean return of -300 within 50,000 env steps.

Usage: .venv/bin/python scripts/bench_learning.py [--max-steps 15000] [--seed 1]
       .venv/bin/python scripts/bench_learning.py --row cartpole [--seeds 1 2 3]
       .venv/bin/python scripts/bench_learning.py --row ppo [--seeds 1 2 3] [--max-steps N]
       .venv/bin/python scripts/bench_learning.py --row nstep [--seeds 1 2 3] [--max-steps 15000]
       .venv/bin/python scripts/bench_learning.py --row pomdp [--seeds 1 2 3] [--max-steps 50000]
       .venv/bin/python scripts/bench_learning.py --row weights [--seeds 1 2 3] [--variants float32 int8]

``--vector`` runs another comparison instead (issue 31): Pendulum-v1 with one worker of ``worker.num_envs`` 8 envs
against one of a single env, three processes each, side by side for each of 3 seeds; each is judged on its policy
(every 500 env steps, the worker's newest policy plays 10 deterministic episodes; see run_pipeline_envs); target:
the median env steps to a mean return >= -200 of num_envs 8 within 1.3x those of num_envs 1.
       .venv/bin/python scripts/bench_learning.py --vector [--num-envs 8] [--seeds 1,2,3] [--max-steps 30000]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("WANDB_MODE", "disabled")

import torch
from benchmarks.common import crossing, env_steps, evaluate, pendulum_config, server_steps, three_roles

from netrl.config.load import config_from_dict, config_to_dict
from netrl.launch import stop_processes, write_config
from netrl.local import run_local
from netrl.pipelines.make import make_pipeline
from netrl.trainer.trainer import Trainer
from netrl.worker.worker import RolloutWorker

THRESHOLD = -200.0
WINDOW = 10


def first_crossing(episodes_csv: Path, t0: float) -> dict[str, Any] | None:
    """Env steps and wall time when the mean of the last WINDOW training returns first reached THRESHOLD."""
    found = crossing(episodes_csv, THRESHOLD, WINDOW)
    return None if found is None else {"steps_to_-200": found[0], "wall_s": round(found[1] - t0, 1)}


def run_pipeline(tmp: Path, seed: int, max_steps: int) -> dict[str, Any] | None:
    cfg = pendulum_config(tmp / "pipeline", seed)
    path = write_config(cfg, tmp / "pipeline.json")
    episodes = cfg.run_dir / "episodes_bench.csv"
    logs = (tmp / "pipeline.log").open("wb")
    t0 = time.time()
    procs = three_roles(path, logs)
    try:
        while True:
            result = first_crossing(episodes, t0)
            if result or env_steps(episodes) >= max_steps:
                return result
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a pipeline process exited early; see {tmp / 'pipeline.log'}")
            time.sleep(0.5)
    finally:
        stop_processes(procs)


def run_single(tmp: Path, seed: int, max_steps: int) -> dict[str, Any] | None:
    cfg = pendulum_config(tmp / "single", seed)
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(seed)
    pipeline = make_pipeline(cfg)
    episodes = cfg.run_dir / "episodes_bench.csv"
    stop = threading.Event()
    t0 = time.time()
    worker = RolloutWorker.from_config(cfg, pipeline)
    worker.episode_log_level = logging.DEBUG
    training = Trainer.from_config(cfg, pipeline).training_cls()
    result: dict[str, Any] | None = None

    def on_round(_: dict[str, Any]) -> None:
        nonlocal result
        result = first_crossing(episodes, t0)
        if result or worker.produced >= max_steps:
            stop.set()

    run_local(training, worker, stop, on_round)
    return result


def main() -> int:
    if "--vector" in sys.argv[1:]:  # a benchmark of its own: see main_vector
        return main_vector()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=None,
                        help="give up after this many env steps (default: 15,000; --row cartpole and ppo-cartpole: "
                        "100,000; ppo-pendulum: 200,000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--row", choices=["pendulum", "cartpole", "ppo", "ppo-cartpole", "ppo-pendulum", "nstep",
                                          "pomdp", "weights"],
                        default="pendulum")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3],
                        help="--row cartpole, nstep, weights and the ppo rows: seeds to run")
    parser.add_argument("--variants", nargs="+", default=None,
                        help="--row weights: which of float32, float16, int8, normalize_obs (default: all)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.row.startswith("ppo"):
        from benchmarks.ppo import ROWS
        from benchmarks.ppo import report as report_ppo
        from benchmarks.ppo import run_row as run_ppo

        results = []
        for name in (ROWS if args.row == "ppo" else [args.row]):
            with tempfile.TemporaryDirectory(prefix="netrl-bench-ppo-") as d:
                results.append(run_ppo(name, Path(d), args.seeds, args.max_steps))
        for result in results:
            report_ppo(result)
        print(json.dumps({"ppo": results}))
        return 0
    if args.row == "nstep":
        from benchmarks.nstep import report as report_nstep
        from benchmarks.nstep import run_row as run_nstep

        with tempfile.TemporaryDirectory(prefix="netrl-bench-nstep-") as d:
            nstep = run_nstep(Path(d), args.seeds, args.max_steps or 15_000)
        report_nstep(nstep)
        print(json.dumps(nstep))
        return 0
    if args.row == "weights":
        from benchmarks.weights import report as report_weights
        from benchmarks.weights import run_row as run_weights

        with tempfile.TemporaryDirectory(prefix="netrl-bench-weights-") as d:
            row = run_weights(Path(d), args.seeds, args.max_steps or 15_000, args.variants)
        report_weights(row)
        print(json.dumps(row))
        return 0
    if args.row == "pomdp":
        from benchmarks.pomdp import report as report_pomdp
        from benchmarks.pomdp import run_row as run_pomdp

        with tempfile.TemporaryDirectory(prefix="netrl-bench-pomdp-") as d:
            row = run_pomdp(Path(d), args.seeds, args.max_steps)
        report_pomdp(row)
        print(json.dumps(row))
        return 0
    if args.row == "cartpole":
        from benchmarks.cartpole import report, run_row

        with tempfile.TemporaryDirectory(prefix="netrl-bench-") as d:
            row = run_row(Path(d), args.seeds, args.max_steps or 100_000)
        report(row)
        print(json.dumps(row))
        return 0
    with tempfile.TemporaryDirectory(prefix="netrl-bench-") as d:
        tmp = Path(d)
        max_steps = args.max_steps or 15_000
        pipeline = run_pipeline(tmp, args.seed, max_steps)
        single = run_single(tmp, args.seed, max_steps)
    print(f"{'run':<10} {'env steps to -200':>18} {'wall s':>8}")
    for name, r in (("pipeline", pipeline), ("single", single)):
        print(f"{name:<10} {r and r['steps_to_-200']!s:>18} {r and r['wall_s']!s:>8}")
    if pipeline and single:
        ratio = pipeline["wall_s"] / single["wall_s"]
        ok = pipeline["steps_to_-200"] <= 10_000 and ratio <= 1.5
        print(f"pipeline/single wall time: {ratio:.2f}x (target <= 1.5x, pipeline <= 10,000 steps): "
              f"{'met' if ok else 'NOT met'}")
    print(json.dumps({"pipeline": pipeline, "single": single}))
    return 0


# -- --vector: Pendulum-v1 with worker.num_envs 8 against num_envs 1 (issue 31) ------------------------------------

VECTOR_TARGET = 1.3  # num_envs 8 reaches -200 within this many times the env steps of num_envs 1 (median of seeds)


VECTOR_EVAL_EVERY = 500  # env steps between evaluations of the worker's newest policy
VECTOR_EVAL_EPISODES = 10


def run_pipeline_envs(tmp: Path, seed: int, max_steps: int, num_envs: int,
                      vectorization: str = "sync") -> dict[str, Any] | None:
    """The three-process pipeline as in run_pipeline, with one worker of ``num_envs`` envs (worker.num_envs).

    Judged on the policy, not on training episodes: with 8 envs, 8 episodes end together every 1,600 env steps, and
    each ran under the policies of those 1,600 steps, so a crossing of the training returns lags by up to 1,400 steps
    more than with one env. Every VECTOR_EVAL_EVERY env steps (the worker's episodes CSV counts all its envs) the
    worker's newest policy file plays VECTOR_EVAL_EPISODES deterministic episodes; the run is done when their mean
    reaches THRESHOLD. Env steps are counted by the server (its status port: the samples it accepted from the worker),
    since the CSV moves only when episodes end. The training-return crossing (first_crossing) is reported beside it."""
    import gymnasium

    from netrl.storage.weight_files import read_weights_file

    name = f"envs{num_envs}-seed{seed}"
    data = config_to_dict(pendulum_config(tmp / name, seed))
    if num_envs != 1:  # (a netrl without the key runs the num_envs = 1 row)
        data["worker"].update(num_envs=num_envs, vectorization=vectorization)
    cfg = config_from_dict(data)
    path = write_config(cfg, tmp / f"{name}.json")
    episodes, policy = cfg.run_dir / "episodes_bench.csv", cfg.run_dir / "worker_policy_bench.pt"
    env = gymnasium.make(cfg.env.id)
    actor = make_pipeline(cfg).actor_module_cls(env.observation_space, env.action_space)
    log_path = tmp / f"{name}.log"
    logs = log_path.open("wb")
    t0 = time.time()
    procs = three_roles(path, logs)
    next_eval = VECTOR_EVAL_EVERY
    try:
        while True:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a pipeline process exited early; see {log_path}")
            steps = server_steps(cfg.server.status_port)
            if steps >= next_eval and policy.exists():
                state, _ = read_weights_file(policy)
                actor.load_state_dict(state)
                wall = time.time() - t0
                score = evaluate(lambda o: actor.act_(o, test=True), env, VECTOR_EVAL_EPISODES)
                print(f"  num_envs {num_envs}, seed {seed}: {steps} env steps, policy's mean {score:.1f}", flush=True)
                if score >= THRESHOLD:
                    return {"steps_to_-200": steps, "wall_s": round(wall, 1),
                            "training_returns": first_crossing(episodes, t0)}
                next_eval = steps + VECTOR_EVAL_EVERY
            if steps >= max_steps:
                return None
            time.sleep(0.5)
    finally:
        stop_processes(procs)
        env.close()


def main_vector() -> int:
    """``--vector``: for each seed, num_envs 1 and num_envs N (8) side by side; medians of the env steps to -200."""
    parser = argparse.ArgumentParser(description="Pendulum-v1 to a mean return >= -200 with worker.num_envs N "
                                     "against num_envs 1, three processes each, median over seeds")
    parser.add_argument("--vector", action="store_true", required=True)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--vectorization", choices=("sync", "async"), default="sync")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--max-steps", type=int, default=30_000, help="give up after this many env steps")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    runs: dict[int, list[dict[str, Any] | None]] = {1: [], args.num_envs: []}
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)  # the evaluations: as the roles, one thread each
    with tempfile.TemporaryDirectory(prefix="netrl-bench-vector-") as d:
        for seed in seeds:
            for n in runs:
                result = run_pipeline_envs(Path(d), seed, args.max_steps, n, args.vectorization)
                runs[n].append(result)
                print(f"seed {seed}, num_envs {n}: {result}", flush=True)
    # a run that never got there counts as max_steps: the median stays honest about it
    medians = {n: statistics.median([r["steps_to_-200"] if r else args.max_steps for r in rs])
               for n, rs in runs.items()}
    ratio = medians[args.num_envs] / medians[1]
    print(f"{'num_envs':<10} {'median env steps to -200':>26} {'per seed':>30}")
    for n, rs in runs.items():
        per_seed = ", ".join(str(r["steps_to_-200"]) if r else f">{args.max_steps}" for r in rs)
        print(f"{n:<10} {medians[n]:>26,.0f} {per_seed:>30}")
    print(f"num_envs {args.num_envs} / num_envs 1: {ratio:.2f}x the env steps (target <= {VECTOR_TARGET}x): "
          f"{'met' if ratio <= VECTOR_TARGET else 'NOT met'}")
    print(json.dumps({"vector": {"num_envs": args.num_envs, "seeds": seeds,
                                 "runs": {str(n): rs for n, rs in runs.items()},
                                 "median_steps": {str(n): m for n, m in medians.items()}, "ratio": ratio}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
