"""Batch: the transitions a memory hands a ``TrainingAgent``, collated on the training device."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

__all__ = ["Batch"]


class _Fields(NamedTuple):
    obs: Any
    act: torch.Tensor
    rew: torch.Tensor
    next_obs: Any
    terminated: torch.Tensor
    truncated: torch.Tensor
    weight: torch.Tensor | None = None


class Batch(_Fields):
    """A batch of transitions, collated on the training device.

    Read its fields by name (``batch.obs``, ``batch.act``...) or unpack all seven:
    ``o, a, r, o2, terminated, truncated, weight = batch``. ``terminated`` stops bootstrapping;
    ``truncated`` (time limit or ``max_samples_per_episode``) does not. ``weight`` is a
    per-transition loss weight, or None when every weight is 1 (no stale samples down-weighted).

    ``batch.extra`` holds further named per-transition tensors, outside the seven so that
    unpacking keeps working: the actor's extra outputs recorded with each transition's action
    (``action_log_prob``, ``state_value``...; see the module docstring), and what a memory adds
    (``traj_ids``). ``{}`` when there are none. Pass it as ``Batch(o, a, r, o2, term, trunc, weight,
    extra={...})``; ``_replace`` keeps it.
    """

    extra: dict[str, torch.Tensor]

    def __new__(cls, *fields: Any, extra: dict[str, torch.Tensor] | None = None, **named: Any) -> Batch:
        self = super().__new__(cls, *fields, **named)
        # tuples take no slots: it lives in the instance's __dict__
        self.extra = {} if extra is None else extra
        return self

    @classmethod
    # mypy types NamedTuple's specially
    def _make(cls, iterable: Iterable[Any]) -> Batch:  # type: ignore[override]
        return cls(*iterable)  # namedtuple's _make bypasses __new__, and so would leave no extra

    def _replace(self, **changes: Any) -> Batch:
        extra = changes.pop("extra", self.extra)
        return Batch(*_Fields._replace(self, **changes), extra=extra)

    # pickle and copy keep extra
    def __getnewargs_ex__(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return tuple(self), {"extra": self.extra}

    def __repr__(self) -> str:
        return f"{_Fields.__repr__(self)[:-1].replace('_Fields', 'Batch', 1)}, extra={sorted(self.extra)})"
