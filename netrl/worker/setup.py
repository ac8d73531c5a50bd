"""A RolloutWorker from config.json: its name claimed in the run folder, its seed, its files and its keys."""

from __future__ import annotations

import logging
import zlib
from typing import Any

import numpy as np
import torch

from netrl.config.sections import Config
from netrl.net.keys import client_keys
from netrl.worker.names import claim_worker_id

__all__ = ["worker_from_config", "worker_seed"]

log = logging.getLogger("netrl.worker.worker")


def worker_seed(seed: int | None, worker_id: str) -> int | None:
    """A worker's own seed, from the config's ``seed`` and its name: workers started from one config.json must
    not collect the same episodes and actions, and a worker's stream stays the same from run to run."""
    return None if seed is None else (seed + zlib.crc32(worker_id.encode())) % 2**32


def worker_from_config(cls: Any, cfg: Config, pipeline: Any) -> Any:
    """``cls(...)`` (a RolloutWorker) with the settings of ``cfg`` and the parts of ``pipeline``; it holds its
    worker_id's lock in the run folder until it closes."""
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
                     num_envs=w.num_envs, vectorization=w.vectorization, init_random_frames=w.init_random_frames,
                     run_dir=cfg.run_dir, torch_threads=cfg.torch_threads, normalize_obs=cfg.env.normalize_obs,
                     normalize_obs_clip=cfg.env.normalize_obs_clip)
    except BaseException:
        if name_lock is not None:
            name_lock.release()
        raise
    worker.name_lock = name_lock
    if worker.seed is not None:  # the actor's sampling: this process's torch stream is this worker's
        torch.manual_seed(worker.seed)
    return worker
