"""Weight broadcast latency: from the trainer's publish until every worker has checked and loaded
the weights, for 0.1M, 1M and 10M-parameter actors, 1, 4 and 16 workers, CURVE on and off.

netrl: a real TrainerLink publishes a real actor's state_dict through a real server to real
RolloutWorkers, whose network threads check the weights against their actor and load them into a
spare one (the control path then swaps it in). A worker reports the moment a version is ready;
the latency of a version is the slowest worker's time. Raw, with no netrl code: a PUB socket sends
the same bytes to the same number of SUB processes (one hop), and the same through a forwarding
process in between (SUB -> PUB, zero-copy: the trainer -> server -> worker topology). Target:
within 2x raw ZeroMQ over the same path.

Each measurement first publishes ``WARMUP`` versions that are not counted, on both sides: a
worker's first versions allocate its weight buffers and run its loading code for the first time
(up to 4x the steady latency for 16 workers here), a cost paid once per worker process, not per
version. The detail keeps those latencies too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from benchmarks.common import child, forward, json_lines, kill, report_loaded
from benchmarks.results import Row
from benchmarks.settings import choose, ints, names, positive
from netrl.config.load import config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.net.keys import keygen
from netrl.util import count_of

SIZES = {"0.1M": 313, "1M": 997, "10M": 3160}  # hidden width h of an MLP actor (3 -> h -> h -> 1)
WARMUP = 2  # versions published before the measured ones (see the module docstring)


@dataclasses.dataclass(frozen=True)
class Settings:
    sizes: tuple[str, ...] = tuple(SIZES)
    workers: tuple[int, ...] = (1, 4, 16)
    security: tuple[str, ...] = ("curve", "none")
    versions: int = 20  # measured per figure: small versions swing most and cost least
    versions_10m: int = 8  # measured per figure of a 10M-parameter actor
    weight_format: str | None = None  # network.weight_format (None: its default)

    def __post_init__(self) -> None:
        choose(self.sizes, SIZES, "--sizes")
        choose(self.security, ("curve", "none"), "--security")
        positive("--workers", min(self.workers, default=0), 1, strict=False)
        positive("--versions", min(self.versions, self.versions_10m), 1, strict=False)


QUICK = Settings(versions=3, versions_10m=3)
SMOKE = Settings(sizes=("0.1M",), workers=(1,), security=("none",), versions=2, versions_10m=2)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--sizes", type=names, help=f"actor sizes (default {','.join(d.sizes)})")
    p.add_argument("--workers", type=ints, help="worker counts (default 1,4,16)")
    p.add_argument("--security", type=names, help="curve and/or none (default both)")
    p.add_argument("--versions", type=int, help=f"versions measured per figure ({d.versions})")
    p.add_argument("--versions-10m", type=int,
                   help=f"versions measured per figure of the 10M actor ({d.versions_10m})")
    p.add_argument("--weight-format", type=str,
                   help=f"network.weight_format (default: {Config().network.weight_format})")


def _actor(hidden: int) -> Any:
    import gymnasium

    from netrl.agents.sac import MLPActor

    obs = gymnasium.spaces.Box(-1, 1, (3,), np.float32)
    act = gymnasium.spaces.Box(-2, 2, (1,), np.float32)
    return MLPActor(obs, act, hidden_sizes=(hidden, hidden))


def child_worker(cfg_path: str, hidden: str, name: str) -> None:
    """A real RolloutWorker (Pendulum env, never stepped) that prints when each weight version is
    ready."""
    import torch

    from netrl.agents.sac import MLPActor
    from netrl.config.load import load_config
    from netrl.envs.gym import GenericGymEnv
    from netrl.net.keys import client_keys
    from netrl.util import partial
    from netrl.worker.worker import RolloutWorker

    torch.set_num_threads(1)
    cfg = load_config(cfg_path)
    keys = client_keys(cfg.keys_dir, "worker", name) if cfg.security == "curve" else None
    # no weights file (run_dir None): the figure is the time to a loaded actor
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"),
                           partial(MLPActor, hidden_sizes=(int(hidden), int(hidden))),
                           server_ip="127.0.0.1", server_port=cfg.network.worker_port,
                           worker_id=name, network=cfg.network, keys=keys, run_dir=None)
    worker.start()
    assert worker.weights is not None
    report_loaded(worker, 0.02)  # polling faster only loads the machine


def child_publisher(cfg_path: str, hidden: str, versions: str, interval: str) -> None:
    """A real TrainerLink publishing ``versions`` versions of an actor, ``interval`` seconds
    apart."""
    import torch

    from netrl.config.load import load_config
    from netrl.net.keys import client_keys
    from netrl.net.transport import new_session
    from netrl.trainer.delivery import Deliveries
    from netrl.trainer.trainer import TrainerLink

    torch.set_num_threads(1)
    cfg = load_config(cfg_path)
    keys = client_keys(cfg.keys_dir, "trainer", "trainer") if cfg.security == "curve" else None
    link = TrainerLink(cfg.network, "trainer", new_session(), cfg.network.trainer_port, 8,
                       Deliveries(), None, None, keys, weight_format=cfg.network.weight_format,
                       weight_budget_s=cfg.network.weight_budget_s)
    link.start()
    actor = _actor(int(hidden))
    while not link.link.ready:
        time.sleep(0.01)
    sys.stdin.readline()  # the parent says go once every worker is connected
    for version in range(1, int(versions) + 1):
        with torch.no_grad():
            next(actor.parameters()).add_(0.001)  # a new version really differs
        t0 = time.time()
        link.publish(actor, version, 0)
        print(json.dumps({"v": version, "t0": t0}), flush=True)
        time.sleep(float(interval))
    link.halt(2.0)


def child_raw_forwarder(upstream: str, out_port: str, server_public: str,
                        server_secret: str) -> None:
    """The raw stand-in for the server: subscribes to the publisher and republishes every message
    unchanged."""
    ctx = zmq.Context()
    sub, pub = ctx.socket(zmq.SUB), ctx.socket(zmq.PUB)
    if server_public:
        public, secret = zmq.curve_keypair()
        sub.curve_publickey, sub.curve_secretkey = public, secret
        sub.curve_serverkey = server_public.encode()
        pub.curve_server = True
        pub.curve_secretkey, pub.curve_publickey = server_secret.encode(), server_public.encode()
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(upstream)
    pub.bind(f"tcp://127.0.0.1:{out_port}")
    forward(sub, pub)


def child_raw_sub(endpoint: str, server_public: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    if server_public:
        public, secret = zmq.curve_keypair()
        sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.curve_serverkey = server_public.encode()
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    print(json.dumps({"ready": True}), flush=True)
    while True:
        frames = sock.recv_multipart(copy=False)
        print(json.dumps({"v": int(frames[0].bytes), "t": time.time()}), flush=True)


def _latencies(published: dict[int, float],
               reports: list[list[dict[str, Any]]]) -> dict[int, float]:
    """Version -> seconds from its publication until the last worker had it (versions some worker
    missed: none)."""
    out = {}
    for version, t0 in published.items():
        times = [next((r["t"] for r in rep if r.get("v") == version), None) for rep in reports]
        if all(t is not None for t in times):
            out[version] = max(t for t in times if t is not None) - t0
    return out


def _wait_ready(reports: list[list[dict[str, Any]]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(any(r.get("ready") for r in rep) for rep in reports):
        if time.monotonic() > deadline:
            raise RuntimeError("benchmark workers did not start")
        time.sleep(0.05)


def broadcast_netrl(tmp: Path, hidden: int, workers: int, security: str, versions: int,
                    interval: float, weight_format: str | None = None) -> dict[int, float]:
    data = config_to_dict(Config())
    if weight_format is not None:
        data["network"]["weight_format"] = weight_format
    data.update(weights_folder=str(tmp / "w"), keys_dir=str(tmp / "keys"), security=security)
    data["network"].update(trainer_port=free_port(), worker_port=free_port(),
                           heartbeat_interval_s=1.0, heartbeat_liveness=30)
    data["server"].update(status_port=free_port())
    cfg_path = write_config(data, tmp / f"broadcast-{hidden}-{workers}-{security}.json")
    server = spawn_role("server", cfg_path, log_level="WARNING", stdout=subprocess.DEVNULL)
    time.sleep(0.8)
    procs = [child(child_worker, str(cfg_path), str(hidden), f"b{hidden}-{i}")
             for i in range(workers)]
    reports: list[list[dict[str, Any]]] = [[] for _ in procs]
    for p, rep in zip(procs, reports, strict=True):
        json_lines(p, rep)
    publisher = child(child_publisher, str(cfg_path), str(hidden), str(versions), str(interval),
                      stdin=True)
    published: list[dict[str, Any]] = []
    json_lines(publisher, published)
    try:
        _wait_ready(reports, 120)
        time.sleep(1.0)
        assert publisher.stdin is not None
        publisher.stdin.write("go\n")
        publisher.stdin.flush()
        publisher.wait(timeout=versions * interval + 60)
        time.sleep(interval)
        return _latencies({r["v"]: r["t0"] for r in published}, reports)
    finally:
        # Each worker's interpreter spends about 0.3 s of CPU tearing torch down at exit: 16 need
        # 4-5 s on two cores
        stop_processes([publisher, *procs], timeout=5 + 0.5 * workers, then=[server])


def broadcast_raw(hidden: int, workers: int, security: str, versions: int, interval: float,
                  forwarded: bool = False) -> dict[int, float]:
    from netrl.protocol.messages import Message, MsgType
    from netrl.protocol.weights import state_arrays
    from netrl.protocol.wire import encode

    arrays = state_arrays(_actor(hidden))
    port = free_port()
    public, secret = zmq.curve_keypair() if security == "curve" else (b"", b"")
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    if public:
        pub.curve_server, pub.curve_secretkey, pub.curve_publickey = True, secret, public
    pub.bind(f"tcp://127.0.0.1:{port}")
    helpers, sub_port = [], port
    if forwarded:
        sub_port = free_port()
        helpers.append(child(child_raw_forwarder, f"tcp://127.0.0.1:{port}", str(sub_port),
                             public.decode(), secret.decode()))
    subs = [child(child_raw_sub, f"tcp://127.0.0.1:{sub_port}", public.decode())
            for _ in range(workers)]
    reports: list[list[dict[str, Any]]] = [[] for _ in subs]
    for p, rep in zip(subs, reports, strict=True):
        json_lines(p, rep)
    try:
        _wait_ready(reports, 60)
        time.sleep(1.0)  # PUB/SUB: let the subscriptions arrive
        published = {}
        for version in range(1, versions + 1):
            frames = encode(Message(MsgType.WEIGHTS, "raw", policy_version=version,
                                    body={"trained_steps": 0, "session": "raw"}, arrays=arrays))
            published[version] = time.time()
            pub.send_multipart([str(version).encode(), *frames[1:]], copy=False)
            time.sleep(interval)
        return _latencies(published, reports)
    finally:
        kill([*subs, *helpers])
        ctx.destroy(0)


def _steady_ms(latencies: dict[int, float]) -> float:
    """Median latency in ms of the versions after the warm-up ones."""
    steady = [t for v, t in latencies.items() if v > WARMUP]
    if not steady:
        raise RuntimeError("no measured weight version reached every worker")
    return 1000 * float(np.median(steady))


def run(s: Settings) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="netrl-bench-") as d:
        tmp = Path(d)
        keygen(tmp / "keys")
        for size in s.sizes:
            hidden = SIZES[size]
            for workers in s.workers:
                interval = {"0.1M": 0.3, "1M": 0.5, "10M": 1.0 + 0.15 * workers}[size]
                versions = WARMUP + (s.versions_10m if size == "10M" else s.versions)
                for security in s.security:
                    got = broadcast_netrl(tmp, hidden, workers, security, versions, interval,
                                          s.weight_format)
                    raw = broadcast_raw(hidden, workers, security, versions, interval)
                    fwd = broadcast_raw(hidden, workers, security, versions, interval,
                                        forwarded=True)
                    net_ms, raw_ms, fwd_ms = _steady_ms(got), _steady_ms(raw), _steady_ms(fwd)
                    who = count_of(workers, "worker")
                    print(f"broadcast {size:>4} params {who:>10} {security:<5}  netrl "
                          f"{net_ms:8.1f} ms | raw {raw_ms:8.1f} ms | {net_ms / raw_ms:.2f}x | "
                          f"raw through a forwarder {fwd_ms:8.1f} ms | {net_ms / fwd_ms:.2f}x",
                          flush=True)
                    detail = {"raw_ms": raw_ms, "ratio": net_ms / raw_ms,
                              "versions_measured": sum(v > WARMUP for v in got),
                              "all_ms": {name: {v: 1000 * t for v, t in lat.items()}
                                         for name, lat in (("netrl", got), ("raw", raw),
                                                           ("raw_forwarded", fwd))}}
                    rows.append(Row(
                        "broadcast", f"{size} params, {who}, {security}",
                        "publish to loaded on every worker, median", net_ms, "ms", fwd_ms,
                        "raw ZeroMQ, same path", net_ms / fwd_ms, "x", "<= 2x",
                        net_ms / fwd_ms <= 2,
                        {"params": size, "workers": workers, "security": security,
                         "versions": versions - WARMUP, "warmup_versions": WARMUP,
                         "interval_s": interval,
                         "weight_format": s.weight_format or Config().network.weight_format},
                        detail))
    return rows
