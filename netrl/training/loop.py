"""TrainingOffline: tmrl's training loop (epochs > rounds > steps), independent of how samples arrive.

The loop talks to a :class:`SampleSource`: the networked Trainer's connection to the server, or, for the
single-process baseline, a local worker. Calling sequence::

    training = TrainingOffline(env_cls, memory_cls, training_agent_cls, epochs=..., rounds=..., steps=...)
    training.start(source)                      # build memory and agent, publish weights v1
    for epoch in range(training.epochs):
        for round_stats in training.run_epoch(source, stop):   # one dict per round, for logging
            ...

Pacing (the update-to-data ratio): training pauses while ``trained_steps >= max_training_steps_per_env_step *
samples`` (tmrl's meaning), and the loop tells the source how many samples it wants in total,
``max(start_training, trained_steps / ratio) + worker_lead``, so throttled workers run no further ahead.

With ``total_frames`` set (TorchRL's collectors' name), the loop stops once that many samples have arrived: an epoch
cut short yields the round under way, and :meth:`TrainingOffline.frames_done` tells the caller to save and finish.
"""

from __future__ import annotations

import cProfile
import inspect
import io
import logging
import math
import pstats
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from netrl.agents.base import ModelSpec, TrainingAgent, has_state_dict
from netrl.agents.compiled import compile_kwargs
from netrl.agents.sac import SACAgent
from netrl.envs.checks import check_spaces, value_limits
from netrl.envs.normalize import ObsNormalizer, normalize_batches
from netrl.memory.base import MemoryDataloading
from netrl.memory.build import build_memory
from netrl.memory.history import attach_views
from netrl.memory.prefetch import BatchesAhead
from netrl.memory.priority import pop_priority, update_from_metrics
from netrl.memory.replay import ReplayMemory
from netrl.samples.batch import Batch
from netrl.samples.columns import Buffer, tree_map
from netrl.training.rounds import RoundStats
from netrl.training.safeguards import Safeguards
from netrl.training.sync import BatchMode, SyncBatches, add_packet, collect_and_train
from netrl.util import worth_logging

__all__ = ["SampleSource", "TrainingAgent", "TrainingOffline"]

log = logging.getLogger(__name__)


_SHORT_UNPACK = re.compile(r"too many values to unpack \(expected [1-6][,)]")


def _publishes_models(source: Any) -> bool:
    """Whether ``source.publish`` takes a ``model`` (the Trainer's link does; simpler sources publish the policy
    only)."""
    try:
        return "model" in inspect.signature(source.publish).parameters
    except (TypeError, ValueError):
        return False


def _note_batch_unpacking(error: ValueError, agent: TrainingAgent) -> None:
    """Tell a ported tmrl agent why ``o, a, r, o2, d = batch`` failed in its ``train``: a Batch has seven fields."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    train = getattr(type(agent).train, "__code__", None)
    if tb is not None and tb.tb_frame.f_code is train and _SHORT_UNPACK.match(str(error)):
        error.add_note(f"netrl: if this is the batch in {type(agent).__name__}.train, a Batch has {len(Batch._fields)} "
                       f"fields ({', '.join(Batch._fields)}): tmrl's `o, a, r, o2, d = batch` becomes "
                       "`o, a, r, o2, d, _, _ = batch` (d is terminated), or read them by name: batch.terminated")


class SampleSource(Protocol):
    """Where the training loop gets samples and sends weights."""

    def fetch(self) -> list[Buffer]:
        """Every packet received since the last call (never blocks)."""

    def wait(self, timeout: float) -> None:
        """Block until new packets may be available, at most ``timeout`` seconds."""

    def publish(self, actor: torch.nn.Module, version: int, trained_steps: int) -> None:
        """Send the actor's weights as ``version``."""

    def progress(self, trained_steps: int, samples: int, wanted: int) -> None:
        """Tell the workers' pacing how many samples the trainer wants in total."""

    def taken_version(self) -> int:
        """The newest weight version that may hold other weights than this loop's (e.g. an earlier trainer
        session's, still with the server and the workers), or -1. The loop numbers its versions after it."""


