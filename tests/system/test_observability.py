"""A running system seen from outside: status lines, python -m netrl --status (table and JSON) and --plot."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from netrl.launch import free_port
from tests.conftest import Procs
from tests.fakes import FAST_TRAINER, small_config, wait_until
from tests.reliability import delivered


def netrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netrl", *args], capture_output=True, text=True, timeout=60)


def test_status_plot_and_status_lines_of_a_running_system(tmp_path: Path, procs: Procs) -> None:
    config = small_config(tmp_path, trainer=FAST_TRAINER, status_interval_s=0.5,
                          server={"status_port": free_port()})
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    trainer = procs.spawn("trainer", config)
    worker = procs.spawn("worker", config, "--worker-id", "robot-7")
    run_dir = tmp_path / "weights" / "test"
    wait_until(lambda: sum(delivered(run_dir).values()) >= 600, 60, "samples at the trainer")
    procs.wait_for(server, r"status \| 1 worker \[robot-7:v\d+\] \| trainer connected \| in \d+/s")
    procs.wait_for(worker, r"status \| worker robot-7 \| \d+ steps/s \| weights v\d+ \| server connected")

    table = netrl("--status", "--config", str(config))
    assert table.returncode == 0, table.stderr
    assert "robot-7" in table.stdout and "samples in" in table.stdout and "spool 0 samples" in table.stdout
    assert re.search(r"trainer 'trainer' at 127\.0\.0\.1", table.stdout)
    snapshot = json.loads(netrl("--status", "--json", "--config", str(config)).stdout)
    (robot,) = snapshot["workers"]
    assert robot["name"] == "robot-7" and robot["address"] == "127.0.0.1" and robot["key"] == "worker"
    assert robot["version"] >= 1 and robot["samples"] > 0 and robot["last_seen"] > 0
    assert snapshot["rates"]["samples_in"] > 0 and snapshot["spool"]["samples"] == 0
    assert snapshot["rejected"] == 0 and snapshot["dropped"] == 0 and snapshot["progress"]["trained_steps"] > 0
    # every counter is there from the start, at 0 until it counts (scripts read them), and the ports say which server
    assert snapshot["stats"]["spool_errors"] == snapshot["stats"]["window_refusals"] == 0
    ports = json.loads(config.read_text())["network"]
    assert snapshot["ports"] == {"trainer": ports["trainer_port"], "worker": ports["worker_port"]}
    assert f"(trainer port {ports['trainer_port']}, worker port {ports['worker_port']})" in table.stdout
    # another server's config that shares this status port: the snapshot is not its server's, and --status says so
    other = json.loads(config.read_text())
    other["network"].update(trainer_port=free_port(), worker_port=free_port())
    (tmp_path / "other.json").write_text(json.dumps(other))
    elsewhere = netrl("--status", "--config", str(tmp_path / "other.json"))
    assert elsewhere.returncode == 0 and "robot-7" in elsewhere.stdout
    assert (f"listens on trainer port {ports['trainer_port']} and worker port {ports['worker_port']}, not the "
            f"{other['network']['trainer_port']} and {other['network']['worker_port']} of") in elsewhere.stderr
    assert "listens on" not in table.stderr

    for p in (worker, trainer, server):
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == 0
    assert "no netrl server answered" in netrl("--status", "--config", str(config)).stderr
    plotted = netrl("--plot", "test", "--config", str(config))
    assert plotted.returncode == 0, plotted.stderr
    png = run_dir / "learning.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
    assert netrl("--plot", "no-such-run", "--config", str(config)).returncode == 1
