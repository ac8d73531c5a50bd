"""A recurrent actor's state, one per env of a worker: zeros at each episode start, fed to the
actor with each observation, and recorded with the row of the step it entered (R2D2's stored
state; see :mod:`netrl.actor`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from netrl.actor import ActorModule
from netrl.samples.columns import check_extra_spec

__all__ = ["RecurrentStates"]


class RecurrentStates:
    """The per-env states of ``actor`` (which declares ``recurrent_state()``) for ``n`` envs."""

    def __init__(self, actor: ActorModule, n: int) -> None:
        spec = check_extra_spec(actor.recurrent_state(), type(actor).__name__)
        self.values = {k: np.zeros((n, *shape), dtype) for k, (shape, dtype) in spec.items()}
        self.own_extras = bool(actor.extra_outputs())

    def reset(self, i: int) -> None:
        """Env ``i`` starts an episode: its state is the initial one."""
        for v in self.values.values():
            v[i] = 0

    def act(self, actor: ActorModule, obs: Any, test: bool, idx: np.ndarray | None = None,
            views: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """The actions for ``obs`` (one env's observation when ``idx`` is None, else the batch of
        envs ``idx``; ``views``: their windows, :mod:`netrl.memory.act_views`), and each row's
        extras: the actor's own, and the state that entered the step. The envs' states
        advance."""
        rows = np.zeros(1, np.intp) if idx is None else idx
        # copies: the rows' record keeps them
        entering = {k: v[rows] for k, v in self.values.items()}
        if idx is None:
            out = actor.act_(obs, test=test, state={k: v[0] for k, v in entering.items()}, views=views)
        else:
            out = actor.act_(obs, test=test, batch=True, state=entering, views=views)
        actions, new_state = out[0], out[1]
        extras = dict(out[2]) if self.own_extras else {}
        for k, v in self.values.items():
            v[rows] = new_state[k]
        extras.update({k: v[0] for k, v in entering.items()} if idx is None else entering)
        return actions, extras

    def random_extras(self, extras: dict[str, Any]) -> dict[str, Any]:
        """A random action's row: the actor's own extra outputs are zeros (it did not choose the
        action), the state is the one that entered the step."""
        return {k: v if k in self.values else np.zeros_like(v) for k, v in extras.items()}
