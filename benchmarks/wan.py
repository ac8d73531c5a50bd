"""A worker over a long lossy link: the real roles as processes (server, trainer, one worker;
Pendulum-v1 and every setting at its default, CURVE on), the worker connected to the server's
worker port through an emulated link (benchmarks/wan_link.py: a userspace TCP forwarder that
delays, loses as TCP experiences loss, and limits bandwidth; its docstring gives the model), side
by side with the same run over a direct link.

Reports, per run:
  reconnects        times the worker lost the server (and the server the worker) once connected
  TCP connections   connections the worker opened through the emulated link (1: never again)
  connect           the worker's first connection: HELLO to WELCOME, retries included
  version latency   for each weight version the worker got: the trainer's publish to the worker
                    having it loaded and ready for its next step (median, p90, max; both from the
                    roles' logs, on one machine's clock)
  versions          versions the worker got of those the trainer published (a slow link skips
                    some: the newest wins)
  samples/s         env steps the worker produced per second (throttled to the trainer's pace)

Targets over the link: one TCP connection for the whole run, version latency median <= 2 s.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.results import Row
from benchmarks.settings import positive
from benchmarks.wan_link import WanLink
from netrl.config.load import config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.net.keys import keygen


@dataclasses.dataclass(frozen=True)
class Settings:
    rtt_ms: float = 200.0  # round trip of the emulated link
    loss: float = 0.05  # segment loss probability (see wan_link.py)
    bandwidth_mbit: float = 10.0  # each way
    minutes: float = 10.0  # the run over the emulated link
    direct_minutes: float | None = None  # the direct run beside it: None, as long (at most 2)

    def __post_init__(self) -> None:
        positive("--minutes", self.minutes)
        positive("--direct-minutes", self.direct_minutes or 0.0, strict=False)
        positive("--bandwidth-mbit", self.bandwidth_mbit)
        if not 0 <= self.loss < 1:
            raise ValueError(f"--loss must be in [0, 1) (got {self.loss:g})")


QUICK = Settings(minutes=1.5, direct_minutes=1.0)
SMOKE = Settings(minutes=0.25, direct_minutes=0.15)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--rtt-ms", type=float, help=f"round trip of the emulated link ({d.rtt_ms:g})")
    p.add_argument("--loss", type=float, help=f"segment loss probability ({d.loss:g})")
    p.add_argument("--bandwidth-mbit", type=float, help=f"each way, Mbit/s ({d.bandwidth_mbit:g})")
    p.add_argument("--minutes", type=float, help=f"the run over the link ({d.minutes:g})")
    p.add_argument("--direct-minutes", type=float,
                   help="the direct run beside it (default: as long, at most 2; 0: none)")


def complete(s: Settings) -> Settings:
    """The direct run's length, when not given: as long as the one over the link, at most 2."""
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


