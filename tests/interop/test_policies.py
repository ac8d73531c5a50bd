"""TensorDictActor: a TorchRL policy as the ActorModule a worker runs; built from the spaces through
netrl.partial, acting on one observation and on a batch, exploring on training episodes and not
on test ones, its out_keys beyond the action declared as extra outputs, and its weights the ones
a worker loads."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("torchrl")

from tensordict.nn import TensorDictModule, TensorDictSequential

from netrl.actor import declared_extras
from netrl.interop.policies import TensorDictActor
from netrl.protocol.weights import load_weights, state_arrays
from netrl.util import partial
from tests.interop.nets import q_policy, tanh_normal_policy

OBS = gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT = gymnasium.spaces.Box(-2.0, 2.0, (1,), np.float32)


def test_a_tanh_normal_policy_acts_with_its_log_prob_and_params_as_extra_outputs() -> None:
    torch.manual_seed(0)
    actor = partial(TensorDictActor, policy=partial(tanh_normal_policy, hidden=8))(OBS, ACT)
    assert declared_extras(actor) == {
        "loc": ((1,), "<f4"),
        "scale": ((1,), "<f4"),
        "action_log_prob": ((), "<f4"),
    }
    action, extras = actor.act_(np.zeros(3, np.float32))
    assert action.shape == (1,) and action.dtype == np.float32 and -2 <= action[0] <= 2
    assert extras["action_log_prob"].shape == () and extras["loc"].shape == (1,)
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    test_a, _ = actor.act_(obs, test=True, batch=True)
    again, _ = actor.act_(obs, test=True, batch=True)
    train_a, train_x = actor.act_(obs, test=False, batch=True)
    assert test_a.shape == (5, 1) and np.array_equal(
        test_a, again
    )  # deterministic on test episodes
    assert not np.allclose(train_a, test_a)  # samples on training ones
    assert (
        train_x["action_log_prob"].shape == (5,) and np.isfinite(train_x["action_log_prob"]).all()
    )


def test_a_worker_actor_loads_the_trainer_actors_weights_and_then_acts_the_same() -> None:
    make = partial(TensorDictActor, policy=tanh_normal_policy)
    torch.manual_seed(1)
    trainer_side = make(OBS, ACT)
    torch.manual_seed(2)
    worker_side = make(OBS, ACT)
    obs = np.ones((2, 3), np.float32)
    assert not np.allclose(
        trainer_side.act_(obs, test=True, batch=True)[0], worker_side.act_(obs, True, True)[0]
    )
    assert list(trainer_side.state_dict()) == list(worker_side.state_dict())
    assert all(k.startswith("module.") for k in trainer_side.state_dict())
    load_weights(
        worker_side, state_arrays(trainer_side), assign=True
    )  # as the worker loads a version
    np.testing.assert_array_equal(
        trainer_side.act_(obs, test=True, batch=True)[0],
        worker_side.act_(obs, test=True, batch=True)[0],
    )


@pytest.mark.parametrize("discrete", ["one_hot", "categorical"])
def test_a_q_value_actor_returns_netrl_discrete_actions_from_its_one_hot_or_index(
    discrete: Any,
) -> None:
    space = gymnasium.spaces.Discrete(4, start=2)
    policy = partial(q_policy, categorical=discrete == "categorical")
    actor = TensorDictActor(
        OBS, space, policy=policy, discrete=discrete, extra_keys=["action_value"]
    )
    assert actor.extra_outputs() == {"action_value": ((4,), "float32")}
    obs = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
    actions, extras = actor.act_(obs, test=True, batch=True)
    assert actions.shape == (6,) and all(space.contains(a) for a in actions.tolist())
    assert (actions == extras["action_value"].argmax(-1) + 2).all()  # greedy, start added back
    one, _ = actor.act_(obs[0], test=True)
    assert one.shape == () and one == actions[0]


def test_a_dict_observation_reaches_the_policy_as_nested_keys() -> None:
    space = gymnasium.spaces.Dict(
        {
            "pos": gymnasium.spaces.Box(-1, 1, (2,), np.float32),
            "vel": gymnasium.spaces.Box(-1, 1, (1,), np.float32),
        }
    )

    def policy(observation_space: Any, action_space: Any) -> nn.Module:
        return TensorDictModule(
            lambda p, v: torch.cat([p, v], -1)[..., :1] * 0 + p[..., :1] + v,
            [("observation", "pos"), ("observation", "vel")],
            ["action"],
        )

    actor = TensorDictActor(space, ACT, policy=policy)
    action = actor.act_(
        {"pos": np.array([0.5, 0.0], np.float32), "vel": np.array([0.25], np.float32)}
    )
    assert actor.extra_outputs() == {} and action.tolist() == [0.75]


def test_what_a_row_cannot_carry_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"extra_keys \['entropy'\] are not among what the policy"):
        TensorDictActor(OBS, ACT, policy=tanh_normal_policy, extra_keys=["entropy"])
    no_action = partial(
        TensorDictModule, nn.Linear(3, 1), in_keys=["observation"], out_keys=["value"]
    )
    with pytest.raises(ValueError, match="wrote no 'action'"):
        TensorDictActor(OBS, ACT, policy=lambda o, a: no_action())
    nested = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    both = TensorDictModule(lambda a: a * 2, in_keys=["action"], out_keys=[("stats", "double")])
    with pytest.raises(ValueError, match=r"writes the nested keys \[\('stats', 'double'\)\]"):
        TensorDictActor(OBS, ACT, policy=TensorDictSequential(nested, both))
    assert (
        TensorDictActor(
            OBS, ACT, policy=TensorDictSequential(nested, both), extra_keys=[]
        ).extra_outputs()
        == {}
    )
