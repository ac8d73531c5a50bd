"""The learning rows: each a config over the shared base, its variants, its judge and its target.

* **pendulum**: Pendulum-v1 through the three processes against the same SAC in one process
  (``netrl.local``), the same config (256x256 SAC, batch 256, update-to-data ratio 1, training from
  1,000 samples); env steps and wall time to a mean training return >= -200. Targets: the pipeline
  within 10,000 env steps and 1.5x the single process's wall time.
* **cartpole**: CartPole-v1 with netrl's double DQN through the three processes beside SB3's DQN
  with RL Zoo's hyperparameters, to 20 greedy episodes averaging >= 475, evaluated every 2,000 env
  steps (netrl's counted by its worker's episodes log, which may trail by the episode under way).
  netrl takes RL Zoo's values where the two share a knob: learning rate 2.3e-3, batch 64, buffer
  100,000, learning starts 1,000, gamma 0.99, net [256, 256], final epsilon 0.04 reached after
  8,000 env steps. SB3 trains 128 gradient steps every 256 env steps (an update-to-data ratio of
  0.5), which netrl's trainer spreads evenly; SB3 copies its target every 10 env steps but only
  between bursts, which is a copy every 128 gradient steps. SB3's ratio counts the env steps past
  learning_starts, netrl's all of them: on its first 1,000 samples netrl trains 500 steps at once
  (SB3 128), and it stays 384 gradient steps ahead. Targets: within 100,000 env steps and 1.5x
  SB3's.
* **ppo-cartpole**, **ppo-pendulum**: netrl's PPO with version-synced collection from 2 workers x
  8 envs (counted by the server), beside SB3's PPO with RL Zoo's hyperparameters; both use SB3's
  separate tanh MLPs of [64, 64]. CartPole-v1: 256 env steps per batch (SB3 8 x 32, netrl 16 x 16),
  minibatch 256, 20 epochs, gamma 0.98, lambda 0.8, learning rate and clip range falling linearly
  from 1e-3 and 0.2 over 100,000 env steps; to 20 deterministic episodes >= 475, evaluated every
  2,048 env steps; target within 1.3x SB3's. Pendulum-v1: 4,096 per batch (SB3 4 x 1,024, netrl
  16 x 256), minibatch 64, 10 epochs, gamma 0.9, lambda 0.95, learning rate 1e-3; to 10 episodes
  >= -250 every 4,096 env steps, no target (RL Zoo's SB3 uses gSDE, which netrl's PPO has not).
* **nstep**: SAC with 3-step returns and prioritized replay (alpha 0.6, beta 0.4 annealed to 1 over
  10,000 training steps) beside plain SAC, the pendulum row's config, one process each (the network
  changes nothing the memory or the agent do, and two cores cannot race six processes fairly).
* **weights**: the pendulum row through the three processes (weights travel only over the
  network) with ``network.weight_format`` float32, float16 and int8, and with
  ``env.normalize_obs``; target: each within 1.2x the env steps of float32.
* **pomdp**: Pendulum-v1 without its angular velocity (``env.hide_obs``), the recurrent SAC (a
  64-unit encoder, a GRU of 64, sequences of 16 with 4 of burn-in, batches of 32) beside the MLP
  SAC, one training step per two env steps from 2,000 samples, packets of 200 rows (a sequence
  stops at a packet boundary); to a mean training return >= -300; target: the recurrent SAC's
  median within 50,000 env steps.
* **torchrl-sac**: TorchRL's SAC script (examples/torchrl_sac.py) through the three processes
  against the same script on TorchRL's own Collector and ReplayBuffer: torchrl_sac.py says how.
* **drone-pomdp**, **image-nstep-per**: the drone and image pipelines by env steps (issue 44's
  learning claims): replay_rows.py says what each runs.
* **vector**: the pendulum row with one worker of ``worker.num_envs`` 8 against one of a single
  env, judged on the worker's policy every 500 env steps (counted by the server): 8 envs end 8
  episodes together every 1,600 env steps, each under that stretch's policies, so training returns
  would lag by up to 1,400 steps more than with one env. Target: within 1.3x the env steps of one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.learning.learners import Local, Processes
from benchmarks.learning.loop import Judge, Learner, Variant
from benchmarks.learning.sb3 import DQN, PPO
from netrl.config.load import config_from_dict, config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port
from netrl.net.keys import keygen

Changes = dict[str, dict[str, Any]]  # config section -> keys changed


@dataclasses.dataclass(frozen=True)
class LearningRow:
    what: str
    judge: Judge
    variants: dict[str, Variant]  # run in this order on each seed
    max_steps: int
    reference: str | None = None  # the variant the others are compared with
    seeds: tuple[int, ...] = (1, 2, 3)
    judged: tuple[str, ...] = ()  # the variants the target applies to
    target_ratio: float | None = None  # at most this many times the reference's figure
    target_steps: int | None = None  # the median gets there within this many env steps
    all_reached: bool = False  # every run of a judged variant must get there
    compare: str = "steps"  # the figure the ratio target compares: steps or wall_s
    # per variant, the config keys it sets over the base (printed, and kept with the figures)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a learning row's command-line options change (the family's Settings, in short)."""

    num_envs: int = 8
    vectorization: str = "sync"
    start_training: int | None = None  # None: each row's own
    eval_every: int | None = None  # None: each row's judge's own
    eval_episodes: int | None = None


