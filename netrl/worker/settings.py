"""A worker's own settings, in one frozen object: from config.json
(:meth:`WorkerSettings.from_config`) or from the keywords a RolloutWorker is built with in Python
(:meth:`WorkerSettings.from_keywords`).

The worker's parts (the env and actor classes, the sample compressor, the obs_preprocessor, further
models) are not settings: they stay arguments of :class:`~netrl.worker.worker.RolloutWorker`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gymnasium

from netrl.config.sections import Config, NetworkConfig
from netrl.net.keys import ClientKeys, client_keys
from netrl.pipelines.base import Pipeline
from netrl.protocol.codecs import Codec
from netrl.protocol.messages import PEER_NAME, PEER_NAME_RULE
from netrl.samples.info import InfoKey, check_info_keys
from netrl.util import did_you_mean
from netrl.worker.names import default_worker_id

__all__ = ["Vectorization", "WorkerSettings", "same_step_autoreset", "worker_seed"]

log = logging.getLogger("netrl.worker.worker")

Vectorization = Literal["sync", "async"]
VECTOR_GYMNASIUM = "1.1"  # the first with vector envs' autoreset modes (pyproject.toml's minimum)


def same_step_autoreset() -> Any:
    """Gymnasium's ``AutoresetMode.SAME_STEP``, which vector workers (``num_envs`` > 1) need;
    ValueError naming the installed gymnasium where it has no autoreset modes (before 1.1)."""
    modes = getattr(gymnasium.vector, "AutoresetMode", None)
    if modes is None:
        raise ValueError(f"num_envs > 1 needs gymnasium >= {VECTOR_GYMNASIUM}, whose vector envs "
                         f"autoreset in the same step; gymnasium {gymnasium.__version__} is "
                         f"installed: pip install 'gymnasium>={VECTOR_GYMNASIUM}', or set "
                         f"worker.num_envs to 1")
    return modes.SAME_STEP


def worker_seed(seed: int | None, worker_id: str) -> int | None:
    """A worker's own seed, from the config's ``seed`` and its name: workers started from one
    config.json must not collect the same episodes and actions, and a worker's stream stays the same
    from run to run."""
    return None if seed is None else (seed + zlib.crc32(worker_id.encode())) % 2**32


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a RolloutWorker is set to (tmrl's arguments and netrl's own).

    Attributes:
        device: inference device.
        network: connection settings (see config.json); ``server_ip=`` among the keywords replaces
            its address.
        server_port, worker_id: the server's port for workers, and this worker's name (None: the
            host's).
        min_samples_per_worker_packet: rows gathered before a packet is sent (with
            ``max_packet_delay_s`` set, at most that long).
        max_samples_per_episode: episodes longer than this are truncated (and bootstrapped, not
            terminal).
        model_path: where received weights are saved, and loaded from at start; default
            ``<run_dir>/worker_policy_<worker_id>.pt``.
        model_path_history: prefix for the weight history kept when ``model_history > 0`` (files
            ``<prefix>_v000123.pt``); None: ``model_path`` without its suffix, plus ``_history``.
        model_history: also keep every ``model_history``-th received version (0: none).
        standalone: run without a server (deployment): no samples are sent, weights come from
            ``model_path``.
        overlap: rows of context a memory needs before each transition (see :mod:`netrl.samples`).
        throttle: wait for the trainer's PACE allowance (simulated envs only, never real-time ones).
        max_packet_delay_s: a partial packet is sent after this long. None (tmrl's behaviour, the
            default here; config.json sets 0.5 s): a packet waits for
            ``min_samples_per_worker_packet`` rows.
        compression: codec for packets ("zstd", "lz4", "none"); only integer arrays such as images
            use it.
        max_backlog_bytes: unacknowledged packets kept for resending; beyond it the oldest are
            dropped (counted). Packets not yet taken by the network thread are bounded by it too.
        send_window_bytes: unacknowledged packets in flight to the server.
        flush_timeout_s: on close, how long to wait for the last packets to be acknowledged.
        seed: the env's first reset and the random actions (None: unseeded).
        episode_log: CSV file that gets one line per finished episode (time, return, length, env
            steps...), which ``python -m netrl --plot`` draws; default
            ``<run_dir>/episodes_<worker_id>.csv``.
        keys: CURVE keys to connect with (:func:`netrl.net.keys.client_keys`); None connects
            unencrypted.
        status_interval_s: seconds between status log lines (0: none); 10 s, as ``python -m netrl``.
        env_timeout_factor, env_timeout_min_s: when an env call counts as hung
            (:mod:`netrl.envs.guard`).
        on_env_failure: what a hung env call or a dead env thread does: "stop" (raise EnvFailure) or
            "reset".
        num_envs: envs this worker runs, stepped together in one Gymnasium vector env
            (:mod:`netrl.worker.runners.vector`): the actor must take batches (see
            :mod:`netrl.actor`).
        vectorization: "sync" (the envs step one after another in this process) or "async" (a
            process per env).
        init_random_frames: act uniformly at random from the action space until the trainer holds
            this many samples (as the server tells; in test episodes and standalone, never); 0: off.
        run_dir: the run folder (the trainer's ``run_dir``, default ``weights/run`` for both), where
            ``model_path`` and ``episode_log`` go unless given; None: no files but those given.
        torch_threads: ``torch.set_num_threads`` when the worker starts (None: leave torch's
            setting); 1, as ``python -m netrl``: inference on small inputs gains nothing from more,
            and they compete with the env.
        normalize_obs, normalize_obs_clip: ``env.normalize_obs``: ``act`` gets observations
            normalised by the trainer's statistics as last received
            (:meth:`netrl.worker.policy.PolicyHandle.obs`).
        info_keys: the env info entries every row records (the pipeline's, see
            :mod:`netrl.samples.info`); the trainer must declare the same.
    """

    device: str = "cpu"
    network: NetworkConfig = field(default_factory=NetworkConfig)
    server_port: int = 55556
    worker_id: str | None = None
    min_samples_per_worker_packet: int = 1
    max_samples_per_episode: float = math.inf
    model_path: str | None = None
    model_path_history: str | None = None
    model_history: int = 0
    standalone: bool = False
    overlap: int = 1
    throttle: bool = False
    max_packet_delay_s: float | None = None
    compression: Codec = "zstd"
    max_backlog_bytes: int = 256 << 20
    send_window_bytes: int = 32 << 20
    flush_timeout_s: float = 2.0
    seed: int | None = None
    episode_log: str | None = None
    keys: ClientKeys | None = None
    status_interval_s: float = 10.0
    env_timeout_factor: float = 50.0
    env_timeout_min_s: float = 5.0
    on_env_failure: Literal["stop", "reset"] = "stop"
    num_envs: int = 1
    vectorization: Vectorization = "sync"
    init_random_frames: int = 0
    run_dir: str | Path | None = "weights/run"
    torch_threads: int | None = 1
    normalize_obs: bool = False
    normalize_obs_clip: float = 10.0
    info_keys: tuple[InfoKey, ...] = ()

    def __post_init__(self) -> None:
        n = self.num_envs
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"num_envs must be an integer >= 1 (got {n!r})")
        if n > 1:
            same_step_autoreset()  # told here, before any env is built
        if self.vectorization not in ("sync", "async"):
            raise ValueError('vectorization must be "sync" or "async" (got '
                             f'{self.vectorization!r})')
        if self.min_samples_per_worker_packet < 1:
            raise ValueError("min_samples_per_worker_packet must be >= 1 "
                             f"(got {self.min_samples_per_worker_packet})")
        delay = self.max_packet_delay_s
        if delay is not None and not delay > 0:
            raise ValueError("max_packet_delay_s must be > 0, or None to wait for "
                             f"min_samples_per_worker_packet rows (got {delay})")
        if self.torch_threads is not None and not 1 <= self.torch_threads <= 1024:
            raise ValueError("torch_threads must be between 1 and 1024, or None to leave torch's "
                             f"setting (got {self.torch_threads!r})")
        # the server refuses it
        if self.worker_id is not None and not PEER_NAME.fullmatch(self.worker_id):
            raise ValueError(f"worker_id {self.worker_id!r} is not a valid name: use "
                             f"{PEER_NAME_RULE}")
        object.__setattr__(self, "info_keys", check_info_keys(self.info_keys, "info_keys"))
        if self.init_random_frames < 0:
            raise ValueError(f"init_random_frames must be >= 0 (got {self.init_random_frames})")

    @classmethod
    def from_keywords(cls, base: WorkerSettings | None = None, owner: str = "RolloutWorker",
                      **keywords: Any) -> WorkerSettings:
        """``base`` (default: the defaults) with ``keywords`` replacing its values; ``server_ip``
        replaces the network's address. A keyword that is no setting is refused by name, with the
        nearest one."""
        names = [f.name for f in dataclasses.fields(cls)]
        for name in keywords:
            if name not in names and name != "server_ip":
                hint = did_you_mean(name, [*names, "server_ip"])
                raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}{hint}; its "
                                f"settings are WorkerSettings' fields: {', '.join(names)}")
        base = base or cls()
        server_ip = keywords.pop("server_ip", None)
        if server_ip is not None:
            keywords["network"] = dataclasses.replace(keywords.get("network") or base.network,
                                                      server_ip=server_ip)
        elif keywords.get("network", base.network) is None:
            keywords["network"] = NetworkConfig()
        n = keywords.get("num_envs")
        if isinstance(n, numbers.Integral) and not isinstance(n, bool):  # numpy's integers too
            keywords["num_envs"] = int(n)
        return dataclasses.replace(base, **keywords)

    @classmethod
    def from_config(cls, cfg: Config, pipeline: Pipeline, worker_id: str) -> WorkerSettings:
        """The settings ``cfg.worker`` gives the worker named ``worker_id`` running ``pipeline`` (as
        ``python -m netrl --worker``: its files in the run folder, its own seed, its keys)."""
        w = cfg.worker
        if w.throttle and pipeline.realtime:
            log.info("worker.throttle is ignored: the %s pipeline's env runs in real time, and "
                     "pausing it would change what it learns", cfg.env.pipeline)
        longest = w.max_samples_per_episode
        return cls(
            device=w.device, network=cfg.network, server_port=cfg.network.worker_port,
            worker_id=worker_id, min_samples_per_worker_packet=w.min_samples_per_worker_packet,
            max_samples_per_episode=math.inf if longest is None else longest,
            model_path=str(cfg.run_dir / f"worker_policy_{worker_id}.pt"),
            model_path_history=str(cfg.run_dir / f"worker_policy_{worker_id}"),
            model_history=w.model_history,
            overlap=pipeline.overlap, throttle=w.throttle and not pipeline.realtime,
            max_packet_delay_s=w.max_packet_delay_s, compression=w.compression,
            max_backlog_bytes=w.max_backlog_bytes, send_window_bytes=w.send_window_bytes,
            flush_timeout_s=w.flush_timeout_s, seed=worker_seed(cfg.seed, worker_id),
            episode_log=str(cfg.run_dir / f"episodes_{worker_id}.csv"),
            keys=(client_keys(cfg.keys_dir, "worker", worker_id) if cfg.security == "curve"
                  else None),
            status_interval_s=cfg.status_interval_s, env_timeout_factor=w.env_timeout_factor,
            env_timeout_min_s=w.env_timeout_min_s, on_env_failure=pipeline.on_env_failure,
            num_envs=w.num_envs, vectorization=w.vectorization,
            init_random_frames=w.init_random_frames, run_dir=cfg.run_dir,
            torch_threads=cfg.torch_threads, normalize_obs=cfg.env.normalize_obs,
            normalize_obs_clip=cfg.env.normalize_obs_clip, info_keys=pipeline.info_keys)

    def resolved(self) -> WorkerSettings:
        """These settings with what they leave open filled in: the worker's name, and its files in
        the run folder (the CLI's file names, so that ``--plot`` finds the episodes)."""
        worker_id = self.worker_id or default_worker_id()
        model_path, episode_log = self.model_path, self.episode_log
        if self.run_dir is not None:
            model_path = model_path or str(Path(self.run_dir) / f"worker_policy_{worker_id}.pt")
            episode_log = episode_log or str(Path(self.run_dir) / f"episodes_{worker_id}.csv")
        history = self.model_path_history
        if history is None and model_path:
            history = str(Path(model_path).with_suffix("")) + "_history"
        return dataclasses.replace(self, worker_id=worker_id, model_path=model_path,
                                   episode_log=episode_log, model_path_history=history)

