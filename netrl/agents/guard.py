"""Training steps that go non-finite change nothing: :class:`StateGuard` keeps
the agent's last finite state.

A NaN or an infinity in a loss or a gradient spreads to every weight within a step or
two, and from there to every worker and every checkpoint. The training loop checks
each step's metrics, and every few steps the agent's whole training state (the tensors
:meth:`~netrl.agents.base.TrainingAgent.state_tensors` lists: parameters, buffers, optimiser
state, bare tensors such as SAC's ``log_alpha``), which it then keeps as the state to go back to.
When a step's metrics or the state are not finite, every one of those tensors is put back as it
was kept. Calling sequence::

    guard = StateGuard(agent)
    guard.begin()                          # before training (after loading a checkpoint): the state
                                           # to go back to
    metrics = agent.train(batch)
    if not guard.accept(metrics, check):   # check the state too, and keep it, every few steps...
        ...                                # ...or it has put the last state kept back

Checking and keeping the state costs a copy of it and one sum over the copy (a sum is
not finite exactly when an element is not, or when finite elements add up past the
float's range, which a healthy agent's state never does): for SAC's 256x256 networks on
one CPU thread, 0.5 ms against a 6.6 ms step. Every step, that is 10%; every 10th step
(:data:`~netrl.training.safeguards.KEEP_EVERY`), 1%. A gradient that is not finite while its loss is
makes the next step's losses NaN, so the step after a bad one is caught by its metrics, and going
back undoes the few finite steps since the state was kept with it.
"""

from __future__ import annotations

import math
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["StateGuard", "find_state_tensors", "nonfinite_metrics"]

MAX_ITEMS = 1000  # a longer list or dict (a tmrl memory's rows, say) holds no training state


def _contents(value: Any) -> list[tuple[str, Any]]:
    """The tensors an nn.Module or an optimiser holds, by name; a list's, a
    tuple's or a dict's items."""
    if isinstance(value, torch.nn.Module):
        return [(f".{k}", t) for k, t in (*value.named_parameters(), *value.named_buffers())]
    if isinstance(value, torch.optim.Optimizer):
        params = [(f".param_groups[{g}][{i}]", p) for g, group in enumerate(value.param_groups)
                  for i, p in enumerate(group["params"])]
        return params + [(f".state[{i}].{k}", t) for i, state in enumerate(value.state.values())
                         for k, t in state.items()]
    if isinstance(value, (list, tuple)):
        return [(f"[{i}]", item) for i, item in enumerate(value)] if len(value) <= MAX_ITEMS else []
    if isinstance(value, dict):
        return [(f"[{k!r}]", item) for k, item in value.items()] if len(value) <= MAX_ITEMS else []
    if hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, types.FunctionType,
                                                             types.MethodType)):
        # e.g. an agent that wraps another
        return [(f".{k}", item) for k, item in vars(value).items()]
    return []


