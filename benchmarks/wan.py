"""A worker over a long lossy link: the real roles as processes (server, trainer, one worker;
Pendulum-v1 and every setting at its default, CURVE on), the server and the trainer in one network
namespace and the worker in another, joined by an emulated path that drops, delays and
rate-limits their IP packets (benchmarks/packet_link.py), so that the kernel's TCP meets the
losses as on a real path; a run over a direct link (loopback) beside it. It needs root and
/dev/net/tun.

Reports, per run:
  reconnects        times the worker lost the server (and the server the worker) once connected
  TCP connections   connections the worker opened over the path (1: never again)
  connect           the worker's first connection: HELLO to WELCOME, retries included
  version latency   for each weight version the worker got: the trainer's publish to the worker
                    having it loaded and ready for its next step (median, p90, max; both from the
                    roles' logs, on one machine's clock); and the max of the versions published
                    after the connection's first minute (its slow start and TCP's first, long
                    retransmission timeouts apart); and the max with the versions published
                    before the worker connected counted from its connection (the handshake's
                    time apart)
  versions          versions the worker got of those the trainer published (a slow link skips
                    some: the newest wins)
  retransmitted     TCP segments the server's side sent again, of those it sent (its kernel's
                    counters: the losses were real)
  samples/s         env steps the worker produced per second (throttled to the trainer's pace)

``--one-way-ms`` and ``--loss`` take lists: a run for each pair (the matrix of docs/benchmarks/
links.md is ``--one-way-ms 50,100,200 --loss 0.01,0.05 --minutes 2``). Target at 100 ms each way,
5% loss, 10 Mbit/s: one TCP connection for the whole run, version latency median <= 1 s and max
<= 3 s.

How TCP meets the losses is the congestion control's choice, which both namespaces inherit from
this machine unless ``--congestion`` names one (its figures print it): BBR barely slows down for
random losses, while a loss-based one (reno; cubic, Linux's default, behaves like it at these
windows) halves its window at each, so that a 270 KB float32 version takes seconds at 5% loss;
``--weight-format auto`` lets the server send int8 deltas instead (docs/benchmarks/links.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from benchmarks.packet_link import NEAR_IP, PacketPath, Side
from benchmarks.results import Row
from benchmarks.settings import positive
from netrl.config.load import config_to_dict
from netrl.config.sections import Config
from netrl.launch import LAUNCHER_ENV, free_port, spawn_role, stop_processes, write_config
from netrl.net.keys import keygen

TARGET = {"one_way_ms": 100.0, "loss": 0.05, "bandwidth_mbit": 10.0}  # where the target applies
TARGET_MEDIAN_S, TARGET_MAX_S = 1.0, 3.0


def floats(text: str) -> tuple[float, ...]:
    """``"50,100"`` -> ``(50.0, 100.0)``: an option that takes a comma-separated list of numbers."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got {text!r}") from None


@dataclasses.dataclass(frozen=True)
class Settings:
    one_way_ms: tuple[float, ...] = (100.0,)  # delay each way: a run for each (with each loss)
    loss: tuple[float, ...] = (0.05,)  # IP packet loss probability, each way
    bandwidth_mbit: float = 10.0  # each way
    queue_ms: float = 100.0  # the path's drop-tail queue, in time at the rate
    congestion: str | None = None  # TCP congestion control in both namespaces (None: inherited)
    minutes: float = 10.0  # each run over the path
    direct_minutes: float | None = None  # the direct run beside it: None, as long (at most 2)
    weight_format: str | None = None  # network.weight_format (None: its default)
    logs: str | None = None  # keep each run's folder (config, the roles' logs) here

    def __post_init__(self) -> None:
        positive("--minutes", self.minutes)
        positive("--direct-minutes", self.direct_minutes or 0.0, strict=False)
        positive("--bandwidth-mbit", self.bandwidth_mbit)
        positive("--queue-ms", self.queue_ms)
        if not self.one_way_ms or any(ms < 0 for ms in self.one_way_ms):
            raise ValueError(f"--one-way-ms must be delays >= 0 (got {self.one_way_ms})")
        if not self.loss or any(not 0 <= p < 1 for p in self.loss):
            raise ValueError(f"--loss must be probabilities in [0, 1) (got {self.loss})")
        if self.logs is not None and Path(self.logs).exists():
            raise ValueError(f"--logs {self.logs}: it exists already; name a new folder")


