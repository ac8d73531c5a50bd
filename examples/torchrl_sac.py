"""TorchRL's SAC on Pendulum-v1, trained through netrl's three processes (server, trainer, worker).

The script is TorchRL's own (its sota-implementations/sac is the model): the actor is a
``ProbabilisticActor`` with a ``TanhNormal``, two Q-value nets sit behind a ``SACLoss``, a
``SoftUpdate`` moves the target nets, and each loss term has its own Adam. netrl only carries it:
``TorchRLAgent`` trains the loss on netrl's batches (TensorDicts in TorchRL's layout), and the
workers act with the actor through ``TensorDictActor``. The same script also runs on TorchRL's own
``Collector`` and ``ReplayBuffer`` (``--collector torchrl``), which is what netrl is compared with
(``python -m benchmarks learning --rows torchrl-sac``)::

    python examples/torchrl_sac.py                        # server, trainer, worker: this machine
    python examples/torchrl_sac.py --frames 3000          # a shorter run (env steps)
    python examples/torchrl_sac.py --smoke                # 600 env steps: does it run?
    python examples/torchrl_sac.py --collector torchrl    # the same SAC on TorchRL's Collector

The run folder (``--run-dir``, default weights/torchrl-sac) gets the config the roles share
(config.json), the trainer's checkpoint and metrics.csv, and the worker's episodes CSV; a run that
was stopped resumes. To start the roles yourself, on one machine or several, write the config and
start each role from the folder that holds this script (netrl imports ``env.pipeline``'s module,
``torchrl_sac``, from the folder it starts in)::

    cd examples
    python torchrl_sac.py --config-only      # writes weights/torchrl-sac/config.json, runs nothing
    python -m netrl --server  --config weights/torchrl-sac/config.json
    python -m netrl --trainer --config weights/torchrl-sac/config.json
    python -m netrl --worker  --config weights/torchrl-sac/config.json

Needs the ``torchrl`` extra (``pip install -e ".[torchrl]"``).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import logging
import math
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium
import torch
from gymnasium.spaces import Box
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import Bounded, LazyTensorStorage, ReplayBuffer
from torchrl.envs import GymEnv
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import SACLoss, SoftUpdate

HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Hyper:
    """TorchRL's SAC hyperparameters (its sota config's), with Pendulum-v1's short warm-up."""

    env_id: str = "Pendulum-v1"
    hidden: tuple[int, ...] = (256, 256)
    lr: float = 3e-4  # every optimiser's (actor, critic, alpha)
    gamma: float = 0.99
    polyak: float = 0.995  # SoftUpdate's eps: target <- 0.995 target + 0.005 online
    alpha_init: float = 1.0
    batch_size: int = 256
    buffer_size: int = 1_000_000
    init_random_frames: int = 1000  # random actions, and no training, before this many env steps
    frames_per_batch: int = 20  # TorchRL: env steps per collected batch; netrl: per packet
    utd_ratio: float = 1.0  # gradient steps per env step


HP = Hyper()
SMOKE = dataclasses.replace(HP, batch_size=64, init_random_frames=200)


# -- the models, as TorchRL's SAC builds them ------------------------------------------------
# netrl builds them in every role from the env's Gymnasium spaces, hence the factories' arguments.
def make_actor(observation_space: gymnasium.Space, action_space: gymnasium.Space) -> nn.Module:
    assert isinstance(observation_space, Box) and isinstance(action_space, Box)  # SAC: vectors in, out
    low, high = torch.as_tensor(action_space.low), torch.as_tensor(action_space.high)
    action_spec = Bounded(low, high, low.shape)
    net = nn.Sequential(
        MLP(in_features=observation_space.shape[0], num_cells=list(HP.hidden),
            out_features=2 * action_spec.shape[-1], activation_class=nn.ReLU),
        # softplus(x + bias) keeps the scale positive and near 1 at initialisation
        NormalParamExtractor(scale_mapping="biased_softplus_1.0", scale_lb=0.1),
    )
    return ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], spec=action_spec, distribution_class=TanhNormal,
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high,
                             "tanh_loc": False},
        return_log_prob=False,
    )


def make_qvalue(observation_space: gymnasium.Space, action_space: gymnasium.Space) -> nn.Module:
    assert isinstance(observation_space, Box) and isinstance(action_space, Box)
    net = MLP(in_features=observation_space.shape[0] + action_space.shape[0],
              num_cells=list(HP.hidden), out_features=1, activation_class=nn.ReLU)
    return ValueOperator(net, in_keys=["action", "observation"])  # Q(s, a): a and s concatenated


