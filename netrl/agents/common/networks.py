"""Networks: ReLU MLPs (SAC, DQN), orthogonally initialised tanh MLPs (PPO, as SB3's) and the twin
Q networks of SAC's critic, evaluated as one batched MLP.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TwinQ", "mlp", "tanh_mlp"]


def mlp(sizes: Sequence[int], activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Linear layers through ``sizes``, ``activation`` between them (none after the last)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


def tanh_mlp(n_in: int, hidden: Sequence[int], n_out: int, out_gain: float) -> nn.Sequential:
    """Tanh MLP, orthogonally initialised (gain sqrt(2) inside, ``out_gain`` on the last layer),
    biases zero, as SB3's PPO."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(n_in, h), nn.Tanh()]
        n_in = h
    layers.append(nn.Linear(n_in, n_out))
    for i, layer in enumerate(m for m in layers if isinstance(m, nn.Linear)):
        nn.init.orthogonal_(layer.weight, out_gain if i == len(hidden) else math.sqrt(2))
        nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class TwinQ(nn.Module):
    """Two Q networks evaluated as one batched MLP: their weights stacked along a leading
    dimension of 2."""

    def __init__(self, in_dim: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        sizes = [in_dim, *hidden_sizes, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in itertools.pairwise(sizes):
            bound = 1 / math.sqrt(fan_in)  # nn.Linear's default initialisation
            weight = torch.empty(2, fan_in, fan_out).uniform_(-bound, bound)
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(torch.empty(2, 1, fan_out).uniform_(-bound, bound)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: (batch, in_dim) -> Q values (2, batch)."""
        h = x.unsqueeze(0).expand(2, *x.shape)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            # compiled, the bias add fuses with the ReLU instead of being copied into the
            # product's output first
            h = torch.bmm(h, w) + b if torch.compiler.is_compiling() else torch.baddbmm(b, h, w)
            if i < last:
                h = F.relu(h)
        return h.squeeze(-1)