def config(folder: Path, seed: int, *changes: Changes) -> Config:
    """The base every learning row shares (CURVE keys in the run's folder, free ports, one worker
    named bench, no test episodes, wandb off), with ``changes`` applied in order."""
    data = config_to_dict(Config())
    keygen(folder / "keys")
    data.update(run_name="bench", weights_folder=str(folder), seed=seed,
                keys_dir=str(folder / "keys"))
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"]["status_port"] = free_port()
    data["worker"].update(test_episode_interval=0, worker_id="bench")
    data["wandb"]["mode"] = "disabled"
    for change in changes:
        for section, keys in change.items():
            data[section].update(keys)
    return config_from_dict(data)


PENDULUM: Changes = {
    "server": {"min_samples_per_server_packet": 100},
    "worker": {"min_samples_per_worker_packet": 20},
    "trainer": {"epochs": 1000, "rounds": 1, "steps": 500, "update_model_interval": 20,
                "update_buffer_interval": 20, "start_training": 1000, "worker_lead": 100,
                "max_training_steps_per_env_step": 1.0},
}
CARTPOLE: Changes = {
    "env": {"id": "CartPole-v1"},
    "worker": {"min_samples_per_worker_packet": 20},
    "trainer": {**PENDULUM["trainer"], "max_training_steps_per_env_step": 0.5},
    "memory": {"memory_size": 100_000, "batch_size": 64},
    "agent": {"gamma": 0.99, "hidden_sizes": [256, 256], "dqn": {
        "lr": 2.3e-3, "target_update_interval": 128, "exploration_initial_eps": 1.0,
        "exploration_final_eps": 0.04, "exploration_steps": 3500}},
}
DQN_ZOO = {"learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000,
           "learning_starts": 1000, "gamma": 0.99, "target_update_interval": 10, "train_freq": 256,
           "gradient_steps": 128, "exploration_final_eps": 0.04,
           "policy_kwargs": {"net_arch": [256, 256]}}
