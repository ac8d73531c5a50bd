"""The drone pipeline: rtgym through GenericGymEnv, and the action buffer dropped by the worker and rebuilt exactly.

The env is rtgym's real dummy drone at a short time step (5 ms instead of 50) so the tests stay fast; rtgym's own
action-buffer code produces the observations the memory must rebuild.
"""

from __future__ import annotations

import dataclasses
import random
import time

import numpy as np
import pytest
import torch

from netrl.config.sections import Config
from netrl.envs.gym import GenericGymEnv
from netrl.memory.action_buffer import ActionBufferCompressor, ActionBufferMemory, act_buf_settings
from netrl.pipelines.drone import drone_pipeline, drone_rtgym_config
from netrl.pipelines.make import make_pipeline
from netrl.samples import Buffer
from netrl.worker.worker import RolloutWorker
from tests.recording import local_packets, over_the_wire, recorded, same

FAST = 0.005  # seconds per step in these tests


pytestmark = [pytest.mark.filterwarnings("ignore:Time-step timed out"),  # a 5 ms clock may slip on a busy machine
              pytest.mark.filterwarnings("ignore:.*share an object")]  # rtgym's buffers: GenericGymEnv copies them


@pytest.mark.parametrize("env_id", ["rtgym:real-time-gym-v1", "rtgym:real-time-gym-ts-v1"])
def test_generic_gym_env_wraps_rtgym_and_copies_the_reused_action_arrays(env_id: str) -> None:
    config = drone_rtgym_config(time_step=FAST, ep_max_length=5)
    env = GenericGymEnv(env_id, {"config": config})
    try:
        assert len(env.observation_space.spaces) == 4 + 4  # position, target, 4 actions
        np.testing.assert_array_equal(env.default_action, np.zeros(2, np.float32))
        obs, _ = env.reset(seed=3)
        assert all(leaf.dtype == np.float32 for leaf in obs)
        action = np.array([0.5, -0.25], np.float32)
        obs1, *_ = env.step(action)
        np.testing.assert_array_equal(obs1[-1], action)
        action[:] = 9.0  # rtgym keeps a reference to the array we passed; what we stored must not change
        obs2, *_ = env.step(np.array([0.1, 0.2], np.float32))
        np.testing.assert_array_equal(obs1[-1], [0.5, -0.25])
        assert obs2[-2] is not obs1[-1]
    finally:
        env.close()


def test_the_drone_leaves_the_global_random_state_alone() -> None:
    state = random.getstate()
    env = GenericGymEnv("rtgym:real-time-gym-v1", {"config": drone_rtgym_config(time_step=FAST, ep_max_length=20)})
    try:
        env.reset(seed=1)
        for _ in range(10):
            env.step(np.array([0.3, -0.3], np.float32))  # each command and observation draws a delay in a thread
    finally:
        env.close()
    time.sleep(0.1)  # time passes on purpose: the drone's delay threads draw meanwhile, and must not use `random`
    assert random.getstate() == state


def test_config_is_copied_and_v0_is_not_used() -> None:
    from rtgym import DEFAULT_CONFIG_DICT

    before = dict(DEFAULT_CONFIG_DICT)
    config = drone_rtgym_config()
    assert DEFAULT_CONFIG_DICT == before and config is not DEFAULT_CONFIG_DICT
    assert config["time_step_duration"] == 0.05 and config["act_buf_len"] == 4 and not config["reset_act_buf"]
    pipe = make_pipeline(Config(env=dataclasses.replace(Config().env, pipeline="drone")))
    assert pipe.realtime and pipe.overlap == 7 and pipe.env_cls.args[0].endswith("-v1")  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="act_in_obs"):
        act_buf_settings({**config, "act_in_obs": False})


def _check_memory(memory: ActionBufferMemory, truth: dict[bytes, tuple], checked: set[bytes]) -> int:
    """Compare every sampleable transition (per item and as one vectorised batch) with what the env produced."""
    wrong = 0
    for i in range(len(memory)):
        o, a, _r, o2, *_ = memory.get_transition(i)
        prev, now = truth[np.asarray(a).tobytes()]
        wrong += not (same(o, prev) and same(o2, now))
        checked.add(np.asarray(a).tobytes())
    if len(memory):
        batch = memory.sample()
        for b in range(batch.act.shape[0]):
            prev, now = truth[batch.act[b].numpy().tobytes()]
            o = tuple(leaf[b].numpy() for leaf in batch.obs)
            o2 = tuple(leaf[b].numpy() for leaf in batch.next_obs)
            wrong += not (same(o, prev) and same(o2, now))
    return wrong


def _without_seams(buf: Buffer) -> Buffer:
    obs = (*buf.obs[:-1], np.zeros_like(buf.obs[-1]))
    return dataclasses.replace(buf, obs=obs)