def make_loss(observation_space: gymnasium.Space, action_space: gymnasium.Space,
              actor: nn.Module | None = None) -> SACLoss:
    actor = actor if actor is not None else make_actor(observation_space, action_space)
    loss = SACLoss(actor_network=actor, qvalue_network=make_qvalue(observation_space, action_space),
                   num_qvalue_nets=2,
                   loss_function="l2", delay_actor=False, delay_qvalue=True,
                   alpha_init=HP.alpha_init)  # target_entropy "auto": -dim(action)
    loss.make_value_estimator(gamma=HP.gamma)
    return loss


def make_optimizers(loss: SACLoss) -> dict[str, torch.optim.Optimizer]:
    """One Adam per loss term, each over its own parameters, as TorchRL's SAC has them."""
    return {
        "loss_actor": torch.optim.Adam(loss.actor_network_params.flatten_keys().values(), HP.lr),
        "loss_qvalue": torch.optim.Adam(loss.qvalue_network_params.flatten_keys().values(), HP.lr),
        "loss_alpha": torch.optim.Adam([loss.log_alpha], HP.lr),
    }


def make_updater(loss: SACLoss) -> SoftUpdate:
    return SoftUpdate(loss, eps=HP.polyak)


def update(loss: SACLoss, optimizers: dict[str, torch.optim.Optimizer], updater: SoftUpdate,
           batch: TensorDict) -> TensorDict:
    """One SAC step, as TorchRL's script takes it (netrl's TorchRLAgent takes the same)."""
    out: TensorDict = loss(batch)
    # over disjoint parameters, one backward of the sum gives each term its own gradient
    total = out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]
    for opt in optimizers.values():
        opt.zero_grad()
    total.backward()
    for opt in optimizers.values():
        opt.step()
    updater.step()
    return out.detach()


# -- through netrl's three processes --------------------------------------------------------------
def sac_pipeline(cfg: Any) -> Any:
    """What ``env.pipeline`` names: every role builds the same pipeline from the same config."""
    from netrl import GenericGymEnv, Pipeline, ReplayMemory, partial
    from netrl.interop.loss_agent import TorchRLAgent
    from netrl.interop.policies import TensorDictActor

    return Pipeline(
        env_cls=partial(GenericGymEnv, id=HP.env_id),
        # extra_keys=[]: the actor's "loc" and "scale" need not travel with each row
        actor_module_cls=partial(TensorDictActor, policy=make_actor, extra_keys=[]),
        memory_cls=ReplayMemory,  # memory.memory_size and memory.batch_size size it
        training_agent_cls=partial(TorchRLAgent, loss=make_loss, optimizer=make_optimizers,
                                   updater=make_updater, extra_keys=[]),
    )


def netrl_settings(hp: Hyper, pipeline: str) -> dict[str, dict[str, Any]]:
    """TorchRL's settings in netrl's config keys (section -> keys)."""
    return {
        "env": {"pipeline": pipeline},
        "memory": {"memory_size": hp.buffer_size, "batch_size": hp.batch_size},
        # the collector's init_random_frames: random actions, then the policy; the worker sends
        # its rows in packets of a collector's batch
        "worker": {"init_random_frames": hp.init_random_frames,
                   "min_samples_per_worker_packet": hp.frames_per_batch},
        # the trainer keeps to utd_ratio gradient steps per env step (over all of them, where
        # TorchRL counts those past init_random_frames), pulls new rows and publishes the policy
        # once per batch of frames
        "trainer": {"start_training": hp.init_random_frames,
                    "max_training_steps_per_env_step": hp.utd_ratio,
                    "update_buffer_interval": hp.frames_per_batch,
                    "update_model_interval": hp.frames_per_batch},
    }