QUICK = Settings(minutes=1.5, direct_minutes=1.0)
SMOKE = Settings(minutes=0.25, direct_minutes=0.15)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--one-way-ms", type=floats,
                   help=f"delay each way, ms; a list runs each ({d.one_way_ms[0]:g})")
    p.add_argument("--loss", type=floats,
                   help=f"IP packet loss probability each way; a list runs each ({d.loss[0]:g})")
    p.add_argument("--bandwidth-mbit", type=float, help=f"each way, Mbit/s ({d.bandwidth_mbit:g})")
    p.add_argument("--queue-ms", type=float,
                   help=f"the path's drop-tail queue, ms at the rate ({d.queue_ms:g})")
    p.add_argument("--congestion", type=str,
                   help="TCP congestion control of both sides (default: this machine's)")
    p.add_argument("--minutes", type=float, help=f"each run over the path ({d.minutes:g})")
    p.add_argument("--direct-minutes", type=float,
                   help="the direct run beside them (default: as long, at most 2; 0: none)")
    p.add_argument("--weight-format", type=str,
                   help=f"network.weight_format (default: {Config().network.weight_format})")
    p.add_argument("--logs", type=str, metavar="DIR",
                   help="keep each run's folder (its config, the roles' logs, the server's at "
                   "DEBUG) in DIR, a folder that does not exist yet (default: a temporary one, "
                   "removed)")


def complete(s: Settings) -> Settings:
    """The direct run's length, when not given: as long as one over the path, at most 2."""
    if s.direct_minutes is not None:
        return s
    return dataclasses.replace(s, direct_minutes=min(s.minutes, 2.0))


STAMP = re.compile(r"^(\d\d:\d\d:\d\d\.\d{3}) ")


def _time(line: str, day: str) -> float:
    m = STAMP.match(line)
    assert m, line
    return datetime.strptime(f"{day} {m.group(1)}", "%Y-%m-%d %H:%M:%S.%f").timestamp()


def _lines(text: str, pattern: str) -> list[tuple[str, re.Match[str]]]:
    out = []
    for line in text.splitlines():
        m = re.search(pattern, line)
        if m and STAMP.match(line):
            out.append((line, m))
    return out


def count_before(text: str, pattern: str, day: str, stop: float) -> int:
    """Log lines of ``text`` matching ``pattern`` stamped before ``stop`` (a time.time()): losses
    during the run, not at its end, where a worker's goodbye lost on the path shows on the server
    as its connection closing."""
    return sum(_time(line, day) < stop for line, _ in _lines(text, pattern))


