"""Shared pieces of the benchmarks: synthetic packets, child processes and the episode logs they read."""

from __future__ import annotations

import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from netrl.protocol.schema import SampleSchema
from netrl.samples import Buffer

BENCH = str(Path(__file__).resolve().parent.parent / "bench.py")
KINDS: dict[str, dict[str, Any]] = {  # rows per packet, the layout of one row, and the worker's packet codec
    "vector": {"rows": 1000, "obs": ((12,), np.float32), "act": ((2,), np.float32), "codec": "none"},
    "image": {"rows": 100, "obs": ((4, 64, 64), np.uint8), "act": ((2,), np.float32), "codec": "none"},
    # image rows as a camera makes them (ImageReach's noisy frame stacks), sent as a worker sends them by default
    "camera": {"rows": 100, "obs": ((4, 64, 64), np.uint8), "act": ((2,), np.float32), "codec": "zstd"},
}


def packet(kind: str) -> Buffer:
    """One packet of rows of ``kind``, starting with an episode's first row: random for vector and image (which
    no codec can shrink), an ImageReach episode's camera frames for camera."""
    spec = KINDS[kind]
    n = int(spec["rows"])
    rng = np.random.default_rng(0)
    (obs_shape, obs_dtype), (act_shape, act_dtype) = spec["obs"], spec["act"]
    obs = _camera_frames(n) if kind == "camera" else rng.integers(0, 255, (n, *obs_shape)).astype(obs_dtype)
    return Buffer(act=rng.normal(size=(n, *act_shape)).astype(act_dtype), obs=obs,
                  rew=rng.normal(size=n).astype(np.float32), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                  reset=np.arange(n) == 0, context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64))


def _camera_frames(n: int) -> np.ndarray:
    """``n`` observations (4x64x64 frame stacks) of ImageReach under random actions, resetting between episodes."""
    from netrl.envs.image import ImageReachEnv

    env = ImageReachEnv()
    env.action_space.seed(0)
    obs, _ = env.reset(seed=0)
    out = [obs]
    while len(out) < n:
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        out.append(obs if not (terminated or truncated) else env.reset()[0])
    return np.stack(out)


def schema(kind: str) -> SampleSchema:
    import gymnasium

    spec = KINDS[kind]
    (obs_shape, obs_dtype), (act_shape, _) = spec["obs"], spec["act"]
    high = 255 if obs_dtype == np.uint8 else 1.0
    obs = gymnasium.spaces.Box(0, high, obs_shape, obs_dtype)
    return SampleSchema.from_spaces(obs, gymnasium.spaces.Box(-1, 1, act_shape, np.float32))


def child(*args: str) -> subprocess.Popen[str]:
    """``python scripts/bench.py <args>`` in its own process group, stdout captured."""
    return subprocess.Popen([sys.executable, BENCH, *args], stdout=subprocess.PIPE, text=True, start_new_session=True)


def result(p: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The JSON object a child printed last."""
    out, _ = p.communicate(timeout=timeout)
    return dict(json.loads(out.strip().splitlines()[-1]))


def forward(src: zmq.Socket[Any], dst: zmq.Socket[Any]) -> None:
    """A raw baseline's stand-in for the server: every message from ``src`` to ``dst``, never copied in Python,
    until the parent stops the process."""
    try:
        while True:
            dst.send_multipart(src.recv_multipart(copy=False), copy=False)
    except KeyboardInterrupt:
        pass


def kill(procs: Iterable[subprocess.Popen[str]]) -> None:
    """Stop raw-baseline children at once: they own nothing, and a blocked send or receive may not see a SIGINT."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def env_steps(episodes_csv: Path) -> int:
    """Env steps a worker's episodes CSV has logged so far (0 before its first episode)."""
    if not episodes_csv.exists():
        return 0
    with episodes_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return int(rows[-1]["env_steps"]) if rows else 0


def crossing(episodes_csv: Path, threshold: float, window: int = 10) -> tuple[int, float] | None:
    """``(env_steps, time)`` of the training episode at which the mean of the last ``window`` training returns (test
    episodes left out) first reached ``threshold`` in a worker's episodes CSV; None before that."""
    if not episodes_csv.exists():
        return None
    returns: list[float] = []
    with episodes_csv.open(newline="") as f:
        for row in csv.DictReader(f):
            if row.get("test") == "1":
                continue
            returns.append(float(row["return"]))
            if len(returns) >= window and sum(returns[-window:]) / window >= threshold:
                return int(row["env_steps"]), float(row["time"])
    return None


def evaluate(act: Any, env: Any, episodes: int) -> float:
    """Mean return of ``episodes`` deterministic episodes on seeds 1000..; ``act(obs)`` gives an action."""
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=1000 + k)
        done, ret = False, 0.0
        while not done:
            obs, r, terminated, truncated, _ = env.step(act(obs))
            ret, done = ret + float(r), terminated or truncated
        returns.append(ret)
    return float(np.mean(returns))


