"""Learning runs of the drone and image pipelines through the three processes (server, trainer,
worker): the learning family's rows ``drone`` and ``image``.

For a pipeline this writes a config, starts the roles on localhost with free ports (CURVE on),
trains for ``--minutes`` (or until the trainer's epochs are done), prints the learning curve from
the worker's episode log, and then evaluates the trainer's final policy against uniformly random
actions on the same fresh episodes (reset seeds 1000..), in this process:

* drone: rtgym's dummy RC drone at 50 ms steps. Reported: mean distance to the target over an
  episode, the distance at its end, the share of episodes that came within 0.05 of the target and
  the steps until they first did.
* image: ImageReach from 4x64x64 frames. Reported: return, success rate (reached the goal),
  episode length.
"""

from __future__ import annotations

import csv
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.results import Row
from netrl.config.load import config_from_dict, config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.net.keys import keygen
from netrl.pipelines.make import make_pipeline
from netrl.protocol.weights import load_weights
from netrl.storage.weight_files import read_weights_file

# Trainer settings per pipeline: the drone's samples come at 20 Hz, so it trains several steps per
# sample.
SETTINGS: dict[str, dict[str, Any]] = {
    "drone": {"trainer": {"start_training": 400, "max_training_steps_per_env_step": 4.0,
                          "steps": 400, "update_model_interval": 100, "update_buffer_interval": 20},
              "memory": {"memory_size": 100_000, "batch_size": 256},
              "worker": {"test_episode_interval": 5, "min_samples_per_worker_packet": 20}},
    "image": {"trainer": {"start_training": 1000, "max_training_steps_per_env_step": 1.0,
                          "steps": 500, "update_model_interval": 50, "update_buffer_interval": 20,
                          "worker_lead": 100},
              "memory": {"memory_size": 100_000, "batch_size": 64},
              "worker": {"test_episode_interval": 10, "min_samples_per_worker_packet": 50}},
}
FIGURES = {  # per pipeline: (key of an evaluation, the figure, its unit)
    "drone": [("mean_distance", "mean distance to the target over an episode", ""),
              ("reached_0.05", "episodes within 0.05 of the target", "share")],
    "image": [("success", "episodes that reach the goal", "share"),
              ("return", "mean return of an episode", "")],
}


def learn_config(pipeline: str, out: Path, seed: int) -> Config:
    keygen(out / "keys")  # CURVE, as by default
    data = config_to_dict(Config())
    data.update(run_name=pipeline, weights_folder=str(out), seed=seed, keys_dir=str(out / "keys"))
    data["env"]["pipeline"] = pipeline
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"]["status_port"] = free_port()  # never the default port of a running server
    data["worker"].update(worker_id="learn", **SETTINGS[pipeline]["worker"])
    data["trainer"].update(epochs=100_000, rounds=1, **SETTINGS[pipeline]["trainer"])
    data["memory"].update(SETTINGS[pipeline]["memory"])
    data["wandb"]["mode"] = "disabled"
    return config_from_dict(data)


