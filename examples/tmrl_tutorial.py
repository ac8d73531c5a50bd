"""tmrl's tutorial, written for netrl: the dummy RC drone learns to reach a target, through three processes.

The pieces are the tutorial's: an rtgym interface for the drone, an rtgym config with a 4-action buffer, an
``ActorModule`` (SAC's squashed Gaussian MLP), a sample compressor that drops the action buffer, a list-based
memory that rebuilds it, and a SAC ``TrainingAgent``. What netrl asks differently is marked "netrl:" (the full
list is docs/tmrl.md). Run each role in its own terminal, from the same folder::

    python examples/tmrl_tutorial.py server
    python examples/tmrl_tutorial.py trainer
    python examples/tmrl_tutorial.py worker

or all three at once for 5 minutes, then the policy against random actions: examples/tmrl_tutorial_learn.py.

The run folder (``--run-dir``, default weights/tutorial) holds the trainer's checkpoint, policy.pt, metrics.csv
and the worker's episodes CSV; a trainer started again resumes from its checkpoint. Ctrl+C stops a role cleanly.
``TUTORIAL_SMOKE=1`` shrinks every setting so that the whole tutorial runs in seconds (tests/test_examples.py).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import signal
import sys
import threading
import warnings
from copy import deepcopy
from pathlib import Path
from typing import Any

import gymnasium.spaces as spaces
import numpy as np
import torch
import torch.nn.functional as F
from rtgym import DEFAULT_CONFIG_DICT, DummyRCDrone, RealTimeGymInterface

from netrl import RolloutWorker, Server, Trainer  # tmrl.networking
from netrl.actor import ActorModule
from netrl.envs import GenericGymEnv
from netrl.memory import MemoryDataloading
from netrl.nn import copy_shared, no_grad
from netrl.training import TrainingAgent, TrainingOffline
from netrl.util import cached_property, partial, prod

SMOKE = os.environ.get("TUTORIAL_SMOKE") == "1"
# rtgym's observations reuse the action buffer's arrays from step to step, which Gymnasium's checker warns about;
# netrl copies each observation into its packet, so nothing is overwritten
warnings.filterwarnings("ignore", message=".*share an object")

# === Environment ======================================================================================================


class DummyRCDroneInterface(RealTimeGymInterface):
    """The drone obeys velocity commands after a random delay; the observation is its position and the target."""

    def __init__(self) -> None:
        self.rc_drone: Any = None
        self.target = np.zeros(2, np.float32)
        self.rng = np.random.default_rng()

    def get_observation_space(self) -> spaces.Tuple:
        pos_space = spaces.Box(low=-1.0, high=1.0, shape=(1,), dtype=np.float32)
        tar_space = spaces.Box(low=-0.5, high=0.5, shape=(1,), dtype=np.float32)
        return spaces.Tuple((pos_space, pos_space, tar_space, tar_space))

    def get_action_space(self) -> spaces.Box:
        return spaces.Box(low=-2.0, high=2.0, shape=(2,), dtype=np.float32)

    def get_default_action(self) -> np.ndarray:
        return np.zeros(2, np.float32)

    def send_control(self, control: np.ndarray) -> None:
        self.rc_drone.send_control(float(control[0]), float(control[1]))

    def _observation(self) -> list[np.ndarray]:
        # netrl: observations must fit their spaces, so each is an array of shape (1,), not a number
        pos_x, pos_y = self.rc_drone.get_observation()
        return [np.array([pos_x], np.float32), np.array([pos_y], np.float32), self.target[:1].copy(),
                self.target[1:].copy()]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list, dict]:
        if self.rc_drone is None:
            self.rc_drone = DummyRCDrone()  # the drone keeps flying from one episode to the next
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.target[:] = self.rng.uniform(-0.5, 0.5, 2)
        return self._observation(), {}  # netrl: Gymnasium's reset returns (obs, info)

    def get_obs_rew_terminated_info(self) -> tuple[list, float, bool, dict]:
        obs = self._observation()
        rew = -float(np.hypot(obs[0][0] - self.target[0], obs[1][0] - self.target[1]))
        return obs, rew, rew > -0.01, {}

    def wait(self) -> None:
        self.send_control(self.get_default_action())


my_config = DEFAULT_CONFIG_DICT.copy()
my_config["interface"] = DummyRCDroneInterface
my_config["time_step_duration"] = 0.02 if SMOKE else 0.05
my_config["start_obs_capture"] = my_config["time_step_duration"]
my_config["time_step_timeout_factor"] = 1.0
my_config["ep_max_length"] = 20 if SMOKE else 100
my_config["act_buf_len"] = 4
my_config["reset_act_buf"] = False  # the buffer carries the last actions over a reset (see MyMemory.act_buf)
my_config["last_act_on_reset"] = False
my_config["benchmark"] = False

# netrl: the thread-safe rtgym env, as a worker has a network thread
env_cls = partial(GenericGymEnv, id="rtgym:real-time-gym-ts-v1", gym_kwargs={"config": my_config})

# === Actor (the worker's policy) ======================================================================================

LOG_STD_MAX = 2
LOG_STD_MIN = -20
HIDDEN_SIZES = (32, 32) if SMOKE else (256, 256)


def mlp(sizes: list[int], activation: type[torch.nn.Module], output_activation: type[torch.nn.Module]
        = torch.nn.Identity) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for j in range(len(sizes) - 1):
        act = activation if j < len(sizes) - 2 else output_activation
        layers += [torch.nn.Linear(sizes[j], sizes[j + 1]), act()]
    return torch.nn.Sequential(*layers)


class MyActorModule(ActorModule):
    """SAC's squashed Gaussian policy on the concatenated observation (after Spinning Up)."""

    def __init__(self, observation_space: spaces.Tuple, action_space: spaces.Box,
                 hidden_sizes: tuple[int, ...] = HIDDEN_SIZES, activation: type[torch.nn.Module] = torch.nn.ReLU):
        super().__init__(observation_space, action_space)
        dim_obs = sum(prod(space.shape) for space in observation_space)
        dim_act = action_space.shape[0]
        self.net = mlp([dim_obs, *hidden_sizes], activation, activation)
        self.mu_layer = torch.nn.Linear(hidden_sizes[-1], dim_act)
        self.log_std_layer = torch.nn.Linear(hidden_sizes[-1], dim_act)
        self.act_limit = float(action_space.high[0])

    def forward(self, obs: tuple[torch.Tensor, ...], test: bool = False,
                with_logprob: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        net_out = self.net(torch.cat(obs, -1))
        mu = self.mu_layer(net_out)
        log_std = torch.clamp(self.log_std_layer(net_out), LOG_STD_MIN, LOG_STD_MAX)
        pi_distribution = torch.distributions.Normal(mu, torch.exp(log_std))
        pi_action = mu if test else pi_distribution.rsample()
        logp_pi = None
        if with_logprob:
            logp_pi = pi_distribution.log_prob(pi_action).sum(-1)
            logp_pi -= (2 * (np.log(2) - pi_action - F.softplus(-2 * pi_action))).sum(-1)  # tanh's Jacobian
        return self.act_limit * torch.tanh(pi_action), logp_pi

    def act(self, obs: tuple[torch.Tensor, ...], test: bool = False) -> np.ndarray:
        with torch.no_grad():
            a, _ = self.forward(obs, test, False)
            return a.cpu().numpy()  # netrl: one action per observation of the batch, shape (B, 2); no squeeze()


actor_module_cls = partial(MyActorModule)

# === Sample compression (worker) and its memory (trainer) =============================================================


def my_sample_compressor(prev_act: Any, obs: Any, rew: float, terminated: bool, truncated: bool,
                         info: dict[str, Any]) -> tuple[Any, Any, float, bool, bool, dict[str, Any]]:
    """Drop the action buffer from observations before they travel: the memory rebuilds it from the actions.

    netrl: tmrl >= 0.5's six arguments, with ``terminated`` and ``truncated`` where the tutorial had ``done``."""
    return prev_act, obs[:4], rew, terminated, truncated, info


ACT, POS_X, POS_Y, TAR_X, TAR_Y, REW, TERMINATED, TRUNCATED, RESET = range(9)  # the columns of MyMemory.data


class MyMemory(MemoryDataloading):
    """The tutorial's list-based memory: one Python list per column, and ``get_transition`` rebuilds each
    observation's action buffer from the stored actions.

    netrl: ``buffer.memory`` lists each env step once and in order, and ``info["reset"]`` marks each episode's first
    observation (its action is a placeholder). Rebuilding is exact as long as every step of the worker reaches the
    memory, which is why the worker runs no test episodes (they are not sent).
    """

    def __init__(self, act_buf_len: int, device: str = "cpu", nb_steps: int = 1, obs_preprocessor: Any = None,
                 sample_preprocessor: Any = None, memory_size: int = 1_000_000, batch_size: int = 256,
                 dataset_path: str = "") -> None:
        self.act_buf_len = act_buf_len
        self.default_action = np.zeros(2, np.float32)  # the interface's get_default_action()
        super().__init__(device=device, nb_steps=nb_steps, obs_preprocessor=obs_preprocessor,
                         sample_preprocessor=sample_preprocessor, memory_size=memory_size, batch_size=batch_size,
                         dataset_path=dataset_path)

    def append_buffer(self, buffer: Any) -> None:
        if not self.data:
            self.data = [[] for _ in range(9)]
        for act, obs, rew, terminated, truncated, info in buffer.memory:
            row = (act, obs[0], obs[1], obs[2], obs[3], rew, terminated, truncated, info["reset"])
            for column, value in zip(self.data, row, strict=True):
                column.append(value)
        to_trim = len(self.data[ACT]) - self.memory_size
        if to_trim > 0:
            for column in self.data:
                del column[:to_trim]

    def __len__(self) -> int:
        if not self.data:
            return 0
        # a transition needs its previous observation's action buffer, which reaches up to 2L - 1 rows back
        return max(0, len(self.data[ACT]) - 2 * self.act_buf_len)

    def act_buf(self, row: int) -> list[np.ndarray]:
        """The action buffer of the observation in ``row``, as rtgym built it (reset_act_buf=False,
        last_act_on_reset=False): each step appends its action, and a reset replaces the last one by the default
        action, so walking back, a reset row gives the default action and skips the row before it."""
        actions: list[np.ndarray] = []
        while len(actions) < self.act_buf_len:
            if row < 0:  # before the memory's first row: a new env's buffer holds default actions
                actions.append(self.default_action)
            elif self.data[RESET][row]:
                actions.append(self.default_action)
                row -= 1  # the previous episode's last action, which reset() replaced
            else:
                actions.append(self.data[ACT][row])
            row -= 1
        return actions[::-1]

    def get_transition(self, item: int) -> tuple[Any, ...]:
        idx_now = item + 2 * self.act_buf_len  # the row of the new observation
        if self.data[RESET][idx_now]:  # a new episode's first observation ends no transition: take a neighbour
            idx_now = idx_now + 1 if idx_now + 1 < len(self.data[ACT]) else idx_now - 1
        idx_last = idx_now - 1  # the row of the previous observation
        d = self.data
        last_obs = (d[POS_X][idx_last], d[POS_Y][idx_last], d[TAR_X][idx_last], d[TAR_Y][idx_last],
                    *self.act_buf(idx_last))
        new_obs = (d[POS_X][idx_now], d[POS_Y][idx_now], d[TAR_X][idx_now], d[TAR_Y][idx_now],
                   *self.act_buf(idx_now))
        # netrl: seven values, terminated and truncated where the tutorial had done (info is not used by netrl)
        return (last_obs, d[ACT][idx_now], np.float32(d[REW][idx_now]), new_obs, d[TERMINATED][idx_now],
                d[TRUNCATED][idx_now], {})


memory_cls = partial(MyMemory, act_buf_len=my_config["act_buf_len"], memory_size=1_000_000,
                     batch_size=16 if SMOKE else 256)

# === Training agent (SAC) =============================================================================================


class MyCriticModule(torch.nn.Module):
    def __init__(self, observation_space: spaces.Tuple, action_space: spaces.Box,
                 hidden_sizes: tuple[int, ...] = HIDDEN_SIZES, activation: type[torch.nn.Module] = torch.nn.ReLU):
        super().__init__()
        obs_dim = sum(prod(space.shape) for space in observation_space)
        self.q = mlp([obs_dim + action_space.shape[0], *hidden_sizes, 1], activation)

    def forward(self, obs: tuple[torch.Tensor, ...], act: torch.Tensor) -> torch.Tensor:
        return torch.squeeze(self.q(torch.cat((*obs, act), -1)), -1)


class MyActorCriticModule(torch.nn.Module):
    def __init__(self, observation_space: spaces.Tuple, action_space: spaces.Box,
                 hidden_sizes: tuple[int, ...] = HIDDEN_SIZES, activation: type[torch.nn.Module] = torch.nn.ReLU):
        super().__init__()
        self.actor = MyActorModule(observation_space, action_space, hidden_sizes, activation)
        self.q1 = MyCriticModule(observation_space, action_space, hidden_sizes, activation)
        self.q2 = MyCriticModule(observation_space, action_space, hidden_sizes, activation)


class MyTrainingAgent(TrainingAgent):
    """SAC with twin critics and a learned entropy coefficient, as in the tutorial."""

    model_nograd = cached_property(lambda self: no_grad(copy_shared(self.model)))  # what the workers get

    def __init__(self, observation_space: Any = None, action_space: Any = None, device: str = "cpu",
                 model_cls: Any = MyActorCriticModule, gamma: float = 0.99, polyak: float = 0.995, alpha: float = 0.2,
                 lr_actor: float = 1e-3, lr_critic: float = 1e-3, lr_entropy: float = 1e-3) -> None:
        super().__init__(observation_space=observation_space, action_space=action_space, device=device)
        self.model = model_cls(observation_space, action_space).to(device)
        self.model_target = no_grad(deepcopy(self.model))
        self.gamma, self.polyak = gamma, polyak
        self.q_params = list(itertools.chain(self.model.q1.parameters(), self.model.q2.parameters()))
        self.pi_optimizer = torch.optim.Adam(self.model.actor.parameters(), lr=lr_actor)
        self.q_optimizer = torch.optim.Adam(self.q_params, lr=lr_critic)
        self.target_entropy = -float(np.prod(action_space.shape))
        self.log_alpha = torch.log(torch.ones(1, device=device) * alpha).requires_grad_(True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=lr_entropy)

    def get_actor(self) -> ActorModule:
        return self.model_nograd.actor

    def train(self, batch: Any) -> dict[str, float]:
        o, a, r, o2, terminated, _truncated, _weight = batch  # netrl: seven fields; a truncation still bootstraps
        pi, logp_pi = self.model.actor(o)
        alpha_t = torch.exp(self.log_alpha.detach())
        loss_alpha = -(self.log_alpha * (logp_pi + self.target_entropy).detach()).mean()
        self.alpha_optimizer.zero_grad()
        loss_alpha.backward()
        self.alpha_optimizer.step()

        q1, q2 = self.model.q1(o, a), self.model.q2(o, a)
        with torch.no_grad():
            a2, logp_a2 = self.model.actor(o2)
            q_pi_targ = torch.min(self.model_target.q1(o2, a2), self.model_target.q2(o2, a2))
            backup = r + self.gamma * (1 - terminated) * (q_pi_targ - alpha_t * logp_a2)
        loss_q = ((q1 - backup) ** 2).mean() + ((q2 - backup) ** 2).mean()
        self.q_optimizer.zero_grad()
        loss_q.backward()
        self.q_optimizer.step()

        for p in self.q_params:  # the actor's loss must not move the critics
            p.requires_grad = False
        q_pi = torch.min(self.model.q1(o, pi), self.model.q2(o, pi))
        loss_pi = (alpha_t * logp_pi - q_pi).mean()
        self.pi_optimizer.zero_grad()
        loss_pi.backward()
        self.pi_optimizer.step()
        for p in self.q_params:
            p.requires_grad = True

        with torch.no_grad():
            for p, p_targ in zip(self.model.parameters(), self.model_target.parameters(), strict=True):
                p_targ.mul_(self.polyak).add_((1 - self.polyak) * p)
        return {"loss_actor": loss_pi.item(), "loss_critic": loss_q.item(), "loss_entropy_coef": loss_alpha.item(),
                "entropy_coef": alpha_t.item()}

    # netrl (optional): with these two, a restarted trainer resumes the critics and optimisers too
    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "model_target": self.model_target.state_dict(),
                "log_alpha": self.log_alpha.detach().clone(), "pi_optimizer": self.pi_optimizer.state_dict(),
                "q_optimizer": self.q_optimizer.state_dict(), "alpha_optimizer": self.alpha_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.model_target.load_state_dict(state["model_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        for name in ("pi_optimizer", "q_optimizer", "alpha_optimizer"):
            getattr(self, name).load_state_dict(state[name])


training_agent_cls = partial(MyTrainingAgent, model_cls=MyActorCriticModule)

# the drone sends 20 samples a second: several training steps per sample, and a memory that is never trimmed
training_cls = partial(
    TrainingOffline, env_cls=env_cls, memory_cls=memory_cls, training_agent_cls=training_agent_cls,
    epochs=1 if SMOKE else 10_000,  # the tutorial's advice, np.inf, also works: train until stopped
    rounds=1 if SMOKE else 10, steps=10 if SMOKE else 400, update_buffer_interval=20 if SMOKE else 100,
    update_model_interval=10 if SMOKE else 100, max_training_steps_per_env_step=4.0,
    start_training=60 if SMOKE else 400, device="cpu")

# === The three roles ==================================================================================================


def stop_on_signals(parent: int | None) -> threading.Event:
    """Ctrl+C (or SIGTERM) sets the event a role's run(stop) watches, so that it stops cleanly (saving what it
    has); a second one interrupts at once. A role started by a launcher (``--parent``) also stops once it is gone."""
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    if parent is not None:
        def watch_parent() -> None:
            while not stop.wait(1.0):
                if os.getppid() != parent:
                    stop.set()

        threading.Thread(target=watch_parent, daemon=True).start()
    return stop


def run_role(role: str, args: argparse.Namespace) -> None:
    run_dir = Path(args.run_dir)
    torch.set_num_threads(1)  # one thread per process: the three share the machine's cores
    stop = stop_on_signals(args.parent)
    if role == "server":  # netrl: no keys= here, so unencrypted (fine on 127.0.0.1; see docs/security.md)
        Server(min_samples_per_server_packet=20, trainer_port=args.trainer_port, worker_port=args.worker_port,
               spool_dir=run_dir / "server-spool").run(stop)
    elif role == "worker":
        worker = RolloutWorker(
            env_cls=env_cls, actor_module_cls=actor_module_cls, sample_compressor=my_sample_compressor, device="cpu",
            server_ip="127.0.0.1", min_samples_per_worker_packet=20, max_samples_per_episode=1000,
            model_path=str(run_dir / "worker-policy.pt"),  # the newest policy received, kept for a restart
            server_port=args.worker_port, worker_id="drone", episode_log=str(run_dir / "episodes_drone.csv"),
            status_interval_s=10.0)
        worker.run(test_episode_interval=0, stop=stop)  # no test episodes: see MyMemory
    else:
        trainer = Trainer(training_cls=training_cls, server_ip="127.0.0.1", server_port=args.trainer_port,
                          run_dir=run_dir, sample_compressor=my_sample_compressor,  # netrl: the workers' compressor
                          wandb_mode="disabled", status_interval_s=10.0)
        trainer.run(stop)  # the policy goes to run_dir/policy.pt after every epoch and when it stops


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", choices=["server", "worker", "trainer"])
    p.add_argument("--run-dir", default="weights/tutorial", help="run folder (default weights/tutorial)")
    p.add_argument("--trainer-port", type=int, default=55555)
    p.add_argument("--worker-port", type=int, default=55556)
    p.add_argument("--parent", type=int, help=argparse.SUPPRESS)  # a launcher's pid: stop when it is gone
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.role} %(levelname)s %(name)s: %(message)s")
    run_role(args.role, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
