"""The recurrent SAC on the drone (tuple observations) and image (a CNN before the core) pipelines: a real worker
runs the pipeline's env with the recurrent actor, the memory stores the state that entered each step, and the
agent trains a few steps from batches whose recorded state, run forward through the actor over the sequence's
observations, gives the state recorded at the next step.

The recurrent SAC trains on the pipelines' own memories (ActionBufferMemory, FrameStackMemory, which sample
sequences across packets), and its parts also on a ReplayMemory with sequences and no compressor;
with n-step returns and prioritized sequences too, its per-step priorities reaching the memory."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import pytest
import torch

from netrl.agents.common.encoders import ConvEncoder
from netrl.agents.recurrent_sac import RecurrentActor, RecurrentSACAgent
from netrl.config.load import config_from_dict
from netrl.config.sections import Config
from netrl.errors import ConfigError
from netrl.memory.base import MemoryDataloading
from netrl.memory.priority import pop_priority
from netrl.memory.replay import ReplayMemory
from netrl.pipelines.algorithms import recurrent_sac, sequence_memory
from netrl.pipelines.base import Pipeline
from netrl.pipelines.drone import drone_pipeline
from netrl.pipelines.image import image_pipeline
from netrl.pipelines.make import make_pipeline
from netrl.pipelines.replay_options import apply_replay_options
from netrl.worker.worker import RolloutWorker
from tests.recording import local_packets, over_the_wire

pytestmark = [pytest.mark.filterwarnings("ignore:Time-step timed out"),  # a 5 ms clock may slip on a busy machine
              pytest.mark.filterwarnings("ignore:.*share an object")]

BASE = Config()
RECURRENT = dataclasses.replace(
    BASE, agent=dataclasses.replace(BASE.agent, hidden_sizes=[16, 8], recurrent="gru"),
    memory=dataclasses.replace(BASE.memory, sequence_length=4, burn_in=1))
PLAIN = dataclasses.replace(BASE, agent=dataclasses.replace(BASE.agent, hidden_sizes=[16, 8]))


def pipelines(cfg: Config) -> dict[str, Any]:
    def on(name: str) -> Config:
        return dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, pipeline=name))

    return {"drone": lambda: drone_pipeline(on("drone"), time_step=0.005, ep_max_length=12),
            "image": lambda: image_pipeline(on("image"), size=32)}


def train_a_few_steps(pipe: Pipeline) -> Any:
    torch.manual_seed(0)
    env = pipe.env_cls()
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    agent = pipe.training_agent_cls(observation_space=obs_space, action_space=act_space, device="cpu")
    assert isinstance(agent, RecurrentSACAgent)
    worker = RolloutWorker(pipe.env_cls, pipe.actor_module_cls, pipe.sample_compressor, min_samples_per_worker_packet=6,
                           overlap=pipe.overlap, seed=0)
    worker.start()
    worker.policy.actor.load_state_dict(agent.get_actor().state_dict())  # the worker acts with the agent's weights
    memory = pipe.memory_cls(memory_size=1000, batch_size=8, seed=0)
    for buf in local_packets(worker, [False] * 3):
        memory.append_buffer(over_the_wire(buf))
    batch = memory.sample()
    state, mask = batch.extra["recurrent_state"], batch.extra["mask"]
    assert state.shape == (8, 4, 1, 8) and state.abs().sum() > 0
    # the recorded state of step j + 1 is the actor's recurrence from step j's (same episode, unmasked)
    actor = agent.actor
    nstep = "steps_to_next_obs" in batch.extra  # next_obs is n steps on: step j's is obs[:, j] only
    with torch.no_grad():
        for j in range(3):
            obs_j = _step(batch.obs, j) if j == 0 or nstep else _step(batch.next_obs, j - 1)
            _, after = actor.unroll(obs_j, {"recurrent_state": state[:, j]})
            same_episode = (mask[:, j + 1] > 0) & (batch.terminated[:, j] == 0) & (batch.truncated[:, j] == 0)
            assert same_episode.any()
            torch.testing.assert_close(after["recurrent_state"][same_episode], state[same_episode, j + 1],
                                       rtol=1e-4, atol=1e-5)
    for _ in range(3):
        batch = memory.sample()
        metrics = agent.train(batch)
        priority = pop_priority(metrics)
        if getattr(memory, "prioritized", False):  # per-step |td| to the sum tree
            assert priority is not None and priority.shape == (8, 4)
            assert memory.update_priority(priority.numpy(), batch.extra["index"].numpy()) > 0
    assert all(np.isfinite(v) for v in metrics.values())
    return memory


def _step(obs: Any, j: int) -> Any:
    """Step ``j`` of a sequence's observations ``[B, L, ...]`` as a one-step sequence ``[B, 1, ...]``."""
    if isinstance(obs, (tuple, list)):
        return type(obs)(_step(o, j) for o in obs)
    return obs[:, j:j + 1]


