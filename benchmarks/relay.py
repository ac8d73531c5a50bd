"""Relay throughput: samples/s and MB/s delivered worker -> server -> trainer through the real
delivery path, next to raw ZeroMQ moving the same samples.

netrl: each source drives a real WorkerLink with a prebuilt packet; the sink is a real TrainerLink
(acknowledgements, de-duplication, schema checks and the sample log on) behind a real server. Two
raw baselines, with no netrl code: the same packets' frames pushed by the same number of processes
straight to one PULL socket (one hop), and through a forwarding process in between (PULL -> PUSH,
zero-copy: the physical limit of a worker -> server -> trainer topology, two hops, three processes
on the machine's two cores). All with CURVE on and off.

Three kinds of packet (``KINDS``): vector rows (12 float32 obs, 2 float32 actions), 4x64x64 uint8
image rows of random pixels (incompressible, sent raw), and camera rows, the same shape of
ImageReach frames compressed with zstd per packet as a worker does by default. The baselines always
move the uncompressed packet: what a sink receives is the same samples either way. Each figure is
measured ``--repeat`` times (netrl and both baselines side by side each time); medians reported.

Targets, against raw ZeroMQ over the same path: vector with one worker >= 1,000,000 samples/s;
image and camera >= 50% of raw ZeroMQ's rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from benchmarks.common import child, forward, kill, result
from benchmarks.results import Row
from benchmarks.settings import choose, ints, names, positive
from netrl.config.load import config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.net.keys import client_keys, keygen
from netrl.net.thread import Command, command_head
from netrl.net.transport import new_session
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import encode, frames_nbytes, samples_message
from netrl.samples import Buffer
from netrl.trainer.delivery import Deliveries, SampleLog
from netrl.util import count_of

KINDS: dict[str, dict[str, Any]] = {  # rows per packet, one row's layout, the worker's packet codec
    "vector": {"rows": 1000, "obs": ((12,), np.float32), "act": ((2,), np.float32),
               "codec": "none"},
    "image": {"rows": 100, "obs": ((4, 64, 64), np.uint8), "act": ((2,), np.float32),
              "codec": "none"},
    # image rows as a camera makes them (ImageReach's noisy frame stacks), sent as a worker does
    "camera": {"rows": 100, "obs": ((4, 64, 64), np.uint8), "act": ((2,), np.float32),
               "codec": "zstd"},
    # a real-time worker's packet: 10 Pendulum rows (about 20 Hz with the default delay), where
    # per-packet work, not bytes, bounds the relay (issue 47, item 4)
    "pendulum": {"rows": 10, "obs": ((3,), np.float32), "act": ((1,), np.float32),
                 "codec": "zstd"},
}
# The raw baselines' queue limit per pipe: ZeroMQ's default (1,000 messages) for packets of a few
# hundred bytes, where a limit of 16 would stall every pipe and flatter netrl's ratio; 16 for
# megabyte packets (see _bounded).
SMALL_PACKET_ROWS = 10
SECURITY = ("curve", "none")


@dataclasses.dataclass(frozen=True)
class Settings:
    kinds: tuple[str, ...] = tuple(KINDS)
    workers: tuple[int, ...] = (1, 4, 16)
    security: tuple[str, ...] = SECURITY
    repeat: int = 3
    warmup_s: float = 1.0
    seconds: float = 3.0

    def __post_init__(self) -> None:
        choose(self.kinds, KINDS, "--kinds")
        choose(self.security, SECURITY, "--security")
        positive("--repeat", self.repeat, 1, strict=False)
        positive("--workers", min(self.workers, default=0), 1, strict=False)
        positive("--seconds", self.seconds)
        positive("--warmup-s", self.warmup_s, strict=False)


QUICK = Settings(warmup_s=0.5, seconds=1.5)
SMOKE = Settings(kinds=("vector",), workers=(1,), security=("none",), repeat=1, warmup_s=0.2,
                 seconds=0.5)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--kinds", type=names, help=f"kinds of packet (default {','.join(d.kinds)})")
    p.add_argument("--workers", type=ints, help="worker counts (default 1,4,16)")
    p.add_argument("--security", type=names, help="curve and/or none (default both)")
    p.add_argument("--repeat", type=int,
                   help=f"measurements per figure, medians (default {d.repeat})")
    p.add_argument("--warmup-s", type=float, help=f"seconds not counted (default {d.warmup_s})")
    p.add_argument("--seconds", type=float, help=f"seconds counted (default {d.seconds})")


def packet(kind: str) -> Buffer:
    """One packet of rows of ``kind``, starting with an episode's first row: random for vector and
    image (which no codec can shrink), an ImageReach episode's camera frames for camera."""
    spec = KINDS[kind]
    n = int(spec["rows"])
    rng = np.random.default_rng(0)
    (obs_shape, obs_dtype), (act_shape, act_dtype) = spec["obs"], spec["act"]
    obs = (_camera_frames(n) if kind == "camera"
           else rng.uniform(-1, 1, (n, *obs_shape)).astype(obs_dtype) if kind == "pendulum"
           else rng.integers(0, 255, (n, *obs_shape)).astype(obs_dtype))
    act = (rng.uniform(-1, 1, (n, *act_shape)) if kind == "pendulum"
           else rng.normal(size=(n, *act_shape))).astype(act_dtype)
    return Buffer(act=act, obs=obs,
                  rew=rng.normal(size=n).astype(np.float32), terminated=np.zeros(n, bool),
                  truncated=np.zeros(n, bool), reset=np.arange(n) == 0, context=np.zeros(n, bool),
                  policy_version=np.zeros(n, np.int64))


