"""A worker over a long lossy link: the real roles as processes (server, trainer, one worker; Pendulum-v1 and every
setting at its default, CURVE on), the worker connected to the server's worker port through an emulated link
(scripts/benchmarks/wan_link.py: a userspace TCP forwarder that delays, loses as TCP experiences loss, and limits
bandwidth; its docstring gives the model), side by side with the same run over a direct link.

Reports, per run:
  reconnects          times the worker lost the server (and the server the worker) once connected
  TCP connections     connections the worker opened through the emulated link (1: it never had to try again)
  connect             the worker's first connection: HELLO to WELCOME, retries included (its log line says)
  version latency     for each weight version the worker got: the trainer's publish to the worker having it loaded
                      and ready for its next step (median, p90, max; both from the roles' logs, on one machine's clock)
  versions            versions the worker got of those the trainer published (a slow link skips some: the newest wins)
  samples/s           env steps the worker produced per second (throttled to the trainer's pace, as by default)

Usage: .venv/bin/python scripts/bench_wan.py [--rtt-ms 200] [--loss 0.05] [--bandwidth-mbit 10] [--minutes 10]
                                             [--quick] [--json bench_wan.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("WANDB_MODE", "disabled")

from benchmarks.wan_link import WanLink

from netrl.config.sections import Config
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.net.keys import keygen

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


def run(label: str, minutes: float, folder: Path, link: dict[str, float] | None) -> dict[str, Any]:
    """One run of ``minutes``: the worker direct, or through a WanLink with ``link``'s settings."""
    folder.mkdir(parents=True)
    keygen(folder / "keys")
    worker_port = free_port()
    settings: dict[str, Any] = {
        "run_name": "wan", "weights_folder": str(folder / "weights"), "keys_dir": str(folder / "keys"),
        "network": {"trainer_port": free_port(), "worker_port": worker_port},
        "server": {"status_port": free_port()}, "trainer": {"epochs": 100_000}, "wandb": {"mode": "disabled"}}
    config = write_config(Config(), folder / "config.json", **settings)
    day = datetime.now().strftime("%Y-%m-%d")
    with contextlib.ExitStack() as stack:
        worker_config = config
        wan = None
        if link is not None:
            wan = stack.enter_context(WanLink(worker_port, link["rtt_ms"], link["loss"], link["bandwidth_mbit"]))
            worker_config = write_config(Config(), folder / "worker.json",
                                         **{**settings, "network": {**settings["network"], "worker_port": wan.port}})
        logs = {role: (folder / f"{role}.log").open("wb") for role in ("server", "trainer", "worker")}
        procs = [spawn_role("server", config, stdout=logs["server"])]
        _wait_for(folder / "server.log", "server listening", 30)
        procs.append(spawn_role("trainer", config, log_level="DEBUG", stdout=logs["trainer"]))
        procs.append(spawn_role("worker", worker_config, "--worker-id", "far", log_level="DEBUG",
                                stdout=logs["worker"]))
        started = time.time()
        end = started + minutes * 60
        while time.time() < end and all(p.poll() is None for p in procs):
            time.sleep(min(5.0, max(0.0, end - time.time())))
        crashed = [p.args[3] for p in procs if p.poll() is not None]
        # before the stop, which the count is not about
        tcp_connections = wan.stats.connections if wan is not None else 0
        stop_processes([procs[2], procs[1]], timeout=20, then=[procs[0]])  # the server last
        for f in logs.values():
            f.close()
    server, trainer, worker = (Path(folder / f"{r}.log").read_text(errors="replace")
                               for r in ("server", "trainer", "worker"))
    published = {int(m.group(1)): _time(line, day) for line, m in _lines(trainer, r"published weights v(\d+)")}
    ready = {int(m.group(1)): _time(line, day) for line, m in _lines(worker, r"weights v(\d+) ready")}
    latencies = sorted(ready[v] - published[v] for v in ready if v in published)
    connects = [float(m.group(1)) for _, m in _lines(worker, r"connected to worker server .* in ([\d.]+) s")]
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
        result["link"] = {**(link or {}), "segments": wan.stats.segments, "lost_segments": wan.stats.lost,
                          "tcp_connections": tcp_connections, "bytes": wan.stats.bytes}
    return result


def _wait_for(path: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise SystemExit(f"{path} did not show {text!r} within {timeout} s:\n{path.read_text(errors='replace')[-2000:]}")


def table(results: list[dict[str, Any]]) -> list[str]:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    head = "| run | minutes | reconnects (worker / server) | TCP connections | first connection | " \
           "version latency median / p90 / max | versions got / published | samples/s |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in results:
        tcp = r["link"]["tcp_connections"] if "link" in r else "-"
        lines.append(f"| {r['run']} | {r['minutes']:g} | {r['worker_reconnects']} / {r['server_lost_worker']} | "
                     f"{tcp} | "
                     f"{num(r['connect_s'], '.2f')} s | {num(r['latency_median_s'], '.2f')} / "
                     f"{num(r['latency_p90_s'], '.2f')} / {num(r['latency_max_s'], '.2f')} s | "
                     f"{r['received']} / {r['published']} | {num(r['samples_s'], ',.0f')} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rtt-ms", type=float, default=200.0, help="round trip of the emulated link")
    parser.add_argument("--loss", type=float, default=0.05, help="segment loss probability (see wan_link.py)")
    parser.add_argument("--bandwidth-mbit", type=float, default=10.0, help="bandwidth each way, Mbit/s")
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the run over the emulated link")
    parser.add_argument("--direct-minutes", type=float, default=None,
                        help="length of the direct run beside it (default: the same, at most 2; 0: none)")
    parser.add_argument("--quick", action="store_true", help="1.5 minutes over the link and 1 direct")
    parser.add_argument("--json", default="bench_wan.json", help="where to write the results")
    args = parser.parse_args()
    minutes = 1.5 if args.quick else args.minutes
    direct = args.direct_minutes if args.direct_minutes is not None else (1.0 if args.quick else min(minutes, 2.0))
    link = {"rtt_ms": args.rtt_ms, "loss": args.loss, "bandwidth_mbit": args.bandwidth_mbit}
    results = []
    with tempfile.TemporaryDirectory(prefix="netrl-wan-") as tmp:
        if direct > 0:
            results.append(run("direct", direct, Path(tmp) / "direct", None))
        label = f"{args.rtt_ms:g} ms, {args.loss:.0%} loss, {args.bandwidth_mbit:g} Mbit/s"
        results.append(run(label, minutes, Path(tmp) / "wan", link))
    lines = table(results)
    print("\n".join(lines))
    Path(args.json).write_text(json.dumps({"results": results, "table": lines}, indent=1))
    print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
