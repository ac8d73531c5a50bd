"""What a worker acts with: its actor and the version of its weights, swapped between two env steps.

Besides the actor, acting takes: the views it declares, built per env
(:mod:`netrl.memory.act_views`), an obs_preprocessor, the trainer's observation statistics
(``env.normalize_obs``), a recurrent actor's per-env state, random actions while the trainer holds
fewer than ``init_random_frames`` samples, and the further models synced from the trainer
(:mod:`netrl.worker.models`). The network thread loads each received version into a spare actor
(:class:`~netrl.worker.weight_receiver.WeightReceiver`); :meth:`swap` takes it, a pointer swap.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from netrl.actor import declared_extras
from netrl.envs.checks import check_action
from netrl.envs.normalize import ObsNormalizer
from netrl.memory.act_views import ActViews
from netrl.memory.views import declared_views
from netrl.samples.columns import ExtraSpec, check_extra_spec, tree_map
from netrl.worker.link import WorkerLink
from netrl.worker.models import ExtraModels
from netrl.worker.random_frames import RandomFrames
from netrl.worker.recurrent import RecurrentStates
from netrl.worker.weight_receiver import WeightReceiver

__all__ = ["PolicyHandle"]


class PolicyHandle:
    """A worker's actor, its weights' version, and what acting with it takes (see the module
    docstring).

    Built with the worker; :meth:`build` gives it the actor once the env's spaces are known, and
    :meth:`connect` the network thread's receiver of new versions (none in standalone and
    single-process mode).
    """

    def __init__(self, worker_id: str, num_envs: int, obs_preprocessor: Callable[..., Any] | None,
                 models: Mapping[str,
                                 torch.nn.Module] | None, init_random_frames: int, standalone: bool,
                 seed: int | None) -> None:
        self.worker_id, self.num_envs = worker_id, num_envs
        self.obs_preprocessor = obs_preprocessor
        # further modules synced from the trainer
        self.models = ExtraModels(models, "RolloutWorker(models=...)")
        self.init_random_frames, self.standalone, self.seed = init_random_frames, standalone, seed
        self.actor: Any = None
        # a copy of the actor as built, which received weights are checked against
        self.template: Any = None
        self.version = -1  # weight version of the actor (-1: the actor's own initialisation)
        # env.normalize_obs: the statistics act's observations are normalised with (build); the
        # trainer's "obs_norm" model replaces them as versions arrive
        self.obs_norm: ObsNormalizer | None = None
        # the actor's extra outputs
        self.extra_spec: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {}
        self.recurrent: RecurrentStates | None = None  # a recurrent actor's per-env states (build)
        # the views the actor declares, per env (build); the runners start and push their rows
        self.views: ActViews | None = None
        # the actor's first action was checked (random ones may come first)
        self.actor_checked = False
        self.action_space: Any = None
        self.weights: WeightReceiver | None = None  # the network thread's (connect)
        self.link: WorkerLink | None = None  # tells what the trainer holds (connect)
        # the trainer's samples, from the single-process mode (local.py)
        self.trainer_samples: int | None = None
        # random actions until the trainer holds enough
        self.random_frames: RandomFrames | None = None

    def build(self, actor: Any, observation_space: Any, action_space: Any,
              normalize_obs_clip: float | None, compressed: bool = False) -> ExtraSpec:
        """Take ``actor`` (with the env's spaces; ``normalize_obs_clip``: env.normalize_obs's clip,
        None when off; ``compressed``: a sample compressor changes the rows); what every row
        carries besides the sample: the actor's extra outputs and each model's version.
        ValueError naming the view for views the worker cannot build as the memory does."""
        self.actor, self.action_space = actor, action_space
        views = declared_views(actor)
        if views:
            name = type(actor).__name__
            into_obs = [v.name for v in views if v.into == "obs"]
            if into_obs and (normalize_obs_clip is not None or self.obs_preprocessor is not None):
                raise ValueError(f"{name}: the view {into_obs[0]!r} goes into the observation, "
                                 f"which env.normalize_obs or an obs_preprocessor would change "
                                 f"at act time but not in the memory's batches: declare it "
                                 f'with into="extra", or turn those off')
            self.views = ActViews(views, self.num_envs, observation_space, action_space, name,
                                  compressed)
        if normalize_obs_clip is not None:  # mean 0, var 1 until the trainer's statistics arrive
            self.obs_norm = ObsNormalizer(observation_space, normalize_obs_clip)
            # the trainer's versions replace it
            self.models.add("obs_norm", self.obs_norm, "env.normalize_obs")
        extras = declared_extras(actor)
        self.extra_spec = check_extra_spec(extras, type(actor).__name__)
        if getattr(actor, "recurrent_state", dict)():
            self.recurrent = RecurrentStates(actor, self.num_envs)
        self.template = copy.deepcopy(actor)
        return self.models.spec(extras) if self.models else extras

    def connect(self, weights: WeightReceiver, link: WorkerLink) -> None:
        self.weights, self.link = weights, link

    def swap(self) -> None:
        """Take the newest version received (between two env steps; never within a sync
        fragment)."""
        if self.weights is None:
            return
        ready = self.weights.slot.swap(self.actor)
        if ready is not None:
            self.version, _session, self.actor = ready
        if self.models:
            self.models.swap()
            if self.obs_norm is not None:  # the trainer's statistics, in a copy of the normaliser
                self.obs_norm = self.models.current["obs_norm"]  # type: ignore[assignment]

    def newest(self) -> int:
        """The newest version held: in use, or waiting to be swapped in."""
        pending = self.weights.slot.pending_version() if self.weights is not None else None
        return max(self.version, -1 if pending is None else pending)

    def model(self, name: str) -> torch.nn.Module:
        """The module of model ``name`` (one of ``models``) in use now: its newest version swapped
        in between two env steps, as the actor is."""
        if name not in self.models.current:
            raise KeyError(f"worker {self.worker_id} has no model {name!r}; its models: "
                           f"{sorted(self.models.current)} "
                           "(RolloutWorker(models={name: module}))")
        return self.models.current[name]

    def obs(self, obs: Any) -> Any:
        """What ``act`` gets for ``obs`` (one observation or a batch, after any obs_preprocessor):
        with env.normalize_obs, normalised by :attr:`obs_norm` (float leaves as float32 arrays),
        else ``obs`` itself. The packets carry the raw observation."""
        if self.obs_norm is None:
            return obs
        with torch.no_grad():
            out = self.obs_norm(obs)
        return tree_map(lambda x: x.numpy() if isinstance(x, torch.Tensor) else x, out)

    def act(self, obs: Any, test: bool, check_space: Any) -> tuple[Any, dict[str, Any] | None]:
        """One env's action for ``obs`` and its row's extras (None when the actor declares none):
        random while ``init_random_frames`` asks (never in a test episode), else the actor's, whose
        first action is checked against ``check_space``."""
        act = None if test else self.random_actions(obs)
        views = self.views.extra() if self.views is not None else None
        if self.views is not None:
            obs = self.views.observe(obs)
        if act is not None:
            if self.recurrent is None:
                return act, None  # a random action's extra outputs are zeros
            # the state advances under random actions too, and is recorded
            _, chosen = self.recurrent.act(self.actor, self.obs(self._preprocessed(obs)), test,
                                           views=views)
            return act, self.recurrent.random_extras(chosen)
        o = self.obs(self._preprocessed(obs))
        extra = None
        if self.recurrent is not None:
            act, extra = self.recurrent.act(self.actor, o, test, views=views)
        else:
            act = self.actor.act_(o, test=test, views=views)
            if self.extra_spec:
                act, extra = act
        if not self.actor_checked:
            check_action(act, check_space, type(self.actor).__name__)
            self.actor_checked = True
        return act, extra

    def _preprocessed(self, obs: Any) -> Any:
        return self.obs_preprocessor(obs) if self.obs_preprocessor else obs

    def random_actions(self, obs: Any, n: int | None = None) -> Any | None:
        """Random actions for ``obs`` (``n`` observations of a vector step) while the trainer holds
        fewer than ``init_random_frames`` samples, else None: the actor chooses
        (:mod:`netrl.worker.random_frames`). Never for a standalone worker (no trainer to ask); the
        caller never asks for test episodes, which show the policy."""
        if not self.init_random_frames or self.standalone:
            return None
        if self.random_frames is None:
            self.random_frames = RandomFrames(self.init_random_frames, self.action_space, self.seed,
                                              self.worker_id)
        if self.random_frames.done:  # for good
            return None
        if self.link is not None:
            self.random_frames.told(self.link.trainer_samples,
                                    self.link.link.server_stats.get("trainer_samples"))
        elif self.trainer_samples is not None:  # the single-process mode's count
            self.random_frames.told(self.trainer_samples)
        return None if self.random_frames.done else self.random_frames.actions(obs, n)

    def zero_extras(self, n: int) -> dict[str, np.ndarray] | None:
        """``n`` rows of the actor's extra outputs as zeros (None when it declares none)."""
        spec = self.extra_spec
        return {k: np.zeros((n, *shape), dtype) for k, (shape,
                                                        dtype) in spec.items()} if spec else None
