"""Starting and stopping netrl roles as separate processes: the demo, the integration
tests and the benchmarks.

Children run in their own process group, so a Ctrl+C in the terminal reaches only the
launcher, which then sends each child exactly one SIGINT and waits for it to stop cleanly
(and kills it if it does not).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from netrl.config.load import config_to_dict
from netrl.config.sections import Config
from netrl.errors import ConfigError, NetrlError
from netrl.monitor.metrics import read_rows
from netrl.storage.folderlock import FolderLock

__all__ = ["LAUNCHER_ENV", "free_port", "run_demo", "spawn_role", "stop_processes", "write_config"]

log = logging.getLogger(__name__)

LAUNCHER_ENV = "NETRL_LAUNCHER_PID"  # set by spawn_role: the pid whose exit stops the role


_GIVEN: set[int] = set()  # ports free_port returned in this process


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that this process was not
    given before: a config takes several ports before anything binds them, and the kernel may hand
    out a port it just gave again."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise OSError("no free TCP port on 127.0.0.1 that this process was not given before")


def write_config(cfg: Config | dict[str, Any], path: str | Path, **sections: dict[str, Any]) -> Path:
    """Write ``cfg`` (with ``sections`` merged in, e.g.
    ``trainer={"epochs": 1}``) as a config.json."""
    data = config_to_dict(cfg) if isinstance(cfg, Config) else json.loads(json.dumps(cfg))
    for section, values in sections.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


def spawn_role(role: str, config_path: str | Path, *extra: str, log_level: str = "INFO",
               stdout: IO[Any] | int | None = None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``python -m netrl --<role>`` in its own process group (the launcher forwards
    Ctrl+C itself); it stops cleanly once this process is gone (``LAUNCHER_ENV``,
    see :func:`netrl.__main__.watch_launcher`)."""
    cmd = [sys.executable, "-m", "netrl", f"--{role}", "--config", str(config_path), "--log-level", log_level, *extra]
    return subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.STDOUT if stdout is not None else None,
                            env={**os.environ, **(env or {}), LAUNCHER_ENV: str(os.getpid())},
                            start_new_session=True)


def stop_processes(procs: Sequence[subprocess.Popen[Any]], timeout: float = 10.0,
                   then: Sequence[subprocess.Popen[Any]] = ()) -> list[int | None]:
    """SIGINT every live process once, wait up to ``timeout`` in total, then kill stragglers; then
    the same for ``then``. Returns exit codes, ``procs`` first.

    Pass a server as ``then`` and its clients as ``procs``: a client stopped together with its
    server may hear the server's goodbye first, and log that it lost the server.
    """
    try:
        return _stop(procs, timeout) + _stop(then, timeout)
    # a second Ctrl+C: no more waiting, but no process is left behind either
    except KeyboardInterrupt:
        for p in [*procs, *then]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        raise


def _stop(procs: Sequence[subprocess.Popen[Any]], timeout: float) -> list[int | None]:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("pid %d did not stop within %.0f s; killing it", p.pid, timeout)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return [p.returncode for p in procs]


def _returns(metrics: Path) -> list[float]:
    return [float(r["return_mean"]) for r in read_rows(metrics) if r.get("return_mean")]


def run_demo(cfg: Config, config_path: str, stop: threading.Event, log_level: str = "INFO") -> None:
    """Server, trainer and one worker on localhost (free ports), until the
    trainer finishes or Ctrl+C.

    ``log_level`` is the launcher's ``--log-level``, and the three roles log at it too; at
    the default INFO the worker logs warnings only, so that the trainer's round lines
    are what the demo shows."""
    from netrl.pipelines.make import make_pipeline
    from netrl.storage.checkpoint import (
        load_state,  # here: it imports torch, which the launcher's other users never need
    )

    # as the worker and the trainer will: a bad env.id is exit code 2 before anything starts
    realtime = make_pipeline(cfg).realtime
    run_dir = cfg.run_dir
    # one demo per run folder, held before the folder is moved aside or its config rewritten
    # (the other demo's --status hint would point nowhere); the lock file sits next to the
    # folder, which may be renamed
    lock = FolderLock(run_dir.parent, "weights folder",
                      f"another demo runs in {run_dir}/: stop it first (Ctrl+C), or give "
                      f"this one another --run-name", name=f".{run_dir.name}.demo-lock")
    lock.acquire()
    try:
        state = load_state(run_dir) if cfg.trainer.resume else None
        # a finished demo: watch it learn again (null epochs and total_frames: never finished)
        t = cfg.trainer
        if state is not None and t.epochs is not None and state["epoch"] >= t.epochs:
            _move_aside(run_dir, f"held a finished run ({state['epoch']} of {t.epochs} epochs)")
        elif state is not None and t.total_frames is not None and state.get("total_samples", 0) >= t.total_frames:
            _move_aside(run_dir, f"held a finished run ({state.get('total_samples')} of "
                                 f"trainer.total_frames {t.total_frames} env steps)")
        elif not cfg.trainer.resume and any((run_dir / name).exists() for name in _EARLIER_RUN):
            # the trainer refuses such a folder (it never overwrites a run), and the spool
            # would feed the old samples to the new run: resume false asks for a new
            # run, as a finished one does
            _move_aside(run_dir, "held an earlier run and trainer.resume is false")
        if cfg.security == "curve":
            from netrl.net.keys import keygen

            if keygen(cfg.keys_dir):
                log.info("demo: created CURVE keys in %s/ (first start)", cfg.keys_dir)
        _run_demo(cfg, run_dir, stop, log_level, realtime)
    finally:
        lock.release()


