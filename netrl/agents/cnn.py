"""A small CNN actor-critic for SAC on stacked grayscale frames, sized to train on a CPU.

``CNNActorCritic`` fits :class:`~netrl.agents.sac.SACAgent`'s ``model_cls`` contract (``.actor``,
``.critic``, ``.q(obs, act, critic=None)``)::

    frames (B, S, 64, 64) uint8 -> /255 -> ConvEncoder -> 64 features
        (4x4 patches, 3x3 conv, spatial-softmax keypoints) |
                                                           +-> actor MLP -> squashed Gaussian action
                                                           +-> twin Q MLPs (with the action)

The keypoint head turns each channel into the (x, y) where it fires, which suits tasks about
where things are: on ImageReach it learned within 10,000 steps what a flattened-map linear head
had not learned in 36,000. The critic and the actor share one encoder, trained by the critic's
loss only; the actor reads its features detached (as in SAC-AE and DrQ), so the actor loss never
back-propagates through the convolutions. The target critic is a copy of the critic, encoder
included. The actor owns the encoder as a submodule, so its ``state_dict`` (what workers load) is
self-contained; a worker's actor simply has its own encoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
from torch import nn

from netrl.agents.common.actors import MLPActor
from netrl.agents.common.encoders import ConvEncoder, EncoderHead
from netrl.agents.common.networks import TwinQ

__all__ = ["CNNActor", "CNNActorCritic"]


class CNNActor(MLPActor):
    """:class:`~netrl.agents.common.actors.MLPActor` on top of a
    :class:`~netrl.agents.common.encoders.ConvEncoder` (an ``ActorModule`` for workers)."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space,
                 hidden_sizes: Sequence[int] = (256, 256), encoder: ConvEncoder | None = None,
                 detach_encoder: bool = False, head: EncoderHead = "keypoints") -> None:
        encoder = encoder or ConvEncoder(observation_space, head=head)
        feature_space = gymnasium.spaces.Box(-1.0, 1.0, (encoder.features,), np.float32)
        super().__init__(feature_space, action_space, hidden_sizes)
        self.observation_space = observation_space
        self.encoder = encoder
        self.detach_encoder = detach_encoder

    def features(self, obs: Any) -> torch.Tensor:
        h = self.encoder(obs)
        return self.net(h.detach() if self.detach_encoder else h)


class _CNNCritic(nn.Module):
    def __init__(self, encoder: ConvEncoder, act_dim: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.encoder = encoder
        self.q = TwinQ(encoder.features + act_dim, hidden_sizes)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.q(torch.cat([self.encoder(obs), act.reshape(act.shape[0], -1)], -1))


class CNNActorCritic(nn.Module):
    """Actor plus twin critic sharing one encoder; ``q(obs, act)`` returns both Q
    estimates, shape (2, batch)."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space,
                 hidden_sizes: Sequence[int] = (256, 256), features: int = 64, head: EncoderHead = "keypoints") -> None:
        super().__init__()
        encoder = ConvEncoder(observation_space, features, head=head)
        self.critic = _CNNCritic(encoder, int(np.prod(action_space.shape or ())), hidden_sizes)
        self.actor = CNNActor(observation_space, action_space, hidden_sizes, encoder=encoder, detach_encoder=True)

    def q(self, obs: Any, act: torch.Tensor, critic: nn.Module | None = None) -> torch.Tensor:
        return (critic or self.critic)(obs, act)
