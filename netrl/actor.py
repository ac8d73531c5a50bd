"""ActorModule: the policy a RolloutWorker runs and the Trainer optimises, as in tmrl.

A subclass is a ``torch.nn.Module`` built from ``(observation_space, action_space)`` that implements
``act(obs, test=False)``, where ``obs`` is already a batch of tensors (or a tuple/dict of them)
with a leading dimension ``B``, on the module's device. The worker never calls ``act`` itself: it
calls :meth:`ActorModule.act_`, which collates raw numpy observations. The calling sequence::

    actor = MyActorModule(env.observation_space, env.action_space).to(device)
    action = actor.act_(obs, test=False)                     # one observation -> one action (B = 1)
    actions = actor.act_(obs_batch, test=False, batch=True)  # N observations (a vector env's)
                                                             # -> N actions

The ``act`` contract, which the built-in agents follow and new ones should:

* ``act`` returns a numpy array of shape ``(B, *action_space.shape)``: one action per
  observation, for any ``B >= 1``. A Discrete action space has shape ``()``, so its batch of
  actions has shape ``(B,)``.
* ``act_(obs)`` (one observation) unwraps such a ``(1, *action_space.shape)``
  result to the single action.
* ``act_(obs, batch=True)`` requires it, and raises ValueError naming the actor when ``act``
  returns anything else for a batch of ``N > 1``: a worker with ``worker.num_envs > 1`` makes
  one such call per vector step.
* tmrl-style actors, whose ``act`` returns one action shaped like the action space (``a.squeeze()``,
  ``a[0]``), keep working through ``act_(obs)``, so with ``worker.num_envs = 1``; they need
  the change above for more envs.
* ``test`` is one flag for the whole batch. A worker whose envs mix test and training episodes
  calls ``act_`` once for each group.

Extra outputs: an actor may return named per-observation values with its actions (a
log-probability, a value estimate), which the worker records in each row and the trainer's
memory hands the agent as ``Batch.extra`` (see :mod:`netrl.samples`). It declares them with
:meth:`ActorModule.extra_outputs`, and its ``act`` then returns ``(actions, {name: array of shape
(B, *shape)})``; ``act_`` returns ``(action, {name: array of shape})`` for one observation and
``(actions, extras)`` for a batch. An actor that declares none returns actions alone, as before::

    def extra_outputs(self):
        return {"action_log_prob": ((), "float32"), "state_value": ((), "float32")}

Recurrent state: an actor that remembers (an RNN over its observations, for a partially observed
env) declares its per-env state with :meth:`ActorModule.recurrent_state`, name -> (per-env
shape, dtype), TorchRL's names::

    def recurrent_state(self):  # a GRU; an LSTM has "recurrent_state_h" and "recurrent_state_c"
        return {"recurrent_state": ((1, 64), "float32")}

Its ``act`` then takes the state and returns the next one: ``act(obs, state=None, test=False)``
with ``state`` a dict of tensors shaped ``(B, *shape)`` (None: the initial state, zeros),
returning ``(actions, new_state)``, or ``(actions, new_state, extras)`` when it declares
extra outputs too. The worker keeps one state per env (zeros at each episode start) and
calls ``act_(obs, test, batch, state=...)``, which returns ``(actions, new_state)`` or
``(actions, new_state, extras)`` with numpy arrays. The state that *entered* each step
travels with the step's row as extra outputs of the same names (:func:`declared_extras` adds
them), so a memory stores it with each row, as R2D2 does, and a sampled sequence starts from
the state the worker really had.

Views at act time: an actor that acts on earlier rows (RLlib's ``prev_actions``, ``prev_rewards``,
a stack of the last observations) declares them with :meth:`ActorModule.views` (the
:class:`~netrl.memory.views.View` declarations of :mod:`netrl.memory.views`); its agent declares
the same ones (:meth:`~netrl.agents.base.TrainingAgent.views` does by default), so a
:class:`~netrl.memory.history.HistoryMemory` assembles them for training. The worker builds them
per env from the rows it records (:mod:`netrl.memory.act_views`) and hands them to ``act`` in the
form the agent sees them in a batch: a view into the observation replaces its leaf with the window
``(B, length, *shape)``, and the views into ``batch.extra`` arrive as ``act(obs, test=False,
views={name: tensor (B, length, *shape)})`` (``act_(..., views=...)`` with numpy windows, shaped
``(length, *shape)`` for one observation)::

    def views(self):
        return [prev_actions(4), prev_rewards(4)]

    def act(self, obs, test=False, views=None):  # views["prev_actions"]: (B, 4, *act_shape)
        ...
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import gymnasium
import numpy as np
import torch

from netrl.memory.views import View
from netrl.samples.columns import MAX_EXTRAS, ExtraSpec, check_extra_spec, tree_map

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
        """The extra outputs ``act`` returns with its actions: name -> (per-row shape, numpy
        dtype string), e.g. ``{"action_log_prob": ((), "float32")}``. Names are lowercase
        identifiers of at most 32 characters. None by default: ``act`` returns actions only."""
        return {}

    def recurrent_state(self) -> ExtraSpec:
        """The state a recurrent actor keeps per env: name -> (per-env shape, numpy dtype string),
        e.g. ``{"recurrent_state": ((1, 64), "float32")}``; zeros at each episode start (see the
        module's docstring). None by default: ``act`` takes no state."""
        return {}

    def views(self) -> list[View]:
        """The views ``act`` reads besides the observation (see the module docstring): built per
        env by the worker, identical to what the trainer's batch holds. None by default."""
        return []

    @abstractmethod
    def act(self, obs: Any, test: bool = False) -> Any:
        """Compute actions from a batch of observations (tensors with a leading dimension ``B``).

        Args:
            obs: a tensor, or a tuple/dict of tensors, shaped ``(B, *obs_shape)`` on
                this module's device.
            test: True for test episodes, which usually act deterministically.

        Returns:
            ``B`` actions as a numpy array shaped ``(B, *action_space.shape)`` (see the
            module's docstring; a tmrl-style actor may return the one action of a batch of 1
            instead, and then serves one env only). With :meth:`extra_outputs` declared:
            ``(actions, {name: array shaped (B, *shape)})``.
        """

    def act_(self, obs: Any, test: bool = False, batch: bool = False, state: dict[str, Any] | None = None,
             views: dict[str, Any] | None = None) -> Any:
        """Collate raw observations to tensors on this module's device and call :meth:`act`.

        Args:
            obs: one observation (``batch=False``), or a tree whose leaves have a leading dimension
                ``N``, one row per env, as Gymnasium's vector envs return them (``batch=True``).
            test: passed on to :meth:`act`.
            batch: whether ``obs`` is a batch.
            state: a recurrent actor's state (:meth:`recurrent_state`), arrays shaped
                ``(N, *shape)`` for a batch and ``(*shape)`` for one observation;
                None: the initial state.
            views: the windows of the views into ``batch.extra`` (:meth:`views`), numpy arrays
                shaped ``(N, length, *shape)`` for a batch and ``(length, *shape)`` for one
                observation, passed to ``act`` as tensors (``act(..., views=...)``); None: none.

        Returns:
            one action shaped like the action space, or ``N`` actions shaped
            ``(N, *action_space.shape)``; with :meth:`extra_outputs` declared,
            ``(actions, extras)``, each extra shaped ``(*shape)`` for one observation
            and ``(N, *shape)`` for a batch, in its declared dtype. A recurrent actor's:
            ``(actions, new_state)``, or ``(actions, new_state, extras)``.

        Raises:
            ValueError: ``batch`` is True and :meth:`act` did not return one action per
                observation, or the extras are not the declared ones, in their declared shapes.
        """
        declared = self.extra_outputs()
        kw = {} if views is None else {"views": self._view_tensors(views, batch)}
        if self.recurrent_state():
            return self._act_recurrent(obs, test, batch, state, declared, kw)
        if declared:
            return self._act_with_extras(obs, test, batch, declared, kw=kw)
        return self._act_only(obs, test, batch, kw=kw)

    def _view_tensors(self, views: dict[str, Any], batch: bool) -> dict[str, torch.Tensor]:
        """``act``'s ``views``: tensors on this module's device, with a leading dimension."""
        out = {k: torch.as_tensor(np.asarray(v), device=self.device) for k, v in views.items()}
        return out if batch else {k: v.unsqueeze(0) for k, v in out.items()}

    def _act_only(self, obs: Any, test: bool, batch: bool, out: Any = None,
                  kw: dict[str, Any] | None = None) -> Any:
        """``act_`` for actions alone (``out``: what ``act`` already returned; ``kw``: more
        arguments for ``act``, its views)."""
        device, kw = self.device, kw or {}
        shape = getattr(self.action_space, "shape", None)
        if not batch:
            if out is None:
                batched = tree_map(lambda x: torch.as_tensor(np.asarray(x), device=device).unsqueeze(0), obs)
                with torch.no_grad():
                    out = self.act(batched, test=test, **kw)
            if shape is not None and np.shape(out) == (1, *shape):
                return np.asarray(out)[0]
            return out  # a tmrl-style actor's single action
        n = _rows(obs)
        if out is None:
            tensors = tree_map(lambda x: torch.as_tensor(np.asarray(x), device=device), obs)
            with torch.no_grad():
                out = self.act(tensors, test=test, **kw)
        if shape is not None and np.shape(out) != (n, *shape):
            raise ValueError(f"{type(self).__name__}.act returned an array of shape "
                             f"{np.shape(out)} for a batch of {n} observations; a worker "
                             f"with several envs needs one action per observation, shape "
                             f"{(n, *shape)}: make act() return the whole batch (see "
                             f"netrl.actor), or run this actor with worker.num_envs = 1")
        return np.asarray(out)

    def _act_with_extras(self, obs: Any, test: bool, batch: bool, declared: ExtraSpec, out: Any = None,
                         kw: dict[str, Any] | None = None) -> Any:
        """``act_`` for actions with extra outputs (``out``: what ``act`` already returned, as
        (actions, extras); ``kw``: more arguments for ``act``)."""
        name = type(self).__name__
        spec = check_extra_spec(declared, name)
        if out is None:
            tensors = tree_map(lambda x: torch.as_tensor(np.asarray(x), device=self.device), obs)
            if not batch:
                tensors = tree_map(lambda t: t.unsqueeze(0), tensors)
            with torch.no_grad():
                out = self.act(tensors, test=test, **(kw or {}))
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            raise ValueError(f"{name} declares extra outputs {sorted(spec)}, so "
                             f"its act() must return (actions, {{name: "
                             f"array}}); it returned a {type(out).__name__}")
        actions, extras = out
        n = 1 if not batch else _rows(obs)
        if extras.keys() != spec.keys():
            raise ValueError(f"{name}.act() returned the extra outputs {sorted(extras)}, but "
                             f"extra_outputs() declares {sorted(spec)}: return exactly those")
        checked = {}
        for key, (shape, dtype) in spec.items():
            value = extras[key]
            value = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
            if value.shape != (n, *shape) or (value.dtype.kind == "f" and dtype.kind in "biu"):
                raise ValueError(f"{name}.act() returned the extra output {key!r} as "
                                 f"{value.dtype} of shape {value.shape} for {n} observations; "
                                 f"extra_outputs() declares {dtype} of shape {shape} per "
                                 f"observation, so it must be shaped {(n, *shape)}")
            checked[key] = value.astype(dtype, copy=False) if batch else value[0].astype(dtype, copy=False)
        return self._act_only(obs, test, batch, actions), checked

    def _act_recurrent(self, obs: Any, test: bool, batch: bool, state: dict[str, Any] | None,
                       declared: ExtraSpec, kw: dict[str, Any]) -> Any:
        name = type(self).__name__
        spec = check_extra_spec(self.recurrent_state(), name)
        n = _rows(obs) if batch else 1
        device = self.device
        tensors = tree_map(lambda x: torch.as_tensor(np.asarray(x), device=device), obs)
        if state is None:
            state = {k: np.zeros((n, *shape) if batch else shape, dtype) for k, (shape, dtype) in spec.items()}
        if state.keys() != spec.keys():
            raise ValueError(f"{name}.act_ got the recurrent state {sorted(state)}; "
                             f"recurrent_state() declares {sorted(spec)}")
        state_in = {k: torch.as_tensor(np.asarray(v), device=device) for k, v in state.items()}
        if not batch:
            tensors = tree_map(lambda t: t.unsqueeze(0), tensors)
            state_in = {k: v.unsqueeze(0) for k, v in state_in.items()}
        with torch.no_grad():
            # a recurrent act's form
            out = self.act(tensors, state=state_in, test=test, **kw)  # type: ignore[call-arg]
        size = 3 if declared else 2
        if not (isinstance(out, tuple) and len(out) == size and isinstance(out[1], dict)):
            form = "(actions, new_state, extras)" if declared else "(actions, new_state)"
            raise ValueError(f"{name} declares a recurrent state {sorted(spec)}, so its act(obs, "
                             f"state, test) must return {form}; it returned a {type(out).__name__}"
                             + (f" of {len(out)}" if isinstance(out, tuple) else ""))
        new_state = {}
        if out[1].keys() != spec.keys():
            raise ValueError(f"{name}.act() returned the state {sorted(out[1])}; "
                             f"recurrent_state() declares {sorted(spec)}: return exactly those")
        for key, (shape, dtype) in spec.items():
            value = out[1][key]
            value = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
            if value.shape != (n, *shape):
                raise ValueError(f"{name}.act() returned the state {key!r} of shape "
                                 f"{value.shape} for {n} observations; recurrent_state() "
                                 f"declares {shape} per env, so it must be shaped {(n, *shape)}")
            new_state[key] = value.astype(dtype, copy=False) if batch else value[0].astype(dtype, copy=False)
        if not declared:
            return self._act_only(obs, test, batch, out[0]), new_state
        actions, extras = self._act_with_extras(obs, test, batch, declared, out=(out[0], out[2]))
        return actions, new_state, extras


def declared_extras(actor: Any) -> ExtraSpec:
    """What every row carries for ``actor``: its ``extra_outputs()`` and its ``recurrent_state()``
    (``{}`` for an actor that has neither, tmrl-style ones too), checked; ValueError naming the
    actor and the entry that is wrong, or a name declared twice."""
    owner = type(actor).__name__
    out: ExtraSpec = {}
    for method_name in ("extra_outputs", "recurrent_state"):
        method = getattr(actor, method_name, None)
        if method is None:
            continue
        spec = check_extra_spec(method(), owner)
        both = sorted(set(spec) & set(out))
        if both:
            raise ValueError(f"{owner} declares {both} both as extra outputs "
                             f"and as recurrent state: name them apart")
        out.update({name: (shape, dtype.str) for name, (shape, dtype) in spec.items()})
    if len(out) > MAX_EXTRAS:
        raise ValueError(f"{owner} declares {len(out)} extra outputs and recurrent state "
                         f"leaves together; at most {MAX_EXTRAS} travel with a row")
    return out


def _rows(tree: Any) -> int:
    """The leading dimension of a batch of observations (that of its first leaf)."""
    found: list[int] = []
    tree_map(lambda x: found.append(int(np.shape(x)[0])) if not found else None, tree)
    return found[0]
