"""Module helpers kept from ``tmrl.nn``, for TrainingAgents ported from tmrl's tutorial.

A SAC agent often keeps a gradient-free view of its model to hand the actor out::

    # in the class body
    model_nograd = cached_property(lambda self: no_grad(copy_shared(self.model)))
"""

from __future__ import annotations

import copy
from typing import TypeVar

import torch

__all__ = ["copy_shared", "no_grad"]

M = TypeVar("M", bound=torch.nn.Module)


def copy_shared(module: M) -> M:
    """A copy of ``module`` whose parameters and buffers share memory with the original's: the
    copy is a second set of module objects (so its ``requires_grad`` flags can differ) that always
    holds the original's current values."""
    twin = copy.deepcopy(module)
    original = module.state_dict(keep_vars=True)
    for name, tensor in twin.state_dict(keep_vars=True).items():
        tensor.data = original[name].data  # same storage; the copy's own tensor objects stay
    return twin


def no_grad(module: M) -> M:
    """Turn off gradients for every parameter of ``module`` and return it."""
    for param in module.parameters():
        param.requires_grad_(False)
    return module