_EARLIER_RUN = ("checkpoint", "samples", "server-spool")  # what a new run must not start from


def _move_aside(run_dir: Path, why: str) -> None:
    """Rename ``run_dir`` with the time appended, so the demo's new run starts
    from an empty folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    old = run_dir.with_name(f"{run_dir.name}-{stamp}")
    n = 1
    # a run moved aside within the same second: renaming onto it would fail with OSError
    while old.exists():
        n += 1
        old = run_dir.with_name(f"{run_dir.name}-{stamp}-{n}")
    run_dir.rename(old)
    log.info("demo: %s/ %s; moved it to %s/ and starting a new one", run_dir, why, old)


def _run_demo(cfg: Config, run_dir: Path, stop: threading.Event, log_level: str, realtime: bool) -> None:
    from netrl.worker.names import host_name

    ports = {"trainer_port": free_port(), "worker_port": free_port()}
    # a real-time env never waits: the server exempts the demo's worker from pacing (its shared
    # key; without CURVE, its name)
    unpaced = ([] if not realtime else ["worker"] if cfg.security == "curve"
               else [cfg.worker.worker_id or host_name()])
    # the spool lives in the run folder: a finished demo moved aside takes its samples with it
    demo_cfg = write_config(cfg, run_dir / "demo_config.json", network={**ports, "server_ip": "127.0.0.1"},
                            server={"bind_ip": "127.0.0.1", "status_port": free_port(),
                                    "spool_dir": str(run_dir / "server-spool"), "unpaced_workers": unpaced})
    # a resumed demo keeps its earlier rounds (the trainer drops untrained ones)
    metrics = run_dir / "metrics.csv"
    # env.id is the gym pipeline's alone: the others name their own env, and "Pendulum-v1"
    # (the default) would mislead
    what = f"{cfg.env.id} (the gym pipeline)" if cfg.env.pipeline == "gym" else f"the {cfg.env.pipeline} pipeline"
    log.info("demo: %s on localhost (trainer port %d, worker port %d); Ctrl+C stops all three. "
             "Outputs go to %s/; `python -m netrl --status --config %s` shows the server's state",
             what, ports["trainer_port"],
             ports["worker_port"], run_dir, demo_cfg)
    server = spawn_role("server", demo_cfg, log_level=log_level)
    time.sleep(0.5)
    trainer = spawn_role("trainer", demo_cfg, log_level=log_level)
    worker = spawn_role("worker", demo_cfg, log_level="WARNING" if log_level == "INFO" else log_level)
    early = None
    try:
        while not stop.is_set() and trainer.poll() is None:
            early = next((role for role, p in (("server", server), ("worker", worker)) if p.poll() is not None), None)
            if early:
                log.error("the demo's %s exited early (code %s); stopping the others",
                          early, server.returncode
                          if early == "server" else worker.returncode)
                break
            stop.wait(0.5)
    finally:
        codes = stop_processes([worker, trainer], then=[server])
    if early or codes[1] not in (0, None):
        # a role found a config problem the launcher could not (e.g. a device this machine lacks)
        if 2 in codes:
            raise ConfigError([f"a role of the demo refused it (exit codes worker/trainer/server "
                               f"{codes}); its log above names the setting"], "config for the demo")
        raise NetrlError(f"the demo did not run to its end: exit codes "
                         f"worker/trainer/server {codes}; its log above says why")
    returns = _returns(metrics)
    if returns:
        log.info("demo done: mean episode return went from "
                 "%.0f (first round) to %.0f (last round), best %.0f",
                 returns[0], returns[-1], max(returns))
    log.info("policy saved to %s; exit codes worker/trainer/server: %s",
             run_dir / "policy.pt", codes)
