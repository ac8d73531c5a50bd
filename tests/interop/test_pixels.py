"""Images under TorchRL's key: to_tensordict, TensorDictActor and TorchRLAgent take the
observation's key ("pixels" for TorchRL's pixel envs and CNN policies, or a Dict's entries mapped
to keys), with a FrameStackMemory batch and a small ConvNet policy."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("torchrl")

from torchrl.data import OneHot
from torchrl.modules import MLP, ConvNet, QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate

from netrl.interop.loss_agent import TorchRLAgent
from netrl.interop.policies import TensorDictActor
from netrl.interop.tensordicts import to_tensordict
from netrl.memory.frames import FrameStackMemory
from netrl.memory.replay import ReplayMemory
from tests.interop.rows import feed

FRAME = gymnasium.spaces.Box(0, 255, (8, 8), np.uint8)
STACK = 3
FOUR = gymnasium.spaces.Discrete(4)
DICT = gymnasium.spaces.Dict(
    {
        "image": gymnasium.spaces.Box(0, 255, (8, 8), np.uint8),
        "speed": gymnasium.spaces.Box(-1, 1, (2,)),
    }
)


def frame(k: int) -> np.ndarray:
    return np.full((8, 8), k % 256, np.uint8)


def frames_batch() -> Any:
    memory = feed(
        FrameStackMemory(memory_size=80, batch_size=16, stack=STACK, seed=0),
        obs=frame,
        act=lambda k: np.int64(k % 4),
        overlap=STACK,
    )
    return memory.sample()


class Scaled(nn.Module):
    """uint8 frames to floats in [0, 1], as TorchRL's ToTensorImage would leave them."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.net(pixels.float() / 255.0)  # type: ignore[no-any-return]


def conv_q_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """A small CNN Q network reading "pixels" ([S, H, W] stacks), as TorchRL's Atari DQN."""
    net = nn.Sequential(
        ConvNet(num_cells=[8], kernel_sizes=[3], strides=[2]),
        MLP(in_features=8 * 3 * 3, out_features=int(action_space.n), num_cells=[16]),
    )
    return QValueActor(Scaled(net), in_keys=["pixels"], spec=OneHot(int(action_space.n)))


def test_a_frame_stack_batch_goes_under_pixels_untouched() -> None:
    batch = frames_batch()
    td = to_tensordict(batch, FRAME, FOUR, observation_key="pixels")
    assert "observation" not in td.keys() and "observation" not in td["next"].keys()
    assert td["pixels"].shape == (16, STACK, 8, 8) and td["pixels"].dtype == torch.uint8
    assert td["pixels"].data_ptr() == batch.obs.data_ptr()  # placed, not copied
    assert td["next", "pixels"].data_ptr() == batch.next_obs.data_ptr()


def test_a_dict_observations_entries_go_to_keys_of_their_own() -> None:
    memory = feed(
        ReplayMemory(memory_size=60, batch_size=8, seed=0),
        obs=lambda k: {"image": frame(k), "speed": np.full(2, k / 100, np.float32)},
    )
    batch = memory.sample()
    keys = {"image": "pixels", "speed": "observation"}
    td = to_tensordict(batch, DICT, gymnasium.spaces.Box(-1, 1, (1,)), observation_key=keys)
    assert td["pixels"].dtype == torch.uint8 and td["observation"].shape == (8, 2)
    assert td["next", "pixels"].data_ptr() == batch.next_obs["image"].data_ptr()


@pytest.mark.parametrize(
    ("key", "space", "error"),
    [
        ("action", FRAME, "a key of the transition itself"),
        ({"image": "pixels"}, DICT, r"the entries \['image'\]; the observation space's are"),
        ({"image": "pixels", "speed": "pixels"}, DICT, "give each entry a key of its own"),
        ({"image": "pixels"}, FRAME, "pass one key"),
    ],
)
def test_an_observation_key_that_cannot_hold_the_observation_is_refused(
    key: Any, space: Any, error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        TensorDictActor(space, FOUR, policy=conv_q_policy, observation_key=key)


def test_a_conv_policy_acts_on_pixels_and_a_dqn_loss_trains_on_the_frame_batch() -> None:
    torch.manual_seed(0)
    stacked = gymnasium.spaces.Box(0, 255, (STACK, 8, 8), np.uint8)
    actor = TensorDictActor(stacked, FOUR, policy=conv_q_policy, observation_key="pixels")
    obs = np.stack([np.stack([frame(k + j) for j in range(STACK)]) for k in range(5)])
    actions, extras = actor.act_(obs, test=True, batch=True)
    assert actions.shape == (5,) and extras["action_value"].shape == (5, 4)

    def make_loss(observation_space: Any, action_space: Any) -> DQNLoss:
        loss = DQNLoss(conv_q_policy(observation_space, action_space), delay_value=True)
        loss.make_value_estimator(gamma=0.9)
        return loss

    agent = TorchRLAgent(
        stacked,
        FOUR,
        "cpu",
        loss=make_loss,
        optimizer=lambda loss: torch.optim.Adam(loss.parameters(), 1e-3),
        updater=lambda loss: SoftUpdate(loss, tau=0.05),
        observation_key="pixels",
    )
    batch = frames_batch()
    before = [p.clone() for p in agent.loss.parameters()]
    metrics = agent.train(batch)
    assert np.isfinite(metrics["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.loss.parameters(), strict=True))
    # what the workers run reads the same key
    assert agent.get_actor().act_(obs[0], test=True)[0] in range(4)
