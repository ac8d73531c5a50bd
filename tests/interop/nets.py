"""TorchRL modules and losses as TorchRL's examples build them, for the interop tests
(imported after ``pytest.importorskip("torchrl")``)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import Categorical, OneHot
from torchrl.modules import (
    MLP,
    LSTMModule,
    ProbabilisticActor,
    QValueActor,
    QValueModule,
    TanhNormal,
    ValueOperator,
)
from torchrl.objectives import DQNLoss, SACLoss


def tanh_normal_policy(observation_space: Any, action_space: Any, hidden: int = 16) -> nn.Module:
    """TorchRL's SAC actor, as its examples build it."""
    n_act = int(action_space.shape[0])
    net = nn.Sequential(
        nn.Linear(int(observation_space.shape[0]), hidden),
        nn.Tanh(),
        nn.Linear(hidden, 2 * n_act),
        NormalParamExtractor(),
    )
    low, high = float(action_space.low[0]), float(action_space.high[0])
    return ProbabilisticActor(
        TensorDictModule(net, ["observation"], ["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": low, "high": high},
        return_log_prob=True,
    )


def q_policy(observation_space: Any, action_space: Any, categorical: bool = False) -> nn.Module:
    """TorchRL's DQN actor; ``categorical``: acting with the index, not a one-hot."""
    n = int(action_space.n)
    return QValueActor(
        nn.Linear(int(observation_space.shape[0]), n),
        in_keys=["observation"],
        spec=Categorical(n) if categorical else OneHot(n),
    )


def lstm_q_policy(observation_space: Any, action_space: Any, hidden: int = 8) -> nn.Module:
    """TorchRL's recurrent DQN policy, as its LSTM tutorial builds it: an LSTMModule over the
    observation, a linear head, a QValueModule (one-hot actions)."""
    lstm = LSTMModule(
        input_size=int(observation_space.shape[0]),
        hidden_size=hidden,
        in_key="observation",
        out_key="embed",
    )
    head = TensorDictModule(nn.Linear(hidden, int(action_space.n)), ["embed"], ["action_value"])
    return TensorDictSequential(lstm, head, QValueModule(spec=OneHot(int(action_space.n))))


class QNet(nn.Module):
    def __init__(self, n_obs: int, n_act: int) -> None:
        super().__init__()
        self.net = MLP(in_features=n_obs + n_act, out_features=1, num_cells=[32])

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs, act], -1))  # type: ignore[no-any-return]


def sac_loss(observation_space: Any, action_space: Any) -> SACLoss:
    n_obs, n_act = int(observation_space.shape[0]), int(action_space.shape[0])
    qvalue = ValueOperator(QNet(n_obs, n_act), in_keys=["observation", "action"])
    loss = SACLoss(
        tanh_normal_policy(observation_space, action_space),
        qvalue,
        num_qvalue_nets=2,
        target_entropy=-float(n_act),
    )
    loss.make_value_estimator(gamma=0.9)
    return loss


def dqn_loss(observation_space: Any, action_space: Any, categorical: bool = False) -> DQNLoss:
    loss = DQNLoss(q_policy(observation_space, action_space, categorical), delay_value=True)
    loss.make_value_estimator(gamma=0.9)
    return loss
