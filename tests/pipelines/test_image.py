"""The image pipeline: the CNN SAC trains on stacks the memory rebuilt, and the worker's actor loads its weights."""

from __future__ import annotations

import dataclasses

import gymnasium
import numpy as np
import pytest
import torch

from netrl.agents.cnn import CNNActor, CNNActorCritic
from netrl.agents.sac import SACAgent
from netrl.config.sections import Config
from netrl.pipelines.make import make_pipeline
from netrl.worker.worker import RolloutWorker
from tests.recording import local_packets, over_the_wire

SMALL = Config(agent=dataclasses.replace(Config().agent, hidden_sizes=[32]))


def test_cnn_sac_trains_on_rebuilt_stacks_and_worker_actor_loads_its_weights() -> None:
    torch.manual_seed(0)
    pipe = make_pipeline(dataclasses.replace(SMALL, env=dataclasses.replace(SMALL.env, pipeline="image")))
    env = pipe.env_cls()
    obs_space, act_space = env.observation_space, env.action_space
    agent = pipe.training_agent_cls(observation_space=obs_space, action_space=act_space, device="cpu")
    assert isinstance(agent, SACAgent) and isinstance(agent.model, CNNActorCritic)
    worker = RolloutWorker(pipe.env_cls, pipe.actor_module_cls, pipe.sample_compressor, min_samples_per_worker_packet=8,
                           overlap=pipe.overlap, seed=0)
    memory = pipe.memory_cls(memory_size=500, batch_size=16, seed=0)
    for buf in local_packets(worker, [False] * 3):
        memory.append_buffer(over_the_wire(buf))
    encoder = agent.model.critic.encoder
    before = [p.detach().clone() for p in encoder.parameters()]
    for _ in range(3):
        metrics = agent.train(memory.sample())
    assert all(np.isfinite(v) for v in metrics.values())
    assert any(not torch.equal(b, p) for b, p in zip(before, encoder.parameters(), strict=True))  # the critic trains it
    assert agent.get_actor().encoder is encoder  # shared, read detached by the actor
    actor = pipe.actor_module_cls(obs_space, act_space)
    assert isinstance(actor, CNNActor) and actor.encoder is not encoder
    actor.load_state_dict(agent.get_actor().state_dict())
    obs, _ = env.reset(seed=0)
    act = actor.act_(obs, test=True)
    assert act.shape == (2,) and np.all(np.abs(act) <= 1)
    with torch.no_grad():
        want = agent.get_actor()(torch.as_tensor(obs)[None], test=True, with_logprob=False)[0][0].numpy()
    np.testing.assert_allclose(act, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="stack, height, width"):
        CNNActor(gymnasium.spaces.Box(0, 1, (4,)), act_space)