def _camera_frames(n: int) -> np.ndarray:
    """``n`` observations (4x64x64 frame stacks) of ImageReach under random actions, resetting
    between episodes."""
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

    from netrl.envs.checks import value_limits

    if kind == "pendulum":  # Pendulum-v1's spaces, with the value limits a trainer checks
        obs_space = gymnasium.spaces.Box(np.array([-1, -1, -8], np.float32),
                                         np.array([1, 1, 8], np.float32))
        act_space = gymnasium.spaces.Box(-2, 2, (1,), np.float32)
        return SampleSchema.from_spaces(obs_space, act_space,
                                        limits=value_limits(obs_space, act_space, 100.0))
    spec = KINDS[kind]
    (obs_shape, obs_dtype), (act_shape, _) = spec["obs"], spec["act"]
    high = 255 if obs_dtype == np.uint8 else 1.0
    obs = gymnasium.spaces.Box(0, high, obs_shape, obs_dtype)
    return SampleSchema.from_spaces(obs, gymnasium.spaces.Box(-1, 1, act_shape, np.float32))


# -- child processes ----------------------------------------------------------------------------
def _ready_then_wait(go: str) -> None:
    """Tell the parent this source is connected, then wait until every source is (the parent
    creates ``go``)."""
    print("ready", flush=True)
    while not Path(go).exists():
        time.sleep(0.01)


def child_source(cfg_path: str, kind: str, worker_id: str, go: str) -> None:
    """A worker whose 'env' is a prebuilt packet: it drives the real WorkerLink as fast as it
    can."""
    from netrl.config.load import load_config
    from netrl.worker.link import WorkerLink

    cfg = load_config(cfg_path)
    keys = client_keys(cfg.keys_dir, "worker", worker_id) if cfg.security == "curve" else None
    link = WorkerLink(cfg.network, worker_id, new_session(), cfg.network.worker_port, keys,
                      max_backlog_bytes=1 << 30, send_window_bytes=cfg.worker.send_window_bytes)
    link.start()
    buf, steps, seq = packet(kind), int(KINDS[kind]["rows"]) - 1, 0
    codec = KINDS[kind]["codec"]  # compressed per packet, as a worker does
    while not link.link.ready:
        time.sleep(0.01)
    _ready_then_wait(go)
    first = samples_message(buf, worker_id, link.link.session, 1, steps)
    nbytes = frames_nbytes(encode(first, codec))

    def room() -> bool:  # unacknowledged packets, and those on their way to the network thread
        return link.backlog_bytes + (seq - link.last_seq) * nbytes < 16 << 20

    try:
        while link.is_alive():
            with link.settled:  # block like a producer facing a full pipe
                if not link.settled.wait_for(room, 0.5):
                    continue
            seq += 1
            frames = encode(samples_message(buf, worker_id, link.link.session, seq, seq * steps),
                            codec)
            link.command([command_head(Command.PACKET, seq, int(steps)), *frames])
    except KeyboardInterrupt:
        pass
    finally:
        link.halt(1.0)


