"""One server with hundreds to a thousand workers: its CPU, memory, heartbeats and weight fan-out.

A real server (``python -m netrl --server``, CURVE on) between a trainer stub and the load
generator (benchmarks/loadgen.py: every simulated worker a real client link with its own key,
HELLO, heartbeats, ``--rows`` Pendulum rows every ``--period`` seconds: 20 Hz at the defaults of
10 rows and 0.5 s, the worker's default packet delay). The trainer stub is netrl's real trainer
link (``TrainerLink``: it checks, de-duplicates and acknowledges every bundle) with no training:
it takes the samples and publishes a 1M-parameter MLP actor every ``--publish`` seconds in the
``int8`` format (the cheapest on the wire), as a trainer does. Per worker count, over ``--seconds``
after every worker connected:

- relay CPU share: the server process's CPU time over the wall time (1.0 = one core);
- the server's resident memory (RSS) at the end, and the load generator's own CPU share, which
  competes with the server on this machine;
- heartbeat misses: peers the server declared lost (its ``peers_lost`` counter) and the
  generator's reconnects;
- weight fan-out: for each version, from the publish to the last worker having it (max over
  workers); version latency p50/p99 over every (worker, version);
- packets sent, acknowledged to the workers, and taken by the trainer (nothing lost);
- the ``--status`` snapshot's round trip with every worker connected.

Targets (issue 47): 1,024 workers at 20 Hz with no heartbeat miss, RSS under 1 GiB, version
latency p99 under 1 s on loopback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from benchmarks.common import child, json_lines
from benchmarks.loadgen import LoadGenerator
from benchmarks.results import Row
from benchmarks.settings import ints, positive
from netrl.config import load_config
from netrl.config.load import config_to_dict
from netrl.config.sections import Config
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.monitor.status import query_status
from netrl.net.keys import keygen

DRAIN_S = 30.0  # longest wait, once the workers stop sending, for every packet's ACK
HIDDEN_1M = 997  # MLP actor 3 -> 997 -> 997 -> 1 (x2 for mean and log-std heads): about 1M params


@dataclasses.dataclass(frozen=True)
class Settings:
    workers: tuple[int, ...] = (64, 256, 1024)
    seconds: float = 30.0  # measured, after every worker connected
    rows: int = 10  # rows per packet
    period: float = 0.5  # seconds between a worker's packets (rows / period = its env rate)
    publish: float = 3.0  # seconds between weight versions
    restart: bool = False  # then restart the server and time every worker's return

    def __post_init__(self) -> None:
        positive("--workers", min(self.workers, default=0), 1, strict=False)
        positive("--seconds", self.seconds)
        positive("--rows", self.rows, 1, strict=False)
        positive("--period", self.period)
        positive("--publish", self.publish)


QUICK = Settings(workers=(64, 256), seconds=12.0)
SMOKE = Settings(workers=(8,), seconds=4.0, publish=1.5)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--workers", type=ints, help="simulated worker counts (default 64,256,1024)")
    p.add_argument("--seconds", type=float, help=f"measured seconds per count ({d.seconds:g})")
    p.add_argument("--rows", type=int, help=f"rows per packet ({d.rows})")
    p.add_argument("--period", type=float, help=f"seconds between a worker's packets ({d.period:g})")
    p.add_argument("--publish", type=float, help=f"seconds between weight versions ({d.publish:g})")
    p.add_argument("--restart", action="store_true", default=None,
                   help="then restart the server and time every worker's return")


def child_trainer(cfg_path: str, hidden: str, publish_s: str) -> None:
    """The trainer stub: a real TrainerLink taking every bundle, publishing an actor in int8 every
    ``publish_s`` seconds once the parent says go; one JSON line per version and per second."""
    import sys

    import gymnasium
    import torch

    from netrl.agents.sac import MLPActor
    from netrl.net.keys import client_keys
    from netrl.net.transport import new_session
    from netrl.trainer.delivery import Deliveries
    from netrl.trainer.link import TrainerLink

    torch.set_num_threads(1)
    cfg = load_config(cfg_path)
    keys = client_keys(cfg.keys_dir, "trainer", "trainer")
    link = TrainerLink(cfg.network, "trainer", new_session(), cfg.network.trainer_port, 8,
                       Deliveries(), None, None, keys, weight_format="int8")
    link.start()
    box = gymnasium.spaces.Box
    actor = MLPActor(box(-1, 1, (3,), np.float32), box(-2, 2, (1,), np.float32),
                     hidden_sizes=(int(hidden), int(hidden)))
    params = sum(p.numel() for p in actor.parameters())
    print(json.dumps({"ready": True, "params": params}), flush=True)
    packets = rows = version = 0
    started = next_report = 0.0
    try:
        while True:
            for buf in link.fetch():
                packets += 1
                rows += len(buf)
            link.wait(0.05)
            now = time.monotonic()
            if not started and sys.stdin in _readable():
                sys.stdin.readline()  # the parent says go once every worker is connected
                started = now
            if started and now >= started + version * float(publish_s):
                version += 1
                with torch.no_grad():
                    next(actor.parameters()).add_(0.001)  # a new version really differs
                t0 = time.time()
                link.publish(actor, version, 0)
                print(json.dumps({"v": version, "t0": t0}), flush=True)
            if now >= next_report:
                print(json.dumps({"packets": packets, "rows": rows}), flush=True)
                next_report = now + 0.5
    finally:
        link.halt(2.0)


def _readable() -> list[Any]:
    import select
    import sys

    return select.select([sys.stdin], [], [], 0)[0]


def _config(work: Path, workers: int) -> Path:
    data = config_to_dict(Config())
    data.update(keys_dir=str(work / "keys"), weights_folder=str(work / "weights"))
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    # room for every simulated worker (the default admits 1,000)
    data["server"].update(status_port=free_port(), max_workers=max(workers, 1000))
    return write_config(data, work / "config.json")


def measure(workers: int, s: Settings) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="netrl-server-scale-"))
    names = [f"sim-{i}" for i in range(workers)]
    cfg_path = _config(work, workers)
    t = time.monotonic()
    keygen(str(work / "keys"), names)
    print(f"  {workers} keys made in {time.monotonic() - t:.1f} s", flush=True)
    cfg = load_config(cfg_path)
    log = work / "server.log"
    with log.open("wb") as out:
        server = spawn_role("server", cfg_path, stdout=out)
    trainer = child(child_trainer, str(cfg_path), str(HIDDEN_1M), str(s.publish), stdin=True)
    lines: list[dict[str, Any]] = []
    json_lines(trainer, lines)
    gen = LoadGenerator(cfg.network, cfg.keys_dir, names, s.rows, s.period)
    try:
        t = time.monotonic()
        while not any(line.get("ready") for line in lines):
            if trainer.poll() is not None or time.monotonic() - t > 120:
                raise SystemExit("the trainer stub did not start")
            time.sleep(0.1)
        gen.open()
        t = time.monotonic()
        while gen.totals()["connected"] < workers:
            gen.step(0.01)
            if time.monotonic() - t > 60 + workers * 0.2:
                raise SystemExit(f"only {gen.totals()['connected']} of {workers} workers "
                                 f"connected:\n{log.read_text(errors='replace')[-3000:]}")
        connect_s = time.monotonic() - t
        print(f"  {workers} workers connected in {connect_s:.1f} s", flush=True)
        before, proc = gen.totals(), psutil.Process(server.pid)
        cpu0, wall0 = sum(proc.cpu_times()[:2]), time.monotonic()
        assert trainer.stdin is not None
        trainer.stdin.write("go\n")
        trainer.stdin.flush()
        while time.monotonic() - wall0 < s.seconds:
            gen.step(0.01)
        wall, cpu = time.monotonic() - wall0, sum(proc.cpu_times()[:2]) - cpu0
        window_end = time.time()  # versions published later (drain, restart) are not counted
        after = gen.totals()
        rss = proc.memory_info().rss
        t = time.monotonic()
        status = query_status(cfg.server.status_port, timeout_s=10)
        status_s = time.monotonic() - t
        gen.sending = False
        # the packets in flight reach the trainer and their ACKs come back (or DRAIN_S passes)
        drain = time.monotonic() + DRAIN_S
        while time.monotonic() < drain and gen.totals()["acked"] < gen.totals()["sent"]:
            gen.step(0.01)
        drain_s = DRAIN_S - max(0.0, drain - time.monotonic())
        gen.step(0.6)  # the trainer's next count (it prints one every 0.5 s)
        final = gen.totals()
        restart = _restart(server, cfg_path, work, gen, workers) if s.restart else {}
        server = restart.pop("server", server)
    finally:
        gen.close()
        stop_processes([trainer], timeout=10, then=[server])
    published = {line["v"]: line["t0"] for line in lines
                 if "t0" in line and line["t0"] <= window_end}
    taken = max((line for line in lines if "packets" in line), key=lambda line: line["packets"],
                default={"packets": 0, "rows": 0})
    latencies, fanout = [], []
    for version, t0 in published.items():
        got = [w.weights[version] - t0 for w in gen.workers if version in w.weights]
        latencies += got
        if len(got) == workers:
            fanout.append(max(got))
    result = {
        "workers": workers, "connect_s": connect_s, "wall_s": wall, "server_cpu_share": cpu / wall,
        "server_rss_mib": rss / 2**20,
        "gen_cpu_share": (after["cpu_s"] - before["cpu_s"]) / wall,
        "peers_lost": status.get("stats", {}).get("peers_lost"),
        "reconnects": final["reconnects"], "versions": len(published),
        "versions_everywhere": len(fanout),
        "fanout_ms": 1000 * float(np.median(fanout)) if fanout else None,
        "fanout_max_ms": 1000 * max(fanout) if fanout else None,
        "latency_p50_ms": 1000 * float(np.percentile(latencies, 50)) if latencies else None,
        "latency_p99_ms": 1000 * float(np.percentile(latencies, 99)) if latencies else None,
        "packets_sent": final["sent"], "packets_refused": final["refused"],
        "packets_acked": final["acked"], "packets_to_trainer": taken["packets"],
        "packets_nacked": final["nacked"], "packets_rejected": final["rejected"],
        "status_ms": 1000 * status_s, "drain_s": drain_s, **restart,
    }
    shutil.rmtree(work, ignore_errors=True)
    return result


def _restart(server: Any, cfg_path: Path, work: Path, gen: LoadGenerator,
             workers: int) -> dict[str, Any]:
    """Stop the server (its BYE tells every worker), start it again, and time every worker's
    return: the reconnection storm, CURVE handshakes included."""
    stop_processes([server], timeout=10)
    down = time.monotonic()
    log = work / "server-restarted.log"
    with log.open("wb") as out:
        server = spawn_role("server", cfg_path, stdout=out)
    while "server listening" not in log.read_text(errors="replace"):
        gen.step(0.01)  # the workers go on trying, as they would
        if server.poll() is not None or time.monotonic() - down > 60:
            raise SystemExit(f"the server did not restart:\n{log.read_text()[-3000:]}")
    up, proc = time.monotonic(), psutil.Process(server.pid)
    cpu0 = sum(proc.cpu_times()[:2])
    while gen.totals()["connected"] < workers and time.monotonic() - up < 120:
        gen.step(0.01)
    back = time.monotonic()
    print(f"  restart: {gen.totals()['connected']} of {workers} workers back "
          f"{back - up:.1f} s after the new server listened ({up - down:.1f} s down)", flush=True)
    return {"server": server, "restart_down_s": up - down, "restart_back_s": back - up,
            "restart_back": gen.totals()["connected"],
            "restart_server_cpu_share": (sum(proc.cpu_times()[:2]) - cpu0) / max(back - up, 1e-3)}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def run(s: Settings) -> list[Row]:
    rows: list[Row] = []
    for workers in s.workers:
        r = measure(workers, s)
        print(f"server_scale {workers:>5} workers | server CPU {100 * r['server_cpu_share']:.0f}% "
              f"RSS {r['server_rss_mib']:.0f} MiB | generator CPU "
              f"{100 * r['gen_cpu_share']:.0f}% | lost {r['peers_lost']} reconnects "
              f"{r['reconnects']} | fan-out {_ms(r['fanout_ms'])} (max "
              f"{_ms(r['fanout_max_ms'])}, {r['versions_everywhere']}/{r['versions']} versions "
              f"everywhere) | latency p50 {_ms(r['latency_p50_ms'])} p99 "
              f"{_ms(r['latency_p99_ms'])} | packets sent {r['packets_sent']} acked "
              f"{r['packets_acked']} to trainer {r['packets_to_trainer']}, refused for now "
              f"{r['packets_nacked']}, for good {r['packets_rejected']} (drained in "
              f"{r['drain_s']:.1f} s) | status {r['status_ms']:.0f} ms", flush=True)
        params = {**dataclasses.asdict(s), "workers": workers, "format": "int8",
                  "hz": s.rows / s.period}
        name = f"{workers} workers at {s.rows / s.period:g} Hz"
        lost = (r["peers_lost"] or 0) + r["reconnects"]
        p99 = r["latency_p99_ms"]
        rows += [
            Row("server_scale", name, "relay CPU share (server CPU / wall)", r["server_cpu_share"],
                "share", params=params, detail=r),
            Row("server_scale", name, "server resident memory", r["server_rss_mib"], "MiB",
                target="< 1 GiB", met=r["server_rss_mib"] < 1024, params=params),
            Row("server_scale", name, "heartbeat misses (peers lost + reconnects)", lost, "",
                target="0", met=lost == 0, params=params),
            Row("server_scale", name, "weight fan-out to every worker, median", r["fanout_ms"],
                "ms", params=params),
            Row("server_scale", name, "version latency p99 over workers", p99, "ms",
                target="< 1 s", met=p99 is not None and p99 < 1000, params=params),
            Row("server_scale", name, "packets to the trainer / sent", r["packets_to_trainer"],
                "packets", baseline=r["packets_sent"], baseline_name="sent",
                ratio=r["packets_to_trainer"] / max(1, r["packets_sent"]), ratio_label="%",
                target="nothing lost", met=r["packets_to_trainer"] >= r["packets_sent"],
                params=params),
        ]
    return rows
