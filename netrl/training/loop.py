"""TrainingOffline: tmrl's training loop (epochs > rounds > steps), whatever the samples come from.

The loop talks to a :class:`SampleSource`: the networked Trainer's connection to the server, or, for
the single-process baseline, a local worker. Calling sequence::

    training = TrainingOffline(env_cls, memory_cls, training_agent_cls, epochs=..., steps=...,
                               settings=TrainingSettings(...))  # netrl's; or as keywords
    training.start(source)                      # build memory and agent, publish weights v1
    for epoch in range(training.epochs):
        for round_stats in training.run_epoch(source, stop):   # one dict per round, for logging
            ...

What it is made of, once built: ``settings`` (:mod:`netrl.training.settings`), ``ingester`` (packets
into the memory, :mod:`netrl.training.ingest`), ``publisher`` (weights out,
:mod:`netrl.training.publish`), ``safeguards`` (what it refuses and undoes) and, for sync
collection, ``sync`` (:mod:`netrl.training.sync`).

Pacing (the update-to-data ratio): training pauses while ``trained_steps >=
max_training_steps_per_env_step * samples`` (tmrl's meaning), and the loop tells the source how many
samples it wants in total, ``max(start_training, trained_steps / ratio) + worker_lead``, so
throttled workers run no further ahead. With ``max_policy_lag`` set, it wants no more than it
trains on before it publishes ``max_policy_lag - 1`` more versions (yet one more than it holds), so
a sample arrives before the policy moves ``max_policy_lag`` versions on (a worker's samples arrive
in order, and its steps beyond the wish are fewer than a version's: a vector step is a row an env).

With ``total_frames`` set (TorchRL's collectors' name), the loop stops once that many samples have
arrived: an epoch cut short yields the round under way, and :meth:`TrainingOffline.frames_done`
tells the caller to save and finish.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

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
from netrl.samples.columns import Buffer
from netrl.training.ingest import Ingester
from netrl.training.plausibility import declared_reward_range, reward_bound
from netrl.training.profiling import EpochProfile
from netrl.training.publish import Publisher
from netrl.training.rounds import RoundStats
from netrl.training.safeguards import Safeguards
from netrl.training.settings import TrainingSettings, fold_keywords
from netrl.training.source import SampleSource
from netrl.training.sync import SyncBatches

__all__ = ["SampleSource", "TrainingAgent", "TrainingOffline", "TrainingSettings"]

log = logging.getLogger(__name__)


_SHORT_UNPACK = re.compile(r"too many values to unpack \(expected [1-6][,)]")


def _note_batch_unpacking(error: ValueError, agent: TrainingAgent) -> None:
    """Tell a ported tmrl agent why ``o, a, r, o2, d = batch`` failed in its ``train``: a Batch has
    seven fields."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    train = getattr(type(agent).train, "__code__", None)
    if tb is not None and tb.tb_frame.f_code is train and _SHORT_UNPACK.match(str(error)):
        error.add_note(f"netrl: if this is the batch in {type(agent).__name__}.train, a Batch has "
                       f"{len(Batch._fields)} fields ({', '.join(Batch._fields)}): tmrl's "
                       "`o, a, r, o2, d = batch` becomes `o, a, r, o2, d, _, _ = batch` (d is "
                       "terminated), or read them by name: batch.terminated")


