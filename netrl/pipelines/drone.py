"""The RC-drone pipeline of tmrl's tutorial: rtgym's dummy drone at 50 ms
steps with a 4-action buffer.

The drone obeys velocity commands after a random 20-50 ms delay and reports its position after
another one, so the observation carries the last 4 actions (rtgym's action buffer) to stay Markov::

    obs = (pos_x, pos_y, target_x, target_y, a[t-3], a[t-2], a[t-1], a[t])  # 4 x (1,) + 4 x (2,)
                                                                            # float32
    reward = -|pos - target|; terminated when closer than 0.01; truncated after 100 steps (5 s)

As in the tutorial, the worker's :class:`~netrl.memory.action_buffer.ActionBufferCompressor`
drops the action buffer and the trainer's :class:`~netrl.memory.action_buffer.ActionBufferMemory`
rebuilds it (exactly, across episode ends: the buffer is not reset between
episodes). The env runs in real time, so the worker is never paused by pacing, and a
:class:`~netrl.envs.realtime.StepTimer` logs its step periods. Settings are module constants;
:func:`drone_pipeline` takes them as arguments for tests and benchmarks.
"""

from __future__ import annotations

import random
from typing import Any

import gymnasium.spaces as spaces
import numpy as np
import rtgym.tuto.dummy_drone
from rtgym import DEFAULT_CONFIG_DICT, DummyRCDrone, RealTimeGymInterface

from netrl.agents.sac import MLPActor, MLPActorCritic
from netrl.config.sections import Config
from netrl.envs.gym import GenericGymEnv
from netrl.envs.realtime import StepTimer
from netrl.memory.action_buffer import ActionBufferCompressor, ActionBufferMemory, act_buf_settings
from netrl.pipelines.algorithms import Parts, recurrent_sac, sac_agent
from netrl.pipelines.base import Pipeline
from netrl.util import partial

__all__ = ["ACT_BUF_LEN", "ENV_ID", "EP_MAX_LENGTH", "TIME_STEP", "DummyRCDroneInterface", "drone_env",
           "drone_pipeline", "drone_rtgym_config"]

TIME_STEP = 0.05  # seconds per step (20 Hz)
ACT_BUF_LEN = 4  # actions in the observation
EP_MAX_LENGTH = 100  # steps per episode
ENV_ID = "rtgym:real-time-gym-ts-v1"  # rtgym's thread-safe env: the worker has a network thread


_DRONE_RANDOM = random.Random()


class DummyRCDroneInterface(RealTimeGymInterface):  # type: ignore[misc]
    """tmrl's tutorial interface for rtgym's :class:`DummyRCDrone`, without the OpenCV window."""

    def __init__(self) -> None:
        self.rc_drone: Any = None
        self.target = np.zeros(2, np.float32)
        self.rng = np.random.default_rng()

    def get_observation_space(self) -> spaces.Tuple:
        pos = spaces.Box(-1.0, 1.0, (1,), np.float32)
        tar = spaces.Box(-0.5, 0.5, (1,), np.float32)
        return spaces.Tuple((pos, pos, tar, tar))

    def get_action_space(self) -> spaces.Box:
        return spaces.Box(-2.0, 2.0, (2,), np.float32)

    def get_default_action(self) -> np.ndarray:
        return np.zeros(2, np.float32)

    def send_control(self, control: np.ndarray) -> None:
        self.rc_drone.send_control(float(control[0]), float(control[1]))

    def _obs(self) -> list[np.ndarray]:
        x, y = self.rc_drone.get_observation()
        return [np.array([x], np.float32), np.array([y], np.float32), self.target[:1].copy(), self.target[1:].copy()]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[np.ndarray], dict]:
        if self.rc_drone is None:
            # rtgym's drone draws its delays from the global random module, in threads that
            # run until the process exits: its own generator keeps it from moving the user's
            # (perhaps seeded) random state
            rtgym.tuto.dummy_drone.random = _DRONE_RANDOM
            self.rc_drone = DummyRCDrone()  # the drone keeps flying between episodes
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.target[:] = self.rng.uniform(-0.5, 0.5, 2)
        return self._obs(), {}

    def get_obs_rew_terminated_info(self) -> tuple[list[np.ndarray], float, bool, dict]:
        obs = self._obs()
        rew = -float(np.hypot(obs[0][0] - self.target[0], obs[1][0] - self.target[1]))
        return obs, rew, rew > -0.01, {}

    def wait(self) -> None:
        self.send_control(self.get_default_action())


def drone_rtgym_config(time_step: float = TIME_STEP, act_buf_len: int = ACT_BUF_LEN,
                       ep_max_length: int = EP_MAX_LENGTH, reset_act_buf: bool = False,
                       last_act_on_reset: bool = False) -> dict[str, Any]:
    """The tutorial's rtgym config (a copy of ``DEFAULT_CONFIG_DICT``, which rtgym
    shares between envs)."""
    if time_step <= 0 or ep_max_length < 1:
        raise ValueError(f"time_step must be > 0 and ep_max_length >= 1 "
                         f"(got {time_step}, {ep_max_length})")
    config = dict(DEFAULT_CONFIG_DICT)
    config.update(interface=DummyRCDroneInterface, time_step_duration=time_step, start_obs_capture=time_step,
                  time_step_timeout_factor=1.0, ep_max_length=ep_max_length, act_buf_len=act_buf_len,
                  reset_act_buf=reset_act_buf, last_act_on_reset=last_act_on_reset, benchmark=False)
    return config


def drone_env(env_id: str = ENV_ID, rtgym_config: dict[str, Any] | None = None) -> StepTimer:
    """The drone env, timed: step periods are logged per episode (DEBUG) and
    overruns as warnings."""
    config = rtgym_config or drone_rtgym_config()
    return StepTimer(GenericGymEnv(env_id, {"config": config}), nominal_s=config["time_step_duration"])


def drone_pipeline(cfg: Config, *, time_step: float = TIME_STEP, act_buf_len: int = ACT_BUF_LEN,
                   ep_max_length: int = EP_MAX_LENGTH, reset_act_buf: bool = False, last_act_on_reset: bool = False,
                   env_id: str = ENV_ID) -> Pipeline:
    """Build the drone pipeline: SAC, or with ``agent.recurrent`` the recurrent SAC on
    sequences of ``memory.sequence_length`` rows. Its sample compressor is stateful: build
    one pipeline per worker."""
    rtgym_config = drone_rtgym_config(time_step, act_buf_len, ep_max_length, reset_act_buf, last_act_on_reset)
    settings = act_buf_settings(rtgym_config)
    hidden = tuple(cfg.agent.hidden_sizes)
    memory = partial(ActionBufferMemory, **settings)
    if cfg.agent.recurrent is not None:  # the tuple observation, flattened, into the core
        parts = recurrent_sac(cfg, memory)
    else:
        parts = Parts(partial(MLPActor, hidden_sizes=hidden), memory,
                      sac_agent(cfg, partial(MLPActorCritic, hidden_sizes=hidden)))
    return Pipeline(
        env_cls=partial(drone_env, env_id, rtgym_config),
        **parts._asdict(),
        sample_compressor=ActionBufferCompressor(**settings),
        # a reset row skips one action: a buffer reaches 2L - 1 rows back
        overlap=2 * act_buf_len - 1,
        realtime=True,
    )
