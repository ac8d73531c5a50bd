"""Collection throughput: env steps/s of one worker running 1, 4 and 16 envs, beside 16 one-env worker processes.

Every row runs the three roles as processes (``python -m netrl --server/--trainer/--worker``) on this machine, with
the config's env (default CartPole-v1, the gym pipeline's MLP actor), pacing off (``worker.throttle`` false: the
workers step as fast as they can) and CURVE on. The figure is the env steps the real server accepted per second
from all workers together (its ``--status`` counter), measured over ``--seconds`` once every worker has delivered
samples and ``--warmup`` more seconds have passed. The trainer receives, logs and stores every sample; by default it
does not train (``trainer.start_training`` is set beyond the run), so that the figure is the workers' rate and not
their share of the cores left by SAC's updates; ``--train`` lets it train.

Rows: ``worker.num_envs`` = 1, 4, 16 in one worker process (``worker.vectorization``: sync by default), and 16 worker
processes of one env each. Each row is measured ``--repeat`` times, the rows in turn; medians are reported.
Targets (issue 31): 16 envs in one worker >= 5x the steps/s of one env, and >= the steps/s of 16 one-env processes.

The last line of output is one JSON object: {"rows": [...], "targets": {...}}.

Usage: .venv/bin/python scripts/bench_throughput.py [--envs 1,4,16] [--processes 16] [--seconds 10] [--repeat 1]
       [--env CartPole-v1] [--vectorization sync] [--train] [--security curve]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("WANDB_MODE", "disabled")

from netrl.config.load import config_from_dict, config_to_dict
from netrl.config.sections import Config, WorkerConfig
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.monitor.status import query_status
from netrl.net.keys import keygen

VECTOR_KEYS = ("num_envs", "vectorization")  # worker.* keys of issue 31's vector envs


def bench_config(tmp: Path, env_id: str, num_envs: int, vectorization: str, train: bool, security: str) -> Config:
    data = config_to_dict(Config())
    keygen(tmp / "keys")
    data.update(run_name="throughput", weights_folder=str(tmp), seed=1, keys_dir=str(tmp / "keys"),
                security=security, status_interval_s=0)
    data["env"].update(id=env_id)
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"]["status_port"] = free_port()
    data["worker"].update(test_episode_interval=0, throttle=False)
    if num_envs != 1 or "num_envs" in WorkerConfig.__dataclass_fields__:
        missing = [k for k in VECTOR_KEYS if k not in WorkerConfig.__dataclass_fields__]
        if missing:
            raise SystemExit(f"this netrl has no worker.{', worker.'.join(missing)} (issue 31's vector envs): "
                             "run --envs 1 only, or merge the branch that adds them")
        data["worker"].update(num_envs=num_envs, vectorization=vectorization)
    data["trainer"].update(epochs=1000, rounds=1, steps=1000)
    if not train:  # the trainer stores every sample and never trains: the figure is the workers'
        data["trainer"].update(start_training=2**40)
    data["wandb"]["mode"] = "disabled"
    return config_from_dict(data)


def accepted(port: int) -> tuple[float, int, list[dict[str, Any]]]:
    """(time, env steps the server has accepted from all workers, the workers' entries) from its status port."""
    snap = query_status(port, timeout_s=5.0)
    return time.monotonic(), int(snap["stats"]["samples_in"]), list(snap["workers"])


def run_row(tmp: Path, name: str, env_id: str, num_envs: int, processes: int, args: argparse.Namespace) -> float:
    """Env steps/s the server accepts from ``processes`` worker processes of ``num_envs`` envs each."""
    folder = tmp / name
    cfg = bench_config(folder, env_id, num_envs, args.vectorization, args.train, args.security)
    path = write_config(cfg, folder / "config.json")
    logs = (folder / "roles.log").open("wb")
    server = spawn_role("server", path, stdout=logs, log_level="WARNING")
    procs: list[subprocess.Popen[bytes]] = [spawn_role("trainer", path, stdout=logs, log_level="WARNING")]
    procs += [spawn_role("worker", path, "--worker-id", f"w{i:02d}", stdout=logs, log_level="WARNING")
              for i in range(processes)]
    port = cfg.server.status_port
    try:
        deadline = time.monotonic() + args.start_timeout
        while True:  # every worker connected and delivering (16 processes importing torch take a while)
            if any(p.poll() is not None for p in [server, *procs]):
                raise SystemExit(f"a process of row {name!r} exited early; see {folder / 'roles.log'}")
            try:
                _, _, workers = accepted(port)
            except Exception:  # the server is not listening yet
                workers = []
            if len(workers) == processes and all(w["samples"] > 0 for w in workers):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"row {name!r}: {len(workers)} of {processes} workers delivering after "
                                 f"{args.start_timeout} s; see {folder / 'roles.log'}")
            time.sleep(0.5)
        time.sleep(args.warmup)
        t0, n0, _ = accepted(port)
        time.sleep(args.seconds)
        t1, n1, _ = accepted(port)
        return (n1 - n0) / (t1 - t0)
    finally:
        stop_processes(procs, then=[server])
        logs.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1", help="Gymnasium id run by the gym pipeline")
    parser.add_argument("--envs", default="1,4,16", help="worker.num_envs of the one-worker rows")
    parser.add_argument("--processes", type=int, default=16, help="one-env worker processes of the last row (0: none)")
    parser.add_argument("--vectorization", choices=("sync", "async"), default="sync")
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window per row")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds after every worker delivers, before it")
    parser.add_argument("--start-timeout", type=float, default=240.0)
    parser.add_argument("--repeat", type=int, default=1, help="measurements per row, in turns; medians reported")
    parser.add_argument("--train", action="store_true", help="let the trainer train (it competes for the cores)")
    parser.add_argument("--security", choices=("curve", "none"), default="curve")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    envs = [int(n) for n in args.envs.split(",") if n]
    if any(n < 1 for n in envs) or args.processes < 0 or args.repeat < 1:
        parser.error("--envs must be integers >= 1, --processes >= 0 and --repeat >= 1")
    rows = [(f"1 worker, {n} env{'s' if n > 1 else ''}", n, 1) for n in envs]
    if args.processes:
        rows.append((f"{args.processes} worker processes, 1 env each", 1, args.processes))
    measured: dict[str, list[float]] = {name: [] for name, _, _ in rows}
    with tempfile.TemporaryDirectory(prefix="netrl-throughput-") as d:
        for r in range(args.repeat):
            for i, (name, num_envs, processes) in enumerate(rows):
                rate = run_row(Path(d), f"r{r}-{i}", args.env, num_envs, processes, args)
                measured[name].append(rate)
                print(f"{name}: {rate:,.0f} env steps/s", flush=True)
    results = [{"row": name, "num_envs": n, "processes": p, "steps_s": statistics.median(measured[name]),
                "runs": measured[name]} for name, n, p in rows]
    by = {(r["num_envs"], r["processes"]): r["steps_s"] for r in results}
    targets: dict[str, Any] = {}
    if (16, 1) in by and (1, 1) in by:
        targets["16_envs_over_1_env"] = round(by[16, 1] / by[1, 1], 2)
    if (16, 1) in by and (1, args.processes) in by and args.processes == 16:
        targets["16_envs_over_16_processes"] = round(by[16, 1] / by[1, 16], 2)
    print(f"\n{args.env}, pacing off, vectorization {args.vectorization}, {os.cpu_count()} cores, "
          f"trainer {'training' if args.train else 'storing only'}, {args.repeat} run(s) per row (median)")
    print("| row | env steps/s | vs 1 env |\n|---|---|---|")
    base = by.get((1, 1))
    for r in results:
        ratio = f"{r['steps_s'] / base:.2f}x" if base else ""
        print(f"| {r['row']} | {r['steps_s']:,.0f} | {ratio} |")
    if "16_envs_over_1_env" in targets:
        ok = targets["16_envs_over_1_env"] >= 5
        print(f"16 envs / 1 env: {targets['16_envs_over_1_env']:.2f}x (target >= 5x): {'met' if ok else 'NOT met'}")
    if "16_envs_over_16_processes" in targets:
        ok = targets["16_envs_over_16_processes"] >= 1
        print(f"16 envs / 16 processes: {targets['16_envs_over_16_processes']:.2f}x (target >= 1x): "
              f"{'met' if ok else 'NOT met'}")
    out = {"env": args.env, "vectorization": args.vectorization, "train": args.train, "rows": results,
           "targets": targets}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