def measure(label: str, minutes: float, folder: Path, s: Settings,
            path: tuple[float, float] | None) -> dict[str, Any]:
    """One run of ``minutes``: the worker direct, or over a PacketPath of ``path`` (one way in ms,
    loss) and ``s``'s other settings."""
    folder.mkdir(parents=True)
    keygen(folder / "keys")
    data = config_to_dict(Config())
    data.update(run_name="wan", weights_folder=str(folder / "weights"),
                keys_dir=str(folder / "keys"))
    # in a namespace of its own every port is free; free_port() also keeps the direct run apart
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"]["status_port"] = free_port()
    data["trainer"]["epochs"] = 100_000
    data["wandb"]["mode"] = "disabled"
    if s.weight_format is not None:
        data["network"]["weight_format"] = s.weight_format
    day = datetime.now().strftime("%Y-%m-%d")
    load = os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        net = None
        if path is not None:
            net = stack.enter_context(PacketPath(path[0], path[1], s.bandwidth_mbit, s.queue_ms,
                                                 s.congestion))
            data["network"]["server_ip"] = data["server"]["bind_ip"] = NEAR_IP
        config = write_config(data, folder / "config.json")
        logs = {role: stack.enter_context((folder / f"{role}.log").open("wb"))
                for role in ("server", "trainer", "worker")}

        def spawn(side: Side, role: str, *extra: str, level: str = "INFO") -> Any:
            if net is None:
                return spawn_role(role, config, *extra, log_level=level, stdout=logs[role])
            return spawn_in(net, side, role, config, *extra, level=level, stdout=logs[role])

        # the server's DEBUG lines (each version it sends) only when its log is kept to be read
        procs = [spawn("near", "server", level="DEBUG" if s.logs else "INFO")]
        try:
            _wait_for(folder / "server.log", "server listening", 30)
            procs.append(spawn("near", "trainer", level="DEBUG"))
            procs.append(spawn("far", "worker", "--worker-id", "far", level="DEBUG"))
            started = time.time()
            end = started + minutes * 60
            while time.time() < end and all(p.poll() is None for p in procs):
                time.sleep(min(5.0, max(0.0, end - time.time())))
            crashed = [role for role, p in zip(("server", "trainer", "worker"), procs,
                                               strict=False) if p.poll() is not None]
            # before the stop, which the counts are not about
            tcp = net.tcp_counters("near") if net is not None else {}
            connections = net.stats.up.connections if net is not None else 0
        finally:
            stopping = time.time()
            stop_processes(procs[:0:-1], timeout=20, then=procs[:1])  # the server last
    server, trainer, worker = (Path(folder / f"{r}.log").read_text(errors="replace")
                               for r in ("server", "trainer", "worker"))
    published = {int(m.group(1)): _time(line, day)
                 for line, m in _lines(trainer, r"published weights v(\d+)")}
    ready = {int(m.group(1)): _time(line, day)
             for line, m in _lines(worker, r"weights v(\d+) ready")}
    latencies = sorted(ready[v] - published[v] for v in ready if v in published)
    connects = [float(m.group(1))
                for _, m in _lines(worker, r"connected to worker server .* in ([\d.]+) s")]
    first = _lines(worker, r"connected to worker server")
    produced = [int(m.group(1)) for _, m in _lines(worker, r": (\d+) samples produced in")]
    connected_at = _time(first[0][0], day) if first else end
    result: dict[str, Any] = {
        "run": label, "minutes": minutes, "crashed": crashed,
        "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
        "worker_reconnects": count_before(worker, r"lost the server at (?!.*said goodbye)", day,
                                          stopping),
        "server_lost_worker": count_before(server, r"worker 'far' .* lost", day, stopping),
        "connect_s": connects[0] if connects else None,
        "published": len(published), "received": len(latencies),
        "latency_median_s": statistics.median(latencies) if latencies else None,
        "latency_p90_s": latencies[int(0.9 * (len(latencies) - 1))] if latencies else None,
        "latency_max_s": latencies[-1] if latencies else None,
        # the connection's first minute apart: its slow start and TCP's first, long timeouts
        "latency_max_after_1min_s": max(
            (ready[v] - published[v] for v in ready
             if v in published and published[v] >= connected_at + 60), default=None),
        # a version published before the worker connected counted from the connection: the
        # handshake's time apart (the first version: published before the worker is there)
        "latency_max_from_connection_s": max(
            (ready[v] - max(published[v], connected_at) for v in ready if v in published),
            default=None),
        "samples_s": produced[0] / max(1e-9, end - connected_at) if produced else None,
    }
    if net is not None and path is not None:
        result["path"] = {
            "one_way_ms": path[0], "loss": path[1], "bandwidth_mbit": s.bandwidth_mbit,
            "queue_ms": s.queue_ms, "congestion": net.congestion, "tcp_connections": connections,
            "server_segments_sent": tcp.get("OutSegs"),
            "server_segments_retransmitted": tcp.get("RetransSegs"),
            **{f"{d.name}_{k}": getattr(d, k) for d in (net.stats.down, net.stats.up)
               for k in ("packets", "lost", "queue_drops", "bytes_delivered")}}
    return result


