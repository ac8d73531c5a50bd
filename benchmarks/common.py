"""The helper processes of the benchmarks: started, read and stopped the same way by every family.

A family's helper is a function named ``child_<what>`` in its module; :func:`child` runs it in a
process of its own as ``python -m benchmarks _child <module>.<function> <args>`` (run.py), from
the repository root, so that it imports the same netrl and benchmarks as its parent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import zmq

ROOT = Path(__file__).resolve().parent.parent  # the repository: where `python -m benchmarks` runs


def child(function: Callable[..., None], *args: str, stdin: bool = False,
          log: IO[Any] | None = None,
          wrap: Callable[[list[str]], list[str]] | None = None) -> subprocess.Popen[str]:
    """``function(*args)`` in a process of its own and its own process group, stdout captured (or,
    with ``log``, written there with stderr), and stdin a pipe with ``stdin``; ``wrap`` turns the
    command into another (a network namespace's: benchmarks.packet_link.PacketPath.command)."""
    target = f"{function.__module__}.{function.__name__}"
    argv = [sys.executable, "-m", "benchmarks", "_child", target, *args]
    return subprocess.Popen(wrap(argv) if wrap else argv, cwd=ROOT,
                            stdin=subprocess.PIPE if stdin else None,
                            stdout=log if log is not None else subprocess.PIPE,
                            stderr=subprocess.STDOUT if log is not None else None, text=True,
                            start_new_session=True)


def result(p: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The JSON object a child printed last."""
    out, _ = p.communicate(timeout=timeout)
    return dict(json.loads(out.strip().splitlines()[-1]))


def forward(src: zmq.Socket[Any], dst: zmq.Socket[Any]) -> None:
    """A raw baseline's stand-in for the server: every message from ``src`` to ``dst``, never copied
    in Python, until the parent stops the process."""
    try:
        while True:
            dst.send_multipart(src.recv_multipart(copy=False), copy=False)
    except KeyboardInterrupt:
        pass


def kill(procs: Iterable[subprocess.Popen[str]]) -> None:
    """Stop raw-baseline children at once: they own nothing, and a blocked send or receive may not
    see a SIGINT."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def report_loaded(worker: Any, poll_s: float) -> None:
    """A benchmark's worker child: print ``{"ready": true}``, then each weight version its receiver
    loaded with the time it recorded, one JSON line each, until stopped (SIGINT); the poll's period
    adds nothing to those times."""
    print(json.dumps({"ready": True}), flush=True)
    seen: set[int] = set()
    try:
        while True:
            for version, t in list(worker.weights.loaded_at.items()):
                if version not in seen:
                    seen.add(version)
                    print(json.dumps({"v": version, "t": t}), flush=True)
            time.sleep(poll_s)
    finally:  # stopped with SIGINT: close the network thread, or exiting waits on its sockets
        worker.close()


def json_lines(p: subprocess.Popen[str], into: list[dict[str, Any]]) -> threading.Thread:
    """Collect each JSON object a child prints (a line starting with ``{``) into ``into``, from a
    thread, as the child prints it."""
    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("{"):
                into.append(json.loads(line))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread
