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
from collections.abc import Callable, Generator, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from netrl.actor import declared_extras
from netrl.config.sections import Config, NetworkConfig
from netrl.envs.checks import check_sample_compressor, check_spaces
from netrl.envs.guard import EnvCaller
from netrl.envs.normalize import ObsNormalizer
from netrl.errors import EnvFailure, NetrlError
from netrl.lifecycle.runs import Runs, RunStop, ctrl_c_stops
from netrl.lifecycle.tmrl_args import TMRL_ONLY, is_count, is_number, is_path, is_text, tmrl_arguments
from netrl.lifecycle.torch_threads import apply_torch_threads
from netrl.monitor.metrics import CsvLog
from netrl.net.keys import ClientKeys
from netrl.net.transport import new_session
from netrl.protocol.messages import PEER_NAME, PEER_NAME_RULE
from netrl.protocol.schema import SampleSchema, probe_copy
from netrl.protocol.weight_formats import format_names
from netrl.protocol.wire import Codec
from netrl.samples.columns import EpisodeStats, check_extra_spec, tree_map
from netrl.samples.spaces import default_value
from netrl.storage.folderlock import FolderLock
from netrl.storage.weight_files import remove_stale_temps
from netrl.util import version_label
from netrl.worker.runners.one_env import close_net, one_env_steps
from netrl.worker.link import WorkerLink
from netrl.worker.model_files import load_model_file, save_model_file
from netrl.worker.models import ExtraModels
from netrl.worker.names import default_worker_id
from netrl.worker.packets import PacketMaker
from netrl.worker.random_frames import RandomFrames
from netrl.worker.recurrent import RecurrentStates
from netrl.worker.setup import worker_from_config
from netrl.worker.runners.sync import SyncFragments
from netrl.worker.runners.vector import VectorEnvs, Vectorization, make_vector_env
from netrl.worker.weight_receiver import ModelReceivers, WeightReceiver

__all__ = ["RolloutWorker"]

log = logging.getLogger(__name__)

# today's tmrl RolloutWorker's order by position (netrl's is older tmrl's, up to obs_preprocessor)
TMRL_WORKER_ORDER = ("env_cls", "actor_module_cls", "sample_compressor", "device", "max_samples_per_episode",
                     "model_path", "obs_preprocessor", "crc_debug", "model_path_history", "model_history", "standalone",
                     "server_ip", "server_port", "password")
_AFTER_OBS_PREPROCESSOR = ("tmrl has crc_debug next, which netrl does not take, so netrl takes none of the later ones "
                           "by position (taken one place early, each value would land in the wrong parameter)")


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
        model_path: where received weights are saved, and loaded from at start; default
            ``<run_dir>/worker_policy_<worker_id>.pt``.
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
        episode_log: CSV file that gets one line per finished episode (time, return, length, env steps...), which
            ``python -m netrl --plot`` draws; default ``<run_dir>/episodes_<worker_id>.csv``.
        run_dir: the run folder (the trainer's ``run_dir``, default ``weights/run`` for both), where ``model_path``
            and ``episode_log`` go unless given; None: no files but those given.
        keys: CURVE keys to connect with (:func:`netrl.net.keys.client_keys`); None connects unencrypted.
        status_interval_s: seconds between status log lines (0: none); 10 s, as ``python -m netrl``.
        torch_threads: ``torch.set_num_threads`` when the worker starts (None: leave torch's setting); 1, as
            ``python -m netrl``: inference on small inputs gains nothing from more, and they compete with the env.
        env_timeout_factor, env_timeout_min_s: when an env call counts as hung (:mod:`netrl.envs.guard`).
        on_env_failure: what a hung env call or a dead env thread does: "stop" (raise EnvFailure) or "reset".
        num_envs: envs this worker runs, stepped together in one Gymnasium vector env (:mod:`netrl.worker.runners.vector`):
            the actor must take batches (see :mod:`netrl.actor`).
        vectorization: "sync" (the envs step one after another in this process) or "async" (a process per env).
        init_random_frames: act uniformly at random from the action space until the trainer holds this many samples
            (as the server tells; in test episodes and standalone, never); 0: off.
        normalize_obs, normalize_obs_clip: ``env.normalize_obs``: ``act`` gets observations normalised by
            :attr:`obs_norm` (the trainer's statistics as last received; see :meth:`policy_obs`).

    The arguments after ``obs_preprocessor`` are keyword-only: tmrl's positional order has ``crc_debug`` there,
    which netrl does not take, so a call in that order would give every later value to the wrong parameter.
    """

    @tmrl_arguments("RolloutWorker", TMRL_WORKER_ORDER, TMRL_ONLY, _AFTER_OBS_PREPROCESSOR, {
        "server_ip": (is_text, "a string or None"), "min_samples_per_worker_packet": (is_count, "an integer"),
        "max_samples_per_episode": (is_number, "a number"), "model_path": (is_path, "a path or None"),
        "obs_preprocessor": (lambda f: f is None or callable(f), "a function or None")})
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
                 status_interval_s: float = 10.0, env_timeout_factor: float = 50.0, env_timeout_min_s: float = 5.0,
                 on_env_failure: Literal["stop", "reset"] = "stop", num_envs: int = 1,
                 vectorization: Vectorization = "sync", init_random_frames: int = 0,
                 run_dir: str | Path | None = "weights/run", torch_threads: int | None = 1,
                 normalize_obs: bool = False, normalize_obs_clip: float = 10.0,
                 models: Mapping[str, torch.nn.Module] | None = None) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be an integer >= 1 (got {num_envs!r})")
        if vectorization not in ("sync", "async"):
            raise ValueError(f'vectorization must be "sync" or "async" (got {vectorization!r})')
        if min_samples_per_worker_packet < 1:
            raise ValueError(f"min_samples_per_worker_packet must be >= 1 (got {min_samples_per_worker_packet})")
        if max_packet_delay_s is not None and not max_packet_delay_s > 0:
            raise ValueError(f"max_packet_delay_s must be > 0, or None to wait for min_samples_per_worker_packet rows "
                             f"(got {max_packet_delay_s})")
        if torch_threads is not None and not 1 <= torch_threads <= 1024:
            raise ValueError(f"torch_threads must be between 1 and 1024, or None to leave torch's setting "
                             f"(got {torch_threads!r})")
        if sample_compressor is not None:
            check_sample_compressor(sample_compressor)
        if normalize_obs and obs_preprocessor is not None:  # the trainer's statistics are of the raw observations
            raise ValueError("env.normalize_obs is true and the worker has an obs_preprocessor: normalise inside the "
                             "obs_preprocessor instead, or set env.normalize_obs to false")
        self.normalize_obs, self.normalize_obs_clip = normalize_obs, normalize_obs_clip
        # env.normalize_obs: the statistics act's observations are normalised with (start); the trainer's "obs_norm"
        # model replaces them as versions arrive
        self.obs_norm: ObsNormalizer | None = None
        self.torch_threads = torch_threads
        self.env_cls, self.actor_module_cls = env_cls, actor_module_cls
        self.sample_compressor, self.obs_preprocessor = sample_compressor, obs_preprocessor
        self.device = device
        self.network = network or NetworkConfig()
        if server_ip is not None:
            self.network = dataclasses.replace(self.network, server_ip=server_ip)
        self.server_port = server_port
        self.min_samples = min_samples_per_worker_packet
        self.max_samples_per_episode = max_samples_per_episode
        self.worker_id = worker_id or default_worker_id()
        if not PEER_NAME.fullmatch(self.worker_id):  # the server would refuse its HELLO
            raise ValueError(f"worker_id {self.worker_id!r} is not a valid name: use {PEER_NAME_RULE}")
        self.run_dir = Path(run_dir) if run_dir is not None else None
        if self.run_dir is not None:  # the CLI's file names (worker/setup.py), so --plot finds the episodes
            model_path = model_path or str(self.run_dir / f"worker_policy_{self.worker_id}.pt")
            episode_log = episode_log or str(self.run_dir / f"episodes_{self.worker_id}.csv")
        if model_path_history is None and model_path:
            model_path_history = str(Path(model_path).with_suffix("")) + "_history"
        self.model_path, self.model_path_history, self.model_history = model_path, model_path_history, model_history
        self.standalone = standalone
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
        self.models = ExtraModels(models, "RolloutWorker(models=...)")  # further modules synced from the trainer
        self.net: WorkerLink | None = None
        self.weights: WeightReceiver | None = None
        self.packets = PacketMaker(self.worker_id, self.session, self.min_samples, self.overlap, self.max_delay,
                                   self.compression, self.network.max_message_bytes, self.sample_compressor)
        self.num_envs, self.vectorization = int(num_envs), vectorization
        # several envs: their rows go to per-env packet makers; self.packets only numbers and encodes the packets
        self.vec = VectorEnvs(self, self.num_envs) if self.num_envs > 1 else None
        self.sync = SyncFragments(self, self.num_envs)  # active while the trainer announces sync collection
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
        self.trainer_samples: int | None = None  # the trainer's samples, from the single-process mode (local.py)
        self.random_frames: RandomFrames | None = None  # random actions until the trainer holds init_random_frames
        self.actor_checked = False  # the actor's first action was checked (random ones may come first)
        self.extra_spec: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {}  # the actor's extra outputs (start)
        self.recurrent: RecurrentStates | None = None  # a recurrent actor's per-env states (start)

    @classmethod
    def from_config(cls, cfg: Config, pipeline: Any) -> RolloutWorker:
        """The worker ``cfg.worker`` describes, running ``pipeline``'s env and actor (see :mod:`netrl.worker.setup`)."""
        return worker_from_config(cls, cfg, pipeline)

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
        apply_torch_threads(self.torch_threads, f"worker {self.worker_id}")  # before the actor is built
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
        make = self.env_cls if self.vec is None else partial(make_vector_env, self.env_cls, self.num_envs,
                                                             self.vectorization)
        self.env_calls = EnvCaller(make, f"worker {self.worker_id}", *self.env_timeout)
        self.env = self.env_calls.env

    @property
    def observation_space(self) -> Any:
        """One env's observation space (a vector env's ``single_observation_space``)."""
        return getattr(self.env, "single_observation_space", None) or self.env.observation_space

    @property
    def action_space(self) -> Any:
        return getattr(self.env, "single_action_space", None) or self.env.action_space

    def _build(self) -> None:
        """start() once the env exists: the actor, its saved weights and the network thread (started last)."""
        assert self.env is not None
        check_spaces(self.observation_space, self.action_space)
        log.info("worker %s: observation space %s, action space %s%s", self.worker_id, self.observation_space,
                 self.action_space, f", {self.num_envs} envs ({self.vectorization})" if self.vec else "")
        if self.episode_log is not None:
            # A worker restarted with the same id appends to the same CSV: it counts episodes and env steps on from
            # the last row, so that --plot draws one learning curve rather than two on top of each other.
            self._logged_episodes, self._logged_steps = self.episode_log.last_ints("episode", "env_steps")
        self.actor = self.actor_module_cls(self.observation_space, self.action_space).to(self.device)
        self.actor.eval()
        if self.normalize_obs:  # mean 0, var 1 until the trainer's statistics arrive
            self.obs_norm = ObsNormalizer(self.observation_space, self.normalize_obs_clip)
            self.models.add("obs_norm", self.obs_norm, "env.normalize_obs")  # the trainer's versions replace it
        self.extra_spec = check_extra_spec(declared_extras(self.actor), type(self.actor).__name__)
        if getattr(self.actor, "recurrent_state", dict)():
            self.recurrent = RecurrentStates(self.actor, self.num_envs)
        self._follow_spaces()
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
            receivers = ModelReceivers({"policy": self.weights, **self.models.make_receivers()})
            self.net = WorkerLink(self.network, self.worker_id, self.session, self.server_port, self.keys,
                                  self.max_backlog_bytes, self.send_window_bytes, lambda: self.produced, receivers,
                                  self.status_interval, lambda: self.last_return, receivers.ack)
            self.net.num_envs = self.num_envs
            self.net.weight_stats = receivers.stats()  # a policy loaded from model_path, until weights come
            bounds = self.packets.bounds() if self.vec is None else self.vec.bounds()
            self.net.link.hello_extra = {**bounds, "paced": self.throttle, "models": list(receivers.receivers),
                                         "formats": format_names()}
            self.net.start()

    def model(self, name: str) -> torch.nn.Module:
        """The module of model ``name`` (one of ``models``) in use now: its newest version swapped in between two env
        steps, as the actor is."""
        if name not in self.models.current:
            raise KeyError(f"worker {self.worker_id} has no model {name!r}; its models: {sorted(self.models.current)} "
                           "(RolloutWorker(models={name: module}))")
        return self.models.current[name]

    def policy_obs(self, obs: Any) -> Any:
        """What ``act`` gets for ``obs`` (one observation or a batch, after any obs_preprocessor): with
        env.normalize_obs, normalised by :attr:`obs_norm` (float leaves as float32 arrays), else ``obs`` itself. The
        packets carry the raw observation."""
        if self.obs_norm is None:
            return obs
        with torch.no_grad():
            out = self.obs_norm(obs)
        return tree_map(lambda x: x.numpy() if isinstance(x, torch.Tensor) else x, out)

    def _load_model_file(self, path: str) -> None:
        version = load_model_file(path, self.actor, self.standalone)
        if version is not None:
            self.version = version

    def save_model(self, module: torch.nn.Module | Mapping[str, torch.Tensor], version: int, session: str) -> None:
        """Keep the newest weights (an actor or its state_dict) at ``model_path`` (and every N-th in the history).
        The worker calls it on a thread of its own (see :class:`~netrl.worker.weight_receiver.WeightReceiver`)."""
        if not self.model_path:
            return
        save_model_file(self.model_path, module, version, session)
        self._saved_versions += 1
        if self.model_history and self.model_path_history and self._saved_versions % self.model_history == 0:
            save_model_file(f"{self.model_path_history}_v{version:06d}.pt", module, version, session)

    def close(self) -> None:
        """Send what is left, disconnect and close the env. Idempotent. Called from another thread while
        :meth:`run` or :meth:`run_episode` runs, it stops that thread as its ``stop`` would, and waits for it: only
        that thread may step the env and hand packets over."""
        self._runs.close()  # run() closes on its way out, delivering its backlog; run_episode() leaves it to us
        if not self._runs.shut_once():
            return
        try:
            if self.net is not None:
                close_net(self, self.net)
        finally:
            try:
                if self.weights is not None:  # after the network thread: no version comes any more
                    self.weights.close()
                if self.env_calls is not None:
                    self.env_calls.close()
            finally:
                if self.name_lock is not None:  # the name is free for this worker's restart
                    self.name_lock.release()

    # -- the control path -----------------------------------------------------------------------------------
    def run(self, test_episode_interval: int = 0, nb_episodes: int | None = None,
            stop: threading.Event | None = None) -> None:
        """Run training episodes (plus one test episode after every ``test_episode_interval``) until stopped, then
        close: a worker runs once."""
        stop = self._enter(stop)
        with ctrl_c_stops(stop, f"worker {self.worker_id}"):  # and its backlog delivered on the way out (close)
            self._run(stop, test_episode_interval, nb_episodes)

    def _run(self, stop: RunStop, test_episode_interval: int, nb_episodes: int | None) -> None:
        try:
            self.start()
            train_episodes = 0
            if self.vec is not None:
                self.vec.test_interval = test_episode_interval
            while self.vec is not None and not stop.is_set() and (nb_episodes is None or train_episodes < nb_episodes):
                ended = self._guarded(lambda: self.vec.step() if self.pace(stop) else None)  # type: ignore[union-attr]
                train_episodes += sum(not e.test for e in ended or ())
            while self.vec is None and not stop.is_set() and (nb_episodes is None or train_episodes < nb_episodes):
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

    def _guarded(self, step: Callable[[], Any]) -> Any:
        """``step()`` (one vector step), after a failed env call restarting every env if the pipeline allows it."""
        try:
            out = step()
        except EnvFailure as exc:
            self._env_failed(exc)
            assert self.vec is not None
            self.vec.restart()
            return None
        self._failures_in_a_row = 0
        return out

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
                if self.vec is not None:
                    self.vec.restart()
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
        """One episode as a generator that yields after every env step (the single-process mode drives it).

        With several envs: vector steps until an episode of one of them ends, which it returns (the envs' episodes
        go on in the next call); test episodes then come from ``run(test_episode_interval)`` alone."""
        if self.vec is not None:
            if test:
                raise ValueError(f"worker {self.worker_id} runs {self.num_envs} envs: each runs its own test episodes, "
                                 "one after every test_episode_interval of its training episodes (run()); "
                                 "run_episode(test=True) is for one env")
            return self.vec.steps(stop)
        return one_env_steps(self, test, stop)

    def pace(self, stop: threading.Event, collect: bool = True) -> bool:
        """Before an env step: check the network thread and wait for the trainer's PACE if paced; False on stop."""
        if stop.is_set():
            return False
        self._check_net()
        if collect and self.throttle and not self.sync.active:
            self._wait_for_pace(stop)
        if collect and self.sync.active:  # the wait for each version paces a sync worker (netrl.worker.sync); also
            return self.sync.before_step(stop)  # when the announcement came during the wait for PACE
        return not stop.is_set()

    def packets_due(self) -> bool:
        return self.packets.due() if self.vec is None else self.vec.due()

    def random_actions(self, obs: Any, n: int | None = None) -> Any | None:
        """Random actions for ``obs`` (``n`` observations of a vector step) while the trainer holds fewer than
        ``init_random_frames`` samples, else None: the actor chooses (:mod:`netrl.worker.random_frames`). Never for
        a standalone worker (no trainer to ask); the caller never asks for test episodes, which show the policy."""
        if not self.init_random_frames or self.standalone:
            return None
        if self.random_frames is None:
            self.random_frames = RandomFrames(self.init_random_frames, self.action_space, self.seed, self.worker_id)
        if self.random_frames.done:  # for good
            return None
        if self.net is not None:
            self.random_frames.told(self.net.trainer_samples, self.net.link.server_stats.get("trainer_samples"))
        elif self.trainer_samples is not None:  # the single-process mode's count
            self.random_frames.told(self.trainer_samples)
        return None if self.random_frames.done else self.random_frames.actions(obs, n)

    def _episode_done(self, stats: EpisodeStats) -> None:
        self.episodes_done += 1
        if not stats.test:
            self.last_return = stats.ret
        episode = self._logged_episodes + self.episodes_done
        if self.episode_log is not None:
            self.episode_log.write({"time": time.time(), "episode": episode, "env": stats.env, "test": int(stats.test),
                                    "return": stats.ret, "length": stats.length,
                                    "env_steps": self._logged_steps + self.produced, "policy_version": self.version})
        log.log(self.episode_log_level, "%s episode %d%s: return %.1f over %d steps (policy %s)",
                "test" if stats.test else "training", episode, f" (env {stats.env})" if self.vec else "", stats.ret,
                stats.length, version_label(self.version))

    def _follow_spaces(self) -> None:
        """Send leaves in the dtypes the trainer expects from the spaces, and the actor's extra outputs in every row.
        The compressor is probed on a copy: one such as ActionBufferCompressor keeps state, and a random probe row
        would make the first real one a seam."""
        extras = declared_extras(self.actor)
        if self.models:  # every row also carries the version of each further model it used
            extras = self.models.spec(extras)
        for maker in [self.packets] if self.vec is None else self.vec.makers:
            maker.declare_extras(extras)
            maker.stamp = self.models.stamp if self.models else None
        compressor = probe_copy(self.sample_compressor)
        if compressor is None and self.sample_compressor is not None:  # it cannot be copied: the env's dtypes, then
            return
        schema = SampleSchema.from_spaces(self.observation_space, self.action_space, compressor, extra=extras)
        self.packets.follow(schema)
        if self.vec is not None:
            self.vec.follow(schema)

    def _default_action(self) -> Any:
        env = self.env if self.vec is None else (getattr(self.env, "envs", None) or [None])[0]  # async: no access
        default = getattr(env, "default_action", None)
        return default_value(self.action_space) if default is None else default

    def _record(self, act: Any, obs: Any, rew: float, terminated: bool, truncated: bool, info: dict[str, Any],
                reset: bool, version: int = -1, extra: dict[str, Any] | None = None) -> None:
        self.packets.add(act, obs, rew, terminated, truncated, info, reset, version if not reset else self.version,
                         networked=self.local_packets is None and self.net is not None, extra=extra)
        if not reset:
            self.produced += 1
        if self.packets.due():
            self._send_packet()

    def _send_packet(self) -> None:
        buf = self.packets.cut() if self.vec is None else self.vec.cut()
        if buf is None:
            return
        if self.local_packets is not None:  # single-process mode: no network
            self.local_packets.append(buf)
            return
        if self.net is None:
            return
        self.net.hand_over(self.packets.to_frames(buf, self.produced))

    def _swap_weights(self, force: bool = False) -> None:
        """Take the newest version received, between steps (in sync mode only between fragments, ``force``)."""
        if self.weights is None or (self.sync.holding and not force):
            return
        ready = self.weights.slot.swap(self.actor)
        if ready is not None:
            version, _session, self.actor = ready
            self.version = version
        if self.models:
            self.models.swap()
            if self.obs_norm is not None:
                self.obs_norm = self.models.current["obs_norm"]  # type: ignore[assignment]  # a copy of it

    def _wait_for_pace(self, stop: threading.Event) -> None:
        if self.net is not None:
            self.net.wait_for_pace(lambda: self.produced, stop, self._send_packet, self._check_net)

    def _check_net(self) -> None:
        net = self.net
        if net is not None and (net.link.fatal or net.error):
            raise NetrlError(f"worker {self.worker_id} cannot continue: {net.link.fatal or net.error}")