MODES = [(False, False, "rtgym:real-time-gym-ts-v1"), (False, False, "rtgym:real-time-gym-v1"),
         (True, False, "rtgym:real-time-gym-ts-v1"), (False, True, "rtgym:real-time-gym-ts-v1")]


@pytest.mark.parametrize(("reset_act_buf", "last_act_on_reset", "env_id"), MODES)
def test_memory_rebuilds_the_action_buffer_exactly_across_episodes_packets_and_ring_wraps(
        reset_act_buf: bool, last_act_on_reset: bool, env_id: str) -> None:
    torch.manual_seed(0)
    pipe = drone_pipeline(Config(agent=dataclasses.replace(Config().agent, hidden_sizes=[16])), time_step=FAST,
                          ep_max_length=6, reset_act_buf=reset_act_buf, last_act_on_reset=last_act_on_reset,
                          env_id=env_id)
    env_cls, recorders = recorded(pipe.env_cls)
    worker = RolloutWorker(env_cls, pipe.actor_module_cls, pipe.sample_compressor, min_samples_per_worker_packet=5,
                           overlap=pipe.overlap, seed=1)
    memory = pipe.memory_cls(memory_size=48, batch_size=64, seed=0)
    control = pipe.memory_cls(memory_size=48, batch_size=64, seed=0)  # the same packets, seam flags erased
    # Training episodes, with test episodes (not recorded, but they move the env's action buffer) in between.
    episodes = [False, False, True, False, False, False, True, True, False, False, False, False, True, False] * 2
    checked: set[bytes] = set()
    wrong = control_wrong = packets = 0
    for buf in local_packets(worker, episodes):
        buf = over_the_wire(buf)
        packets += 1
        memory.append_buffer(buf)
        control.append_buffer(_without_seams(buf))
        wrong += _check_memory(memory, recorders[0].truth, checked)
        control_wrong += _check_memory(control, recorders[0].truth, set())
    steps = sum(not t for t in episodes) * 6
    assert wrong == 0
    assert memory.total_appended > memory.memory_size * 3  # the ring wrapped several times
    assert packets >= steps // 5 - 1
    assert len(checked) > 0.75 * steps, (len(checked), steps)  # nearly every transition was sampleable at some point
    # Transitions right after a reset whose buffer holds the previous episode's actions were rebuilt too.
    first_steps = [o2 for o, o2 in (recorders[0].truth[k] for k in checked) if any(same(o, f) for f in
                                                                                   recorders[0].first_obs[1:])]
    assert first_steps
    seams = pipe.sample_compressor.seams  # type: ignore[union-attr]
    if reset_act_buf:
        assert seams == 0 and control_wrong == 0  # buffers refill at reset: nothing carries over
    else:
        assert seams >= 4  # every training episode after a test episode starts at a seam
        assert control_wrong > 0  # without the seam flags the rebuild would be wrong: the check above can fail


def test_compressor_and_memory_reject_mismatched_input(caplog: pytest.LogCaptureFixture) -> None:
    comp = ActionBufferCompressor(act_buf_len=2, reset_act_buf=False)
    zero = np.zeros(2, np.float32)
    obs = (np.zeros(1, np.float32), zero, zero)
    _, out, *_ = comp(zero, obs, 0.0, False, False, {})
    assert len(out) == 2 and out[-1] == 0 and out[-1].dtype == np.uint8
    bad_next = (np.zeros(1, np.float32), np.ones(2, np.float32), np.full(2, 3, np.float32))  # not [0, a]
    _, out, *_ = comp(np.full(2, 3, np.float32), bad_next, 0.0, False, False, {})
    assert out[-1] == 1 and comp.seams == 1  # a seam: the memory will not rebuild across it
    assert "act_buf_len" in caplog.text
    with pytest.raises(ValueError, match="ending with 2 actions"):
        comp(zero, np.zeros(3, np.float32), 0.0, False, False, {})
    with pytest.raises(ValueError, match="act_buf_len must be"):
        ActionBufferCompressor(act_buf_len=0)
    memory = ActionBufferMemory(memory_size=10, act_buf_len=2)
    n = 3
    flags = np.zeros(n, bool)
    raw = Buffer(act=np.zeros((n, 2), np.float32), obs=(np.zeros((n, 1), np.float32), np.zeros((n, 2), np.float32)),
                 rew=np.zeros(n, np.float32), terminated=flags, truncated=flags, reset=flags, context=flags,
                 policy_version=np.zeros(n, np.int64))
    with pytest.raises(ValueError, match="compressed by ActionBufferCompressor"):
        memory.append_buffer(raw)
    with pytest.raises(ValueError, match="obs_preprocessor"):
        ActionBufferMemory(memory_size=10, obs_preprocessor=lambda o: o)
