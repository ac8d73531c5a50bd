"""RolloutWorker: runs the current policy in an env and sends sample packets to the server, as in
tmrl.

Two threads. The *control path* (the thread that calls :meth:`RolloutWorker.run`) only steps the
env, computes actions and appends rows to preallocated columns. Everything slow happens on the
*network thread* (:class:`~netrl.worker.link.WorkerLink`, with
:class:`~netrl.worker.weight_receiver.WeightReceiver`): sending packets, receiving and checking
weights, loading them into a spare actor and saving them to ``model_path``. Between two env steps
the control path swaps in the ready actor, a pointer swap, so a weight update never delays a
real-time step. Every row is tagged with the version of the weights that chose its action.

This module only wires the worker's parts, each passed what it needs and none the worker itself: its
settings (:class:`~netrl.worker.settings.WorkerSettings`), the env
(:class:`~netrl.worker.env_host.EnvHost`), the policy (:class:`~netrl.worker.policy.PolicyHandle`),
the packet sink (:class:`~netrl.worker.sink.PacketSink`), the pacer
(:class:`~netrl.worker.pacer.Pacer`, with sync collection), the episodes
(:class:`~netrl.worker.episodes.Episodes`) and the runner that steps the env with them
(:mod:`netrl.worker.runners`).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Generator, Mapping
from typing import Any

import numpy as np
import torch

from netrl.config.sections import Config
from netrl.envs.checks import check_sample_compressor, check_spaces
from netrl.errors import NetrlError
from netrl.lifecycle.runs import Runs, ctrl_c_stops
from netrl.lifecycle.tmrl_args import TMRL_ONLY, is_count, is_number, is_path, is_text, tmrl_arguments
from netrl.lifecycle.torch_threads import apply_torch_threads
from netrl.net.transport import new_session
from netrl.pipelines.base import Pipeline
from netrl.protocol.weight_formats import format_names
from netrl.samples.columns import EpisodeStats
from netrl.storage.folderlock import FolderLock
from netrl.worker.env_host import EnvHost
from netrl.worker.episodes import Episodes
from netrl.worker.forward import Via as _Via
from netrl.worker.link import WorkerLink
from netrl.worker.model_files import ModelFiles
from netrl.worker.names import claim_worker_id
from netrl.worker.pacer import Pacer
from netrl.worker.policy import PolicyHandle
from netrl.worker.runners.base import EnvRunner, Parts
from netrl.worker.runners.one_env import OneEnvRunner
from netrl.worker.runners.vector import VectorRunner
from netrl.worker.settings import WorkerSettings
from netrl.worker.sink import PacketSink
from netrl.worker.weight_receiver import ModelReceivers, WeightReceiver

__all__ = ["RolloutWorker"]

log = logging.getLogger(__name__)

# today's tmrl RolloutWorker's order by position (netrl's is older tmrl's, up to obs_preprocessor)
TMRL_WORKER_ORDER = ("env_cls", "actor_module_cls", "sample_compressor", "device",
                     "max_samples_per_episode", "model_path", "obs_preprocessor", "crc_debug",
                     "model_path_history", "model_history", "standalone", "server_ip",
                     "server_port", "password")
_AFTER_OBS_PREPROCESSOR = ("tmrl has crc_debug next, which netrl does not take, so netrl takes "
                           "none of the later ones by position (taken one place early, each "
                           "value would land in the wrong parameter)")
_TMRL_POSITIONAL = ("device", "server_ip", "min_samples_per_worker_packet",
                    "max_samples_per_episode", "model_path")

class RolloutWorker:
    """Collects samples with the current policy and streams them to the server (tmrl's arguments).

    Args:
        env_cls: a callable returning a Gymnasium env (usually ``partial(GenericGymEnv, id=...)``).
        actor_module_cls: a callable ``(observation_space, action_space) -> ActorModule``.
        sample_compressor: ``f(act, obs, rew, terminated, truncated, info)`` returning the same
            tuple, shrunk for the network; the trainer's memory undoes it.
        obs_preprocessor: applied to each observation before ``act``.
        device, server_ip, min_samples_per_worker_packet, max_samples_per_episode, model_path:
            tmrl's settings by position (None: the settings' own); see
            :class:`~netrl.worker.settings.WorkerSettings`.
        settings: every setting in one object (default: ``WorkerSettings()``).
        models: further modules synced from the trainer by name (:mod:`netrl.worker.models`).
        options: any field of :class:`~netrl.worker.settings.WorkerSettings` by name
            (``throttle=True``, ``num_envs=4``...), replacing the one of ``settings``; another name
            is refused.

    The arguments after ``obs_preprocessor`` are keyword-only: tmrl's positional order has
    ``crc_debug`` there, which netrl does not take, so a call in that order would give every later
    value to the wrong parameter.
    """

    actor = _Via[Any]("policy", "actor")
    version = _Via[int]("policy", "version")
    obs_norm = _Via[Any]("policy", "obs_norm")
    random_frames = _Via[Any]("policy", "random_frames")
    trainer_samples = _Via[int | None]("policy", "trainer_samples")
    models = _Via[Any]("policy", "models")
    weights = _Via[WeightReceiver | None]("policy", "weights")
    packets = _Via[Any]("sink", "packets")
    produced = _Via[int]("sink", "produced")
    seq = _Via[int]("sink", "seq")
    local_packets = _Via[list[Any] | None]("sink", "local")
    samples_unacknowledged = _Via[int]("sink", "samples_unacknowledged")
    throttle = _Via[bool]("pacer", "throttle")
    episodes_done = _Via[int]("episodes", "done")
    last_return = _Via[float | None]("episodes", "last_return")
    episode_log = _Via[Any]("episodes", "log")
    episode_log_level = _Via[int]("episodes", "level")
    env = _Via[Any]("host", "env")
    env_failures = _Via[int]("host", "failures")
    observation_space = _Via[Any]("host", "observation_space")
    action_space = _Via[Any]("host", "action_space")
    model_path = _Via[str | None]("settings", "model_path", writable=False)
    num_envs = _Via[int]("settings", "num_envs", writable=False)
    standalone = _Via[bool]("settings", "standalone", writable=False)

    @tmrl_arguments("RolloutWorker", TMRL_WORKER_ORDER, TMRL_ONLY, _AFTER_OBS_PREPROCESSOR, {
        "server_ip": (is_text, "a string or None"),
        "min_samples_per_worker_packet": (is_count, "an integer"),
        "max_samples_per_episode": (is_number, "a number"),
        "model_path": (is_path, "a path or None"),
        "obs_preprocessor": (lambda f: f is None or callable(f), "a function or None")})
    def __init__(self, env_cls: Callable[[], Any], actor_module_cls: Callable[..., Any],
                 sample_compressor: Callable[..., Any] | None = None, device: str | None = None,
                 server_ip: str | None = None, min_samples_per_worker_packet: int | None = None,
                 max_samples_per_episode: float | None = None, model_path: str | None = None,
                 obs_preprocessor: Callable[..., Any] | None = None, *,
                 settings: WorkerSettings | None = None,
                 models: Mapping[str, torch.nn.Module] | None = None, **options: Any) -> None:
        given = dict(zip(_TMRL_POSITIONAL, (device, server_ip, min_samples_per_worker_packet,
                                            max_samples_per_episode, model_path), strict=True))
        options.update({k: v for k, v in given.items() if v is not None})
        s = self.settings = WorkerSettings.from_keywords(settings, **options).resolved()
        if sample_compressor is not None:
            check_sample_compressor(sample_compressor)
        # the trainer's statistics are of raw observations
        if s.normalize_obs and obs_preprocessor is not None:
            raise ValueError("env.normalize_obs is true and the worker has an obs_preprocessor: "
                             "normalise inside the obs_preprocessor instead, or set "
                             "env.normalize_obs to false")
        self.env_cls, self.actor_module_cls = env_cls, actor_module_cls
        self.sample_compressor, self.obs_preprocessor = sample_compressor, obs_preprocessor
        assert s.worker_id is not None  # (resolved)
        self.worker_id, self.session, n = s.worker_id, new_session(), s.num_envs
        self.host = EnvHost(env_cls, n, s.vectorization, self.worker_id, s.env_timeout_factor,
                            s.env_timeout_min_s, s.on_env_failure)
        self.policy = PolicyHandle(self.worker_id, n, obs_preprocessor, models,
                                   s.init_random_frames, s.standalone, s.seed)
        self.sink = PacketSink(self.worker_id, self.session, s.min_samples_per_worker_packet,
                               s.overlap, s.max_packet_delay_s, s.compression,
                               s.network.max_message_bytes, sample_compressor, n, s.info_keys)
        self.pacer = Pacer(self.worker_id, s.throttle, n, self.policy, self.sink)
        self.sync = self.pacer.sync  # active while the trainer announces sync collection
        self.episodes = Episodes(self.worker_id, s.episode_log, n)
        self.files = ModelFiles(s.model_path, s.model_path_history, s.model_history)
        parts = Parts(self.host, self.policy, self.pacer, self.sink, self.episodes, s.standalone,
                      s.max_samples_per_episode, s.seed)
        self.runner: EnvRunner = VectorRunner(parts, n) if n > 1 else OneEnvRunner(parts)
        self.net: WorkerLink | None = None
        self._runs = Runs(
            lambda: NetrlError(f"this RolloutWorker ({self.worker_id}) is closed: its env and "
                               "network thread are gone; create a new one"),
            lambda runner: NetrlError(f"worker {self.worker_id} is already running in "
                                      f"{runner.name}: only one thread may step its env; to "
                                      "collect in parallel, create a RolloutWorker for each "
                                      "thread"))
        self._started = False
        # from_config's: keeps worker_id this process's in the run folder
        self.name_lock: FolderLock | None = None

    @classmethod
    def from_config(cls, cfg: Config, pipeline: Pipeline, **options: Any) -> RolloutWorker:
        """The worker ``cfg.worker`` describes, running ``pipeline``'s env and actor; it holds its
        worker_id's lock in the run folder until it closes (the default name: the host's, see
        :mod:`netrl.worker.names`). ``options`` replace settings by name, as the constructor's do
        (``standalone=True``: the same worker, deployed without a server)."""
        worker_id, name_lock = claim_worker_id(cfg.run_dir, cfg.worker.worker_id)
        try:
            worker = cls(pipeline.env_cls, pipeline.actor_module_cls, pipeline.sample_compressor,
                         obs_preprocessor=pipeline.obs_preprocessor,
                         settings=WorkerSettings.from_config(cfg, pipeline, worker_id), **options)
        except BaseException:
            if name_lock is not None:
                name_lock.release()
            raise
        worker.name_lock = name_lock
        # the actor's sampling: this process's torch stream is this worker's
        if worker.settings.seed is not None:
            torch.manual_seed(worker.settings.seed)
        return worker

    # -- lifecycle
    # ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Build the env and actor, load ``model_path`` if present, and connect (unless standalone).
        Does nothing on a started worker (a second env and network thread would be left running);
        raises NetrlError on a closed one."""
        self._runs.check_open()
        if self._started:
            return
        # before the actor is built
        apply_torch_threads(self.settings.torch_threads, f"worker {self.worker_id}")
        self.host.open()
        try:
            self._build()
        except BaseException:  # e.g. the actor's constructor raised: a second start() builds
            # another env beside it
            self.host.close(forget=True)
            raise
        self._started = True

    def _build(self) -> None:
        """start() once the env exists: the actor, its saved weights and the network thread (started
        last)."""
        s, policy = self.settings, self.policy
        obs_space, act_space = self.observation_space, self.action_space
        check_spaces(obs_space, act_space)
        log.info("worker %s: observation space %s, action space %s%s", self.worker_id, obs_space,
                 act_space, f", {s.num_envs} envs ({s.vectorization})" if s.num_envs > 1 else "")
        self.episodes.resume()
        actor = self.actor_module_cls(obs_space, act_space).to(s.device)
        actor.eval()
        extras = policy.build(actor, obs_space, act_space,
                              s.normalize_obs_clip if s.normalize_obs else None,
                              compressed=self.sample_compressor is not None)
        reach = max((v.max_reach for v in policy.views.views), default=0) if policy.views else 0
        if reach >= s.overlap and not s.standalone:  # a packet's first rows would lack them
            self.sink.widen(reach + 1)
            log.info("worker %s: the actor's views read up to %d rows back: packets carry %d "
                     "context rows, not the pipeline's overlap of %d", self.worker_id, reach,
                     reach + 1, s.overlap)
        self.sink.follow(obs_space, act_space, extras,
                         policy.models.stamp if policy.models else None)
        version = self.files.load(actor, s.standalone)
        if version is not None:
            policy.version = version
        if not s.standalone and self.sink.local is None:
            self._connect()

    def _connect(self) -> None:
        """The network thread, with a receiver for each model's weights."""
        s, policy = self.settings, self.policy
        weights = WeightReceiver(policy.template, copy.deepcopy(policy.actor), policy.version,
                                 self.files.save if s.model_path else None)
        receivers = ModelReceivers({"policy": weights, **policy.models.make_receivers()})
        net = WorkerLink(s.network, self.worker_id, self.session, s.server_port, s.keys,
                         s.max_backlog_bytes, s.send_window_bytes, self.sink.count, receivers,
                         s.status_interval_s, lambda: self.episodes.last_return, receivers.ack)
        net.num_envs = s.num_envs
        net.weight_stats = receivers.stats()  # a policy loaded from model_path, until weights come
        net.link.hello_extra = {**self.sink.bounds(), "paced": self.pacer.throttle,
                                "models": list(receivers.receivers), "formats": format_names()}
        self.net = self.sink.link = net
        policy.connect(weights, net)
        self.pacer.connect(net)
        net.start()

    def model(self, name: str) -> torch.nn.Module:
        """The module of model ``name`` (one of ``models``) in use now (see
        :meth:`PolicyHandle.model`)."""
        return self.policy.model(name)

    def save_model(self, module: torch.nn.Module | Mapping[str, torch.Tensor], version: int,
                   session: str) -> None:
        """Keep the newest weights at ``model_path`` (see
        :class:`~netrl.worker.model_files.ModelFiles`)."""
        self.files.save(module, version, session)

    def close(self) -> None:
        """Send what is left, disconnect and close the env. Idempotent. Called from another thread
        while :meth:`run` or :meth:`run_episode` runs, it stops that thread as its ``stop`` would,
        and waits for it: only that thread may step the env and hand packets over."""
        # run() closes on its way out, delivering its backlog; run_episode() leaves it to us
        self._runs.close()
        if not self._runs.shut_once():
            return
        try:
            if self.net is not None:
                self.sink.close(self.net, self.settings.flush_timeout_s)
        finally:
            try:
                # after the network thread: no version comes any more
                if self.policy.weights is not None:
                    self.policy.weights.close()
                self.host.close()
            finally:
                if self.name_lock is not None:  # the name is free for this worker's restart
                    self.name_lock.release()

    # -- the control path
    # -----------------------------------------------------------------------------------
    def run(self, test_episode_interval: int = 0, nb_episodes: int | None = None,
            stop: threading.Event | None = None) -> None:
        """Run training episodes (plus one test episode after every ``test_episode_interval``) until
        stopped,
        then close: a worker runs once."""
        run_stop = self._runs.enter(stop)
        # and its backlog delivered on the way out
        with ctrl_c_stops(run_stop, f"worker {self.worker_id}"):
            try:
                self.start()
                self.runner.run(run_stop, test_episode_interval, nb_episodes)
            finally:
                try:
                    self.close()
                finally:
                    self._runs.leave()

    def run_episode(self, test: bool = False,
                    stop: threading.Event | None = None) -> EpisodeStats | None:
        """One episode (starting the worker first if needed); returns its stats, or None when
        ``stop`` interrupted it."""
        # tmrl's run_episode(max_samples, train) passes a count here
        if not isinstance(test, (bool, np.bool_)):
            raise TypeError("run_episode(test) takes True (a test episode) or False, not "
                            f"{test!r}; the episode "
                            "length is RolloutWorker(max_samples_per_episode=...)")
        run_stop = self._runs.enter(stop)
        try:
            self.start()
            return self.runner.episode(bool(test), run_stop)
        finally:
            self._runs.leave()

    def episode_steps(self, test: bool,
                      stop: threading.Event) -> Generator[None, None, EpisodeStats | None]:
        """One episode as a generator that yields after every env step (the single-process mode
        drives it).

        With several envs: vector steps until an episode of one of them ends, which it returns (the
        envs' episodes go on in the next call); test episodes then come from
        ``run(test_episode_interval)`` alone."""
        return self.runner.episode_steps(test, stop)
