"""Encoders: observations into the feature vectors a network reads.

:func:`flat_obs` concatenates every leaf of a (possibly nested) observation as floats (SAC's MLPs);
:class:`ObsEncoder` does the same with discrete leaves one-hot and the action mask left out (DQN,
PPO); :class:`ConvEncoder` reads stacked uint8 frames through two convolutions and spatial-softmax
keypoints (the CNN actor-critic).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import gymnasium
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from netrl.agents.common.masks import MASK_KEY

__all__ = ["ConvEncoder", "EncoderHead", "ObsEncoder", "SpatialSoftmax", "flat_obs", "obs_dim"]

EncoderHead = Literal["keypoints", "linear"]


def _leaves(obs: Any) -> list[torch.Tensor]:
    if isinstance(obs, (tuple, list)):
        return [leaf for o in obs for leaf in _leaves(o)]
    if isinstance(obs, dict):
        return [leaf for k in sorted(obs) for leaf in _leaves(obs[k])]
    return [obs]


def flat_obs(obs: Any) -> torch.Tensor:
    """Every leaf of a (possibly nested) batch of observations, in one ``(batch, features)``."""
    parts = [o.reshape(o.shape[0], -1).float() for o in _leaves(obs)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, -1)


def obs_dim(space: gymnasium.Space) -> int:
    """Number of features :func:`flat_obs` produces for one observation of ``space``."""
    if isinstance(space, gymnasium.spaces.Box):
        return int(np.prod(space.shape))
    return int(gymnasium.spaces.flatdim(space))


class ObsEncoder(nn.Module):
    """Every observation leaf but the action mask, flattened into one float vector: a ``Box`` as it
    is, a ``Discrete`` or ``MultiDiscrete`` leaf one-hot (an index is not a magnitude), a
    ``MultiBinary`` leaf as 0/1. ``owner`` names the agent in errors ("DQN")."""

    def __init__(self, space: gymnasium.Space, owner: str) -> None:
        super().__init__()
        self.owner = owner
        # per leaf: its path, its kind, its sizes and the value of each one's first choice
        self.leaves: list[tuple[tuple[str | int, ...], str, list[int], list[int]]] = []
        self._add(space, ())
        if not self.leaves:
            raise ValueError(f"observation_space {space} has no leaf besides the action mask for "
                             f"{owner}'s networks to see")
        self.dim = sum(sum(sizes) for _, _, sizes, _ in self.leaves)

    def _add(self, space: gymnasium.Space, path: tuple[str | int, ...]) -> None:
        name = "observation_space" + "".join(f"[{p!r}]" for p in path)
        if isinstance(space, gymnasium.spaces.Dict):
            for key, sub in space.spaces.items():
                if not (path == () and key == MASK_KEY):
                    self._add(sub, (*path, key))
        elif isinstance(space, gymnasium.spaces.Tuple):
            for i, sub in enumerate(space.spaces):
                self._add(sub, (*path, i))
        elif isinstance(space, (gymnasium.spaces.Box, gymnasium.spaces.MultiBinary)):
            self.leaves.append((path, "flat", [int(np.prod(space.shape))], [0]))
        elif isinstance(space, gymnasium.spaces.Discrete):
            self.leaves.append((path, "onehot", [int(space.n)], [int(space.start)]))
        elif isinstance(space, gymnasium.spaces.MultiDiscrete):
            self.leaves.append((path, "onehot", [int(n) for n in space.nvec.reshape(-1)],
                                [int(s) for s in np.asarray(space.start).reshape(-1)]))
        else:
            raise ValueError(f"{name} is a {type(space).__name__}, which {self.owner} cannot "
                             "encode: use Box, Discrete, MultiDiscrete or MultiBinary leaves in "
                             "Dict and Tuple spaces")

    def forward(self, obs: Any) -> torch.Tensor:
        parts = []
        for path, kind, sizes, starts in self.leaves:
            x = obs
            for p in path:
                x = x[p]
            x = x.reshape(x.shape[0], -1)
            if kind == "flat":
                parts.append(x.float())
            else:
                for j, (n, start) in enumerate(zip(sizes, starts, strict=True)):
                    parts.append(F.one_hot(x[:, j].long() - start, n).float())
        return parts[0] if len(parts) == 1 else torch.cat(parts, -1)


class SpatialSoftmax(nn.Module):
    """``(B, C, H, W)`` feature maps -> ``(B, 2C)``: where each channel fires, as the expected
    (x, y) in [-1, 1] under a softmax over positions (Levine et al., "End-to-End Training of Deep
    Visuomotor Policies", 2016)."""

    def __init__(self, height: int, width: int) -> None:
        super().__init__()
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width),
                                indexing="ij")
        self.grid: torch.Tensor
        self.register_buffer("grid", torch.stack([xs.reshape(-1), ys.reshape(-1)], 1),
                             persistent=False)

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        p = maps.flatten(2).softmax(-1)  # (B, C, H*W)
        return (p @ self.grid).flatten(1)


class ConvEncoder(nn.Module):
    """``(B, S, H, W)`` uint8 frames -> ``(B, features)``.

    A 4x4 patch convolution (stride 4), then a 3x3 convolution, then either *keypoints* (the
    default: a spatial softmax gives each channel's (x, y), which suits tasks about where things
    are) or *linear* (stride 2, then a linear layer over the flattened maps). A linear layer,
    LayerNorm and tanh make the features.
    """

    def __init__(self, observation_space: gymnasium.Space, features: int = 64,
                 channels: Sequence[int] = (16, 32), head: EncoderHead = "keypoints") -> None:
        super().__init__()
        shape = getattr(observation_space, "shape", None)
        if (not isinstance(observation_space, gymnasium.spaces.Box) or shape is None
                or len(shape) != 3):
            raise ValueError(f"ConvEncoder needs a (stack, height, width) Box observation space "
                             f"(got {observation_space})")
        # forward() scales by 1/255: a float space would come out 255 times too small
        if observation_space.dtype != np.uint8:
            raise ValueError(f"ConvEncoder takes uint8 frames (0-255), which it scales to [0, 1] "
                             f"(got a {observation_space.dtype} space: convert frames to uint8, or "
                             "give the encoder your own scaling)")
        stack, height, width = shape
        if min(height, width) < 16:
            raise ValueError(f"ConvEncoder needs frames of at least 16x16 pixels "
                             f"(got {height}x{width})")
        if head not in ("keypoints", "linear"):
            raise ValueError(f"ConvEncoder head must be 'keypoints' or 'linear' (got {head!r})")
        c1, c2 = channels
        patches = nn.Sequential(nn.Conv2d(stack, c1, 4, stride=4), nn.ReLU())
        if head == "keypoints":
            self.conv = nn.Sequential(*patches, nn.Conv2d(c1, c2, 3, padding=1),
                                      SpatialSoftmax((height - 4) // 4 + 1, (width - 4) // 4 + 1))
        else:
            self.conv = nn.Sequential(*patches, nn.Conv2d(c1, c2, 3, stride=2), nn.ReLU(),
                                      nn.Flatten())
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, stack, height, width)).shape[1]
        self.head = nn.Sequential(nn.Linear(flat, features), nn.LayerNorm(features), nn.Tanh())
        self.features = features

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(frames.float() * (1.0 / 255.0)))