def netrl_config(hp: Hyper, frames: int, run_dir: Path, seed: int) -> Any:
    """netrl's config for the run: its defaults, TorchRL's settings, a budget of ``frames``."""
    from netrl.config.load import config_from_dict, config_to_dict
    from netrl.config.sections import Config

    data = config_to_dict(Config())
    data.update(run_name=run_dir.name, weights_folder=str(run_dir.parent), seed=seed,
                keys_dir=str(run_dir.parent / "keys"))
    for section, keys in netrl_settings(hp, "torchrl_sac:sac_pipeline").items():
        data[section].update(keys)
    data["worker"].update(worker_id="sac", test_episode_interval=0)
    data["trainer"].update(total_frames=frames, rounds=1, steps=max(1, min(500, frames // 4)))
    data["wandb"]["mode"] = "disabled"
    return config_from_dict(data)


def run_netrl(cfg: Any) -> dict[str, Any]:
    """Server, trainer and worker as processes on this machine, until the trainer has trained
    on ``trainer.total_frames`` env steps; what the run did, from its files."""
    from netrl.launch import run_demo, write_config

    # the roles import this module by env.pipeline's name, from this folder
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE),
                                                             os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(HERE))
    run_dir = cfg.run_dir
    run_demo(cfg, str(write_config(cfg, run_dir / "config.json")), threading.Event())
    with (run_dir / "metrics.csv").open(newline="") as f:
        last = list(csv.DictReader(f))[-1]
    weights = json.loads((run_dir / "worker_policy_sac.pt.json").read_text())
    return {"collector": "netrl", "trained_steps": int(float(last["trained_steps"])),
            "frames": int(float(last["samples"])), "worker_weights_version": weights["version"],
            **{k: float(last[k]) for k in ("loss_actor", "loss_qvalue", "loss_alpha", "alpha")},
            "return_mean": float(last["return_mean"]) if last.get("return_mean") else None}


# -- the same script on TorchRL's own Collector and ReplayBuffer --------------------------------
OnBatch = Callable[[int, nn.Module, dict[str, float]], bool]  # frames, actor, metrics -> stop?


def run_torchrl(hp: Hyper, frames: int, seed: int, on_batch: OnBatch | None = None
                ) -> dict[str, Any]:
    """TorchRL's loop: collect a batch, extend the buffer, then ``utd_ratio`` gradient steps per
    frame once ``init_random_frames`` are in. ``on_batch`` sees each batch's end (True: stop)."""
    torch.manual_seed(seed)
    env = GymEnv(hp.env_id)
    env.set_seed(seed)
    spaces = gymnasium.make(hp.env_id)
    actor = make_actor(spaces.observation_space, spaces.action_space)
    loss = make_loss(spaces.observation_space, spaces.action_space, actor)
    optimizers, updater = make_optimizers(loss), make_updater(loss)
    collector = Collector(env, actor, frames_per_batch=hp.frames_per_batch,
                          total_frames=frames, init_random_frames=hp.init_random_frames,
                          auto_register_policy_transforms=False)
    buffer = ReplayBuffer(storage=LazyTensorStorage(hp.buffer_size), batch_size=hp.batch_size)
    collected, steps, metrics = 0, 0, {}
    for data in collector:
        buffer.extend(data.reshape(-1))
        collected += data.numel()
        if collected >= hp.init_random_frames:
            for _ in range(int(data.numel() * hp.utd_ratio)):
                out = update(loss, optimizers, updater, buffer.sample())
                steps += 1
            metrics = {k: float(v) for k, v in out.items() if v.numel() == 1}
        if on_batch is not None and on_batch(collected, actor, metrics):
            break
    collector.shutdown()
    return {"collector": "torchrl", "frames": collected, "trained_steps": steps, **metrics}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--collector", choices=("netrl", "torchrl"), default="netrl",
                   help="netrl's three processes (default) or TorchRL's own Collector")
    p.add_argument("--frames", type=int, default=20_000, help="env steps to train on (20,000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--run-dir", type=Path, default=Path("weights/torchrl-sac"),
                   help="netrl's run folder (weights/torchrl-sac)")
    p.add_argument("--smoke", action="store_true",
                   help="a short run: 600 env steps, training from 200 on batches of 64")
    p.add_argument("--config-only", action="store_true",
                   help="write the run folder's config.json for the roles, and run nothing")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname).1s %(message)s")
    hp, frames = (SMOKE, 600) if a.smoke else (HP, a.frames)
    if frames <= hp.init_random_frames:
        p.error(f"--frames {frames} must exceed init_random_frames ({hp.init_random_frames})")
    if a.collector == "torchrl" and not a.config_only:
        result = run_torchrl(hp, frames, a.seed)
    else:
        cfg = netrl_config(hp, frames, a.run_dir, a.seed)
        if a.config_only:
            from netrl.launch import write_config
            from netrl.net.keys import keygen

            keygen(cfg.keys_dir)  # the roles' CURVE keys (the one-command run makes its own)
            path = write_config(cfg, a.run_dir / "config.json")
            print(f"wrote {path}: from {HERE}, python -m netrl --server (then --trainer, "
                  f"--worker) --config {path}")
            return
        result = run_netrl(cfg)
    finite = all(math.isfinite(v) for k, v in result.items() if k.startswith("loss_"))
    print(json.dumps({**result, "losses_finite": finite}), flush=True)


if __name__ == "__main__":
    main()
