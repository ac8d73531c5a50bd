"""RolloutWorker: runs the current policy in an env and sends sample packets to the server, as in tmrl.

Two threads. The *control path* (the thread that calls :meth:`RolloutWorker.run`) only steps the env, computes
actions and appends rows to preallocated columns. Everything slow happens on the *network thread*
(:class:`~netrl.worker.link.WorkerLink`, with :class:`~netrl.worker.weight_receiver.WeightReceiver`): sending packets,
receiving and checking weights, loading them into a spare actor and saving them to ``model_path``. Between two env
steps the control path swaps in the ready actor, a pointer swap, so a weight update never delays a real-time step.
Every row is tagged with the version of the weights that chose its action; :class:`~netrl.worker.packets.PacketMaker`
gathers the rows into sample packets.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
import time
import zlib
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from netrl.config.sections import Config, NetworkConfig
from netrl.envs.checks import check_action, check_observation, check_sample_compressor, check_spaces
from netrl.envs.guard import EnvCaller
from netrl.errors import CheckpointError, EnvFailure, NetrlError
from netrl.lifecycle import Runs, RunStop
from netrl.monitor.metrics import CsvLog
from netrl.net.keys import ClientKeys, client_keys
from netrl.net.transport import new_session
from netrl.protocol.messages import PEER_NAME, PEER_NAME_RULE
from netrl.protocol.schema import SampleSchema, probe_copy
from netrl.protocol.weights import check_weights, load_weights
from netrl.protocol.wire import Codec
from netrl.samples import EpisodeStats
from netrl.storage.folderlock import FolderLock
from netrl.storage.weight_files import read_weights_file, remove_stale_temps, write_weights_file
from netrl.util import version_label
from netrl.worker.link import WorkerLink
from netrl.worker.names import claim_worker_id, default_worker_id
from netrl.worker.packets import PacketMaker
from netrl.worker.weight_receiver import WeightReceiver

__all__ = ["RolloutWorker"]

log = logging.getLogger(__name__)


def worker_seed(seed: int | None, worker_id: str) -> int | None:
    """A worker's own seed, from the config's ``seed`` and its name: workers started from one config.json must
    not collect the same episodes and actions, and a worker's stream stays the same from run to run."""
    return None if seed is None else (seed + zlib.crc32(worker_id.encode())) % 2**32


