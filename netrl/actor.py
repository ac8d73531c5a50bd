"""ActorModule: the policy a RolloutWorker runs and the Trainer optimises, as in tmrl.

A subclass is a ``torch.nn.Module`` built from ``(observation_space, action_space)`` that implements
``act(obs, test=False)``, where ``obs`` is already a batch of tensors (or a tuple/dict of them) with a leading
dimension ``B``, on the module's device. The worker never calls ``act`` itself: it calls :meth:`ActorModule.act_`,
which collates raw numpy observations. The calling sequence::

    actor = MyActorModule(env.observation_space, env.action_space).to(device)
    action = actor.act_(obs, test=False)                  # one observation -> one action (B = 1)
    actions = actor.act_(obs_batch, test=False, batch=True)  # N observations (a vector env's) -> N actions

The ``act`` contract, which the built-in agents follow and new ones should:

* ``act`` returns a numpy array of shape ``(B, *action_space.shape)``: one action per observation, for any
  ``B >= 1``. A Discrete action space has shape ``()``, so its batch of actions has shape ``(B,)``.
* ``act_(obs)`` (one observation) unwraps such a ``(1, *action_space.shape)`` result to the single action.
* ``act_(obs, batch=True)`` requires it, and raises ValueError naming the actor when ``act`` returns anything
  else for a batch of ``N > 1``: a worker with ``worker.num_envs > 1`` makes one such call per vector step.
* tmrl-style actors, whose ``act`` returns one action shaped like the action space (``a.squeeze()``, ``a[0]``),
  keep working through ``act_(obs)``, so with ``worker.num_envs = 1``; they need the change above for more envs.
* ``test`` is one flag for the whole batch. A worker whose envs mix test and training episodes calls ``act_``
  once for each group.

Extra outputs: an actor may return named per-observation values with its actions (a log-probability, a value
estimate), which the worker records in each row and the trainer's memory hands the agent as ``Batch.extra`` (see
:mod:`netrl.samples`). It declares them with :meth:`ActorModule.extra_outputs`, and its ``act`` then returns
``(actions, {name: array of shape (B, *shape)})``; ``act_`` returns ``(action, {name: array of shape})`` for one
observation and ``(actions, extras)`` for a batch. An actor that declares none returns actions alone, as before::

    def extra_outputs(self):
        return {"action_log_prob": ((), "float32"), "state_value": ((), "float32")}
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import gymnasium
import numpy as np
import torch

from netrl.samples import ExtraSpec, check_extra_spec, tree_map

__all__ = ["ActorModule", "declared_extras"]


class ActorModule(torch.nn.Module, ABC):
    """Interface of the policy shared by the RolloutWorker and the TrainingAgent."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space) -> None:
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space

    @property
    def device(self) -> torch.device:
        for p in self.parameters():
            return p.device
        return torch.device("cpu")

    def extra_outputs(self) -> ExtraSpec:
        """The extra outputs ``act`` returns with its actions: name -> (per-row shape, numpy dtype string), e.g.
        ``{"action_log_prob": ((), "float32")}``. Names are lowercase identifiers of at most 32 characters. None by
        default: ``act`` returns actions only."""
        return {}

    @abstractmethod
    def act(self, obs: Any, test: bool = False) -> Any:
        """Compute actions from a batch of observations (tensors with a leading dimension ``B``).

        Args:
            obs: a tensor, or a tuple/dict of tensors, shaped ``(B, *obs_shape)`` on this module's device.
            test: True for test episodes, which usually act deterministically.

        Returns:
            ``B`` actions as a numpy array shaped ``(B, *action_space.shape)`` (see the module's docstring; a
            tmrl-style actor may return the one action of a batch of 1 instead, and then serves one env only).
            With :meth:`extra_outputs` declared: ``(actions, {name: array shaped (B, *shape)})``.
        """

    def act_(self, obs: Any, test: bool = False, batch: bool = False) -> Any:
        """Collate raw observations to tensors on this module's device and call :meth:`act`.

        Args:
            obs: one observation (``batch=False``), or a tree whose leaves have a leading dimension ``N``, one row
                per env, as Gymnasium's vector envs return them (``batch=True``).
            test: passed on to :meth:`act`.
            batch: whether ``obs`` is a batch.

        Returns:
            one action shaped like the action space, or ``N`` actions shaped ``(N, *action_space.shape)``; with
            :meth:`extra_outputs` declared, ``(actions, extras)``, each extra shaped ``(*shape)`` for one
            observation and ``(N, *shape)`` for a batch, in its declared dtype.

        Raises:
            ValueError: ``batch`` is True and :meth:`act` did not return one action per observation, or the extras
                are not the declared ones, in their declared shapes.
        """
        declared = self.extra_outputs()
        if declared:
            return self._act_with_extras(obs, test, batch, declared)
        return self._act_only(obs, test, batch)

    def _act_only(self, obs: Any, test: bool, batch: bool, out: Any = None) -> Any:
        """``act_`` for actions alone (``out``: what ``act`` already returned)."""
        device = self.device
        shape = getattr(self.action_space, "shape", None)
        if not batch:
            if out is None:
                batched = tree_map(lambda x: torch.as_tensor(np.asarray(x), device=device).unsqueeze(0), obs)
                with torch.no_grad():
                    out = self.act(batched, test=test)
            if shape is not None and np.shape(out) == (1, *shape):
                return np.asarray(out)[0]
            return out  # a tmrl-style actor's single action
        n = _rows(obs)
        if out is None:
            tensors = tree_map(lambda x: torch.as_tensor(np.asarray(x), device=device), obs)
            with torch.no_grad():
                out = self.act(tensors, test=test)
        if shape is not None and np.shape(out) != (n, *shape):
            raise ValueError(f"{type(self).__name__}.act returned an array of shape {np.shape(out)} for a batch of {n} "
                             f"observations; a worker with several envs needs one action per observation, shape "
                             f"{(n, *shape)}: make act() return the whole batch (see netrl.actor), or run this actor "
                             "with worker.num_envs = 1")
        return np.asarray(out)

    def _act_with_extras(self, obs: Any, test: bool, batch: bool, declared: ExtraSpec) -> Any:
        name = type(self).__name__
        spec = check_extra_spec(declared, name)
        tensors = tree_map(lambda x: torch.as_tensor(np.asarray(x), device=self.device), obs)
        if not batch:
            tensors = tree_map(lambda t: t.unsqueeze(0), tensors)
        with torch.no_grad():
            out = self.act(tensors, test=test)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            raise ValueError(f"{name} declares extra outputs {sorted(spec)}, so its act() must return (actions, "
                             f"{{name: array}}); it returned a {type(out).__name__}")
        actions, extras = out
        n = 1 if not batch else _rows(obs)
        if extras.keys() != spec.keys():
            raise ValueError(f"{name}.act() returned the extra outputs {sorted(extras)}, but extra_outputs() declares "
                             f"{sorted(spec)}: return exactly those")
        checked = {}
        for key, (shape, dtype) in spec.items():
            value = extras[key]
            value = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
            if value.shape != (n, *shape) or (value.dtype.kind == "f" and dtype.kind in "biu"):
                raise ValueError(f"{name}.act() returned the extra output {key!r} as {value.dtype} of shape "
                                 f"{value.shape} for {n} observations; extra_outputs() declares {dtype} of shape "
                                 f"{shape} per observation, so it must be shaped {(n, *shape)}")
            checked[key] = value.astype(dtype, copy=False) if batch else value[0].astype(dtype, copy=False)
        return self._act_only(obs, test, batch, actions), checked


def declared_extras(actor: Any) -> ExtraSpec:
    """What ``actor`` declares with ``extra_outputs()`` (``{}`` for an actor that has none, tmrl-style ones too),
    checked; ValueError naming the actor and the entry that is wrong."""
    method = getattr(actor, "extra_outputs", None)
    if method is None:
        return {}
    spec = check_extra_spec(method(), type(actor).__name__)
    return {name: (shape, dtype.str) for name, (shape, dtype) in spec.items()}


def _rows(tree: Any) -> int:
    """The leading dimension of a batch of observations (that of its first leaf)."""
    found: list[int] = []
    tree_map(lambda x: found.append(int(np.shape(x)[0])) if not found else None, tree)
    return found[0]
