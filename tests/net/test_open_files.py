"""The server's limit on open files: raised at start so that server.max_workers connections fit,
or named in a warning when the hard limit forbids it."""

from __future__ import annotations

import logging
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from netrl.launch import free_port
from netrl.net.sockets import FD_MARGIN, open_files_for
from netrl.server import Server


@pytest.fixture
def low_soft_limit() -> Iterator[int]:
    """The soft limit lowered to what many systems start processes with, restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 1024 if hard == resource.RLIM_INFINITY else min(1024, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        yield low
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_soft_limit_is_raised_for_the_connections(low_soft_limit: int) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2000 + FD_MARGIN:
        pytest.skip(f"the hard limit ({hard}) leaves no room to raise")
    soft, problem = open_files_for(2000)
    assert problem is None
    assert soft == 2000 + FD_MARGIN == resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def test_a_server_for_a_thousand_workers_raises_the_limit_it_starts_with(
        tmp_path: Path, low_soft_limit: int) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1025 + FD_MARGIN:
        pytest.skip(f"the hard limit ({hard}) leaves no room to raise")
    srv = Server(trainer_port=free_port(), worker_port=free_port(), spool_dir=tmp_path / "spool",
                 max_workers=1024)
    try:
        srv.open()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 1025 + FD_MARGIN > low_soft_limit
    finally:
        srv.close()


def test_a_hard_limit_too_low_is_named_with_what_to_do() -> None:
    # a process of its own: an unprivileged process cannot raise its hard limit again
    code = ("import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300)); "
            "from netrl.net.sockets import open_files_for; "
            "soft, problem = open_files_for(1000); print(soft); print(problem)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == "300"
    assert "RLIMIT_NOFILE" in out[1] and "300" in out[1] and "server.max_workers" in out[1]
    assert f"ulimit -n {1000 + FD_MARGIN}" in out[1]


def test_a_server_warns_when_its_workers_cannot_fit(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard > 10**7:
        pytest.skip("no hard limit a server could reach")
    srv = Server(trainer_port=free_port(), worker_port=free_port(), spool_dir=tmp_path / "spool",
                 max_workers=int(hard))
    try:
        with caplog.at_level(logging.WARNING, logger="netrl.server.server"):
            srv.open()
        assert any("RLIMIT_NOFILE" in r.getMessage() for r in caplog.records)
    finally:
        srv.close()