def read_episodes(path: Path) -> list[dict[str, float]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def curve(episodes: list[dict[str, float]], t0: float, block: int) -> list[dict[str, Any]]:
    """Mean training return (and per-step return) per block of training episodes."""
    train = [e for e in episodes if e["test"] == 0]
    out = []
    for i in range(0, len(train) - block + 1, block):
        part = train[i:i + block]
        out.append({"episodes": i + block, "env_steps": int(part[-1]["env_steps"]),
                    "minutes": round((part[-1]["time"] - t0) / 60, 1),
                    "return": round(float(np.mean([e["return"] for e in part])), 2),
                    "return_per_step": round(float(np.mean([e["return"] / e["length"]
                                                            for e in part])), 4)})
    return out


def evaluate(pipeline: str, cfg: Config, policy: Path | None, episodes: int) -> dict[str, Any]:
    """Deterministic episodes of the saved policy (or uniformly random actions when ``policy`` is
    None)."""
    pipe = make_pipeline(cfg)
    env = pipe.env_cls()
    actor = pipe.actor_module_cls(env.observation_space, env.action_space)
    if policy is not None:
        state, _ = read_weights_file(policy)
        load_weights(actor, {k: v.numpy() for k, v in state.items()})
    actor.eval()
    rng = np.random.default_rng(123)
    results: list[dict[str, float]] = []
    try:
        for ep in range(episodes):
            obs, _ = env.reset(seed=1000 + ep)
            rewards: list[float] = []
            done, terminated = False, False
            while not done:
                space = env.action_space
                act = (actor.act_(obs, test=True) if policy is not None
                       else rng.uniform(space.low, space.high).astype(np.float32))
                obs, rew, terminated, truncated, _ = env.step(act)
                rewards.append(float(rew))
                done = terminated or truncated
            dist = -np.asarray(rewards)
            within = np.flatnonzero(dist < 0.05)
            results.append({"return": float(np.sum(rewards)), "length": len(rewards),
                            "mean_distance": float(dist.mean()), "final_distance": float(dist[-1]),
                            "steps_to_0.05": float(within[0] + 1) if within.size else float("nan"),
                            "success": float(terminated)})
    finally:
        env.close()
    summary: dict[str, Any] = {}
    for key in results[0]:
        values = [r[key] for r in results if not np.isnan(r[key])]
        # None: no episode got there
        summary[key] = round(float(np.mean(values)), 4) if values else None
    summary["episodes"] = episodes
    if pipeline == "drone":
        reached = [not np.isnan(r["steps_to_0.05"]) for r in results]
        summary["reached_0.05"] = round(float(np.mean(reached)), 3)
    return summary


def run(pipeline: str, minutes: float, out: Path, seed: int,
        eval_episodes: int = 20) -> dict[str, Any]:
    cfg = learn_config(pipeline, out, seed)
    config_path = write_config(cfg, out / "config.json")
    logs = {role: (out / f"{role}.log").open("wb") for role in ("server", "trainer", "worker")}
    t0 = time.time()
    server = spawn_role("server", config_path, stdout=logs["server"])
    time.sleep(1.0)
    trainer = spawn_role("trainer", config_path, stdout=logs["trainer"])
    worker = spawn_role("worker", config_path, stdout=logs["worker"], log_level="WARNING")
    episodes_csv = cfg.run_dir / "episodes_learn.csv"
    try:
        while time.time() - t0 < minutes * 60 and trainer.poll() is None:
            if server.poll() is not None or worker.poll() is not None:
                raise RuntimeError(f"a role exited early; see the logs in {out}")
            time.sleep(5)
            eps = read_episodes(episodes_csv)
            train = [e for e in eps if e["test"] == 0][-10:]
            if train:
                print(f"{(time.time() - t0) / 60:5.1f} min  env steps "
                      f"{int(eps[-1]['env_steps']):6d}  last 10 returns "
                      f"{np.mean([e['return'] for e in train]):8.2f}", flush=True)
    finally:
        # the server last: it acknowledges the rest
        codes = stop_processes([worker, trainer], timeout=20, then=[server])
        for f in logs.values():
            f.close()
    eps = read_episodes(episodes_csv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trained = evaluate(pipeline, cfg, cfg.run_dir / "policy.pt", eval_episodes)
        random_policy = evaluate(pipeline, cfg, None, eval_episodes)
    return {"pipeline": pipeline, "minutes": round((time.time() - t0) / 60, 1), "exit_codes": codes,
            "env_steps": int(eps[-1]["env_steps"]) if eps else 0,
            "curve": curve(eps, t0, block=20 if pipeline == "drone" else 50),
            "trained_policy": trained, "random_policy": random_policy}


def rows(pipeline: str, minutes: float, seed: int, eval_episodes: int,
         out: Path | None) -> list[Row]:
    """The learning family's rows for ``pipeline``: the trained policy against random actions."""
    folder = out if out is not None else Path(tempfile.mkdtemp(prefix=f"netrl-learn-{pipeline}-"))
    result = run(pipeline, minutes, folder, seed, eval_episodes)
    for point in result["curve"]:
        print(f"  {point}", flush=True)
    print(f"  trained: {result['trained_policy']}", flush=True)
    print(f"  random:  {result['random_policy']}", flush=True)
    trained, random_policy = result["trained_policy"], result["random_policy"]
    params = {"pipeline": pipeline, "minutes": minutes, "seed": seed,
              "eval_episodes": eval_episodes, "folder": str(folder)}
    out_rows = []
    for key, figure, unit in FIGURES[pipeline]:
        value, base = trained.get(key), random_policy.get(key)
        out_rows.append(Row("learning", f"{pipeline}: trained for {minutes:g} minutes, "
                            f"{result['env_steps']:,} env steps", figure, value, unit, base,
                            "random actions", None, params=params, detail=result))
    return out_rows
