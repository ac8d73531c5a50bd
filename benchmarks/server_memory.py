"""The server's resident memory with workers connected: the relay is the one machine on the open
Internet, often a small rented VM, so what it costs matters.

Starts ``python -m netrl --server`` (CURVE on, as by default) from the netrl source tree given by
``--tree`` (this checkout by default; pass an older checkout to compare), then connects
``--workers`` workers from this process. Each is the real client link (HELLO, heartbeats,
reconnects) sending a Pendulum-sized sample packet (20 rows) every ``--period`` seconds, as a
worker stepping at 40 Hz does; with no trainer connected, the server spools them. The server's
resident set size (RSS) and unique set size (USS, the memory only it holds) are read with psutil
when it is listening and after ``--seconds`` with every worker connected, and its memory maps
tell whether torch was loaded (target: never).

    python -m benchmarks server-memory                         # this checkout
    git worktree add /tmp/before <commit>
    python -m benchmarks server-memory --tree /tmp/before      # served by an older one
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import zmq

from benchmarks.common import ROOT
from benchmarks.results import Row
from benchmarks.settings import positive
from netrl.config import Config, load_config
from netrl.config.load import config_to_dict
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.net.keys import client_keys, keygen
from netrl.net.transport import ClientLink, new_session
from netrl.protocol.wire import encode, samples_message
from netrl.samples import Buffer

ROWS = 20  # a Pendulum worker's packet: min_samples_per_worker_packet


@dataclasses.dataclass(frozen=True)
class Settings:
    tree: Path = ROOT  # the netrl source tree the server runs from
    workers: int = 10
    seconds: float = 20.0  # how long the workers send before the reading
    period: float = 0.5  # seconds between a worker's packets

    def __post_init__(self) -> None:
        if not (self.tree / "netrl" / "__main__.py").exists():
            raise ValueError(f"--tree: {self.tree} holds no netrl source tree "
                             "(no netrl/__main__.py)")
        positive("--workers", self.workers, 1, strict=False)
        positive("--seconds", self.seconds)
        positive("--period", self.period)


SMOKE = Settings(workers=2, seconds=2.0)


def add_options(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--tree", type=Path,
                   help="netrl source tree the server runs from (default: this checkout)")
    p.add_argument("--workers", type=int, help=f"workers connected (default {d.workers})")
    p.add_argument("--seconds", type=float,
                   help=f"how long the workers send before the reading ({d.seconds:g})")
    p.add_argument("--period", type=float,
                   help=f"seconds between a worker's packets ({d.period:g})")


def pendulum_packet(rows: int = ROWS) -> Buffer:
    rng = np.random.default_rng(0)
    return Buffer(act=rng.uniform(-2, 2, (rows, 1)).astype(np.float32),
                  obs=rng.uniform(-1, 1, (rows, 3)).astype(np.float32),
                  rew=rng.uniform(-16, 0, rows).astype(np.float32), terminated=np.zeros(rows, bool),
                  truncated=np.zeros(rows, bool), reset=np.eye(1, rows, dtype=bool)[0],
                  context=np.zeros(rows, bool), policy_version=np.full(rows, -1, np.int64),
                  worker="")


def memory_of(pid: int) -> dict[str, Any]:
    proc = psutil.Process(pid)
    info = proc.memory_full_info()
    maps = Path(f"/proc/{pid}/maps").read_text() if Path(f"/proc/{pid}/maps").exists() else ""
    return {"rss_mib": info.rss / 2**20, "uss_mib": info.uss / 2**20,
            "torch_loaded": "/torch/" in maps, "threads": proc.num_threads()}


def wait_for_log(log: Path, text: str, proc: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not log {text!r}:\n"
                             f"{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.05)


def measure(tree: Path, workers: int, seconds: float, period: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="netrl-server-memory-"))
    names = [f"robot-{i}" for i in range(workers)]
    data = config_to_dict(Config())
    data.update(keys_dir=str(work / "keys"), weights_folder=str(work / "weights"))
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    data["server"]["status_port"] = free_port()
    config = write_config(data, work / "config.json")
    keygen(str(work / "keys"), names)
    log = work / "server.log"
    # The server runs the tree under test, the workers this checkout. PYTHONSAFEPATH: `python -m`
    # would otherwise put the current folder first on the path, and a server started from one
    # checkout would run that one.
    env = {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
    served_from = subprocess.run([sys.executable, "-c", "import netrl; print(netrl.__file__)"],
                                 env={**os.environ, **env}, capture_output=True, text=True,
                                 check=True).stdout.strip()
    if not Path(served_from).is_relative_to(tree):
        raise SystemExit(f"the server would import netrl from {served_from}, not from {tree}")
    with log.open("wb") as out:
        server = spawn_role("server", config, stdout=out, env=env)
    ctx = zmq.Context()
    links: list[ClientLink] = []
    try:
        wait_for_log(log, "server listening", server)
        time.sleep(1.0)  # let start-up allocations settle
        idle = memory_of(server.pid)
        net = load_config(config).network
        for name in names:
            link = ClientLink(ctx, net, "worker", name, new_session(), net.worker_port,
                              keys=client_keys(str(work / "keys"), "worker", name))
            link.open()
            links.append(link)
        buf, seq, sent = pendulum_packet(), 0, 0
        deadline, next_send = time.monotonic() + seconds, 0.0
        while time.monotonic() < deadline:
            now = time.monotonic()
            if now >= next_send:
                seq += 1
                for link in links:
                    message = samples_message(buf, link.name, link.session, seq, seq * (ROWS - 1))
                    frames = encode(message)
                    sent += link.send(frames)
                next_send = now + period
            for link in links:
                link.receive()
                link.maintain()
            time.sleep(0.005)
        connected = sum(link.ready for link in links)
        busy = memory_of(server.pid)
        return {"tree": str(tree), "workers": workers, "connected": connected, "packets_sent": sent,
                "idle": idle, "with_workers": busy}
    finally:
        for link in links:
            link.close()
        ctx.destroy(0)
        stop_processes([server])
        shutil.rmtree(work, ignore_errors=True)


def run(s: Settings) -> list[Row]:
    result = measure(s.tree.resolve(), s.workers, s.seconds, s.period)
    idle, busy = result["idle"], result["with_workers"]
    print(f"server from {result['tree']}: {result['connected']}/{result['workers']} workers "
          f"connected, {result['packets_sent']} packets sent", flush=True)
    if result["connected"] != result["workers"]:
        raise SystemExit(f"only {result['connected']} of {result['workers']} workers were "
                         "connected at the reading")
    params = {**dataclasses.asdict(s), "tree": str(result["tree"])}
    rows = []
    for state, m in (("listening, no peers", idle), (f"{s.workers} workers connected", busy)):
        for figure, key in (("resident set size (RSS)", "rss_mib"), ("unique set size (USS)",
                                                                     "uss_mib")):
            rows.append(Row("server-memory", state, figure, m[key], "MiB",
                            target="torch never loaded", met=not m["torch_loaded"], params=params,
                            detail={**m, "packets_sent": result["packets_sent"]}))
    return rows
