"""Shared fixtures: free ports, small configs, and process tracking that fails a test which leaves one behind."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from netrl.config.sections import Config
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.net.keys import keygen
from netrl.server.server import Server

os.environ["WANDB_MODE"] = "disabled"  # before anything could import wandb


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A test that runs the CLI in-process gets its logging setup (a handler on that test's captured stdout); later
    tests must not log into that closed stream ("--- Logging error ---" in the suite's output)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def small_config(tmp_path: Path, **sections: Any) -> Path:
    """A config for fast tests: free ports, short training, wandb disabled, outputs under tmp_path."""
    keygen(tmp_path / "keys")  # tests run with the secure default: CURVE
    base: dict[str, Any] = {
        "run_name": "test", "weights_folder": str(tmp_path / "weights"), "seed": 1, "keys_dir": str(tmp_path / "keys"),
        "network": {"trainer_port": free_port(), "worker_port": free_port(), "heartbeat_interval_s": 0.2,
                    "heartbeat_liveness": 5, "reconnect_initial_s": 0.1, "reconnect_max_s": 1.0},
        "server": {"min_samples_per_server_packet": 20, "max_packet_delay_s": 0.02, "status_port": free_port()},
        "worker": {"min_samples_per_worker_packet": 10, "test_episode_interval": 0},
        "trainer": {"epochs": 1, "rounds": 2, "steps": 60, "update_model_interval": 20,
                    "update_buffer_interval": 10, "start_training": 100, "worker_lead": 50},
        "memory": {"memory_size": 10_000, "batch_size": 32},
        "agent": {"hidden_sizes": [32, 32]},
        "wandb": {"mode": "disabled"},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values) if isinstance(values, dict) else base.__setitem__(name, values)
    return write_config(Config(), tmp_path / "config.json", **base)


@contextlib.contextmanager
def running_server(**kwargs: Any) -> Iterator[tuple[Server, zmq.Context]]:
    """A Server on free ports (unless given) in a thread of this process, plus a context for fake peers; both closed
    after."""
    srv = Server(**{"trainer_port": free_port(), "worker_port": free_port(), **kwargs})
    srv.open()  # bound before this returns: a test that starts two servers knows which one got a port first
    stop = threading.Event()
    thread = threading.Thread(target=srv.run, args=(stop,), daemon=True)
    thread.start()
    ctx = zmq.Context()
    try:
        yield srv, ctx
    finally:
        stop.set()
        thread.join(5)
        ctx.destroy(0)
        assert not thread.is_alive(), "server did not stop within 5 s"


class Procs:
    """Spawns roles and guarantees none survives the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}

    def spawn(self, role: str, config: Path, *extra: str, log_level: str = "INFO") -> subprocess.Popen[bytes]:
        path = self.tmp_path / f"{role}-{len(self.procs)}.log"
        f = path.open("wb")
        p = spawn_role(role, config, *extra, log_level=log_level, stdout=f)
        self.procs.append(p)
        self.logs[p.pid] = path
        return p

    def log(self, p: subprocess.Popen[bytes]) -> str:
        return self.logs[p.pid].read_text(errors="replace")

    def wait_for(self, p: subprocess.Popen[bytes], pattern: str, timeout: float = 30.0) -> str:
        """Wait until the process's log matches the regular expression ``pattern``; returns the log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.log(p)
            if re.search(pattern, out):
                return out
            if p.poll() is not None:
                raise AssertionError(f"pid {p.pid} exited ({p.returncode}) before logging {pattern!r}:\n{out[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"pid {p.pid} did not log {pattern!r} within {timeout} s:\n{self.log(p)[-3000:]}")


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Procs]:
    tracker = Procs(tmp_path)
    yield tracker
    alive = [p for p in tracker.procs if p.poll() is None]
    stop_processes(alive, timeout=5)
    call = getattr(request.node, "rep_call", None)
    if alive and call is not None and call.passed:  # a failed test stopped early: its failure is the report
        pytest.fail(f"test left {len(alive)} netrl process(es) running: {[p.args for p in alive]}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the test item, so fixtures can tell whether the test itself passed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
