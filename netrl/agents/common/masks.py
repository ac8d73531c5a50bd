"""Action masks, Gymnasium's and PettingZoo's convention (TorchRL's key): a ``Dict`` observation
with an ``"action_mask"`` entry, one 0/1 per choice of the action space (``n`` for ``Discrete(n)``,
``sum(nvec)`` for ``MultiDiscrete``). No network reads the mask
(:class:`~netrl.agents.common.encoders.ObsEncoder` leaves it out); an actor reads it so that it
never chooses a masked action.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import torch

__all__ = ["MASK_KEY", "action_mask", "check_allows_an_action", "check_mask_space"]

MASK_KEY = "action_mask"


def check_mask_space(observation_space: gymnasium.Space, width: int) -> None:
    """ValueError unless the observation's mask, where it has one, is one 0/1 per choice (``width``
    of them)."""
    if not (isinstance(observation_space, gymnasium.spaces.Dict)
            and MASK_KEY in observation_space.spaces):
        return
    mask = observation_space.spaces[MASK_KEY]
    if (not isinstance(mask, (gymnasium.spaces.MultiBinary, gymnasium.spaces.Box))
            or mask.shape != (width,)):
        raise ValueError(f'observation_space["{MASK_KEY}"] is {mask}; it must be a '
                         f"MultiBinary({width}) or a Box of shape ({width},): one 0/1 per choice "
                         "of the action space")


def action_mask(obs: Any) -> torch.Tensor | None:
    """The batch's action mask as booleans, or None when the observations carry none."""
    if isinstance(obs, dict) and MASK_KEY in obs:
        return obs[MASK_KEY].reshape(obs[MASK_KEY].shape[0], -1) != 0
    return None


def check_allows_an_action(mask: torch.Tensor, sizes: Sequence[int]) -> None:
    """ValueError naming the first observation whose mask allows no choice in an action
    dimension."""
    for b, part in enumerate(torch.split(mask, list(sizes), -1)):
        empty = ~part.any(-1)
        if bool(empty.any()):
            raise ValueError(f'the "{MASK_KEY}" of observation {int(empty.nonzero()[0])} allows '
                             f"no action in action dimension {b}: an env must allow at least one "
                             "action per dimension")
