"""Fixtures: process tracking that fails a test which leaves one behind, and logging restored after each test."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netrl.launch import spawn_role, stop_processes

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
