"""Weights over a slow link: the time from the trainer's publish to the version loaded on a worker
whose only way to the server is an emulated wide-area link, for each weight format, and the worker's
version lag meanwhile.

The pieces are netrl's own, each in a process of its own: the server (``python -m netrl --server``,
CURVE on, every setting at its default); a trainer process holding a real TrainerLink that publishes
an MLP actor (observation 64 -> 960 -> 960 -> mean and log-std of 8 actions: 1,000,336 parameters,
see ``--hidden``) every ``--interval`` s, and between two publications trains it for real
(``--steps`` Adam steps, lr 3e-4, on a synthetic regression loss), so consecutive versions differ as
in training and deltas are measured on real changes; and a RolloutWorker (a still env with those
spaces, never stepped) whose network thread checks each version and loads it into a spare actor.
The server and the trainer run in one network namespace, the worker in another, and the worker's
only way to the server is the emulated path of :class:`benchmarks.packet_link.PacketPath` (10
Mbit/s, 100 ms round trip, 1% of the IP packets lost each way, a drop-tail queue of 100 ms by
default; the wan family's path): the kernels' TCP meets real losses, retransmits and, with a
loss-based congestion control (``--congestion reno``), shrinks its window. The forwarder runs in a
thread of this process, so its CPU is apart from the roles' (reported). It needs root and
/dev/net/tun.

Reported per format (``--formats``): versions published and applied (a version published while
another is on its way waits, and a newer one replaces it: only the newest is sent), the time from
``publish()`` to the version loaded on the worker (the receiver's ``loaded_at``; both sides read
``time.time()`` on this one machine) for the first version (a delta format's first one is full) and
median and p90 of the others, the version lag (the trainer's newest published version minus the
worker's newest loaded one, on a 100 ms grid over the measured window, computed from those two event
logs: median, max, and the max in each half of the window: a bounded lag is no higher in the second
half), bytes the link carried from server to worker per applied version (heartbeats included), TCP
connections through the link (1: the worker never reconnected), and the forwarder's CPU time.

Baseline, "raw ZeroMQ, one hop": the same float32 bytes with no netrl code, PAIR to PAIR (CURVE on)
over a path of the same settings (the sender on the near side, the receiver on the far side), on the
same schedule and with the same rule (one version in flight, the newest published waits; the
receiver's arrival time comes back over the same path).

Target: ``auto`` at least 4x faster than ``float32`` (median publish -> loaded), lag bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from benchmarks.common import child, json_lines
from benchmarks.packet_link import NEAR_IP, PacketPath
from benchmarks.results import Row
from benchmarks.settings import names, positive
from benchmarks.wan import spawn_in
from benchmarks.weights_roles import (
    ACT,
    OBS,
    actor,
    child_raw_receiver,
    child_raw_sender,
    child_trainer,
    child_worker,
)
from netrl.config.load import config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port, stop_processes, write_config
from netrl.net.keys import keygen

FORMATS = ("float32", "float16", "bfloat16", "int8", "delta", "auto")
GRACE_S = 30.0  # after the last publication: how long the newest version may take to arrive
TARGET = 4.0  # auto at least this many times faster than float32


@dataclasses.dataclass(frozen=True)
class Settings:
    formats: tuple[str, ...] = FORMATS  # one row each (any network.weight_format)
    seconds: float = 30.0  # how long the trainer publishes, per format
    interval: float = 0.5  # seconds between two publications
    steps: int = 8  # Adam steps (batch 64) between two publications
    hidden: int = 960  # hidden width of the actor (64 -> h -> h -> 2x8)
    budget_s: float = 0.0  # network.weight_budget_s; 0: the time between publications
    bandwidth_mbit: float = 10.0  # each way
    rtt_ms: float = 100.0  # round trip of the emulated path (half of it each way)
    loss: float = 0.01  # IP packet loss probability, each way
    queue_ms: float = 100.0  # the path's drop-tail queue, in time at the rate
    congestion: str | None = None  # TCP congestion control of both sides (None: this machine's)
    raw: bool = True  # the raw ZeroMQ baseline row

    def __post_init__(self) -> None:
        if not self.formats:
            raise ValueError("--formats needs a format")
        positive("--seconds", self.seconds)
        positive("--interval", self.interval)
        positive("--steps", self.steps, strict=False)
        positive("--hidden", self.hidden, 1, strict=False)
        if not 0 <= self.loss < 1:
            raise ValueError(f"--loss must be in [0, 1) (got {self.loss:g})")


QUICK = Settings(seconds=8.0)
SMOKE = Settings(formats=("float32", "auto"), seconds=3.0, hidden=64)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--formats", type=names,
                   help=f"weight formats, a row each (default {','.join(FORMATS)})")
    p.add_argument("--seconds", type=float, help=f"publishing time per format ({d.seconds:g})")
    p.add_argument("--interval", type=float, help=f"seconds between publications ({d.interval:g})")
    p.add_argument("--steps", type=int, help=f"Adam steps between publications ({d.steps})")
    p.add_argument("--hidden", type=int, help=f"the actor's hidden width ({d.hidden})")
    p.add_argument("--budget-s", type=float,
                   help="network.weight_budget_s (0, the default: the time between publications)")
    p.add_argument("--bandwidth-mbit", type=float, help=f"each way, Mbit/s ({d.bandwidth_mbit:g})")
    p.add_argument("--rtt-ms", type=float, help=f"round trip of the link ({d.rtt_ms:g})")
    p.add_argument("--loss", type=float, help=f"IP packet loss probability, each way ({d.loss:g})")
    p.add_argument("--queue-ms", type=float,
                   help=f"the path's drop-tail queue, ms at the rate ({d.queue_ms:g})")
    p.add_argument("--congestion", type=str,
                   help="TCP congestion control of both sides (default: this machine's)")
    p.add_argument("--no-raw", dest="raw", action="store_false", default=None,
                   help="skip the raw ZeroMQ baseline row")


def _wait(what: str, until: Callable[[], bool], timeout: float,
          procs: dict[str, subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        exited = [name for name, p in procs.items() if p.poll() is not None]
        if exited:
            raise SystemExit(f"waiting for {what}: the {' and the '.join(exited)} exited (its "
                             "error is above)")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.05)


@dataclasses.dataclass
class _Events:
    published: dict[int, float]  # version -> when publish() was called
    loaded: dict[int, float]  # version -> when the worker had it loaded
    start: float
    end: float  # the measured window: the first publication to the end of publishing


def _summary(ev: _Events, down_bytes: int, connections: int, cpu_s: float,
             wall_s: float) -> dict[str, Any]:
    latencies = {v: ev.loaded[v] - t0 for v, t0 in ev.published.items() if v in ev.loaded}
    first = min(latencies) if latencies else None
    rest = sorted(t for v, t in latencies.items() if v != first)
    grid = np.arange(ev.start, ev.end, 0.1)
    pub_v = np.array(sorted(ev.published))
    pub_t = np.array([ev.published[v] for v in sorted(ev.published)])
    got = sorted((t, v) for v, t in ev.loaded.items())
    got_t = np.array([t for t, _ in got])
    got_v = np.maximum.accumulate(np.array([v for _, v in got] or [0]))
    at = np.searchsorted(pub_t, grid, "right")  # publications up to each instant of the grid
    newest = np.where(at > 0, pub_v[np.maximum(at - 1, 0)], 0)
    at = np.searchsorted(got_t, grid, "right")
    current = np.where(at > 0, got_v[np.maximum(at - 1, 0)], 0)  # 0: none yet
    lag = newest - current
    return {
        "published": len(ev.published), "applied": len(latencies),
        "first_s": latencies.get(first) if first else None,
        "median_s": statistics.median(rest) if rest else None,
        "p90_s": rest[int(0.9 * (len(rest) - 1))] if rest else None,
        "max_s": rest[-1] if rest else None,
        "lag_median": float(np.median(lag)), "lag_max": int(lag.max()),
        "lag_max_halves": [int(lag[:len(lag) // 2].max()), int(lag[len(lag) // 2:].max())],
        "bytes_per_version": down_bytes / len(latencies) if latencies else None,
        "link_bytes_down": down_bytes, "tcp_connections": connections, "forwarder_cpu_s": cpu_s,
        "forwarder_cpu_share": cpu_s / wall_s,
        "latencies_s": {v: round(t, 4) for v, t in latencies.items()},
    }


def _path(s: Settings) -> PacketPath:
    return PacketPath(s.rtt_ms / 2, s.loss, s.bandwidth_mbit, s.queue_ms, s.congestion)


def _cpu() -> float:
    """This process's CPU time: the path's forwarder (a thread of it) is what works in it."""
    return time.process_time()


def run_netrl(fmt: str, s: Settings, tmp: Path) -> dict[str, Any]:
    folder = tmp / fmt
    data = config_to_dict(Config())
    data.update(run_name="link", weights_folder=str(folder / "weights"), keys_dir=str(tmp / "keys"))
    data["network"].update(trainer_port=free_port(), worker_port=free_port(), weight_format=fmt,
                           server_ip=NEAR_IP)
    data["server"].update(status_port=free_port(), bind_ip=NEAR_IP)
    cfg = write_config(data, folder / "config.json")
    log = (folder / "server.log").open("wb")
    procs: dict[str, subprocess.Popen[str]] = {}
    server: Any = None
    try:
        with _path(s) as net:
            # the server and the trainer on the near side, the worker on the far side: the
            # path is the worker's only way to the server
            server = spawn_in(net, "near", "server", cfg, level="WARNING", stdout=log)
            trainer_out: list[dict[str, Any]] = []
            worker_out: list[dict[str, Any]] = []
            trainer = child(child_trainer, str(cfg), str(s.hidden), fmt, str(s.budget_s),
                            str(s.interval), str(s.seconds), str(s.steps), stdin=True,
                            wrap=lambda argv: net.command("near", argv))
            worker = child(child_worker, str(cfg), str(s.hidden), NEAR_IP,
                           str(data["network"]["worker_port"]),
                           wrap=lambda argv: net.command("far", argv))
            procs = {"worker": worker, "trainer": trainer}
            json_lines(trainer, trainer_out)
            json_lines(worker, worker_out)
            _wait("the trainer's and the worker's connections",
                  lambda: (any("ready" in r for r in trainer_out)
                           and any("ready" in r for r in worker_out)), 120, procs)
            time.sleep(1.0)  # the worker's first heartbeats and ACK window settle over the path
            # the measured window starts
            down0, cpu0, wall0 = net.stats.down.bytes_delivered, _cpu(), time.monotonic()
            assert trainer.stdin is not None
            trainer.stdin.write("go\n")
            trainer.stdin.flush()
            _wait("the trainer's publications", lambda: any("done" in r for r in trainer_out),
                  s.seconds + 120, procs)
            published = {r["v"]: r["t0"] for r in trainer_out if "t0" in r}
            end = max(published.values())
            newest = max(published)
            with contextlib.suppress(SystemExit):  # still on its way after the grace: missing
                _wait("the newest version's arrival",
                      lambda: any(r.get("v") == newest for r in worker_out), GRACE_S, procs)
            down = net.stats.down.bytes_delivered - down0
            cpu, wall = _cpu() - cpu0, time.monotonic() - wall0
            connections = net.stats.up.connections
            trainer.stdin.write("stop\n")
            trainer.stdin.flush()
            # inside the path's with: the roles' goodbyes still cross it
            stop_processes(list(procs.values()), timeout=5, then=[server])
    finally:
        stop_processes(list(procs.values()), timeout=5, then=[server] if server else [])
        log.close()
    loaded = {r["v"]: r["t"] for r in worker_out if "t" in r and r["v"] in published}
    events = _Events(published, loaded, min(published.values()), end)
    out = _summary(events, down, connections, cpu, wall)
    done = next(r for r in trainer_out if "done" in r)
    losses = [r["loss"] for r in trainer_out if r.get("loss") is not None]
    return {"run": fmt, **out, "train_s_per_version": done["train_s_median"],
            "loss_first_last": [losses[0], losses[-1]] if losses else None}


def run_raw(s: Settings) -> dict[str, Any]:
    """The same float32 bytes, PAIR to PAIR over a path of the same settings, on the same
    schedule (the sender on the near side, the receiver on the far side, a process each)."""
    public, secret = zmq.curve_keypair()
    port = free_port()
    procs: list[subprocess.Popen[str]] = []
    try:
        with _path(s) as net:
            sent_out: list[dict[str, Any]] = []
            sender = child(child_raw_sender, public.decode(), secret.decode(), NEAR_IP, str(port),
                           str(s.hidden), str(s.seconds), str(s.interval), str(GRACE_S),
                           wrap=lambda argv: net.command("near", argv))
            procs.append(sender)
            json_lines(sender, sent_out)
            _wait("the raw baseline's sender", lambda: any("bound" in r for r in sent_out), 60,
                  {"sender": sender})
            receiver = child(child_raw_receiver, public.decode(), NEAR_IP, str(port),
                             wrap=lambda argv: net.command("far", argv))
            procs.append(receiver)
            _wait("the raw baseline's connection", lambda: any("ready" in r for r in sent_out), 60,
                  {"sender": sender, "receiver": receiver})
            # the receiver is the path's far end: "down" runs from the sender to it, as from the
            # server to a worker
            down0, cpu0, wall0 = net.stats.down.bytes_delivered, _cpu(), time.monotonic()
            _wait("the raw baseline's versions", lambda: any("loaded" in r for r in sent_out),
                  s.seconds + GRACE_S + 60, {"sender": sender})
            down = net.stats.down.bytes_delivered - down0
            cpu, wall = _cpu() - cpu0, time.monotonic() - wall0
            connections = net.stats.up.connections
    finally:
        stop_processes(procs, timeout=5)
    got = next(r for r in sent_out if "loaded" in r)
    published = {int(v): t for v, t in got["published"].items()}
    loaded = {int(v): t for v, t in got["loaded"].items()}
    events = _Events(published, loaded, got["start"], max(published.values()))
    out = _summary(events, down, connections, cpu, wall)
    return {"run": "raw ZeroMQ, one hop (float32)", **out, "payload_bytes": got["payload_bytes"]}


def run(s: Settings) -> list[Row]:
    params = sum(p.numel() for p in actor(s.hidden).parameters())
    print(f"weights: actor {OBS} -> {s.hidden} -> {s.hidden} -> 2x{ACT}, {params:,} parameters; "
          f"path {s.bandwidth_mbit:g} Mbit/s, {s.rtt_ms:g} ms round trip, {s.loss:.0%} of the IP "
          f"packets lost each way, TCP {s.congestion or 'as this machine'}; a "
          f"version every {s.interval:g} s for {s.seconds:g} s per format", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="netrl-wlink-") as d:
        tmp = Path(d)
        keygen(tmp / "keys")
        if s.raw:
            results.append(run_raw(s))
            _report(results[-1])
        for fmt in s.formats:
            try:
                results.append(run_netrl(fmt, s, tmp))
            except SystemExit as exc:  # e.g. a format netrl does not know: its error is above
                results.append({"run": fmt, "error": str(exc)})
            _report(results[-1])
    base = next((r.get("median_s") for r in results if r["run"] == "float32"), None)
    settings = {**dataclasses.asdict(s), "parameters": params}
    rows = []
    for r in results:
        median = r.get("median_s")
        ratio = base / median if base and median else None
        judged = r["run"] == "auto"
        rows.append(Row("weights", r["run"], "publish -> loaded, median", median, "s", base,
                        "float32", ratio, "x faster", f">= {TARGET:g}x faster" if judged else "",
                        (ratio is not None and ratio >= TARGET) if judged else None,
                        {**settings, "format": r["run"]}, r))
    return rows


def _report(r: dict[str, Any]) -> None:
    if "error" in r:
        print(f"  {r['run']}: failed: {r['error']}", flush=True)
        return

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    print(f"  {r['run']}: {num(r['bytes_per_version'], ',.0f')} bytes per version, "
          f"{r['applied']} / {r['published']} versions applied, first "
          f"{num(r['first_s'], '.2f')} s, "
          f"publish -> loaded median / p90 / max {num(r['median_s'], '.2f')} / "
          f"{num(r['p90_s'], '.2f')} / {num(r['max_s'], '.2f')} s, version lag median / max "
          f"{r['lag_median']:g} / {r['lag_max']} (max in 1st / 2nd half {r['lag_max_halves'][0]} / "
          f"{r['lag_max_halves'][1]}), {r['tcp_connections']} TCP connection(s), path forwarder CPU "
          f"{r['forwarder_cpu_s']:.1f} s ({r['forwarder_cpu_share']:.0%})", flush=True)