def server_steps(status_port: int) -> int:
    """Env steps the server has accepted from all workers together (0 until its status port answers)."""
    from netrl.monitor.status import query_status

    try:
        return sum(int(w["samples"]) for w in query_status(status_port, 2.0)["workers"])
    except Exception:  # the server is not listening yet
        return 0


def report_loaded(worker: Any, poll_s: float) -> None:
    """A benchmark's worker child: print ``{"ready": true}``, then each weight version its receiver loaded with the
    time it recorded, one JSON line each, until stopped (SIGINT); the poll's period adds nothing to those times."""
    print(json.dumps({"ready": True}), flush=True)
    seen: set[int] = set()
    try:
        while True:
            for version, t in list(worker.weights.loaded_at.items()):
                if version not in seen:
                    seen.add(version)
                    print(json.dumps({"v": version, "t": t}), flush=True)
            time.sleep(poll_s)
    finally:  # stopped with SIGINT: close the network thread, or exiting waits on its sockets until killed
        worker.close()


def median_steps(runs: list[dict[str, Any]], variants: Iterable[str], max_steps: int,
                 key: str = "steps_to_-200") -> dict[str, dict[str, Any]]:
    """Per variant, the median of its runs' ``key`` and the list of them; a run that never got there counts as
    ``max_steps``, so the median then says "at least"."""
    out = {}
    for variant in variants:
        steps = [r[key] if r[key] is not None else max_steps for r in runs if r["variant"] == variant]
        out[variant] = {"median_steps": statistics.median(steps), "steps": steps}
    return out


def pendulum_config(tmp: Path, seed: int, changes: dict[str, dict[str, Any]] | None = None) -> Any:
    """The pendulum learning row's config for three processes (256x256 SAC, batch 256, update-to-data ratio 1,
    training from 1,000 samples, CURVE keys in ``tmp``), with ``changes`` (section -> keys) applied."""
    from netrl.config.load import config_from_dict, config_to_dict
    from netrl.config.sections import Config
    from netrl.launch import free_port
    from netrl.net.keys import keygen

    data = config_to_dict(Config())
    keygen(tmp / "keys")
    data.update(run_name="bench", weights_folder=str(tmp), seed=seed, keys_dir=str(tmp / "keys"))
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"].update(status_port=free_port(), min_samples_per_server_packet=100)
    data["worker"].update(test_episode_interval=0, min_samples_per_worker_packet=20, worker_id="bench")
    data["trainer"].update(epochs=1000, rounds=1, steps=500, update_model_interval=20, update_buffer_interval=20,
                           start_training=1000, worker_lead=100, max_training_steps_per_env_step=1.0)
    data["wandb"]["mode"] = "disabled"
    for section, keys in (changes or {}).items():
        data[section].update(keys)
    return config_from_dict(data)


def three_roles(path: Path, logs: Any) -> list[subprocess.Popen[bytes]]:
    """The server, the trainer and the worker of the config at ``path``, their output in ``logs``."""
    from netrl.launch import spawn_role

    return [spawn_role("server", path, stdout=logs), spawn_role("trainer", path, stdout=logs),
            spawn_role("worker", path, stdout=logs, log_level="WARNING")]
