"""Fixtures: servers in a thread of the test (``server``, ``make_server``), process tracking that fails a test
which leaves one behind, and logging restored after each test."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from netrl.launch import free_port, spawn_role, stop_processes
from netrl.server.server import Server
from tests.fakes import NET, MakeServer, running_server

os.environ["WANDB_MODE"] = "disabled"  # before anything could import wandb


ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _in_a_folder_of_its_own(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test runs in an empty folder of its own: the roles' default files (``weights/run/``, the server's spool)
    land there, not in the repository, and never reach the next test (a worker loads the policy it finds). Processes
    a test starts import this checkout's netrl, as they did from the repository's root."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A test that runs the CLI in-process gets its logging setup (a handler on that test's captured stdout); later
    tests must not log into that closed stream ("--- Logging error ---" in the suite's output)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "server(**settings): Server settings for the server fixture, over its defaults")


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[MakeServer]:
    """``make_server(**settings)`` starts a Server in a thread of this process and returns it with a zmq context for
    fake peers. The server gets free ports and a spool folder under tmp_path (spool, then spool-2, ...) unless the
    settings name them, and Server's defaults for everything else. Each one is stopped after the test."""
    started: list[tuple[Server, zmq.Context]] = []
    with contextlib.ExitStack() as servers:

        def make(**settings: Any) -> tuple[Server, zmq.Context]:
            n = len(started) + 1
            settings.setdefault("spool_dir", tmp_path / ("spool" if n == 1 else f"spool-{n}"))
            started.append(servers.enter_context(running_server(**settings)))
            return started[-1]

        yield make


@pytest.fixture
def server(request: pytest.FixtureRequest, make_server: MakeServer) -> tuple[Server, zmq.Context]:
    """A server set up for fake peers: fast heartbeats (NET: a silent peer is lost after 1 s), bundles from 5 samples,
    10 ms packet delay, and a status port. A test, or a module with ``pytestmark``, changes any setting with
    ``@pytest.mark.server(**settings)``; a test that needs two servers, or keys of its own, calls make_server."""
    marker = request.node.get_closest_marker("server")
    return make_server(**{"min_samples_per_server_packet": 5, "network": NET, "max_packet_delay_s": 0.01,
                          "status_port": free_port(), **(marker.kwargs if marker else {})})


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