def child_sink(cfg_path: str, kind: str, warmup_s: str, seconds_s: str, log_dir: str) -> None:
    """The trainer side of the real delivery path (TrainerLink with its sample log), counting what
    arrives."""
    warmup, seconds = float(warmup_s), float(seconds_s)
    from netrl.config.load import load_config
    from netrl.trainer.trainer import TrainerLink

    cfg = load_config(cfg_path)
    keys = client_keys(cfg.keys_dir, "trainer", "trainer") if cfg.security == "curve" else None
    # A trainer's sample log in its steady state: at its size (what a 20,000-row replay memory
    # needs, 330 MB of image rows), so that it recycles its segment files, as it does once a long
    # run has filled its memory.
    sample_log = SampleLog(Path(log_dir) / "samples", keep_rows=20_000)
    link = TrainerLink(cfg.network, "trainer", new_session(), cfg.network.trainer_port,
                       cfg.trainer.credit_window, Deliveries(), sample_log, schema(kind), keys)
    link.start()
    connected = time.monotonic() + 60
    while not link.link.ready and time.monotonic() < connected:
        time.sleep(0.01)
    print("ready", flush=True)  # the parent starts the sources only now (see relay_netrl)
    samples = nbytes = packets = 0
    t_start = t_end = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        link.wait(0.01)
        got = link.fetch()
        now = time.monotonic()
        if got and t_start is None:
            t_start = now + warmup
        if t_start is not None and now >= t_start:
            packets += len(got)
            samples += sum(int(np.count_nonzero(b.transition_end)) for b in got)
            nbytes += sum(_buffer_bytes(b) for b in got)
            if now >= t_start + seconds:
                t_end = now
                break
    link.halt(2.0)
    elapsed = (t_end or time.monotonic()) - (t_start or time.monotonic())
    print(json.dumps({"samples_s": samples / max(elapsed, 1e-9),
                      "packets_s": packets / max(elapsed, 1e-9),
                      "mb_s": nbytes / max(elapsed, 1e-9) / 1e6}))


def _buffer_bytes(b: Buffer) -> int:
    leaves = [b.act, b.obs] if not isinstance(b.obs, tuple) else [b.act, *b.obs]
    return (sum(int(x.nbytes) for x in leaves) + b.rew.nbytes + 4 * b.terminated.nbytes
            + b.policy_version.nbytes)


def child_raw_source(endpoint: str, kind: str, server_public: str, go: str) -> None:
    ctx = zmq.Context()
    sock = _bounded(ctx.socket(zmq.PUSH), kind)
    if server_public:
        public, secret = zmq.curve_keypair()
        sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.curve_serverkey = server_public.encode()
    sock.connect(endpoint)
    frames = [bytes(f) for f in encode(samples_message(packet(kind), "raw", "raw", 1, 1), "none")]
    _ready_then_wait(go)
    try:
        while True:
            sock.send_multipart(frames, copy=False)
    except KeyboardInterrupt:
        pass


def _bounded(sock: zmq.Socket[Any], kind: str) -> zmq.Socket[Any]:
    """Queues of a few messages per pipe for large packets, as anyone moving megabyte messages
    would set (ZeroMQ's default of 1,000 queues gigabytes of fresh memory, which this machine fills
    at a fraction of its copy speed); ZeroMQ's default for small packets, whose queues cost
    nothing and whose rate a short queue would cap."""
    sock.sndhwm = sock.rcvhwm = 1000 if int(KINDS[kind]["rows"]) <= SMALL_PACKET_ROWS else 16
    return sock


def _curve_server(sock: zmq.Socket[Any], server_secret: str, server_public: str) -> None:
    if server_secret:
        sock.curve_server = True
        sock.curve_secretkey, sock.curve_publickey = server_secret.encode(), server_public.encode()


def child_raw_forwarder(in_port: str, out_port: str, kind: str, server_secret: str,
                        server_public: str) -> None:
    """The raw stand-in for the server: frames in on PULL, out on PUSH, never copied in Python."""
    ctx = zmq.Context()
    pull, push = _bounded(ctx.socket(zmq.PULL), kind), _bounded(ctx.socket(zmq.PUSH), kind)
    for sock, port in ((pull, in_port), (push, out_port)):
        _curve_server(sock, server_secret, server_public)
        sock.bind(f"tcp://127.0.0.1:{port}")
    forward(pull, push)


