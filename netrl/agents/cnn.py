"""A small CNN actor-critic for SAC on stacked grayscale frames, sized to train on a CPU.

``CNNActorCritic`` fits :class:`~netrl.agents.sac.SACAgent`'s ``model_cls`` contract (``.actor``, ``.critic``,
``.q(obs, act, critic=None)``)::

    frames (B, S, 64, 64) uint8 -> /255 -> ConvEncoder -> 64 features -+-> actor MLP -> squashed Gaussian action
        (4x4 patches, 3x3 conv, spatial-softmax keypoints)              +-> twin Q MLPs (with the action)

The keypoint head turns each channel into the (x, y) where it fires, which suits tasks about where things are: on
ImageReach it learned within 10,000 steps what a flattened-map linear head had not learned in 36,000. The critic
and the actor share one encoder, trained by the critic's loss only; the actor reads its features detached (as in
SAC-AE and DrQ), so the actor loss never back-propagates through the convolutions. The target critic is a copy of the
critic, encoder included. The actor owns the encoder as a submodule, so its ``state_dict`` (what workers load) is
self-contained; a worker's actor simply has its own encoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import gymnasium
import numpy as np
import torch
from torch import nn

from netrl.agents.sac import MLPActor, TwinQ

__all__ = ["CNNActor", "CNNActorCritic", "ConvEncoder", "EncoderHead", "SpatialSoftmax"]


EncoderHead = Literal["keypoints", "linear"]


class SpatialSoftmax(nn.Module):
    """``(B, C, H, W)`` feature maps -> ``(B, 2C)``: where each channel fires, as the expected (x, y) in [-1, 1]
    under a softmax over positions (Levine et al., "End-to-End Training of Deep Visuomotor Policies", 2016)."""

    def __init__(self, height: int, width: int) -> None:
        super().__init__()
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij")
        self.grid: torch.Tensor
        self.register_buffer("grid", torch.stack([xs.reshape(-1), ys.reshape(-1)], 1), persistent=False)

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        p = maps.flatten(2).softmax(-1)  # (B, C, H*W)
        return (p @ self.grid).flatten(1)


class ConvEncoder(nn.Module):
    """``(B, S, H, W)`` uint8 frames -> ``(B, features)``.

    A 4x4 patch convolution (stride 4), then a 3x3 convolution, then either *keypoints* (the default: a spatial
    softmax gives each channel's (x, y), which suits tasks about where things are) or *linear* (stride 2, then a
    linear layer over the flattened maps). A linear layer, LayerNorm and tanh make the features.
    """

    def __init__(self, observation_space: gymnasium.Space, features: int = 64, channels: Sequence[int] = (16, 32),
                 head: EncoderHead = "keypoints") -> None:
        super().__init__()
        shape = getattr(observation_space, "shape", None)
        if not isinstance(observation_space, gymnasium.spaces.Box) or shape is None or len(shape) != 3:
            raise ValueError(f"ConvEncoder needs a (stack, height, width) Box observation space "
                             f"(got {observation_space})")
        if observation_space.dtype != np.uint8:  # forward() scales by 1/255: a float space would come out 255x small
            raise ValueError(f"ConvEncoder takes uint8 frames (0-255), which it scales to [0, 1] (got a "
                             f"{observation_space.dtype} space: convert frames to uint8, or give the encoder your own "
                             "scaling)")
        stack, height, width = shape
        if min(height, width) < 16:
            raise ValueError(f"ConvEncoder needs frames of at least 16x16 pixels (got {height}x{width})")
        if head not in ("keypoints", "linear"):
            raise ValueError(f"ConvEncoder head must be 'keypoints' or 'linear' (got {head!r})")
        c1, c2 = channels
        patches = nn.Sequential(nn.Conv2d(stack, c1, 4, stride=4), nn.ReLU())
        if head == "keypoints":
            self.conv = nn.Sequential(*patches, nn.Conv2d(c1, c2, 3, padding=1),
                                      SpatialSoftmax((height - 4) // 4 + 1, (width - 4) // 4 + 1))
        else:
            self.conv = nn.Sequential(*patches, nn.Conv2d(c1, c2, 3, stride=2), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, stack, height, width)).shape[1]
        self.head = nn.Sequential(nn.Linear(flat, features), nn.LayerNorm(features), nn.Tanh())
        self.features = features

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(frames.float() * (1.0 / 255.0)))


class CNNActor(MLPActor):
    """:class:`~netrl.agents.sac.MLPActor` on top of a :class:`ConvEncoder` (an ``ActorModule`` for workers)."""

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
    """Actor plus twin critic sharing one encoder; ``q(obs, act)`` returns both Q estimates, shape (2, batch)."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space,
                 hidden_sizes: Sequence[int] = (256, 256), features: int = 64, head: EncoderHead = "keypoints") -> None:
        super().__init__()
        encoder = ConvEncoder(observation_space, features, head=head)
        self.critic = _CNNCritic(encoder, int(np.prod(action_space.shape or ())), hidden_sizes)
        self.actor = CNNActor(observation_space, action_space, hidden_sizes, encoder=encoder, detach_encoder=True)

    def q(self, obs: Any, act: torch.Tensor, critic: nn.Module | None = None) -> torch.Tensor:
        return (critic or self.critic)(obs, act)
