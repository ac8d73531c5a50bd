"""A worker's further model targets besides its actor (issue 34): an observation
normaliser, a user's module.

Each is synced from the trainer under a version counter of its own: its
:class:`~netrl.worker.weight_receiver. WeightReceiver` loads a version into a spare copy on the
network thread, and the control path swaps it in between two env steps, as it swaps the actor
(:meth:`ExtraModels.swap`). Every sample row carries the version of each model in use when its
action was chosen, as the extra output column ``"<model>_version"`` (:meth:`ExtraModels.stamp`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from netrl.protocol.models import check_model_names, version_column, version_columns
from netrl.samples.columns import ExtraSpec
from netrl.worker.weight_receiver import WeightReceiver

__all__ = ["ExtraModels"]


class ExtraModels:
    """The modules a worker's code uses besides the actor, by name, and the
    version of each in use."""

    def __init__(self, targets: Mapping[str, torch.nn.Module] | None, owner: str) -> None:
        targets = dict(targets or {})
        check_model_names(targets, owner)
        for name, module in targets.items():
            if not isinstance(module, torch.nn.Module):
                raise ValueError(f"{owner}[{name!r}] is a "
                                 f"{type(module).__name__}, not a torch.nn.Module")
        self.current: dict[str, torch.nn.Module] = targets  # control path's
        self.versions = dict.fromkeys(targets, -1)  # -1: the module as the worker built it
        self.receivers: dict[str, WeightReceiver] = {}
        self._columns = {name: version_column(name) for name in targets}
        # the actor's extra outputs as zeros, for rows that have none
        self._zeros: dict[str, Any] = {}

    def __bool__(self) -> bool:
        return bool(self.current)

    def add(self, name: str, module: torch.nn.Module, owner: str) -> None:
        """One more target (before the worker connects), e.g. env.normalize_obs's "obs_norm"."""
        if name in self.current:
            raise ValueError(f"{owner} adds the model {name!r}, which "
                             f"RolloutWorker(models=...) names too: leave it out of models")
        check_model_names([*self.current, name], owner)
        self.current[name] = module
        self.versions[name] = -1
        self._columns[name] = version_column(name)

    def make_receivers(self) -> dict[str, WeightReceiver]:
        """One receiver per model, each with spare copies of its module
        (nothing is saved to disk)."""
        self.receivers = {name: WeightReceiver(copy.deepcopy(module), copy.deepcopy(module), -1, None, model=name)
                          for name, module in self.current.items()}
        return self.receivers

    def spec(self, actor_extras: ExtraSpec) -> ExtraSpec:
        """The extra outputs every row carries: the actor's, then a version column per model."""
        self._zeros = {name: np.zeros(shape, dtype) for name, (shape, dtype) in actor_extras.items()}
        return {**actor_extras, **version_columns(self.current)}

    def stamp(self, extra: dict[str, Any] | None) -> dict[str, Any]:
        """A row's extra outputs with the version of each model in use (the actor's as
        zeros where it gave none)."""
        out = dict(self._zeros if extra is None else extra)
        for name, column in self._columns.items():
            out[column] = self.versions[name]
        return out

    def swap(self) -> None:
        """Control path, between two env steps: take each model's newest version received."""
        for name, rx in self.receivers.items():
            ready = rx.slot.swap(self.current[name])
            if ready is not None:
                self.versions[name], _session, self.current[name] = ready
