"""Exploration schedules on a worker: a TensorDictActor steps an EGreedyModule's epsilon (an
AdditiveGaussianModule's sigma) by the env steps it acts for, as TorchRL's scripts step it by
their collector's frames; the annealed value stays the worker's when new weights arrive."""

from __future__ import annotations

import copy
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")

from tensordict.nn import TensorDictSequential
from torchrl.data import Bounded, OneHot
from torchrl.modules import AdditiveGaussianModule, EGreedyModule, OrnsteinUhlenbeckProcessModule

from netrl.interop.policies import TensorDictActor
from netrl.protocol.weights import load_weights, state_arrays
from tests.interop.nets import q_policy, tanh_normal_policy

OBS = gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)
FOUR = gymnasium.spaces.Discrete(4)
BOX = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
ENVS = 4


def egreedy(**kwargs: Any) -> EGreedyModule:
    return EGreedyModule(OneHot(4), eps_init=1.0, eps_end=0.05, annealing_num_steps=300, **kwargs)


def greedy_actor() -> TensorDictActor:
    def make(observation_space: Any, action_space: Any) -> torch.nn.Module:
        return TensorDictSequential(q_policy(observation_space, action_space), egreedy())

    return TensorDictActor(OBS, FOUR, policy=make, extra_keys=[])


def eps(actor: TensorDictActor) -> torch.Tensor:
    return actor.module[1].eps.clone()


def act(actor: TensorDictActor, times: int, test: bool = False) -> None:
    obs = np.zeros((ENVS, 3), np.float32)
    for _ in range(times):
        actor.act_(obs, test=test, batch=True)


def test_epsilon_after_n_env_steps_is_torchrls_after_the_same_n() -> None:
    torch.manual_seed(0)
    actor, reference = greedy_actor(), egreedy()
    act(actor, 25)  # 25 acts of 4 envs: 100 env steps
    for _ in range(25):  # TorchRL's loop: exploration.step(data.numel()) per collected batch
        reference.step(ENVS)
    # TorchRL subtracts frame by frame in float32; the worker sets the linear schedule at once
    torch.testing.assert_close(eps(actor), reference.eps, rtol=1e-5, atol=0)
    assert actor.schedule_frames() == 100 and eps(actor) < 1.0
    act(actor, 10, test=True)  # test episodes do not anneal
    torch.testing.assert_close(eps(actor), reference.eps, rtol=1e-5, atol=0)
    assert actor.schedule_frames() == 100
    act(actor, 100)  # past annealing_num_steps: the end value
    assert torch.equal(eps(actor), reference.eps_end)


def test_a_copy_loading_the_trainers_weights_keeps_the_workers_epsilon() -> None:
    torch.manual_seed(0)
    trainer_side, worker_side = greedy_actor(), greedy_actor()
    spare = copy.deepcopy(worker_side)  # the worker loads each version into such a copy
    reference = egreedy()
    act(worker_side, 20)
    reference.step(20 * ENVS)
    published = state_arrays(trainer_side)  # what the trainer sends
    assert not any(name.endswith(".eps") for name in published)  # the worker's own
    assert any(name.endswith(".eps_init") for name in published)
    load_weights(spare, published, assign=True)  # as the worker's receiver loads it
    assert torch.equal(spare.module[0].module[0].weight, trainer_side.module[0].module[0].weight)
    act(spare, 1)  # swapped in: it catches up on the worker's count, then counts its own
    reference.step(ENVS)
    torch.testing.assert_close(eps(spare), reference.eps, rtol=1e-5, atol=0)
    assert spare.schedule_frames() == 21 * ENVS
    kept = eps(spare)
    spare.load_state_dict(trainer_side.state_dict())  # a strict load without eps keeps its own
    assert torch.equal(eps(spare), kept)


def test_an_additive_gaussian_sigma_anneals_by_env_steps_too() -> None:
    torch.manual_seed(0)

    def noise() -> AdditiveGaussianModule:
        spec = Bounded(-1.0, 1.0, (1,))
        return AdditiveGaussianModule(spec, sigma_init=1.0, sigma_end=0.1, annealing_num_steps=50)

    actor = TensorDictActor(
        OBS,
        BOX,
        policy=lambda o, a: TensorDictSequential(tanh_normal_policy(o, a), noise()),
        extra_keys=[],
    )
    reference = noise()
    act(actor, 5)
    reference.step(5 * ENVS)
    torch.testing.assert_close(actor.module[1].sigma, reference.sigma, rtol=1e-5, atol=0)
    assert reference.sigma < 1.0


def test_an_ornstein_uhlenbeck_module_is_refused_by_name() -> None:
    def make(observation_space: Any, action_space: Any) -> torch.nn.Module:
        policy = tanh_normal_policy(observation_space, action_space)
        noise = OrnsteinUhlenbeckProcessModule(Bounded(-1.0, 1.0, (1,)))
        return TensorDictSequential(policy, noise)

    with pytest.raises(ValueError, match=r"OrnsteinUhlenbeckProcessModule.*AdditiveGaussianModule"):
        TensorDictActor(OBS, BOX, policy=make)