def _walk(agent: Any) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` for ``agent``'s attributes and what they hold (see
    :func:`find_state_tensors`), depth first."""
    todo: list[tuple[str, Any, int]] = [(attr, value, 0) for attr, value in reversed(vars(agent).items())]
    seen: set[int] = set()
    while todo:
        name, value, depth = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        yield name, value
        if isinstance(value, torch.Tensor):
            continue
        nested = not isinstance(value, (torch.nn.Module, torch.optim.Optimizer))
        if nested and depth >= 2:
            continue
        todo.extend(reversed([(name + key, item, depth + nested) for key, item in _contents(value)]))


def _optimizers(agent: Any) -> list[torch.optim.Optimizer]:
    return [value for _, value in _walk(agent) if isinstance(value, torch.optim.Optimizer)]


def find_state_tensors(agent: Any) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor training may change, found on ``agent``'s attributes
    (and two levels into lists, tuples, dicts and other objects there, such as an agent that wraps
    another): the parameters and buffers of ``nn.Module``s, the parameters and state of optimisers,
    and bare tensors. Each tensor once, by identity."""
    return [(name, value) for name, value in _walk(agent)
            if isinstance(value, torch.Tensor) and value.layout == torch.strided]


def nonfinite_metrics(metrics: Mapping[str, Any]) -> list[str]:
    """``name=value`` for each metric that is a number but not a finite one."""
    bad = []
    for key, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if not math.isfinite(number):
            bad.append(f"{key}={number}")
    return bad


@dataclass
class _Group:
    """The tensors of one dtype and device, and two flat buffers: the last finite state,
    and room for the next."""

    tensors: list[torch.Tensor]
    good: torch.Tensor
    spare: torch.Tensor
    check: bool  # floating point: summed to check finiteness

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        parts = torch.split(flat, [t.numel() for t in self.tensors])
        return [v.view_as(t) for v, t in zip(parts, self.tensors, strict=True)]

    def gather(self) -> bool:
        """Copy the live tensors into the spare buffer; True if they are all finite."""
        torch.cat([t.detach().reshape(-1) for t in self.tensors], out=self.spare)
        if not self.check or self.spare.numel() == 0:
            return True
        total = self.spare.sum(dtype=torch.float32 if self.spare.element_size() < 4 else None)
        return bool(torch.isfinite(total))


class StateGuard:
    """Checks an agent's training state after each step, and puts back the last finite
    one (see the module doc)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self._groups: list[_Group] = []
        self._ids: list[int] = []
        self.problem = ""  # what the last step that was not accepted had: its non-finite
                           # metrics or tensors
        self.since = 0  # steps accepted since the state was last kept
        self.undone = 0  # training steps the last restore undid

    @property
    def tensors(self) -> int:
        """How many tensors it keeps (0 before :meth:`begin`, or for an agent whose
        state it cannot find)."""
        return len(self._ids)

    def _named(self) -> list[tuple[str, torch.Tensor]]:
        hook = getattr(self.agent, "state_tensors", None)
        return list(hook()) if callable(hook) else find_state_tensors(self.agent)

    def _layout(self, tensors: list[torch.Tensor]) -> None:
        """Group ``tensors`` by dtype and device. Tensors the last finite state had keep their
        values there. A new optimiser state tensor (made by the step under way) goes back to zeros,
        which is how a new optimiser starts (Adam's moments and step count, SGD's momentum); another
        new tensor keeps its value if it is finite."""
        before = {id(t): v for g in self._groups for t, v in zip(g.tensors, g.views(g.good), strict=True)}
        fresh = {id(t) for opt in _optimizers(self.agent) for state in opt.state.values() for t in state.values()}
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for t in tensors:
            groups.setdefault((t.dtype, t.device), []).append(t)
        self._groups = []
        for (dtype, device), ts in groups.items():
            size = sum(t.numel() for t in ts)
            group = _Group(ts, torch.zeros(size, dtype=dtype, device=device),
                           torch.empty(size, dtype=dtype, device=device), dtype.is_floating_point or dtype.is_complex)
            with torch.no_grad():
                for t, view in zip(ts, group.views(group.good), strict=True):
                    old = before.get(id(t))
                    if old is not None and old.shape == t.shape:
                        view.copy_(old)
                    elif id(t) not in fresh and (not (t.is_floating_point() or t.is_complex())
                                                 or bool(torch.isfinite(t).all())):
                        view.copy_(t.detach().reshape(view.shape))
            self._groups.append(group)
        self._ids = [id(t) for t in tensors]

    def begin(self) -> list[str]:
        """Take the agent's current state as the one to go back to; returns the names of its
        non-finite tensors (none, normally: a state that is not finite to begin with cannot be
        trained back to health)."""
        named = self._named()
        self._groups = []
        self._layout([t for _, t in named])
        for g in self._groups:
            g.gather()
            g.good, g.spare = g.spare, g.good
        self.since = 0
        return _nonfinite(named)

    def accept(self, metrics: Mapping[str, Any], check_state: bool = True, step: bool = True) -> bool:
        """After a training step (or, with ``step`` False, between steps): True if its metrics
        are finite and, with ``check_state``, the agent's whole state too (that state becomes the
        one to go back to). Otherwise put the last state kept back, undoing the :attr:`undone` steps
        since, and return False (:attr:`problem` says why)."""
        bad_metrics = nonfinite_metrics(metrics)
        if not bad_metrics and not check_state:
            self.since += 1
            return True
        finite = True
        if not bad_metrics:
            self._relayout()
            # every group: the spare buffers hold this state
            finite = all([g.gather() for g in self._groups])
            if finite:
                for g in self._groups:
                    g.good, g.spare = g.spare, g.good
                self.since = 0
                return True
        bad = [] if finite else _nonfinite(self._named())
        self.problem = ", ".join(bad_metrics + [f"{name} (and {len(bad) - 3} more)" if i == 2 and len(bad) > 3
                                                else name for i, name in enumerate(bad[:3])])
        self.undone = self.since + step
        self.restore()
        return False

    def _relayout(self) -> None:
        tensors = [t for _, t in self._named()]
        if [id(t) for t in tensors] != self._ids:
            self._layout(tensors)

    def restore(self) -> None:
        """Put the last state kept back into the agent's tensors (new optimiser state
        back to zeros: see _layout)."""
        self._relayout()
        with torch.no_grad():
            for g in self._groups:
                torch._foreach_copy_(g.tensors, g.views(g.good))
        self.since = 0


def _nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    return [name for name, t in named if (t.is_floating_point() or t.is_complex())
            and not bool(torch.isfinite(t.detach()).all())]