@pytest.mark.parametrize("name", ["drone", "image"])
def test_the_recurrent_sacs_parts_train_on_the_pipelines_env_and_the_state_reaches_the_batch(name: str) -> None:
    plain = pipelines(PLAIN)[name]()
    encoder = "cnn" if name == "image" else "mlp"
    parts = recurrent_sac(RECURRENT, ReplayMemory, encoder=encoder)
    # a ReplayMemory stores whole observations: no compressor
    pipe = dataclasses.replace(plain, **parts._asdict(), sample_compressor=None, overlap=1)
    actor = pipe.actor_module_cls(plain.env_cls().observation_space, plain.env_cls().action_space)
    assert isinstance(actor, RecurrentActor) and isinstance(actor.encoder, ConvEncoder) == (name == "image")
    train_a_few_steps(pipe)


@pytest.mark.parametrize("name", ["drone", "image"])
def test_the_pipeline_builds_the_recurrent_sac_on_its_own_memory_and_trains_it(name: str) -> None:
    train_a_few_steps(pipelines(RECURRENT)[name]())


def test_a_memory_without_sequences_is_refused_naming_the_key_and_the_memory() -> None:
    class Transitions(MemoryDataloading):
        pass

    with pytest.raises(ConfigError, match=r"memory.sequence_length is 4 .*stores its rows in Transitions"):
        sequence_memory(RECURRENT, Transitions)
    memory = sequence_memory(RECURRENT, ReplayMemory)
    assert memory.keywords == {"sequence_length": 4, "burn_in": 1}  # type: ignore[attr-defined]


REPLAY = dataclasses.replace(RECURRENT, memory=dataclasses.replace(RECURRENT.memory, n_step=3,
                                                                   prioritized=True))


@pytest.mark.parametrize("name", ["drone", "image"])
def test_the_recurrent_sac_trains_with_n_step_returns_and_prioritized_sequences(name: str) -> None:
    cfg = config_from_dict({"env": {"pipeline": name}, "agent": {"recurrent": "gru"},
                            "memory": {"sequence_length": 4, "burn_in": 1, "n_step": 3,
                                       "prioritized": True}})
    built = make_pipeline(cfg)  # what the trainer builds from config.json
    memory_cls: Any = built.memory_cls
    assert {"sequence_length": 4, "burn_in": 1, "n_step": 3, "prioritized": True}.items() <= \
        _keywords(memory_cls).items()
    # the same keys on a pipeline with a fast env clock and short episodes
    pipe = apply_replay_options(REPLAY, pipelines(REPLAY)[name]())
    memory = train_a_few_steps(pipe)
    assert (memory.n_step, memory.prioritized, memory.sequence_length) == (3, True, 4)


def _keywords(cls: Any) -> dict[str, Any]:
    """The keywords of nested partials, outermost last."""
    found: dict[str, Any] = {}
    while isinstance(cls, functools.partial):
        found = {**cls.keywords, **found}
        cls = cls.func
    return found