class TrainingOffline:
    """The training loop with tmrl's parameters. netrl's own come as ``settings``, or as keywords
    of the same names, which are folded into them. See the module docstring."""

    def __init__(self, env_cls: Any = None,
                 memory_cls: Callable[..., MemoryDataloading] = ReplayMemory,
                 training_agent_cls: Callable[..., TrainingAgent] = SACAgent, epochs: float = 10,
                 rounds: int = 50, steps: int = 2000, update_model_interval: int = 100,
                 update_buffer_interval: int = 100, max_training_steps_per_env_step: float = 1.0,
                 sleep_between_buffer_retrieval_attempts: float = 0.1, profiling: bool = False,
                 agent_scheduler: Callable[[TrainingAgent, int], None] | None = None,
                 start_training: int = 0, device: str | None = None, *,
                 settings: TrainingSettings | None = None, **keywords: Any) -> None:
        self.env_cls = env_cls  # makes an env (only its spaces are used), or (obs_space, act_space)
        self.memory_cls, self.training_agent_cls = memory_cls, training_agent_cls
        self.epochs = epochs  # an int, or np.inf (as in tmrl's tutorial) to train until stopped
        self.rounds, self.steps = rounds, steps
        self.update_model_interval = update_model_interval
        self.update_buffer_interval = update_buffer_interval
        self.max_training_steps_per_env_step = max_training_steps_per_env_step
        self.sleep_between_buffer_retrieval_attempts = sleep_between_buffer_retrieval_attempts
        self.profiling, self.agent_scheduler = profiling, agent_scheduler
        self.start_training, self.device = start_training, device
        self.settings = s = fold_keywords(settings, keywords, TrainingOffline)
        self.sync = SyncBatches(s.frames_per_batch, s.rollout_fragment_length, s.batch_mode,
                                s.sync_timeout_s) if s.collection == "sync" else None
        self.total_updates = self.total_samples = self.epoch = 0
        self.round = self.round_steps = 0  # the round of the epoch under way, and its steps so far
        # what build() makes
        self.memory: MemoryDataloading | None = None
        self.agent: TrainingAgent | None = None
        self.agent_has_state = False  # whether the agent has state_dict and load_state_dict
        self.observation_space: Any = None
        self.reward_range: tuple[float, float] | None = None  # the env's, where it declares one
        self.action_space: Any = None
        self.obs_norm: ObsNormalizer | None = None  # published as the model "obs_norm"
        self.safeguards: Safeguards | None = None  # value limits, the undo of non-finite steps
        self.ingester: Ingester | None = None
        self.publisher: Publisher | None = None
        self._profile: EpochProfile | None = None  # the epoch's (profiling): every step, sync too
        self._last_wanted, self._last_report_at = -1, 0.0
        self._round = RoundStats()
        self._resumed_elapsed: float | None = None  # a restored round's time, until its clock runs

    # -- set-up ------------------------------------------------------------------------------------
    def spaces(self) -> tuple[Any, Any]:
        if isinstance(self.env_cls, tuple):
            return self.env_cls
        env = self.env_cls()
        try:
            self.reward_range = declared_reward_range(env)  # (trainer.max_abs_reward's default)
            return env.observation_space, env.action_space
        finally:
            env.close()

    def build(self) -> None:
        """Create the memory, the agent and what the loop is made of (no network, no files)."""
        s = self.settings
        device = self.device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if s.seed is not None:
            torch.manual_seed(s.seed)
        obs_space, act_space = self.spaces()
        check_spaces(obs_space, act_space)
        self.observation_space, self.action_space = obs_space, act_space
        # the sizes come from the partial or the settings (see build_memory): the settings then
        # hold those the memory has
        memory, memory_size, batch_size = build_memory(
            self.memory_cls, device=device, steps=self.steps, memory_size=s.memory_size,
            batch_size=s.batch_size, seed=s.seed, memory_device=s.memory_device,
            storage=s.memory_storage, storage_folder=s.memory_folder,
            resident_mib=s.memory_resident_mib)
        self.memory = memory
        self.settings = s = dataclasses.replace(s, memory_size=memory_size, batch_size=batch_size)
        if s.normalize_obs:  # batches use the statistics current when they are gathered
            self.obs_norm = normalize_batches(memory, obs_space, s.normalize_obs_clip)
        if self.sync is not None and not callable(getattr(memory, "clear", None)):
            raise ValueError(f"trainer.collection is sync, but the memory {type(memory).__name__} "
                             "has no clear(): a sync batch is trained once and dropped; use "
                             "netrl.memory.RolloutMemory")
        compiled = compile_kwargs(self.training_agent_cls, s.compile, device)
        self.agent = agent = self.training_agent_cls(
            observation_space=obs_space, action_space=act_space, device=device, **compiled)
        attach_views(memory, agent)  # what the agent's inputs need from earlier rows (views.py)
        bound = reward_bound(s.max_abs_reward, self.reward_range)
        limits = value_limits(obs_space, act_space, bound)
        self.safeguards = guards = Safeguards(limits, agent, s.max_nonfinite_steps)
        self.agent_has_state = has_state_dict(agent)
        self.ingester = Ingester(memory, s, guards, self.obs_norm, self.sync, self.reward_range)
        self.publisher = Publisher(agent, guards, self.update_model_interval, self.sync, memory)
        self.publisher.add_models(agent.extra_models(), f"{type(agent).__name__}.extra_models()")
        if self.obs_norm is not None:  # the workers normalise act's observations as published
            every = s.normalize_obs_every or self.update_model_interval
            self.publisher.add_models({"obs_norm": ModelSpec(self.obs_norm, every)},
                                      "env.normalize_obs")
        if not self.agent_has_state:
            name = type(agent).__name__
            log.warning("%s does not implement state_dict() and load_state_dict(): checkpoints "
                        "will hold its actor's weights, the counters and the sample log, but no "
                        "other agent state (critics, target networks, optimisers), so a restarted "
                        "trainer trains those afresh. Implement %s.state_dict() and "
                        "%s.load_state_dict(state) (tensors and numbers only) to resume exactly",
                        name, name, name)

    def start(self, source: SampleSource) -> None:
        """Build (unless built), then publish the actor's first version and every model's."""
        if self.agent is None:
            self.build()
        assert self.publisher is not None
        self.publisher.start(source, self.total_updates)

    # -- samples in, weights out -------------------------------------------------------------------
    def ingest(self, source: SampleSource) -> int:
        """Move received packets into the memory; returns the number of new env steps."""
        checked = self.safeguards is not None and self.safeguards.checked_by(source)
        # revocations and lifts heard of, revocations asked for, the workers' standing reported
        steps = self.ingester.exchange(source, self.add) if self.ingester is not None else 0
        return steps + sum(self.add(buf, checked=checked) for buf in source.fetch())

    def add(self, buf: Buffer, new: bool = True, checked: bool = False) -> int:
        """One packet in (:meth:`Ingester.add`; ``new=False``: a replay, counted before)."""
        assert self.ingester is not None and self.publisher is not None
        steps = self.ingester.add(buf, new, self.publisher.version, self._round, checked)
        if new:
            self.total_samples += steps
        return steps

    def publish(self, source: SampleSource) -> None:
        """Send the actor now, under the next free version (:meth:`Publisher.publish`)."""
        assert self.publisher is not None
        self.publisher.publish(source, self.total_updates)

    # -- pacing ------------------------------------------------------------------------------------
    def wanted(self) -> int:
        """Total samples the trainer wants by now: the pacing target for throttled workers."""
        if self.sync is not None:  # the workers wait for each version: it asks for all they make
            return self.total_samples + (1 << 40)
        s, ratio, start = self.settings, self.max_training_steps_per_env_step, self.start_training
        wanted = max(start, math.ceil(self.total_updates / ratio)) + s.worker_lead
        if s.max_policy_lag is not None and self.publisher is not None:  # (module docstring)
            ahead = (s.max_policy_lag - 1) * self.update_model_interval
            fresh = math.floor((self.publisher.published_updates + ahead) / ratio)
            wanted = min(wanted, max(fresh, start, self.total_samples + 1))
        return wanted if s.total_frames is None else min(wanted, s.total_frames)  # none beyond

    def frames_done(self) -> bool:
        """Whether ``total_frames`` samples have arrived: training is over."""
        total = self.settings.total_frames
        return total is not None and self.total_samples >= total

    def _report(self, source: SampleSource, force: bool = False) -> None:
        wanted, now = self.wanted(), time.monotonic()
        # also once a second: the server's --status shows the training steps, which move first
        if (force or wanted - self._last_wanted >= max(1, self.settings.worker_lead // 4)
                or now - self._last_report_at >= 1.0):
            self._last_wanted, self._last_report_at = wanted, now
            if self.sync is not None:
                batch = (self.sync.version, self.sync.steps)
                source.progress(self.total_updates, self.total_samples, wanted,
                                batch=batch)  # type: ignore[call-arg]
            else:
                source.progress(self.total_updates, self.total_samples, wanted)

    def _ready(self) -> bool:
        assert self.memory is not None
        return (self.total_samples >= self.start_training and len(self.memory) > 0
                and self.total_updates < self.max_training_steps_per_env_step * self.total_samples)

    # -- the loop ----------------------------------------------------------------------------------
    def run_epoch(self, source: SampleSource, stop: threading.Event) -> Iterator[dict[str, Any]]:
        """Train one epoch; yields a stats dict after each round. Returns early when ``stop`` is
        set."""
        assert self.memory is not None and self.ingester is not None
        ahead = None if self.settings.prefetch else False  # None: where it helps (see prefetch)
        batches = BatchesAhead(self.memory, self.device or "cpu", ahead=ahead)
        self.ingester.batches = batches  # settled before a packet changes the memory
        try:
            yield from self._epoch(source, stop, batches)
        finally:
            batches.close()
            self.ingester.batches = None

    def _epoch(self, source: SampleSource, stop: threading.Event, batches: BatchesAhead
               ) -> Iterator[dict[str, Any]]:
        agent, guards, publisher = self.agent, self.safeguards, self.publisher
        assert agent is not None and guards is not None and publisher is not None
        assert self.memory is not None
        if self.agent_scheduler is not None:
            self.agent_scheduler(agent, self.epoch)
        self._profile = profile = EpochProfile() if self.profiling else None
        guards.begin()  # the state a non-finite step goes back to (a checkpoint's, after build)
        if self._resumed_elapsed is not None:
            self._round.started = time.monotonic() - self._resumed_elapsed
            self._resumed_elapsed = None
        first_round, first_step = self.round, self.round_steps  # mid-epoch after a resume
        draw = batches.next  # the hot loop: bound once
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
                    guards.settle(self.total_updates)
                    yield self._round_summary(rnd)
                    self._round = RoundStats()
                    return
                publisher.publish_due(source, self.total_updates)
                batch, metrics = self._train(draw)  # gathered while the last step trained
                self.round_steps += 1  # a step undone takes its place in the round, trains nothing
                priority = pop_priority(metrics)  # per sample, not a metric
                if not guards.accept(metrics, batches, self.total_updates + 1):
                    continue  # an undone step's priorities are not kept either
                self.total_updates += 1
                if priority is not None:
                    batches.settle()  # the priorities change: no gather ahead may read them now
                update_from_metrics(self.memory, batch, priority, self.total_updates)
                self._round.add_step(metrics)
                self._report(source)
            guards.settle(self.total_updates)  # a round ends on a finite state, which saves keep
            yield self._round_summary(rnd)
            self._round = RoundStats()  # after the round: the first keeps what arrived before it
        self.epoch, self.round, self.round_steps = self.epoch + 1, 0, 0
        if profile:
            log.info("%s", profile.report(self.epoch))

    def _train(self, draw: Callable[[], Batch]) -> tuple[Batch, dict[str, Any]]:
        """Draw a batch and train the agent on it, timing both for the round."""
        assert self.agent is not None
        profile = self._profile
        if profile:
            profile.enable()
        t0 = time.perf_counter()
        batch = draw()
        t1 = time.perf_counter()
        try:
            metrics = self.agent.train(batch)
        except ValueError as e:
            _note_batch_unpacking(e, self.agent)
            raise
        finally:
            if profile:
                profile.disable()
        self._round.train_s += time.perf_counter() - t1
        self._round.sample_s += t1 - t0
        return batch, metrics

    def _collect(self, source: SampleSource, stop: threading.Event, step: int) -> bool:
        """Async: ingest and wait until training may go on; False. Sync: collect and train one
        batch; True, or False when stopped or total_frames was reached first."""
        if self.sync is not None:
            return self._sync_step(source, stop)
        if step % self.update_buffer_interval == 0:
            self.ingest(source)
        self._wait_until_ready(source, stop)
        return False

    def _wait_until_ready(self, source: SampleSource, stop: threading.Event) -> None:
        if self._ready():
            return
        assert self.publisher is not None
        t0 = time.monotonic()
        self._report(source, force=True)
        while not self._ready() and not stop.is_set() and not self.frames_done():
            source.wait(self.sleep_between_buffer_retrieval_attempts)
            self.publisher.renumber(source, self.total_updates)
            if self.ingest(source):
                self._report(source, force=True)
        self._round.waited_s += time.monotonic() - t0

    def _sync_step(self, source: SampleSource, stop: threading.Event) -> bool:
        """One sync batch as one training step: wait for the batch of the version published last,
        train on it once, and publish the next version, which opens the next batch (also after an
        undone step: the workers wait for one). False, with nothing trained, when stopped or
        total_frames was reached first: the caller's next pass reports it."""
        sync, memory, guards, publisher = self.sync, self.memory, self.safeguards, self.publisher
        assert sync is not None and memory is not None
        assert guards is not None and publisher is not None
        waited = told = time.monotonic()
        self._report(source, force=True)
        while not sync.full():
            if stop.is_set() or self.frames_done():
                return False
            if self.ingest(source):
                self._report(source, force=True)
                continue
            if sync.timed_out():
                if len(memory):
                    sync.short()
                    break
                if time.monotonic() - told >= sync.timeout_s:  # nothing: no worker is collecting
                    told = time.monotonic()
                    log.warning("no samples of weights v%d arrived for %.0f s: is any worker "
                                "connected?", sync.version, told - sync.opened)
            publisher.renumber(source, self.total_updates)  # taken: the batch restarts, renumbered
            source.wait(min(0.05, self.sleep_between_buffer_retrieval_attempts))
        sync.trainer_wait_s = time.monotonic() - waited
        self._round.waited_s += sync.trainer_wait_s
        _, metrics = self._train(memory.sample)
        self.round_steps += 1
        if guards.accept(metrics, memory, self.total_updates + 1):
            self.total_updates += 1
            self._round.add_step(metrics)
        publisher.publish(source, self.total_updates)  # clears the memory for the next batch
        publisher.publish_models(source, self.total_updates)
        return True

    # -- what the loop shows and keeps -------------------------------------------------------------
    def live(self) -> dict[str, Any]:
        """The loop's counters for the trainer's status line. Called from the network thread: plain
        reads of what the loop updates, so a round may be half done."""
        r, p = self._round, self.publisher
        returns = list(r.returns)
        return {"trained_steps": self.total_updates, "samples": self.total_samples,
                "start_training": self.start_training, "memory_len": len(self.memory or ()),
                "memory_size": self.settings.memory_size, "version": p.version if p else 0,
                "model_versions": dict(p.model_versions) if p else {}, "lag": r.lag(),
                "return_mean": float(np.mean(returns)) if returns else None,
                "episodes": len(returns), **(self.sync.live() if self.sync is not None else {}),
                "implausible": self.ingester.plausibility.metrics() if self.ingester else {}}

    def state(self) -> dict[str, Any]:
        """The loop's counters, for a checkpoint (after build)."""
        p = self.publisher
        assert p is not None
        return {"epoch": self.epoch, "total_updates": self.total_updates,
                "total_samples": self.total_samples, "version": p.version, "round": self.round,
                "round_steps": self.round_steps, "model_versions": dict(p.model_versions),
                "round_stats": self._round.to_state(),
                **(self.safeguards.state() if self.safeguards else {}),
                **(self.ingester.plausibility.state() if self.ingester else {})}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's :meth:`state` (after build)."""
        p = self.publisher
        assert p is not None
        self.epoch, self.total_updates = int(state["epoch"]), int(state["total_updates"])
        self.total_samples, p.version = int(state["total_samples"]), int(state["version"])
        # where in the epoch a stopped trainer was (older checkpoints resume at the epoch's start)
        self.round, self.round_steps = int(state.get("round", 0)), int(state.get("round_steps", 0))
        for name, version in (state.get("model_versions") or {}).items():  # (none before issue 34)
            p.model_versions[name] = max(p.model_versions.get(name, 0), int(version))
        if self.safeguards is not None:
            self.safeguards.load_state(state)
        if self.ingester is not None:
            self.ingester.plausibility.load_state(state)
        if "round_stats" in state:  # what the round under way had counted, from before the stop
            self._round = RoundStats.from_state(state["round_stats"])
            # its clock runs on from when training does: rebuilding the memory is not its time
            self._resumed_elapsed = float(state["round_stats"].get("elapsed_s", 0.0))

    def _round_summary(self, rnd: int) -> dict[str, Any]:
        assert self.publisher is not None
        return {"epoch": self.epoch, "round": rnd, "trained_steps": self.total_updates,
                "samples": self.total_samples, "memory_len": len(self.memory or ()),
                "policy_version": self.publisher.version, **self._round.summary(),
                **(self.sync.metrics() if self.sync is not None else {}),
                **(self.safeguards.state() if self.safeguards else {}),
                **(self.ingester.plausibility.metrics() if self.ingester else {})}
