"""TrainingSettings: what netrl adds to tmrl's training loop, in one frozen object.

tmrl's parameters (epochs, rounds, steps, the intervals, the update-to-data ratio...) stay those of
:class:`~netrl.training.loop.TrainingOffline`, so that ``partial(TrainingOffline, ...)`` from tmrl's
tutorial works unchanged; netrl's own settings live here. Three ways to give them, one loop::

    TrainingOffline(env_cls, settings=TrainingSettings.from_config(cfg))    # the Trainer's way
    TrainingOffline(env_cls, settings=TrainingSettings(worker_lead=100))
    TrainingOffline(env_cls, worker_lead=100)        # folded in (over those of settings=)
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from netrl.training.plausibility import Implausible
from netrl.training.sync import BatchMode
from netrl.util import did_you_mean

if TYPE_CHECKING:
    from netrl.config.sections import Config

__all__ = ["Collection", "TrainingSettings", "fold_keywords"]

Collection = Literal["async", "sync"]


@dataclass(frozen=True)
class TrainingSettings:
    """netrl's settings of the training loop (module docstring): config.json's keys of the same
    names, in ``trainer``, ``memory`` (``memory_device`` is ``memory.device``) and ``env``."""

    worker_lead: int = 200  # samples throttled workers may run ahead of the update-to-data ratio
    max_policy_lag: int | None = None  # transitions whose policy is older than this are stale
    stale_sample_weight: float = 0.0  # their loss weight: 0 drops them
    # tmrl sets these in partial(memory_cls, memory_size=..., batch_size=...); values here fill in
    # what the partial leaves out (None: the memory class's default), and a value set in both
    # places must agree. Once TrainingOffline.build() ran, its settings hold those the memory has.
    memory_size: int | None = None
    batch_size: int | None = None
    # each worker's share of a ring memory's rows (training/ingest.py): 0 gives an equal share of
    # the workers holding rows, with headroom, at least min_worker_share
    max_worker_share: float = 0.0
    min_worker_share: float = 0.05
    seed: int | None = None
    # packets with larger rewards are refused (training/safeguards.py); None: the env's declared
    # reward_range, else 1e6 (training/plausibility.py)
    max_abs_reward: float | None = None
    implausible: Implausible = "quarantine"  # what an implausible packet gets (plausibility.py)
    implausible_factor: float = 200.0  # robust scales from the median beyond which a value is
                                       # implausible
    max_nonfinite_steps: int = 100  # non-finite steps in a row (each undone) that stop it (0: off)
    total_frames: int | None = None  # stop once this many samples have arrived (None: epochs do)
    # "sync": every batch under one weight version, trained once, in a RolloutMemory
    # (netrl.training.sync); a training step is then one batch
    collection: Collection = "async"
    frames_per_batch: int = 2048
    rollout_fragment_length: int = 256
    batch_mode: BatchMode = "truncate_episodes"
    sync_timeout_s: float = 30.0
    prefetch: bool = True  # gather batch k+1 while the agent trains on batch k (memory/prefetch.py)
    memory_device: str = "cpu"  # "cuda": the replay columns live on the (CUDA) training device
    # "disk": the ring columns of more than one value per row in files of memory_folder
    # (memory/disk.py); memory_folder must then be given (from_config: <run folder>/replay)
    memory_storage: str = "ram"
    memory_folder: str | None = None
    memory_resident_mib: int = 1024  # file pages kept mapped before they are unmapped (0: no bound)
    compile: str = "none"  # "none", "compile" or "cudagraphs", given to the agent (compiled.py)
    normalize_obs: bool = False  # the loop's obs_norm learns from every packet; batches normalised
    normalize_obs_clip: float = 10.0
    normalize_obs_every: int = 0  # steps between obs_norm publications (0: update_model_interval)

    def __post_init__(self) -> None:
        if self.collection not in ("async", "sync"):
            raise ValueError(f'collection must be "async" or "sync" (got {self.collection!r})')

    @classmethod
    def from_config(cls, cfg: Config) -> TrainingSettings:
        """The settings config.json gives: ``trainer.*``, ``memory.*``, ``env.normalize_obs*`` and
        ``seed``."""
        t, m, env = cfg.trainer, cfg.memory, cfg.env
        return cls(
            worker_lead=t.worker_lead, max_policy_lag=t.max_policy_lag,
            stale_sample_weight=t.stale_sample_weight, max_abs_reward=t.max_abs_reward,
            implausible=t.implausible, implausible_factor=t.implausible_factor,
            max_nonfinite_steps=t.max_nonfinite_steps, total_frames=t.total_frames,
            collection=t.collection, frames_per_batch=t.frames_per_batch,
            rollout_fragment_length=t.rollout_fragment_length, batch_mode=t.batch_mode,
            sync_timeout_s=t.sync_timeout_s, prefetch=t.prefetch, compile=t.compile,
            memory_size=m.memory_size, batch_size=m.batch_size, memory_device=m.device,
            memory_storage=m.storage, memory_folder=m.storage_folder or str(cfg.run_dir / "replay"),
            memory_resident_mib=m.storage_resident_mib,
            max_worker_share=m.max_worker_share, min_worker_share=m.min_worker_share,
            normalize_obs=env.normalize_obs, normalize_obs_clip=env.normalize_obs_clip,
            normalize_obs_every=env.normalize_obs_every, seed=cfg.seed)


_FIELDS = tuple(f.name for f in dataclasses.fields(TrainingSettings))


def fold_keywords(settings: TrainingSettings | None, keywords: Mapping[str, Any],
                  owner: Callable[..., Any]) -> TrainingSettings:
    """``settings`` (None: the defaults) with the ``keywords`` given to ``owner`` in
    place. A keyword that is not a setting is a TypeError naming the nearest of the
    settings and ``owner``'s parameters."""
    name = owner.__name__
    if settings is None:
        settings = TrainingSettings()
    elif not isinstance(settings, TrainingSettings):
        raise TypeError(f"{name}(settings=...) takes a netrl.training.TrainingSettings, not "
                        f"{type(settings).__name__}")
    for key in keywords:
        if key not in _FIELDS:
            known = [*inspect.signature(owner).parameters, *_FIELDS]
            hint = did_you_mean(key, known)
            raise TypeError(f"{name}() got an unexpected keyword argument {key!r}{hint}; it takes "
                            "tmrl's parameters and the fields of netrl.training.TrainingSettings")
    return dataclasses.replace(settings, **keywords) if keywords else settings