PPO_WORKERS = ("bench-1", "bench-2")
PPO_ROWS: dict[str, dict[str, Any]] = {  # the row's netrl config and SB3's RL Zoo values
    "ppo-cartpole": {
        "env": "CartPole-v1", "threshold": 475.0, "episodes": 20, "every": 2048,
        "max_steps": 100_000, "target": 1.3,
        "zoo": {"n_envs": 8, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98,
                "n_epochs": 20, "ent_coef": 0.0, "learning_rate": ("lin", 1e-3),
                "clip_range": ("lin", 0.2), "n_timesteps": 100_000},
        "trainer": {"frames_per_batch": 256, "rollout_fragment_length": 16},
        "agent": {"gamma": 0.98, "ppo": {"gae_lambda": 0.8, "lr": 1e-3, "epochs": 20,
                                         "minibatch_size": 256, "clip_range": 0.2, "ent_coef": 0.0,
                                         "anneal_frames": 100_000}},
    },
    "ppo-pendulum": {
        "env": "Pendulum-v1", "threshold": -250.0, "episodes": 10, "every": 4096,
        "max_steps": 200_000, "target": None,
        "zoo": {"n_envs": 4, "n_steps": 1024, "batch_size": 64, "gae_lambda": 0.95, "gamma": 0.9,
                "n_epochs": 10, "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2,
                "use_sde": True, "sde_sample_freq": 4, "n_timesteps": 100_000},
        "trainer": {"frames_per_batch": 4096, "rollout_fragment_length": 256},
        "agent": {"gamma": 0.9, "ppo": {"gae_lambda": 0.95, "lr": 1e-3, "epochs": 10,
                                        "minibatch_size": 64, "clip_range": 0.2, "ent_coef": 0.0,
                                        "anneal_frames": None}},
    },
}
POMDP: Changes = {
    "server": {"min_samples_per_server_packet": 100},
    "env": {"hide_obs": [2]},
    "worker": {"min_samples_per_worker_packet": 200, "max_packet_delay_s": 10.0},
    "trainer": {**PENDULUM["trainer"], "start_training": 2000, "worker_lead": 200,
                "max_training_steps_per_env_step": 0.5},
}
RECURRENT: Changes = {"agent": {"recurrent": "gru", "hidden_sizes": [64, 64]},
                      "memory": {"sequence_length": 16, "burn_in": 4, "batch_size": 32}}


def processes(*changes: Changes, workers: tuple[str, ...] = ("bench",),
              count: str = "episodes") -> Variant:
    """A variant run by netrl's three processes from the base config with ``changes``."""
    def make(seed: int, folder: Path, max_steps: int) -> Learner:
        return Processes(config(folder, seed, *changes), folder, workers,
                         "server" if count == "server" else "episodes")
    return make


def local(*changes: Changes) -> Variant:
    """A variant run by netrl in one process (netrl.local) from the base config with ``changes``."""
    def make(seed: int, folder: Path, max_steps: int) -> Learner:
        return Local(config(folder, seed, *changes), seed)
    return make


def sb3(kind: type[DQN] | type[PPO], env_id: str, zoo: dict[str, Any]) -> Variant:
    def make(seed: int, folder: Path, max_steps: int) -> Learner:
        return kind(env_id, seed, max_steps, zoo)
    return make


def _ppo(name: str, small: Changes) -> LearningRow:
    row = PPO_ROWS[name]
    changes: Changes = {
        "env": {"id": row["env"]}, "worker": {"num_envs": 8, "worker_id": PPO_WORKERS[0]},
        "trainer": {"epochs": 1_000_000, "collection": "sync", "batch_mode": "truncate_episodes",
                    **row["trainer"]},
        "agent": {"algorithm": "ppo", "hidden_sizes": [64, 64], **row["agent"]}}
    judge = Judge(row["threshold"], row["env"], row["every"], row["episodes"])
    return LearningRow(
        f"{row['env']}, PPO, 2 workers x 8 envs, sync collection, against SB3's PPO", judge,
        {"netrl": processes(changes, small, workers=PPO_WORKERS, count="server"),
         "sb3": sb3(PPO, row["env"], row["zoo"])},
        row["max_steps"], "sb3", judged=("netrl",) if row["target"] else (),
        target_ratio=row["target"], all_reached=row["target"] is not None)