def measure(label: str, minutes: float, folder: Path,
            link: dict[str, float] | None) -> dict[str, Any]:
    """One run of ``minutes``: the worker direct, or through a WanLink with ``link``'s settings."""
    folder.mkdir(parents=True)
    keygen(folder / "keys")
    worker_port = free_port()
    data = config_to_dict(Config())
    data.update(run_name="wan", weights_folder=str(folder / "weights"),
                keys_dir=str(folder / "keys"))
    data["network"].update(trainer_port=free_port(), worker_port=worker_port)
    data["server"]["status_port"] = free_port()
    data["trainer"]["epochs"] = 100_000
    data["wandb"]["mode"] = "disabled"
    config = write_config(data, folder / "config.json")
    day = datetime.now().strftime("%Y-%m-%d")
    with contextlib.ExitStack() as stack:
        worker_config = config
        wan = None
        if link is not None:
            wan = stack.enter_context(WanLink(worker_port, link["rtt_ms"], link["loss"],
                                              link["bandwidth_mbit"]))
            far = json.loads(json.dumps(data))
            far["network"]["worker_port"] = wan.port  # the worker's way to the server: the link
            worker_config = write_config(far, folder / "worker.json")
        logs = {role: (folder / f"{role}.log").open("wb")
                for role in ("server", "trainer", "worker")}
        procs = [spawn_role("server", config, stdout=logs["server"])]
        _wait_for(folder / "server.log", "server listening", 30)
        procs.append(spawn_role("trainer", config, log_level="DEBUG", stdout=logs["trainer"]))
        procs.append(spawn_role("worker", worker_config, "--worker-id", "far", log_level="DEBUG",
                                stdout=logs["worker"]))
        started = time.time()
        end = started + minutes * 60
        while time.time() < end and all(p.poll() is None for p in procs):
            time.sleep(min(5.0, max(0.0, end - time.time())))
        crashed = [role for role, p in zip(("server", "trainer", "worker"), procs, strict=True)
                   if p.poll() is not None]
        # before the stop, which the count is not about
        tcp_connections = wan.stats.connections if wan is not None else 0
        stop_processes([procs[2], procs[1]], timeout=20, then=[procs[0]])  # the server last
        for f in logs.values():
            f.close()
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
        "worker_reconnects": len(_lines(worker, r"lost the server at (?!.*said goodbye)")),
        "server_lost_worker": len(_lines(server, r"worker 'far' .* lost")),
        "connect_s": connects[0] if connects else None,
        "published": len(published), "received": len(latencies),
        "latency_median_s": statistics.median(latencies) if latencies else None,
        "latency_p90_s": latencies[int(0.9 * (len(latencies) - 1))] if latencies else None,
        "latency_max_s": latencies[-1] if latencies else None,
        "samples_s": produced[0] / max(1e-9, end - connected_at) if produced else None,
    }
    if wan is not None:
        result["link"] = {**(link or {}), "segments": wan.stats.segments,
                          "lost_segments": wan.stats.lost, "tcp_connections": tcp_connections,
                          "bytes": wan.stats.bytes}
    return result


def _wait_for(path: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise SystemExit(f"{path} did not show {text!r} within {timeout} s:\n"
                     f"{path.read_text(errors='replace')[-2000:]}")


def run(s: Settings) -> list[Row]:
    link = {"rtt_ms": s.rtt_ms, "loss": s.loss, "bandwidth_mbit": s.bandwidth_mbit}
    label = f"{s.rtt_ms:g} ms, {s.loss:.0%} loss, {s.bandwidth_mbit:g} Mbit/s"
    results = []
    with tempfile.TemporaryDirectory(prefix="netrl-wan-") as tmp:
        if s.direct_minutes:
            results.append(measure("direct", s.direct_minutes, Path(tmp) / "direct", None))
            _report(results[-1])
        results.append(measure(label, s.minutes, Path(tmp) / "wan", link))
        _report(results[-1])
    rows = []
    for r in results:
        over_link = "link" in r
        connections = r["link"]["tcp_connections"] if over_link else None
        median = r["latency_median_s"]
        met = (median is not None and median <= 2.0 and connections == 1) if over_link else None
        rows.append(Row("wan", f"{r['run']}, {r['minutes']:g} minutes", "version latency, median",
                        median, "s", target="<= 2 s, 1 TCP connection" if over_link else "",
                        met=met, params={**link, "minutes": r["minutes"], "direct": not over_link},
                        detail=r))
    return rows


def _report(r: dict[str, Any]) -> None:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    tcp = r["link"]["tcp_connections"] if "link" in r else "-"
    print(f"{r['run']}, {r['minutes']:g} min: reconnects {r['worker_reconnects']} (worker) / "
          f"{r['server_lost_worker']} (server), TCP connections {tcp}, first connection "
          f"{num(r['connect_s'], '.2f')} s, version latency median / p90 / max "
          f"{num(r['latency_median_s'], '.2f')} / {num(r['latency_p90_s'], '.2f')} / "
          f"{num(r['latency_max_s'], '.2f')} s, versions {r['received']} / {r['published']}, "
          f"{num(r['samples_s'], ',.0f')} samples/s", flush=True)
