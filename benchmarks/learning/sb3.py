"""The PPO rows of scripts/bench_learning.py (issue 33): netrl's PPO through the three processes, with version-synced
collection from 2 workers x 8 envs, beside Stable-Baselines3's PPO with RL Zoo's hyperparameters, in the same run.

Rows (``--row ppo-cartpole``, ``--row ppo-pendulum``):

* CartPole-v1: a mean return >= 475 over 20 deterministic episodes; target: netrl's median env steps within 1.3x
  SB3's. RL Zoo: 8 envs x n_steps 32 (256 env steps per batch), minibatch 256, 20 epochs, gamma 0.98, lambda 0.8,
  learning rate lin_0.001 and clip range lin_0.2 over 100,000 steps, no entropy bonus. netrl collects the same 256
  env steps per batch as 16 envs x 16 steps (``trainer.frames_per_batch`` 256, ``rollout_fragment_length`` 16), and
  anneals both over the same 100,000 env steps (``agent.ppo_anneal_frames``).
* Pendulum-v1: the env steps until a mean return >= -250 over 10 deterministic episodes, reported beside SB3's (no
  target). RL Zoo: 4 envs x n_steps 1024 (4,096 per batch), minibatch 64, 10 epochs, gamma 0.9, lambda 0.95, learning
  rate 1e-3, clip range 0.2, and gSDE (``use_sde``, ``sde_sample_freq`` 4), which netrl's PPO does not have: its
  Gaussian has a state-independent log std, SB3's default without gSDE. netrl: 16 envs x 256 steps = 4,096.

Both use SB3's policy network, separate tanh MLPs of [64, 64] for the policy and the value, and are judged alike: every
``eval_every`` env steps, the newest policy plays the row's deterministic episodes on seeds 1000.. of a separate env.
SB3 is evaluated by a callback at the first step past each multiple of ``eval_every``. netrl is evaluated from the
weights its first worker last received (its policy file), when the server has accepted ``eval_every`` more env steps
from both workers together (its status port). In the sync collection a worker receives version v+1 as soon as batch v
is trained, so the policy evaluated is the trainer's newest.

Runs only with the sync collection (trainer.collection) and the extra actor outputs of issue 33 in place.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch

from benchmarks.common import evaluate, server_steps
from netrl.config.load import config_from_dict, config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.net.keys import keygen
from netrl.pipelines.make import make_pipeline
from netrl.storage.weight_files import read_weights_file

WORKERS = ("bench-1", "bench-2")
NUM_ENVS = 8  # per worker

ROWS: dict[str, dict[str, Any]] = {
    "ppo-cartpole": {
        "env": "CartPole-v1", "threshold": 475.0, "episodes": 20, "eval_every": 2048, "max_steps": 100_000,
        "target": 1.3,
        "zoo": {"n_envs": 8, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
                "ent_coef": 0.0, "learning_rate": ("lin", 1e-3), "clip_range": ("lin", 0.2), "n_timesteps": 100_000},
        "trainer": {"frames_per_batch": 256, "rollout_fragment_length": 16},
        "agent": {"gamma": 0.98, "gae_lambda": 0.8, "lr_ppo": 1e-3, "ppo_epochs": 20, "minibatch_size": 256,
                  "clip_range": 0.2, "ent_coef": 0.0, "ppo_anneal_frames": 100_000},
    },
    "ppo-pendulum": {
        "env": "Pendulum-v1", "threshold": -250.0, "episodes": 10, "eval_every": 4096, "max_steps": 200_000,
        "target": None,
        "zoo": {"n_envs": 4, "n_steps": 1024, "batch_size": 64, "gae_lambda": 0.95, "gamma": 0.9, "n_epochs": 10,
                "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2, "use_sde": True, "sde_sample_freq": 4,
                "n_timesteps": 100_000},
        "trainer": {"frames_per_batch": 4096, "rollout_fragment_length": 256},
        "agent": {"gamma": 0.9, "gae_lambda": 0.95, "lr_ppo": 1e-3, "ppo_epochs": 10, "minibatch_size": 64,
                  "clip_range": 0.2, "ent_coef": 0.0, "ppo_anneal_frames": None},
    },
}


def actor_act(actor: Any) -> Any:
    """One deterministic action of a PPOActor for one observation (``act`` returns actions and extras)."""
    def act(obs: Any) -> Any:
        actions, _ = actor.act(torch.as_tensor(np.asarray(obs))[None], test=True)
        return actions[0]
    return act


def bench_config(tmp: Path, seed: int, row: dict[str, Any]) -> Config:
    data = config_to_dict(Config())
    keygen(tmp / "keys")
    data.update(run_name="bench", weights_folder=str(tmp), seed=seed, keys_dir=str(tmp / "keys"))
    data["env"]["id"] = row["env"]
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"]["status_port"] = free_port()
    data["worker"].update(test_episode_interval=0, num_envs=NUM_ENVS, worker_id=WORKERS[0])
    data["trainer"].update(epochs=1_000_000, collection="sync", batch_mode="truncate_episodes", **row["trainer"])
    data["agent"].update(algorithm="ppo", hidden_sizes=[64, 64], **row["agent"])
    data["wandb"]["mode"] = "disabled"
    return config_from_dict(data)


def run_pipeline(tmp: Path, seed: int, row: dict[str, Any], max_steps: int) -> dict[str, Any] | None:
    """netrl's server, trainer and two workers as processes; None if they never reach the threshold."""
    cfg = bench_config(tmp, seed, row)
    path = write_config(cfg, tmp / "pipeline.json")
    policy = cfg.run_dir / f"worker_policy_{WORKERS[0]}.pt"
    env = gymnasium.make(row["env"])
    actor = make_pipeline(cfg).actor_module_cls(env.observation_space, env.action_space)
    log_path = tmp / "pipeline.log"
    logs = log_path.open("wb")
    t0 = time.time()
    server = spawn_role("server", path, stdout=logs)
    procs = [spawn_role("trainer", path, stdout=logs),
             *(spawn_role("worker", path, "--worker-id", w, stdout=logs, log_level="WARNING") for w in WORKERS)]
    next_eval = row["eval_every"]
    try:
        while True:
            if any(p.poll() is not None for p in [server, *procs]):
                raise RuntimeError(f"a pipeline process exited early; see {log_path}")
            steps = server_steps(cfg.server.status_port)
            if steps >= next_eval and policy.exists():
                state, _ = read_weights_file(policy)
                actor.load_state_dict(state)
                wall = time.time() - t0
                score = evaluate(actor_act(actor), env, row["episodes"])
                print(f"  netrl seed {seed}: {steps} env steps, deterministic mean {score:.1f}", flush=True)
                if score >= row["threshold"]:
                    return {"steps": steps, "wall_s": round(wall, 1)}
                next_eval = steps + row["eval_every"]
            if steps >= max_steps:
                problems = [line for line in log_path.read_text(errors="replace").splitlines()
                            if " W [" in line or " E [" in line]
                print(f"  netrl seed {seed}: not reached; the pipeline's last warnings and errors:",
                      *problems[-20:] or ["(none)"], sep="\n    ", flush=True)
                return None
            time.sleep(0.5)
    finally:
        stop_processes(procs, then=[server])
        env.close()


