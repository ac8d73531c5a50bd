"""The demo: one command starts all three roles; Ctrl+C stops them all cleanly within a few seconds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.conftest import small_config


def test_demo_runs_all_three_roles_and_ctrl_c_stops_them(tmp_path: Path) -> None:
    config = small_config(tmp_path, trainer={"epochs": 1000})
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        demo = subprocess.Popen([sys.executable, "-m", "netrl", "--demo", "--config", str(config)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "round 0" not in log.read_text() and time.monotonic() < deadline:
            assert demo.poll() is None, log.read_text()
            time.sleep(0.2)
        text = log.read_text()
        children = psutil.Process(demo.pid).children()
        assert "round 0" in text and len(children) == 3, text[-2000:]
        t0 = time.monotonic()
        demo.send_signal(signal.SIGINT)  # what Ctrl+C in the terminal does
        assert demo.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 6
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    text = log.read_text()
    assert "exit codes worker/trainer/server: [0, 0, 0]" in text
    assert "lost the server" not in text, text[-2000:]  # the worker stops before the server says goodbye
    _, alive = psutil.wait_procs(children, timeout=0)
    assert not alive, f"demo children still running: {alive}"
