"""The discrete row of scripts/bench_learning.py: CartPole-v1 with netrl's double DQN through the three processes,
beside Stable-Baselines3's DQN with RL Zoo's hyperparameters for CartPole-v1, in the same run.

Both are judged alike: every ``EVAL_EVERY`` env steps, the current policy plays ``EVAL_EPISODES`` greedy episodes
on seeds 1000.. of a separate env; a run is done when their mean return reaches ``THRESHOLD``. SB3 is evaluated by a
callback at exact multiples of ``EVAL_EVERY``. The pipeline is evaluated from the weights its worker last received
(the worker's policy file), when its episodes log first shows ``EVAL_EVERY`` more env steps; the steps reported are
that log's, which may trail the worker by the episode it is in (at most 500 steps).

The netrl config is RL Zoo's where the two have the same knob: learning rate 2.3e-3, batch 64, buffer 100,000,
learning starts 1,000, gamma 0.99, net [256, 256], final epsilon 0.04 reached after 8,000 env steps. SB3 trains 128
gradient steps every 256 env steps (an update-to-data ratio of 0.5), which netrl's trainer spreads evenly
(``max_training_steps_per_env_step`` 0.5); SB3 copies its target every 10 env steps but only between bursts, which
is a copy every 128 gradient steps (``target_update_interval`` 128). RL Zoo's exploration_fraction 0.16 is of its
50,000 steps; SB3 runs 100,000 here with 0.08, the same schedule.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch

from benchmarks.common import env_steps, evaluate, three_roles
from netrl.agents.dqn import DQNActor
from netrl.config.load import config_from_dict, config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port, stop_processes, write_config
from netrl.net.keys import keygen
from netrl.storage.weight_files import read_weights_file

THRESHOLD = 475.0
EVAL_EVERY = 2000
EVAL_EPISODES = 20
ENV_ID = "CartPole-v1"
ZOO = {"learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000, "learning_starts": 1000, "gamma": 0.99,
       "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128, "exploration_final_eps": 0.04,
       "policy_kwargs": {"net_arch": [256, 256]}}


def bench_config(tmp: Path, seed: int) -> Config:
    data = config_to_dict(Config())
    keygen(tmp / "keys")
    data.update(run_name="bench", weights_folder=str(tmp), seed=seed, keys_dir=str(tmp / "keys"))
    data["env"]["id"] = ENV_ID
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"]["status_port"] = free_port()
    data["worker"].update(test_episode_interval=0, min_samples_per_worker_packet=20, worker_id="bench")
    data["trainer"].update(epochs=1000, rounds=1, steps=500, update_model_interval=20, update_buffer_interval=20,
                           start_training=1000, worker_lead=100, max_training_steps_per_env_step=0.5)
    data["memory"].update(memory_size=100_000, batch_size=64)
    data["agent"].update(gamma=0.99, lr_critic=2.3e-3, hidden_sizes=[256, 256], target_update_interval=128,
                         exploration_initial_eps=1.0, exploration_final_eps=0.04, exploration_steps=3500)
    data["wandb"]["mode"] = "disabled"
    return config_from_dict(data)


def run_pipeline(tmp: Path, seed: int, max_steps: int) -> dict[str, Any] | None:
    """netrl's server, trainer and worker as processes; None if they never reach THRESHOLD within max_steps."""
    cfg = bench_config(tmp / "pipeline", seed)
    path = write_config(cfg, tmp / "pipeline.json")
    episodes, policy = cfg.run_dir / "episodes_bench.csv", cfg.run_dir / "worker_policy_bench.pt"
    env = gymnasium.make(ENV_ID)
    actor = DQNActor(env.observation_space, env.action_space, tuple(cfg.agent.hidden_sizes))
    logs = (tmp / "pipeline.log").open("wb")
    t0 = time.time()
    procs = three_roles(path, logs)
    next_eval = EVAL_EVERY
    try:
        while True:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a pipeline process exited early; see {tmp / 'pipeline.log'}")
            steps = env_steps(episodes)
            if steps >= next_eval and policy.exists():
                state, _ = read_weights_file(policy)
                actor.load_state_dict(state)
                wall = time.time() - t0
                score = evaluate(lambda o: int(actor.act_(o, test=True)), env, EVAL_EPISODES)
                print(f"  netrl seed {seed}: {steps} env steps, greedy mean {score:.1f}", flush=True)
                if score >= THRESHOLD:
                    return {"steps": steps, "wall_s": round(wall, 1)}
                next_eval = steps + EVAL_EVERY
            if steps >= max_steps:
                problems = [line for line in (tmp / "pipeline.log").read_text(errors="replace").splitlines()
                            if " W [" in line or " E [" in line]
                print(f"  netrl seed {seed}: not reached; the pipeline's last warnings and errors:",
                      *problems[-20:] or ["(none)"], sep="\n    ", flush=True)
                return None
            time.sleep(0.5)
    finally:
        stop_processes(procs)
        env.close()


def run_sb3(seed: int, max_steps: int) -> dict[str, Any] | None:
    """Stable-Baselines3's DQN with RL Zoo's CartPole-v1 hyperparameters, in this process."""
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    env = gymnasium.make(ENV_ID)
    t0 = time.time()
    result: dict[str, Any] = {}

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % EVAL_EVERY:
                return True
            wall = time.time() - t0
            score = evaluate(lambda o: int(self.model.predict(o, deterministic=True)[0]), env, EVAL_EPISODES)
            print(f"  SB3 seed {seed}: {self.num_timesteps} env steps, greedy mean {score:.1f}", flush=True)
            if score >= THRESHOLD:
                result.update(steps=self.num_timesteps, wall_s=round(wall, 1))
                return False
            return True

    model = DQN("MlpPolicy", ENV_ID, exploration_fraction=0.16 * 50_000 / max_steps, seed=seed, verbose=0,
                **ZOO)
    model.learn(max_steps, callback=Evaluate())
    env.close()
    return result or None


def run_row(tmp: Path, seeds: list[int], max_steps: int) -> dict[str, Any]:
    """Both on each seed, one after the other (a 2-core machine); medians over the seeds (a run that never reached
    the threshold counts as max_steps)."""
    torch.set_num_threads(1)
    runs: dict[str, list[Any]] = {"netrl": [], "sb3": []}
    for seed in seeds:
        runs["netrl"].append(run_pipeline(tmp / f"seed{seed}", seed, max_steps))
        runs["sb3"].append(run_sb3(seed, max_steps))
    medians = {name: float(np.median([r["steps"] if r else max_steps for r in rs])) for name, rs in runs.items()}
    ratio = medians["netrl"] / medians["sb3"]
    ok = medians["netrl"] <= 100_000 and ratio <= 1.5 and all(runs["netrl"])
    return {"seeds": seeds, "runs": runs, "median_steps": medians, "ratio": round(ratio, 2), "met": ok}


def report(row: dict[str, Any]) -> None:
    print(f"{'CartPole-v1, mean of 20 greedy episodes >= 475':<48} " + " ".join(f"seed {s:>3}" for s in row["seeds"])
          + "   median")
    for name in ("netrl", "sb3"):
        cells = " ".join(f"{(r['steps'] if r else '-')!s:>8}" for r in row["runs"][name])
        print(f"{'  ' + name + ' (env steps)':<48} {cells} {row['median_steps'][name]:>8.0f}")
    print(f"netrl/SB3 median env steps: {row['ratio']:.2f}x (target <= 1.5x, netrl <= 100,000 steps): "
          f"{'met' if row['met'] else 'NOT met'}")