def rows(o: Shape) -> dict[str, Callable[[], LearningRow]]:
    """Every learning row, shaped by the family's options (the drone and image pipelines' rows
    by env steps: replay_rows.py)."""
    from benchmarks.learning.replay_rows import pipeline_rows  # (they build on this module)
    from benchmarks.learning.torchrl_sac import torchrl_sac_row

    small: Changes = ({} if o.start_training is None
                      else {"trainer": {"start_training": o.start_training}})
    vector: Changes = {"worker": {"num_envs": o.num_envs, "vectorization": o.vectorization}}
    weights: dict[str, Changes] = {"float32": {},
                                   "float16": {"network": {"weight_format": "float16"}},
                                   "int8": {"network": {"weight_format": "int8"}},
                                   "normalize_obs": {"env": {"normalize_obs": True}}}
    return {
        "pendulum": lambda: LearningRow(
            "Pendulum-v1, SAC, three processes against one", Judge(-200.0),
            {"pipeline": processes(PENDULUM, small), "single": local(PENDULUM, small)}, 15_000,
            "single", seeds=(1,), judged=("pipeline",), target_ratio=1.5, target_steps=10_000,
            compare="wall_s"),
        "cartpole": lambda: LearningRow(
            "CartPole-v1, double DQN, three processes, against SB3's DQN",
            Judge(475.0, "CartPole-v1", 2000, 20),
            {"netrl": processes(CARTPOLE, small), "sb3": sb3(DQN, "CartPole-v1", DQN_ZOO)},
            100_000, "sb3", judged=("netrl",), target_ratio=1.5, target_steps=100_000,
            all_reached=True),
        "ppo-cartpole": lambda: _ppo("ppo-cartpole", small),
        "ppo-pendulum": lambda: _ppo("ppo-pendulum", small),
        "nstep": lambda: LearningRow(
            "Pendulum-v1, SAC with 3-step returns and prioritized replay against plain SAC, "
            "one process each", Judge(-200.0),
            {"sac": local(PENDULUM, small),
             "sac_3step_prioritized": local(PENDULUM, small, {"memory": {
                 "n_step": 3, "prioritized": True, "priority_beta_steps": 10_000}})}, 15_000, "sac"),
        "weights": lambda: LearningRow(
            "Pendulum-v1, SAC, three processes, compact weights and normalised observations "
            "against float32", Judge(-200.0),
            {name: processes(PENDULUM, small, change) for name, change in weights.items()},
            15_000, "float32", judged=("float16", "int8", "normalize_obs"), target_ratio=1.2),
        "pomdp": lambda: LearningRow(
            "Pendulum-v1 without its angular velocity, recurrent SAC beside the MLP SAC, three "
            "processes", Judge(-300.0),
            {"recurrent": processes(POMDP, RECURRENT, small), "mlp": processes(POMDP, small)},
            50_000, judged=("recurrent",), target_steps=50_000),
        "vector": lambda: LearningRow(
            f"Pendulum-v1, SAC, one worker of {o.num_envs} envs against one of 1, three processes",
            Judge(-200.0, "Pendulum-v1", 500, 10),
            {"envs1": processes(PENDULUM, small, count="server"),
             f"envs{o.num_envs}": processes(PENDULUM, vector, small, count="server")},
            30_000, "envs1", judged=(f"envs{o.num_envs}",), target_ratio=1.3),
        "torchrl-sac": lambda: torchrl_sac_row(o.start_training),
        "drone-pomdp": lambda: pipeline_rows(small)["drone-pomdp"],
        "image-nstep-per": lambda: pipeline_rows(small)["image-nstep-per"],
    }


def shaped(row: LearningRow, o: Shape) -> LearningRow:
    """``row`` with its judge's evaluations as the options say (smoke runs evaluate sooner)."""
    judge = row.judge
    if judge.every is not None and o.eval_every is not None:
        judge = dataclasses.replace(judge, every=o.eval_every)
    if judge.every is not None and o.eval_episodes is not None:
        judge = dataclasses.replace(judge, episodes=o.eval_episodes)
    return dataclasses.replace(row, judge=judge)