class RolloutWorker:
    """Collects samples with the current policy and streams them to the server (tmrl's arguments).

    Args:
        env_cls: a callable returning a Gymnasium env (usually ``partial(GenericGymEnv, id=...)``).
        actor_module_cls: a callable ``(observation_space, action_space) -> ActorModule``.
        sample_compressor: ``f(act, obs, rew, terminated, truncated, info)`` returning the same tuple, shrunk for
            the network; the trainer's memory undoes it.
        device: inference device.
        server_ip: address of the server.
        min_samples_per_worker_packet: rows gathered before a packet is sent (with ``max_packet_delay_s`` set,
            at most that long).
        max_samples_per_episode: episodes longer than this are truncated (and bootstrapped, not terminal).
        model_path: where received weights are saved, and loaded from at start.
        obs_preprocessor: applied to each observation before ``act``.
        model_path_history: prefix for the weight history kept when ``model_history > 0`` (files
            ``<prefix>_v000123.pt``); None: ``model_path`` without its suffix, plus ``_history``.
        model_history: also keep every ``model_history``-th received version (0: none).
        standalone: run without a server (deployment): no samples are sent, weights come from ``model_path``.
        server_port, worker_id, network: connection settings (see config.json).
        overlap: rows of context a memory needs before each transition (see :mod:`netrl.samples`).
        throttle: wait for the trainer's PACE allowance (simulated envs only, never real-time ones).
        max_packet_delay_s: a partial packet is sent after this long. None (tmrl's behaviour, the default here;
            config.json sets 0.5 s): a packet waits for ``min_samples_per_worker_packet`` rows.
        compression: codec for packets ("zstd", "lz4", "none"); only integer arrays such as images use it.
        max_backlog_bytes: unacknowledged packets kept for resending; beyond it the oldest are dropped (counted).
            Packets not yet taken by the network thread are bounded by it too (see WorkerLink.hand_over).
        send_window_bytes: unacknowledged packets in flight to the server.
        flush_timeout_s: on close, how long to wait for the last packets to be acknowledged.
        episode_log: CSV file that gets one line per finished episode (time, return, length, env steps...).
        keys: CURVE keys to connect with (:func:`netrl.net.keys.client_keys`); None connects unencrypted.
        status_interval_s: seconds between status log lines (0: none).
        env_timeout_factor, env_timeout_min_s: when an env call counts as hung (:mod:`netrl.envs.guard`).
        on_env_failure: what a hung env call or a dead env thread does: "stop" (raise EnvFailure) or "reset".
        init_random_frames: act uniformly at random from the action space until the trainer holds this many samples
            (as the server tells; in test episodes and standalone, never); 0: off.

    The arguments after ``obs_preprocessor`` are keyword-only: tmrl's positional order has ``crc_debug`` there,
    which netrl does not take, so a call in that order would give every later value to the wrong parameter.
    """

    def __init__(self, env_cls: Callable[[], Any], actor_module_cls: Callable[..., Any],
                 sample_compressor: Callable[..., Any] | None = None, device: str = "cpu",
                 server_ip: str | None = None, min_samples_per_worker_packet: int = 1,
                 max_samples_per_episode: float = np.inf, model_path: str | None = None,
                 obs_preprocessor: Callable[..., Any] | None = None, *, model_path_history: str | None = None,
                 model_history: int = 0, standalone: bool = False, server_port: int = 55556,
                 worker_id: str | None = None, network: NetworkConfig | None = None, overlap: int = 1,
                 throttle: bool = False, max_packet_delay_s: float | None = None, compression: Codec = "zstd",
                 max_backlog_bytes: int = 256 << 20, send_window_bytes: int = 32 << 20,
                 flush_timeout_s: float = 2.0, seed: int | None = None,
                 episode_log: str | None = None, keys: ClientKeys | None = None,
                 status_interval_s: float = 0.0, env_timeout_factor: float = 50.0, env_timeout_min_s: float = 5.0,
                 on_env_failure: Literal["stop", "reset"] = "stop", init_random_frames: int = 0) -> None:
        if min_samples_per_worker_packet < 1:
            raise ValueError(f"min_samples_per_worker_packet must be >= 1 (got {min_samples_per_worker_packet})")
        if max_packet_delay_s is not None and not max_packet_delay_s > 0:
            raise ValueError(f"max_packet_delay_s must be > 0, or None to wait for min_samples_per_worker_packet rows "
                             f"(got {max_packet_delay_s})")
        if sample_compressor is not None:
            check_sample_compressor(sample_compressor)
        self.env_cls, self.actor_module_cls = env_cls, actor_module_cls
        self.sample_compressor, self.obs_preprocessor = sample_compressor, obs_preprocessor
        self.device = device
        self.network = network or NetworkConfig()
        if server_ip is not None:
            self.network = dataclasses.replace(self.network, server_ip=server_ip)
        self.server_port = server_port
        self.min_samples = min_samples_per_worker_packet
        self.max_samples_per_episode = max_samples_per_episode
        if model_path_history is None and model_path:
            model_path_history = str(Path(model_path).with_suffix("")) + "_history"
        self.model_path, self.model_path_history, self.model_history = model_path, model_path_history, model_history
        self.standalone = standalone
        self.worker_id = worker_id or default_worker_id()
        if not PEER_NAME.fullmatch(self.worker_id):  # the server would refuse its HELLO
            raise ValueError(f"worker_id {self.worker_id!r} is not a valid name: use {PEER_NAME_RULE}")
        self.session = new_session()
        self.overlap, self.throttle, self.max_delay = overlap, throttle, max_packet_delay_s
        self.compression: Codec = compression
        self.max_backlog_bytes, self.send_window_bytes = max_backlog_bytes, send_window_bytes
        self.flush_timeout = flush_timeout_s
        self.seed = seed
        self.keys = keys
        self.status_interval = status_interval_s
        self.last_return: float | None = None
        self.episode_log = CsvLog(Path(episode_log)) if episode_log else None
        self._logged_episodes = self._logged_steps = 0  # the episode log's counts before this process (see start)
        self.version = -1  # weight version of self.actor (-1: the actor's own initialisation)
        self.produced = 0  # env steps recorded for training
        self.episodes_done = 0
        self.env: Any = None
        self.env_calls: EnvCaller | None = None  # runs the env's calls on its own thread, under watch
        self.env_timeout = (env_timeout_factor, env_timeout_min_s)
        self.on_env_failure = on_env_failure
        self.env_failures = 0  # env calls that hung or met a dead thread, and were reset (on_env_failure "reset")
        self._failures_in_a_row = 0
        self.actor: Any = None
        self.template_actor: Any = None
        self.net: WorkerLink | None = None
        self.weights: WeightReceiver | None = None
        self.packets = PacketMaker(self.worker_id, self.session, self.min_samples, self.overlap, self.max_delay,
                                   self.compression, self.network.max_message_bytes, self.sample_compressor)
        self._saved_versions = 0
        self.samples_unacknowledged = 0  # at close: samples the server neither spooled nor delivered (at risk)
        self._runs = Runs(lambda: NetrlError(f"this RolloutWorker ({self.worker_id}) is closed: its env and network "
                                             "thread are gone; create a new one"),
                          lambda runner: NetrlError(f"worker {self.worker_id} is already running in {runner.name}: "
                                                    "only one thread may step its env; to collect in parallel, "
                                                    "create a RolloutWorker for each thread"))
        self._started = False
        self.name_lock: FolderLock | None = None  # from_config's: keeps worker_id this process's own in the run folder
        self._checked = False  # the first observations and action were checked against the spaces
        self.local_packets: list[Any] | None = None  # set by the single-process mode instead of a network
        self.episode_log_level = logging.INFO
        if init_random_frames < 0:
            raise ValueError(f"init_random_frames must be >= 0 (got {init_random_frames})")
        self.init_random_frames = init_random_frames
        self.trainer_samples: int | None = None  # the samples the trainer holds, as last told (see _choose_action)
        self._random_source: Any = None  # the action space random actions come from, seeded on first use
        self._actor_checked = False  # the actor's first action was checked against the action space

    @classmethod
    def from_config(cls, cfg: Config, pipeline: Any) -> RolloutWorker:
        w = cfg.worker
        worker_id, name_lock = claim_worker_id(cfg.run_dir, w.worker_id)  # default: the host name (netrl.worker.names)
        if w.throttle and pipeline.realtime:
            log.info("worker.throttle is ignored: the %s pipeline's env runs in real time, and pausing it would "
                     "change what it learns", cfg.env.pipeline)
        try:
            worker = cls(pipeline.env_cls, pipeline.actor_module_cls, pipeline.sample_compressor, w.device,
                         cfg.network.server_ip, w.min_samples_per_worker_packet,
                         np.inf if w.max_samples_per_episode is None else w.max_samples_per_episode,
                         str(cfg.run_dir / f"worker_policy_{worker_id}.pt"), pipeline.obs_preprocessor,
                         model_path_history=str(cfg.run_dir / f"worker_policy_{worker_id}"),
                         model_history=w.model_history, server_port=cfg.network.worker_port, worker_id=worker_id,
                         network=cfg.network, overlap=pipeline.overlap,
                         throttle=w.throttle and not pipeline.realtime, max_packet_delay_s=w.max_packet_delay_s,
                         max_backlog_bytes=w.max_backlog_bytes, send_window_bytes=w.send_window_bytes,
                         flush_timeout_s=w.flush_timeout_s, compression=w.compression,
                         seed=worker_seed(cfg.seed, worker_id),
                         episode_log=str(cfg.run_dir / f"episodes_{worker_id}.csv"),
                         keys=client_keys(cfg.keys_dir, "worker", worker_id) if cfg.security == "curve" else None,
                         status_interval_s=cfg.status_interval_s, env_timeout_factor=w.env_timeout_factor,
                         env_timeout_min_s=w.env_timeout_min_s, on_env_failure=pipeline.on_env_failure,
                         init_random_frames=w.init_random_frames)
        except BaseException:
            if name_lock is not None:
                name_lock.release()
            raise
        worker.name_lock = name_lock
        if worker.seed is not None:  # the actor's sampling: this process's torch stream is this worker's
            torch.manual_seed(worker.seed)
        return worker

    @property
    def seq(self) -> int:
        """Sample packets handed to the network thread so far (the newest one's number)."""
        return self.packets.seq

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Build the env and actor, load ``model_path`` if present, and connect (unless standalone). Does nothing on
        a started worker (a second env and network thread would be left running); raises NetrlError on a closed
        one."""
        self._runs.check_open()
        if self._started:
            return
        self._new_env()
        try:
            self._build()
        except BaseException:  # e.g. the actor's constructor raised: a second start() would build another env beside it
            calls, self.env, self.env_calls = self.env_calls, None, None
            assert calls is not None
            calls.close()
            raise
        self._started = True

    def _new_env(self) -> None:
        self.env_calls = EnvCaller(self.env_cls, f"worker {self.worker_id}", *self.env_timeout)
        self.env = self.env_calls.env

    def _build(self) -> None:
        """start() once the env exists: the actor, its saved weights and the network thread (started last)."""
        assert self.env is not None
        check_spaces(self.env.observation_space, self.env.action_space)
        self._follow_spaces()
        log.info("worker %s: observation space %s, action space %s", self.worker_id, self.env.observation_space,
                 self.env.action_space)
        if self.episode_log is not None:
            # A worker restarted with the same id appends to the same CSV: it counts episodes and env steps on from
            # the last row, so that --plot draws one learning curve rather than two on top of each other.
            self._logged_episodes, self._logged_steps = self.episode_log.last_ints("episode", "env_steps")
        self.actor = self.actor_module_cls(self.env.observation_space, self.env.action_space).to(self.device)
        self.actor.eval()
        self.template_actor = copy.deepcopy(self.actor)
        for saved in {Path(p).parent for p in (self.model_path, self.model_path_history) if p}:
            remove_stale_temps(saved)  # what a worker killed while saving weights left
        if self.model_path and Path(self.model_path).exists():
            self._load_model_file(self.model_path)
        elif self.standalone and self.model_path:  # deployment with a mistyped path would run an untrained policy
            log.warning("%s does not exist: this standalone worker runs its actor as initialised, untrained",
                        self.model_path)
        if not self.standalone and self.local_packets is None:
            self.weights = WeightReceiver(self.template_actor, copy.deepcopy(self.actor), self.version,
                                          self.save_model if self.model_path else None)
            self.net = WorkerLink(self.network, self.worker_id, self.session, self.server_port, self.keys,
                                  self.max_backlog_bytes, self.send_window_bytes, lambda: self.produced, self.weights,
                                  self.status_interval, lambda: self.last_return)
            self.net.weight_stats = {"version": self.version}  # a policy loaded from model_path, until weights come
            self.net.link.hello_extra = {**self.packets.bounds(), "paced": self.throttle}
            self.net.start()

    def _load_model_file(self, path: str) -> None:
        try:
            state, meta = read_weights_file(path)
        except CheckpointError as exc:  # e.g. truncated by a power cut while it was being saved
            if self.standalone:  # its only weights: running the actor untrained instead would go unnoticed
                raise CheckpointError(f"{exc}: this standalone worker runs the weights in it; copy the trainer's "
                                      "policy.pt (and its .json) there again, or delete it to run untrained") from None
            log.warning("ignoring %s, which cannot be read (%s): the server sends the current weights once this worker "
                        "is connected, and they replace the file", path, exc)
            return
        problems = check_weights(self.actor, state)
        if problems:
            log.warning("ignoring %s, which does not fit this actor: %s", path, "; ".join(problems[:3]))
            return
        load_weights(self.actor, state)
        self.version = int(meta.get("version", -1))
        log.info("loaded policy v%d from %s", self.version, path)

    def save_model(self, module: torch.nn.Module | Mapping[str, torch.Tensor], version: int, session: str) -> None:
        """Keep the newest weights (an actor or its state_dict) at ``model_path`` (and every N-th in the history).
        The worker calls it on a thread of its own (see :class:`~netrl.worker.weight_receiver.WeightReceiver`)."""
        if not self.model_path:
            return
        meta = {"version": version, "trainer_session": session, "saved_at": time.time()}
        write_weights_file(self.model_path, module, meta)
        self._saved_versions += 1
        if self.model_history and self.model_path_history and self._saved_versions % self.model_history == 0:
            write_weights_file(f"{self.model_path_history}_v{version:06d}.pt", module, meta)

    def close(self) -> None:
        """Send what is left, disconnect and close the env. Idempotent. Called from another thread while
        :meth:`run` or :meth:`run_episode` runs, it stops that thread as its ``stop`` would, and waits for it: only
        that thread may step the env and hand packets over."""
        self._runs.close()  # run() closes on its way out, delivering its backlog; run_episode() leaves it to us
        if not self._runs.shut_once():
            return
        try:
            if self.net is not None:
                self._close_net(self.net)
        finally:
            try:
                if self.weights is not None:  # after the network thread: no version comes any more
                    self.weights.close()
                if self.env_calls is not None:
                    self.env_calls.close()
            finally:
                if self.name_lock is not None:  # the name is free for this worker's restart
                    self.name_lock.release()

    def _close_net(self, net: WorkerLink) -> None:
        unsent, lost = self.packets.unsent_transitions, 0
        if self.packets.pending_episodes and not unsent:  # e.g. after a final test episode
            log.info("worker %s: the stats of its last %d episodes stay in its episode log: no samples are left "
                     "to carry them to the trainer", self.worker_id, len(self.packets.pending_episodes))
        try:
            self._send_packet()
        except NetrlError as exc:  # its network thread had stopped (e.g. the server refused this worker)
            lost = unsent
            log.warning("worker %s could not hand over its last %d samples: %s", self.worker_id, unsent, exc)
        flushed = net.flush(net.handed_seq, self.flush_timeout)  # not one dropped at the pipe: it never arrives
        net.halt()
        c = net.dropped()
        unacked_packets, unacked = net.unacknowledged()
        unacked += lost
        self.samples_unacknowledged = unacked
        level = logging.WARNING if unacked or c["dropped_samples"] or c["rejected_samples"] else logging.INFO
        spooled = (f"; {c['spooled_samples']} of the acknowledged samples are spooled at the server (safe on its "
                   "disk: the trainer gets them when it catches up)") if c["spooled_samples"] else ""
        log.log(level, "worker %s session %s: %d samples produced in %d packets; %d acknowledged, %d dropped, "
                "%d rejected, %d unacknowledged%s", self.worker_id, self.session, self.produced, self.seq,
                c["acked_samples"], c["dropped_samples"], c["rejected_samples"], unacked, spooled)
        if not flushed and unacked_packets:
            log.warning("worker %s stopped with %d packets (%d samples) unacknowledged: the server had neither "
                        "spooled them nor delivered them to the trainer, so they are lost if they did not reach it or "
                        "if it stops before the trainer takes them", self.worker_id, unacked_packets, unacked - lost)

    # -- the control path -----------------------------------------------------------------------------------
    def run(self, test_episode_interval: int = 0, nb_episodes: int | None = None,
            stop: threading.Event | None = None) -> None:
        """Run training episodes (plus one test episode after every ``test_episode_interval``) until stopped, then
        close: a worker runs once."""
        stop = self._enter(stop)
        try:
            self.start()
            train_episodes = 0
            while not stop.is_set() and (nb_episodes is None or train_episodes < nb_episodes):
                if self._episode(False, stop) is None:
                    break
                train_episodes += 1
                if test_episode_interval > 0 and train_episodes % test_episode_interval == 0:
                    self._episode(True, stop)
        finally:
            try:
                self.close()
            finally:
                self._leave()

    def run_episode(self, test: bool = False, stop: threading.Event | None = None) -> EpisodeStats | None:
        """One episode (starting the worker first if needed); returns its stats, or None when ``stop`` interrupted
        it."""
        if not isinstance(test, (bool, np.bool_)):  # tmrl's run_episode(max_samples, train) would pass a count here
            raise TypeError(f"run_episode(test) takes True (a test episode) or False, not {test!r}; the episode length "
                            "is RolloutWorker(max_samples_per_episode=...)")
        run_stop = self._enter(stop)
        try:
            self.start()
            return self._episode(test, run_stop)
        finally:
            self._leave()

    def _enter(self, stop: threading.Event | None) -> RunStop:
        """Make the calling thread the one that steps the env; returns the event it is to watch."""
        return self._runs.enter(stop)

    def _leave(self) -> None:
        self._runs.leave()

    def _episode(self, test: bool, stop: threading.Event) -> EpisodeStats | None:
        steps = self.episode_steps(test, stop)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                self._failures_in_a_row = 0
                return done.value
            except EnvFailure as exc:
                self._env_failed(exc)
                steps = self.episode_steps(test, stop)  # a new episode: its reset row starts a new trajectory

    def _env_failed(self, exc: EnvFailure) -> None:
        """Reset after a failed env call if the pipeline allows it (on a new env if the old one is stuck); raise
        otherwise, or after three failures in a row."""
        self._failures_in_a_row += 1
        if self.on_env_failure != "reset" or self._failures_in_a_row >= 3:
            more = "" if self.on_env_failure != "reset" else f" ({self._failures_in_a_row} failures in a row)"
            raise EnvFailure(f"{exc}; worker {self.worker_id} stops{more}") from exc.__cause__
        self.env_failures += 1
        log.error("%s; the episode is dropped and the env %s (the pipeline's on_env_failure is \"reset\")", exc,
                  "rebuilt, since the old one is stuck" if self.env_calls and self.env_calls.stuck else "reset")
        assert self.env_calls is not None
        if self.env_calls.stuck:
            old = self.env_calls
            self._new_env()
            old.close()

    def episode_steps(self, test: bool, stop: threading.Event) -> Generator[None, None, EpisodeStats | None]:
        """One episode as a generator that yields after every env step (the single-process mode drives it)."""
        collect = not test and not self.standalone
        assert self.env_calls is not None
        obs, info = self.env_calls.call("reset", self.env.reset, seed=self.seed if self.episodes_done == 0 else None)
        if not self._checked:
            check_observation(obs, self.env.observation_space, "the first observation from the env's reset()")
        if collect:
            self._record(self._default_action(), obs, 0.0, False, False, info, reset=True)
        ret, length = 0.0, 0
        while True:
            if stop.is_set():
                return None
            self._check_net()
            if collect and self.throttle:
                self._wait_for_pace(stop)
                if stop.is_set():
                    return None
            self._swap_weights()  # after any wait for the trainer, which trained and published meanwhile
            version = self.version  # the version that chooses this action
            act = self._choose_action(obs, test)
            obs, rew, terminated, truncated, info = self.env_calls.call("step", self.env.step, act)
            if not self._checked:
                check_observation(obs, self.env.observation_space, "the observation from the env's first step()")
                self._checked = True
            length += 1
            ret += float(rew)
            if length >= self.max_samples_per_episode and not terminated:
                truncated = True  # a forced reset is a time limit: the trainer still bootstraps
            stats = EpisodeStats(ret, length, test, self.version) if terminated or truncated else None
            if stats is not None and not self.standalone:  # before the last row: they leave in the same packet
                self.packets.pending_episodes.append(stats)
            if collect:
                self._record(act, obs, rew, terminated, truncated, info, reset=False, version=version)
            elif self.packets.due():  # rows from before a test episode still leave after max_packet_delay_s
                self._send_packet()
            if terminated or truncated:
                break
            yield
        assert stats is not None  # the loop ends only with an episode's end
        self._episode_done(stats)
        yield
        return stats

    def _choose_action(self, obs: Any, test: bool) -> Any:
        """The actor's action, or a uniformly random one while the trainer holds fewer than ``init_random_frames``
        samples (never in a test episode, nor standalone: no trainer to ask). The actor's first action is checked."""
        if self.init_random_frames and not test and not self.standalone:
            if self.net is not None:  # the server says it in every PACE, and in the heartbeats of an idle link
                told = [n for n in (self.net.trainer_samples, self.net.link.server_stats.get("trainer_samples"))
                        if type(n) is int]
                self.trainer_samples = max(told, default=self.trainer_samples)
            if self.trainer_samples is None or self.trainer_samples < self.init_random_frames:
                if self._random_source is None:  # this worker's seed: reproducible, and unlike other workers'
                    self._random_source = copy.deepcopy(self.env.action_space)
                    self._random_source.seed(self.seed)
                    log.info("worker %s acts at random until the trainer holds %d samples (worker.init_random_frames)",
                             self.worker_id, self.init_random_frames)
                return self._random_source.sample()
            log.info("worker %s: the trainer holds %d samples (worker.init_random_frames is %d): acting with the "
                     "policy from now on", self.worker_id, self.trainer_samples, self.init_random_frames)
            self.init_random_frames = 0  # for good: a trainer restarted with fewer samples does not undo it
        act = self.actor.act_(self.obs_preprocessor(obs) if self.obs_preprocessor else obs, test=test)
        if not self._actor_checked:
            check_action(act, self.env.action_space, type(self.actor).__name__)
            self._actor_checked = True
        return act

    def _episode_done(self, stats: EpisodeStats) -> None:
        self.episodes_done += 1
        if not stats.test:
            self.last_return = stats.ret
        episode = self._logged_episodes + self.episodes_done
        if self.episode_log is not None:
            self.episode_log.write({"time": time.time(), "episode": episode, "test": int(stats.test),
                                    "return": stats.ret, "length": stats.length,
                                    "env_steps": self._logged_steps + self.produced, "policy_version": self.version})
        log.log(self.episode_log_level, "%s episode %d: return %.1f over %d steps (policy %s)",
                "test" if stats.test else "training", episode, stats.ret, stats.length, version_label(self.version))

    def _follow_spaces(self) -> None:
        """Send leaves in the dtypes the trainer expects from the spaces. The compressor is probed on a copy: one
        such as ActionBufferCompressor keeps state, and a random probe row would make the first real one a seam."""
        compressor = probe_copy(self.sample_compressor)
        if compressor is None and self.sample_compressor is not None:  # it cannot be copied: the env's dtypes, then
            return
        self.packets.follow(SampleSchema.from_spaces(self.env.observation_space, self.env.action_space, compressor))

    def _default_action(self) -> Any:
        default = getattr(self.env, "default_action", None)
        return np.zeros(self.env.action_space.shape, self.env.action_space.dtype) if default is None else default

    def _record(self, act: Any, obs: Any, rew: float, terminated: bool, truncated: bool, info: dict[str, Any],
                reset: bool, version: int = -1) -> None:
        self.packets.add(act, obs, rew, terminated, truncated, info, reset, version if not reset else self.version,
                         networked=self.local_packets is None and self.net is not None)
        if not reset:
            self.produced += 1
        if self.packets.due():
            self._send_packet()

    def _send_packet(self) -> None:
        buf = self.packets.cut()
        if buf is None:
            return
        if self.local_packets is not None:  # single-process mode: no network
            self.local_packets.append(buf)
            return
        if self.net is None:
            return
        self.net.hand_over(self.packets.to_frames(buf, self.produced))

    def _swap_weights(self) -> None:
        if self.weights is None:
            return
        ready = self.weights.slot.swap(self.actor)
        if ready is not None:
            version, _session, self.actor = ready
            self.version = version

    def _wait_for_pace(self, stop: threading.Event) -> None:
        net = self.net
        if net is None or self.produced < net.allowance:
            return
        self._send_packet()  # the trainer may be waiting for exactly these rows
        waited = time.monotonic()
        net.waiting_for_pace = True  # the status line says why the worker makes no steps
        try:
            with net.pace_cond:
                while self.produced >= net.allowance and not stop.is_set():
                    net.pace_cond.wait(0.05)
                    if time.monotonic() - waited > 10 and not net.paced:
                        log.info("worker %s is waiting for the trainer to ask for samples (worker.throttle is on)",
                                 self.worker_id)
                        waited = time.monotonic()
                    self._check_net()
        finally:
            net.waiting_for_pace = False

    def _check_net(self) -> None:
        net = self.net
        if net is not None and (net.link.fatal or net.error):
            raise NetrlError(f"worker {self.worker_id} cannot continue: {net.link.fatal or net.error}")