def child_raw_sink(where: str, kind: str, warmup_s: str, seconds_s: str, server_secret: str,
                   server_public: str) -> None:
    """Counts what arrives: bound to a port (straight from the sources) or connected to a
    forwarder's endpoint."""
    warmup, seconds = float(warmup_s), float(seconds_s)
    ctx = zmq.Context()
    sock = _bounded(ctx.socket(zmq.PULL), kind)
    if where.startswith("tcp://"):
        if server_public:  # the forwarder is the CURVE server; the sink is its client
            public, secret = zmq.curve_keypair()
            sock.curve_publickey, sock.curve_secretkey = public, secret
            sock.curve_serverkey = server_public.encode()
        sock.connect(where)
    else:
        _curve_server(sock, server_secret, server_public)
        sock.bind(f"tcp://127.0.0.1:{where}")
    rows = int(KINDS[kind]["rows"]) - 1
    if not sock.poll(30_000):
        raise SystemExit("the raw sink received nothing within 30 s")
    t_start = time.monotonic() + warmup
    packets = nbytes = 0
    while True:
        frames = sock.recv_multipart(copy=False)
        now = time.monotonic()
        if now >= t_start:
            packets += 1
            nbytes += sum(len(f) for f in frames[1:])
            if now >= t_start + seconds:
                break
    elapsed = time.monotonic() - t_start
    print(json.dumps({"samples_s": packets * rows / elapsed, "packets_s": packets / elapsed,
                      "mb_s": nbytes / elapsed / 1e6}))


# -- the parent ---------------------------------------------------------------------------------
def start_together(sources: list[subprocess.Popen[str]], go: Path, timeout: float = 120) -> None:
    """Wait until every source has started and connected, then let them all go at once (so that
    the measurement window never includes a process still starting up)."""
    deadline = time.monotonic() + timeout
    for p in sources:
        assert p.stdout is not None
        line = p.stdout.readline()  # blocks until that source is ready (or has died: "")
        if line.strip() != "ready" or time.monotonic() > deadline:
            raise RuntimeError(f"a relay source did not start (it printed {line!r}, exit code "
                               f"{p.poll()})")
    go.touch()


def relay_netrl(tmp: Path, kind: str, workers: int, security: str, warmup: float,
                seconds: float) -> dict[str, float]:
    data = config_to_dict(Config())
    # Every measurement gets its own folder (spool, sample log, start signal): a spool left by an
    # earlier repeat would be relayed first, and an old start file would let sources go early.
    run = Path(tempfile.mkdtemp(prefix=f"run-{kind}-{workers}-{security}-", dir=tmp))
    data.update(weights_folder=str(run / "weights"), keys_dir=str(tmp / "keys"), security=security)
    data["network"].update(trainer_port=free_port(), worker_port=free_port(),
                           heartbeat_interval_s=0.5, heartbeat_liveness=20)
    data["server"].update(min_samples_per_server_packet=int(KINDS[kind]["rows"]),
                          max_queue_bytes=256 << 20, status_port=free_port())
    cfg_path = write_config(data, run / "config.json")
    server = spawn_role("server", cfg_path, log_level="WARNING", stdout=subprocess.DEVNULL)
    time.sleep(0.8)
    sink = child(child_sink, str(cfg_path), kind, str(warmup), str(seconds), str(run))
    # The sink (trainer) connects first, whatever its imports take on a loaded machine: sources
    # started before would fill the server's spool, and the figure would be the spool's replay.
    assert sink.stdout is not None
    if sink.stdout.readline().strip() != "ready":
        raise RuntimeError(f"the relay sink did not start (exit code {sink.poll()})")
    time.sleep(0.2)  # its SCHEMA reaches the server before the first packet
    go = run / "go"
    sources = [child(child_source, str(cfg_path), kind, f"{kind}{workers}{security}-w{i}", str(go))
               for i in range(workers)]
    try:
        start_together(sources, go)
        return result(sink, 120)
    finally:
        stop_processes(sources, timeout=5, then=[server])
        shutil.rmtree(run, ignore_errors=True)  # its spool and sample log: hundreds of MB each