def run_sb3(seed: int, row: dict[str, Any], max_steps: int) -> dict[str, Any] | None:
    """Stable-Baselines3's PPO with RL Zoo's hyperparameters for the row's env, in this process."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    zoo = dict(row["zoo"])
    n_envs, n_timesteps = zoo.pop("n_envs"), zoo.pop("n_timesteps")
    for key in ("learning_rate", "clip_range"):  # RL Zoo's lin_X: X times the fraction of n_timesteps left
        if isinstance(zoo[key], tuple):
            start = zoo[key][1]
            zoo[key] = lambda remaining, start=start: remaining * start
    env = gymnasium.make(row["env"])
    t0 = time.time()
    result: dict[str, Any] = {}
    next_eval = row["eval_every"]

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:
            nonlocal next_eval
            if self.num_timesteps < next_eval:
                return self.num_timesteps < max_steps
            next_eval = self.num_timesteps + row["eval_every"]
            wall = time.time() - t0
            score = evaluate(lambda o: self.model.predict(o, deterministic=True)[0], env, row["episodes"])
            print(f"  SB3 seed {seed}: {self.num_timesteps} env steps, deterministic mean {score:.1f}", flush=True)
            if score >= row["threshold"]:
                result.update(steps=self.num_timesteps, wall_s=round(wall, 1))
                return False
            return self.num_timesteps < max_steps

    model = PPO("MlpPolicy", make_vec_env(row["env"], n_envs=n_envs, seed=seed), seed=seed, verbose=0, **zoo)
    # learn() over RL Zoo's n_timesteps, so that its linear schedules are RL Zoo's; the callback stops it sooner
    model.learn(max(n_timesteps, max_steps), callback=Evaluate())
    env.close()
    return result or None


def run_row(name: str, tmp: Path, seeds: list[int], max_steps: int | None) -> dict[str, Any]:
    """netrl and SB3 on each seed, one after the other (a 2-core machine); medians over the seeds (a run that never
    reached the threshold counts as max_steps)."""
    row = ROWS[name]
    limit = max_steps or row["max_steps"]
    torch.set_num_threads(1)
    runs: dict[str, list[Any]] = {"netrl": [], "sb3": []}
    for seed in seeds:
        runs["netrl"].append(run_pipeline(tmp / f"seed{seed}", seed, row, limit))
        runs["sb3"].append(run_sb3(seed, row, limit))
    medians = {k: float(np.median([r["steps"] if r else limit for r in rs])) for k, rs in runs.items()}
    ratio = medians["netrl"] / medians["sb3"]
    met = None if row["target"] is None else bool(ratio <= row["target"] and all(runs["netrl"]))
    return {"row": name, "env": row["env"], "threshold": row["threshold"], "seeds": seeds, "max_steps": limit,
            "runs": runs, "median_steps": medians, "ratio": round(ratio, 2), "target": row["target"], "met": met}


def report(result: dict[str, Any]) -> None:
    title = f"{result['env']}, PPO, deterministic mean >= {result['threshold']:g}"
    print(f"{title:<52} " + " ".join(f"seed {s:>3}" for s in result["seeds"]) + "   median")
    for name in ("netrl", "sb3"):
        cells = " ".join(f"{(r['steps'] if r else '-')!s:>8}" for r in result["runs"][name])
        label = "netrl, 2 workers x 8 envs" if name == "netrl" else "SB3, RL Zoo hyperparameters"
        print(f"{'  ' + label + ' (env steps)':<52} {cells} {result['median_steps'][name]:>8.0f}")
    line = f"netrl/SB3 median env steps: {result['ratio']:.2f}x"
    if result["target"] is not None:
        line += f" (target <= {result['target']}x): {'met' if result['met'] else 'NOT met'}"
    print(line)