def spawn_in(net: PacketPath, side: Side, role: str, config: Path, *extra: str, level: str,
              stdout: IO[bytes]) -> subprocess.Popen[bytes]:
    """:func:`netrl.launch.spawn_role`, in the namespace of ``side``."""
    cmd = [sys.executable, "-m", "netrl", f"--{role}", "--config", str(config),
           "--log-level", level, *extra]
    return subprocess.Popen(net.command(side, cmd), stdout=stdout, stderr=subprocess.STDOUT,
                            env={**os.environ, LAUNCHER_ENV: str(os.getpid())},
                            start_new_session=True)


def _wait_for(path: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise SystemExit(f"{path} did not show {text!r} within {timeout} s:\n"
                     f"{path.read_text(errors='replace')[-2000:]}")


def _label(one_way_ms: float, loss: float, s: Settings) -> str:
    return f"{one_way_ms:g} ms each way, {loss:.0%} loss, {s.bandwidth_mbit:g} Mbit/s"


def run(s: Settings) -> list[Row]:
    results = []
    print(f"wan: load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())} "
          "(1 / 5 / 15 min) at the start", flush=True)
    keep = contextlib.nullcontext(s.logs) if s.logs else None
    with keep or tempfile.TemporaryDirectory(prefix="netrl-wan-") as tmp:
        if s.direct_minutes:
            results.append(measure("direct", s.direct_minutes, Path(tmp) / "direct", s, None))
            _report(results[-1])
        for i, (ms, loss) in enumerate((ms, p) for ms in s.one_way_ms for p in s.loss):
            results.append(measure(_label(ms, loss, s), s.minutes, Path(tmp) / f"path{i}", s,
                                   (ms, loss)))
            _report(results[-1])
    rows = []
    for r in results:
        p: dict[str, Any] = r.get("path") or {}
        median, top = r["latency_median_s"], r["latency_max_s"]
        targeted = bool(p) and all(p[k] == v for k, v in TARGET.items())
        met = (median is not None and top is not None and median <= TARGET_MEDIAN_S
               and top <= TARGET_MAX_S and p["tcp_connections"] == 1) if targeted else None
        params = {"minutes": r["minutes"], "direct": not p,
                  **({k: p[k] for k in ("one_way_ms", "loss", "bandwidth_mbit", "queue_ms",
                                        "congestion")} if p else {})}
        rows.append(Row("wan", f"{r['run']}, {r['minutes']:g} minutes", "version latency, median",
                        median, "s",
                        target=(f"median <= {TARGET_MEDIAN_S:g} s, max <= {TARGET_MAX_S:g} s, "
                                "1 TCP connection") if targeted else "",
                        met=met, params=params, detail=r))
    return rows


def _report(r: dict[str, Any]) -> None:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    p = r.get("path")
    over = (f", TCP connections {p['tcp_connections']}, retransmitted "
            f"{p['server_segments_retransmitted']:,} of {p['server_segments_sent']:,} segments "
            f"(server), {p['congestion']}, queue {p['queue_ms']:g} ms" if p else "")
    print(f"{r['run']}, {r['minutes']:g} min: reconnects {r['worker_reconnects']} (worker) / "
          f"{r['server_lost_worker']} (server){over}, first connection "
          f"{num(r['connect_s'], '.2f')} s, version latency median / p90 / max "
          f"{num(r['latency_median_s'], '.2f')} / {num(r['latency_p90_s'], '.2f')} / "
          f"{num(r['latency_max_s'], '.2f')} s (max from the connection "
          f"{num(r['latency_max_from_connection_s'], '.2f')} s, after the first minute "
          f"{num(r['latency_max_after_1min_s'], '.2f')} s), versions {r['received']} / "
          f"{r['published']}, "
          f"{num(r['samples_s'], ',.0f')} samples/s, load average {r['load_before']:.2f} -> "
          f"{r['load_after']:.2f}{', CRASHED: ' + ', '.join(r['crashed']) if r['crashed'] else ''}",
          flush=True)