def relay_raw(tmp: Path, kind: str, workers: int, security: str, warmup: float, seconds: float,
              forwarded: bool) -> dict[str, float]:
    port = free_port()
    public, secret = zmq.curve_keypair() if security == "curve" else (b"", b"")
    keys = (secret.decode(), public.decode())
    helpers = []
    if forwarded:
        out_port = free_port()
        helpers.append(child(child_raw_forwarder, str(port), str(out_port), kind, *keys))
        time.sleep(0.5)
        sink = child(child_raw_sink, f"tcp://127.0.0.1:{out_port}", kind, str(warmup), str(seconds),
                     *keys)
    else:
        sink = child(child_raw_sink, str(port), kind, str(warmup), str(seconds), *keys)
    time.sleep(0.3)
    go = Path(tempfile.mkdtemp(prefix=f"raw-{kind}-{workers}-{security}-", dir=tmp)) / "go"
    sources = [child(child_raw_source, f"tcp://127.0.0.1:{port}", kind, public.decode(), str(go))
               for _ in range(workers)]
    try:
        start_together(sources, go)
        return result(sink, 120)
    finally:
        kill([*sources, *helpers])


def measure(tmp: Path, kind: str, workers: int, security: str, s: Settings) -> dict[str, Any]:
    """One figure ``s.repeat`` times, netrl and its two baselines side by side each time; the
    medians (ratios: the median of each repeat's own), so that one stall of this shared machine
    cannot make a figure."""
    runs = []
    for _ in range(s.repeat):
        got = relay_netrl(tmp, kind, workers, security, s.warmup_s, s.seconds)
        raw = relay_raw(tmp, kind, workers, security, s.warmup_s, s.seconds, forwarded=False)
        fwd = relay_raw(tmp, kind, workers, security, s.warmup_s, s.seconds, forwarded=True)
        runs.append({"netrl_samples_s": got["samples_s"], "netrl_mb_s": got["mb_s"],
                     "netrl_packets_s": got["packets_s"], "raw_packets_s": raw["packets_s"],
                     "raw_forwarded_packets_s": fwd["packets_s"],
                     "raw_samples_s": raw["samples_s"], "raw_mb_s": raw["mb_s"],
                     "raw_forwarded_samples_s": fwd["samples_s"],
                     "raw_forwarded_mb_s": fwd["mb_s"],
                     "ratio": got["samples_s"] / raw["samples_s"],
                     "ratio_forwarded": got["samples_s"] / fwd["samples_s"]})
    row = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    print(f"relay {kind:<6} {count_of(workers, 'worker'):>10} {security:<5}  netrl "
          f"{row['netrl_samples_s']:>11,.0f} samples/s {row['netrl_mb_s']:>8.1f} MB/s | raw "
          f"{row['raw_samples_s']:>11,.0f} samples/s {row['raw_mb_s']:>8.1f} MB/s | "
          f"{row['ratio']:.0%} | raw through a forwarder {row['raw_forwarded_samples_s']:>11,.0f} "
          f"samples/s | {row['ratio_forwarded']:.0%}"
          f"{f' (medians of {s.repeat})' if s.repeat > 1 else ''}; packets/s: netrl "
          f"{row['netrl_packets_s']:,.0f}, raw {row['raw_packets_s']:,.0f}, raw through a "
          f"forwarder {row['raw_forwarded_packets_s']:,.0f}", flush=True)
    return {**row, "runs": runs}


def run(s: Settings) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="netrl-bench-") as d:
        tmp = Path(d)
        keygen(tmp / "keys")  # sources use the shared worker key
        for kind in s.kinds:
            for workers in s.workers:
                for security in s.security:
                    got = measure(tmp, kind, workers, security, s)
                    rows.append(_row(kind, workers, security, got, s))
    return rows


def _row(kind: str, workers: int, security: str, got: dict[str, Any], s: Settings) -> Row:
    """A relay figure is judged against raw ZeroMQ over the same path: a relay moves every byte
    twice, and on two cores raw ZeroMQ through a forwarder alone keeps only about half of one
    hop's rate. Raw one hop is in the detail."""
    target, met = "", None
    if kind in ("image", "camera"):
        target, met = ">= 50% of raw ZeroMQ, same path", got["ratio_forwarded"] >= 0.5
    elif workers == 1:
        target, met = ">= 1,000,000 samples/s", got["netrl_samples_s"] >= 1e6
    return Row("relay", f"{kind}, {count_of(workers, 'worker')}, {security}", "samples/s delivered",
               got["netrl_samples_s"], "samples/s", got["raw_forwarded_samples_s"],
               "raw ZeroMQ, same path", got["ratio_forwarded"], "%", target, met,
               {"kind": kind, "workers": workers, "security": security, "repeat": s.repeat,
                "warmup_s": s.warmup_s, "seconds": s.seconds}, got)