@dataclass(eq=False)
class TrainingOffline:
    """The training loop with tmrl's parameters. See the module docstring for the calling sequence."""

    env_cls: Any = None  # callable returning an env (only its spaces are used), or (obs_space, act_space)
    memory_cls: Callable[..., MemoryDataloading] = ReplayMemory
    training_agent_cls: Callable[..., TrainingAgent] = SACAgent
    epochs: float = 10  # an int, or np.inf (as in tmrl's tutorial) to train until stopped
    rounds: int = 50
    steps: int = 2000
    update_model_interval: int = 100
    update_buffer_interval: int = 100
    max_training_steps_per_env_step: float = 1.0
    sleep_between_buffer_retrieval_attempts: float = 0.1
    profiling: bool = False
    agent_scheduler: Callable[[TrainingAgent, int], None] | None = None
    start_training: int = 0
    device: str | None = None
    worker_lead: int = 200
    max_policy_lag: int | None = None  # transitions whose policy is older than this are stale
    stale_sample_weight: float = 0.0  # their loss weight: 0 drops them
    # tmrl sets these in partial(memory_cls, memory_size=..., batch_size=...); values here fill in what the partial
    # leaves out (None: the memory class's default), and a value set in both places must agree. See build().
    memory_size: int | None = None
    batch_size: int | None = None
    seed: int | None = None
    max_abs_reward: float = 1e6  # packets with larger rewards are refused (see netrl.training.safeguards)
    max_nonfinite_steps: int = 100  # non-finite training steps in a row, each undone, before TrainingDiverged (0: off)
    total_frames: int | None = None  # stop once this many samples have arrived (None: epochs decide)
    # "sync": every batch under one weight version, trained once, in a RolloutMemory (see
    # netrl.training.sync); a training
    # step is then one batch
    collection: str = "async"
    frames_per_batch: int = 2048
    rollout_fragment_length: int = 256
    batch_mode: BatchMode = "truncate_episodes"
    sync_timeout_s: float = 30.0
    prefetch: bool = True  # gather batch k+1 while the agent trains on batch k (see netrl.memory.prefetch)
    memory_device: str = "cpu"  # "cuda": the replay columns live on the (CUDA) training device
    compile: str = "none"  # trainer.compile: "none", "compile" or "cudagraphs", given to the agent (agents/compiled.py)
    normalize_obs: bool = False  # env.normalize_obs: self.obs_norm learns from every packet; batches are normalised
    normalize_obs_clip: float = 10.0
    normalize_obs_every: int = 0  # training steps between publications of obs_norm (0: update_model_interval)

    def __post_init__(self) -> None:
        self.total_updates = 0
        self.total_samples = 0
        self.epoch = 0
        self.round = self.round_steps = 0  # the round of the epoch under way, and its training steps so far
        self.version = 0
        # further models synced to the workers (TrainingAgent.extra_models, Trainer(models=...)): each published
        # every ModelSpec.every training steps under a version counter of its own
        self.extra_models: dict[str, ModelSpec] = {}
        self.model_versions: dict[str, int] = {}  # name -> its newest published version (kept in checkpoints)
        self._model_published: dict[str, int] = {}  # name -> total_updates when it was last published
        self._models_unsent_logged = False
        self.unstored = 0  # packets the memory refused (ValueError): skipped, logged and counted
        self.safeguards: Safeguards | None = None  # value limits, the undo of non-finite steps (see build)
        self.published_updates = -1  # total_updates when the actor was last published as ``version``
        self.memory: MemoryDataloading | None = None
        self.agent: TrainingAgent | None = None
        self.agent_has_state = False  # whether the agent implements state_dict/load_state_dict (see build)
        self.observation_space: Any = None
        self.action_space: Any = None
        self.obs_norm: ObsNormalizer | None = None  # env.normalize_obs (see build), published as the model "obs_norm"
        self._last_wanted = -1
        self._last_report_at = 0.0
        self._round = RoundStats()
        self._resumed_elapsed: float | None = None  # the restored round's wall time, until its clock runs again
        if self.collection not in ("async", "sync"):
            raise ValueError(f'collection must be "async" or "sync" (got {self.collection!r})')
        self.sync = SyncBatches(self.frames_per_batch, self.rollout_fragment_length, self.batch_mode,
                                self.sync_timeout_s) if self.collection == "sync" else None
        self._batches: BatchesAhead | None = None  # while an epoch runs

    # -- set-up ---------------------------------------------------------------------------------------------
    def spaces(self) -> tuple[Any, Any]:
        if isinstance(self.env_cls, tuple):
            return self.env_cls
        env = self.env_cls()
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()

    def build(self) -> None:
        """Create the memory and the agent (no network, no files)."""
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = device
        if self.seed is not None:
            torch.manual_seed(self.seed)
        obs_space, act_space = self.spaces()
        check_spaces(obs_space, act_space)
        self.observation_space, self.action_space = obs_space, act_space
        self.memory = self._build_memory(device)
        if self.normalize_obs:  # batches use the statistics current when they are gathered
            self.obs_norm = normalize_batches(self.memory, obs_space, self.normalize_obs_clip)
        if self.sync is not None and not callable(getattr(self.memory, "clear", None)):
            raise ValueError(f"trainer.collection is sync, but the memory {type(self.memory).__name__} has no clear(): "
                             "a sync batch is trained once and dropped; use netrl.memory.RolloutMemory")
        compiled = compile_kwargs(self.training_agent_cls, self.compile, device)
        self.agent = self.training_agent_cls(observation_space=obs_space, action_space=act_space, device=device,
                                             **compiled)
        attach_views(self.memory, self.agent)  # what the agent's inputs need from earlier rows (memory/views.py)
        self.safeguards = Safeguards(value_limits(obs_space, act_space, self.max_abs_reward), self.agent,
                                     self.max_nonfinite_steps)
        self.agent_has_state = has_state_dict(self.agent)
        self.add_models(self.agent.extra_models(), f"{type(self.agent).__name__}.extra_models()")
        if self.obs_norm is not None:  # the workers normalise act's observations with the statistics as published
            every = self.normalize_obs_every or self.update_model_interval
            self.add_models({"obs_norm": ModelSpec(self.obs_norm, every)}, "env.normalize_obs")
        if not self.agent_has_state:
            name = type(self.agent).__name__
            log.warning("%s does not implement state_dict() and load_state_dict(): checkpoints will hold its actor's "
                        "weights, the counters and the sample log, but no other agent state (critics, target "
                        "networks, optimisers), so a restarted trainer trains those afresh. Implement "
                        "%s.state_dict() and %s.load_state_dict(state) (tensors and numbers only) to resume exactly",
                        name, name, name)

    def add_models(self, models: dict[str, ModelSpec], owner: str) -> None:
        """Publish ``models`` too (names are checked by the Trainer, which knows the wire's rules)."""
        for name, spec in models.items():
            if name in self.extra_models:
                raise ValueError(f"{owner} declares the model {name!r}, which is already published (by the agent's "
                                 "extra_models() or Trainer(models=...)): give it another name")
            if not isinstance(spec, ModelSpec) or not isinstance(spec.module, torch.nn.Module):
                raise ValueError(f"{owner}[{name!r}] is {spec!r:.80}, not a ModelSpec(module, every) of a "
                                 "torch.nn.Module")
            if isinstance(spec.every, bool) or not isinstance(spec.every, int) or spec.every < 1:
                raise ValueError(f"{owner}[{name!r}].every must be an integer >= 1: the gradient steps between two "
                                 f"publications (got {spec.every!r})")
            self.extra_models[name] = spec
            self.model_versions.setdefault(name, 0)

    def _build_memory(self, device: str) -> MemoryDataloading:
        """The memory, with ``memory_size`` and ``batch_size`` from the partial or this loop (see
        :func:`~netrl.memory.build.build_memory`), which then hold the values it has."""
        memory, self.memory_size, self.batch_size = build_memory(
            self.memory_cls, device=device, steps=self.steps, memory_size=self.memory_size,
            batch_size=self.batch_size, seed=self.seed, memory_device=self.memory_device)
        return memory

    def start(self, source: SampleSource) -> None:
        if self.agent is None:
            self.build()
        self.publish(source)
        for name in self.extra_models:  # a worker has every model's first version before any is due
            self._publish_model(source, name)

    def publish(self, source: SampleSource) -> None:
        """Send the actor under the next free number (above any the source says is taken: see _renumber)."""
        assert self.agent is not None
        actor = self.agent.get_actor()
        if self.safeguards is not None and not self.safeguards.publishable(actor):
            return
        self.version = max(self.version, source.taken_version()) + 1
        if self.sync is not None:  # the batch under collection takes this version only
            assert self.memory is not None
            self.memory.clear()  # type: ignore[attr-defined]  # (checked in build)
            self.sync.open(self.version)
            announce = getattr(source, "announce", None)
            if announce is None:
                raise ValueError(f"trainer.collection is sync, but the sample source {type(source).__name__} cannot "
                                 "tell the workers (it has no announce()): sync collection needs the networked "
                                 "Trainer")
            announce(self.sync.announcement())
        source.publish(actor, self.version, self.total_updates)
        self.published_updates = self.total_updates

    def _renumber(self, source: SampleSource) -> bool:
        """Publish the actor again after a version the source says is taken; True if it did."""
        taken = source.taken_version()
        # Equal is taken too: the number this loop published last may also name other weights out there.
        if taken < self.version:
            return False
        log.info("weight versions up to v%d may hold an earlier trainer session's weights (workers or the server "
                 "have them): publishing the current actor as v%d", taken, taken + 1)
        self.version = taken
        self.publish(source)
        return True

    def publish_models(self, source: SampleSource) -> None:
        """Publish each extra model that is due (every ``ModelSpec.every`` training steps) or whose number the
        source says is taken (an earlier trainer session's, as _renumber for the policy)."""
        taken = getattr(source, "taken_model_version", None)
        for name, spec in self.extra_models.items():
            renumber = taken is not None and taken(name) >= self.model_versions.get(name, 0)
            due = (self.total_updates % spec.every == 0 and self.total_updates > 0
                   and self._model_published.get(name) != self.total_updates)
            if renumber or due:
                self._publish_model(source, name)

    def _publish_model(self, source: SampleSource, name: str) -> None:
        if not _publishes_models(source):
            if not self._models_unsent_logged:
                self._models_unsent_logged = True
                log.warning("the sample source %s publishes the policy only: the models %s are not sent to the "
                            "workers", type(source).__name__, sorted(self.extra_models))
            return
        taken = getattr(source, "taken_model_version", None)
        version = max(self.model_versions.get(name, 0), taken(name) if taken is not None else -1) + 1
        self.model_versions[name] = version
        source.publish(self.extra_models[name].module, version, self.total_updates,  # type: ignore[call-arg]
                       model=name)
        self._model_published[name] = self.total_updates

    # -- the loop -------------------------------------------------------------------------------------------
    def wanted(self) -> int:
        """Total samples the trainer wants by now: the pacing target for throttled workers."""
        if self.sync is not None:  # the workers wait for each version instead: the pacing asks for all they make
            return self.total_samples + (1 << 40)
        paced = math.ceil(self.total_updates / self.max_training_steps_per_env_step)
        wanted = max(self.start_training, paced) + self.worker_lead
        return wanted if self.total_frames is None else min(wanted, self.total_frames)  # none beyond the last

    def frames_done(self) -> bool:
        """Whether ``total_frames`` samples have arrived: training is over."""
        return self.total_frames is not None and self.total_samples >= self.total_frames

    def ingest(self, source: SampleSource) -> int:
        """Move received packets into the memory; returns the number of new env steps."""
        return sum(self.add(buf) for buf in source.fetch())

    def add(self, buf: Buffer, new: bool = True) -> int:
        """Append one packet; ``new=False`` replays a packet that was already counted (restart from the log).

        Policy lag is measured against the trainer's version when the packet *arrived* (``buf.recv_version``), so
        replaying the sample log after a restart makes the same staleness decisions.
        """
        assert self.memory is not None
        if self.safeguards is not None and self.safeguards.refuse(buf, new):  # values beyond the spaces or the config
            return 0
        if self.obs_norm is not None and not self._learn_obs_stats(buf):
            return 0
        if self.sync is not None:
            return self._add_sync(buf, new)
        ends = ~(buf.reset | buf.context)
        recv = buf.recv_version if buf.recv_version >= 0 else self.version
        lag = recv - np.maximum(buf.policy_version, 0)
        stale = ends & (lag > self.max_policy_lag) if self.max_policy_lag is not None else None
        if stale is not None and stale.any():
            buf.weight = np.where(stale, np.float32(self.stale_sample_weight), np.float32(1.0))
        # what the memory keeps: a packet longer than the memory keeps only its newest rows, and the count (and the
        # pacing built on it) must not claim the others
        kept = ends[-self.memory_size:] if self.memory_size and len(ends) > self.memory_size else ends
        steps = int(np.count_nonzero(kept))
        if self._batches is not None:
            self._batches.settle()  # no gather may read the memory while it changes
        try:
            self.memory.append_buffer(buf)
        except ValueError as exc:  # e.g. image bytes that do not decode: a bad packet costs itself, not the run
            self.unstored += 1
            if worth_logging(self.unstored, first=5, every=100):
                log.error("packet %d of worker %s (%d samples) could not be stored and is skipped (%d so far): %s",
                          buf.seq, buf.worker, steps, self.unstored, exc)
            return 0
        if new and stale is not None:
            self._round.stale += int(stale.sum())
        if new:
            r = self._round
            r.samples += steps
            r.add_lags(lag[ends])
            for ep in buf.episodes:
                (r.test_returns if ep.test else r.returns).append(ep.ret)
            self.total_samples += steps
        return steps

    def _learn_obs_stats(self, buf: Buffer) -> bool:
        """Merge a packet's observations into ``obs_norm`` (also one replayed from the sample log: the statistics are
        rebuilt with the memory); False, with the packet counted as unstored, when they do not fit."""
        assert self.obs_norm is not None
        if self._batches is not None:
            self._batches.settle()  # no gather may read the statistics while they change
        try:  # each row once: context rows repeat the previous packet's last rows
            self.obs_norm.update(tree_map(lambda col: col[~buf.context], buf.obs))
        except ValueError as exc:
            self.unstored += 1
            if worth_logging(self.unstored, first=5, every=100):
                log.error("packet %d of worker %s is skipped (%d so far): %s", buf.seq, buf.worker, self.unstored, exc)
            return False
        return True

    def _add_sync(self, buf: Buffer, new: bool) -> int:
        return add_packet(self, buf, new)

    def live(self) -> dict[str, Any]:
        """The loop's counters for the trainer's status line. Called from the network thread: plain reads of what
        the loop updates, so a round may be half done."""
        r = self._round
        returns = list(r.returns)
        return {"trained_steps": self.total_updates, "samples": self.total_samples,
                "start_training": self.start_training, "memory_len": len(self.memory) if self.memory is not None else 0,
                "memory_size": self.memory_size, "version": self.version, "model_versions": dict(self.model_versions),
                "lag": r.lag(),
                "return_mean": float(np.mean(returns)) if returns else None, "episodes": len(returns),
                **(self.sync.live() if self.sync is not None else {})}

    def state(self) -> dict[str, Any]:
        """The loop's counters, for a checkpoint."""
        return {"epoch": self.epoch, "total_updates": self.total_updates, "total_samples": self.total_samples,
                "version": self.version, "round": self.round, "round_steps": self.round_steps,
                "model_versions": dict(self.model_versions),
                "round_stats": self._round.to_state(), **(self.safeguards.state() if self.safeguards else {})}

    def load_state(self, state: dict[str, Any]) -> None:
        self.epoch, self.total_updates = int(state["epoch"]), int(state["total_updates"])
        self.total_samples, self.version = int(state["total_samples"]), int(state["version"])
        # where in the epoch a stopped trainer was (checkpoints before these keys resume at the epoch's start)
        self.round, self.round_steps = int(state.get("round", 0)), int(state.get("round_steps", 0))
        for name, version in (state.get("model_versions") or {}).items():  # (none in checkpoints before issue 34)
            self.model_versions[name] = max(self.model_versions.get(name, 0), int(version))
        if self.safeguards is not None:
            self.safeguards.load_state(state)
        if "round_stats" in state:  # what the round under way had counted, from before the stop
            self._round = RoundStats.from_state(state["round_stats"])
            # its clock runs on from when training does: rebuilding the memory is not the round's time
            self._resumed_elapsed = float(state["round_stats"].get("elapsed_s", 0.0))

    def _report(self, source: SampleSource, force: bool = False) -> None:
        wanted, now = self.wanted(), time.monotonic()
        # also once a second: the server's --status shows the training steps, which move before the wish does
        if force or wanted - self._last_wanted >= max(1, self.worker_lead // 4) or now - self._last_report_at >= 1.0:
            self._last_wanted, self._last_report_at = wanted, now
            if self.sync is not None:
                source.progress(self.total_updates, self.total_samples, wanted,
                                batch=(self.sync.version, self.sync.steps))  # type: ignore[call-arg]
            else:
                source.progress(self.total_updates, self.total_samples, wanted)

    def _ready(self) -> bool:
        assert self.memory is not None
        return (self.total_samples >= self.start_training and len(self.memory) > 0
                and self.total_updates < self.max_training_steps_per_env_step * self.total_samples)

    def run_epoch(self, source: SampleSource, stop: threading.Event) -> Iterator[dict[str, Any]]:
        """Train one epoch; yields a stats dict after each round. Returns early when ``stop`` is set."""
        assert self.memory is not None
        self._batches = BatchesAhead(self.memory, self.device or "cpu", ahead=None if self.prefetch else False)
        try:
            yield from self._epoch(source, stop, self._batches)
        finally:
            self._batches.close()
            self._batches = None

    def _epoch(self, source: SampleSource, stop: threading.Event, batches: BatchesAhead) -> Iterator[dict[str, Any]]:
        assert self.agent is not None and self.memory is not None
        if self.agent_scheduler is not None:
            self.agent_scheduler(self.agent, self.epoch)
        profiler = cProfile.Profile() if self.profiling else None
        assert self.safeguards is not None
        self.safeguards.begin()  # the state a non-finite step goes back to (a checkpoint's, loaded after build)
        if self._resumed_elapsed is not None:
            self._round.started, self._resumed_elapsed = time.monotonic() - self._resumed_elapsed, None
        first_round, first_step = self.round, self.round_steps  # mid-epoch after a resume, else 0, 0
        for rnd in range(first_round, self.rounds):
            self.round, self.round_steps = rnd, first_step if rnd == first_round else 0
            for step in range(self.round_steps, self.steps):
                if stop.is_set():
                    return
                if self._collect(source, stop, step):  # a sync batch was trained: the step is done
                    continue
                if stop.is_set():
                    return
                if self.frames_done():  # the round so far is reported; the caller saves
                    self.safeguards.settle(self.total_updates)
                    yield self._round_summary(rnd)
                    self._round = RoundStats()
                    return
                self._publish_due_versions(source)
                if profiler:
                    profiler.enable()
                t0 = time.perf_counter()
                batch = batches.next()  # gathered while the previous step trained, if it could be
                t1 = time.perf_counter()
                metrics = self._train(batch)
                self._round.train_s += time.perf_counter() - t1
                self._round.sample_s += t1 - t0
                if profiler:
                    profiler.disable()
                self.round_steps += 1  # a step undone takes its place in the round, but trains nothing
                priority = pop_priority(metrics)  # per sample, not a metric
                if not self.safeguards.accept(metrics, batches, self.total_updates + 1):
                    continue  # an undone step's priorities are not kept either
                self.total_updates += 1
                if priority is not None:
                    batches.settle()  # the priorities change: no gather ahead may be reading them meanwhile
                update_from_metrics(self.memory, batch, priority, self.total_updates)
                self._round.add_step(metrics)
                self._report(source)
            self.safeguards.settle(self.total_updates)  # a round ends on a finite state, which a save may keep
            yield self._round_summary(rnd)
            self._round = RoundStats()  # after the round, not before: the first one keeps what arrived before it
        self.epoch, self.round, self.round_steps = self.epoch + 1, 0, 0
        if profiler:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(20)
            log.info("profile of epoch %d:\n%s", self.epoch, out.getvalue())

    def _train(self, batch: Batch) -> dict[str, Any]:
        assert self.agent is not None
        try:
            return self.agent.train(batch)
        except ValueError as e:
            _note_batch_unpacking(e, self.agent)
            raise

    def _collect(self, source: SampleSource, stop: threading.Event, step: int) -> bool:
        """Async: ingest and wait until training may go on; False. Sync: collect and train one batch; True, or False
        when stopped or total_frames was reached first."""
        if self.sync is not None:
            return self._sync_step(source, stop)
        if step % self.update_buffer_interval == 0:
            self.ingest(source)
        self._wait_until_ready(source, stop)
        return False

    def _sync_step(self, source: SampleSource, stop: threading.Event) -> bool:
        """One sync batch (see :func:`netrl.training.sync.collect_and_train`) as one training step;
        False to end the epoch
        (stopped, or total_frames reached: the caller's next pass reports it)."""
        assert self.safeguards is not None and self.memory is not None
        metrics = collect_and_train(self, source, stop)
        if metrics is None:
            return False
        self.round_steps += 1
        if self.safeguards.accept(metrics, self.memory, self.total_updates + 1):
            self.total_updates += 1
            self._round.add_step(metrics)
        self.publish(source)  # the next batch's version, also after an undone step: the workers wait for one
        if self.extra_models:
            self.publish_models(source)
        return True

    def _publish_due_versions(self, source: SampleSource) -> None:
        if not self._renumber(source) and self._publish_due():  # renumber: checked every step (cheap)
            self.publish(source)
        if self.extra_models:
            self.publish_models(source)

    def _publish_due(self) -> bool:
        """Every ``update_model_interval`` training steps (not again after a step was undone)."""
        return (self.total_updates % self.update_model_interval == 0 and self.total_updates > 0
                and self.published_updates != self.total_updates)

    def _wait_until_ready(self, source: SampleSource, stop: threading.Event) -> None:
        if self._ready():
            return
        t0 = time.monotonic()
        self._report(source, force=True)
        while not self._ready() and not stop.is_set() and not self.frames_done():
            source.wait(self.sleep_between_buffer_retrieval_attempts)
            self._renumber(source)
            if self.ingest(source):
                self._report(source, force=True)
        self._round.waited_s += time.monotonic() - t0

    def _round_summary(self, rnd: int) -> dict[str, Any]:
        return {"epoch": self.epoch, "round": rnd, "trained_steps": self.total_updates, "samples": self.total_samples,
                "memory_len": len(self.memory) if self.memory is not None else 0, "policy_version": self.version,
                **self._round.summary(),
                **(self.sync.metrics() if self.sync is not None else {}),
                **(self.safeguards.state() if self.safeguards else {})}
