"""The demo: one command starts all three roles; Ctrl+C stops them all cleanly within a few seconds; it resumes."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.fakes import small_config, wait_until


def _demo_until(config: Path, log: Path, rounds: str) -> str:
    """Start the demo, wait until it logs ``rounds`` (a round line), Ctrl+C it; returns its log."""
    with log.open("wb") as out:
        demo = subprocess.Popen([sys.executable, "-m", "netrl", "--demo", "--config", str(config)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while rounds not in log.read_text() and time.monotonic() < deadline:
            assert demo.poll() is None, log.read_text()
            time.sleep(0.2)
        text = log.read_text()
        children = psutil.Process(demo.pid).children()
        assert rounds in text and len(children) == 3, text[-2000:]
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
    return text


def test_demo_runs_all_three_roles_and_ctrl_c_stops_them_and_a_restart_resumes(tmp_path: Path) -> None:
    config = small_config(tmp_path, trainer={"epochs": 1000})
    csv = tmp_path / "weights" / "test" / "metrics.csv"
    _demo_until(config, tmp_path / "demo.log", "netrl.monitor.metrics: epoch")  # a round's line
    first = csv.read_text().splitlines()
    assert len(first) >= 2  # a header and a round
    text = _demo_until(config, tmp_path / "demo2.log", "netrl.monitor.metrics: epoch")
    assert "loaded checkpoint" in text, text[-2000:]
    # the resumed demo keeps the rounds its first start logged, and adds its own after them
    assert csv.read_text().splitlines()[:len(first)] == first
    assert len(csv.read_text().splitlines()) > len(first)


def _run(role: str, config: Path, timeout: float) -> str:
    done = subprocess.run([sys.executable, "-m", "netrl", f"--{role}", "--config", str(config)], capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout + done.stderr


def test_a_finished_run_is_reported_and_the_demo_starts_a_new_one(tmp_path: Path) -> None:
    config = small_config(tmp_path)  # one epoch
    run_dir = tmp_path / "weights" / "test"
    assert "epoch 0 round 1" in _run("demo", config, 180)  # ran to its end
    # the trainer alone, on the finished run: it says so and stops, without waiting for a server
    text = _run("trainer", config, 60)
    assert f"{run_dir} holds a finished run (1 of 1 epochs): nothing to train" in text, text[-2000:]
    assert "connected to trainer server" not in text
    # the demo again: it keeps the finished run and learns from scratch in a new one
    text = _run("demo", config, 180)
    assert f"demo: {run_dir}/ held a finished run (1 of 1 epochs); moved it to" in text, text[-2000:]
    assert "epoch 0 round 1" in text
    (old,) = [p for p in run_dir.parent.iterdir() if p.name.startswith("test-")]
    assert (old / "checkpoint" / "CURRENT").exists() and (run_dir / "checkpoint" / "CURRENT").exists()
    assert (old / "server-spool").is_dir()  # its spool went with it: the new run starts from no old samples
    assert "spool" not in text or "from before this start" not in text, text[-2000:]


def _training_demo(tmp_path: Path, log: Path) -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    """A demo that trains for long, once its trainer has started, and its three roles."""
    config = small_config(tmp_path, trainer={"epochs": 1000})
    with log.open("wb") as out:
        demo = subprocess.Popen([sys.executable, "-m", "netrl", "--demo", "--config", str(config)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "trainer started" not in log.read_text() and time.monotonic() < deadline:
            assert demo.poll() is None, log.read_text()
            time.sleep(0.2)
        children = psutil.Process(demo.pid).children()
        assert len(children) == 3, log.read_text()[-2000:]
    except BaseException:
        os.killpg(demo.pid, signal.SIGKILL)
        raise
    return demo, children


def test_a_second_ctrl_c_stops_the_demo_at_once_and_leaves_no_process_behind(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    demo, children = _training_demo(tmp_path, log)
    try:
        demo.send_signal(signal.SIGINT)
        # the demo passes its first Ctrl+C on to its roles: once its trainer says so, it waits for them
        wait_until(lambda: log.read_text().count("received SIGINT: stopping") >= 2, 10, "the first Ctrl+C passed on",
                   poll=0.05)
        demo.send_signal(signal.SIGINT)  # impatient: while the demo waits for its children
        demo.wait(timeout=10)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    _, alive = psutil.wait_procs(children, timeout=2)
    assert not alive, f"demo children still running: {alive}"


def test_roles_stop_cleanly_when_their_launcher_is_killed(tmp_path: Path) -> None:
    # The demo's roles run in their own sessions: with the demo killed (SIGKILL, a crash), all three would run on for
    # ever, holding their folders, and the next demo there would fail on the spool folder.
    log = tmp_path / "demo.log"
    demo, children = _training_demo(tmp_path, log)
    os.kill(demo.pid, signal.SIGKILL)  # the demo alone, not its children
    demo.wait()
    _, alive = psutil.wait_procs(children, timeout=20)
    for p in alive:
        p.kill()
    assert not alive, f"still running after the demo was killed: {alive}"
    text = log.read_text()
    assert text.count(f"the process that started this one (pid {demo.pid}) is gone: stopping") == 3, text[-3000:]
    assert "gone: stopping in 3 s" in text  # the server, last: its workers deliver what they hold first
    # (their exit codes go to no one; the demo's worker logs warnings only)
    assert text.count("exited cleanly") == 2 and "unacknowledged" not in text, text[-3000:]


def test_sighup_stops_a_role_cleanly(tmp_path: Path) -> None:
    # A closed terminal or ssh session sends SIGHUP, whose default action would end a trainer without its checkpoint.
    from netrl.launch import spawn_role

    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = spawn_role("server", small_config(tmp_path), stdout=out)
    try:
        deadline = time.monotonic() + 30
        while "server listening" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        server.send_signal(signal.SIGHUP)
        assert server.wait(timeout=10) == 0, log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
    assert "received SIGHUP: stopping" in log.read_text()


def test_a_demo_whose_server_cannot_start_fails_instead_of_reporting_success(tmp_path: Path) -> None:
    from netrl.storage.folderlock import FolderLock

    config = small_config(tmp_path)
    spool = FolderLock(tmp_path / "weights" / "test" / "server-spool", "spool folder", "")
    spool.acquire()  # as a leftover server would hold it
    try:
        done = subprocess.run([sys.executable, "-m", "netrl", "--demo", "--config", str(config)], capture_output=True,
                              text=True, timeout=120)
    finally:
        spool.release()
    text = done.stdout + done.stderr
    assert done.returncode == 1, text[-2000:]
    assert "the demo's server exited early (code 1)" in text and "the demo did not run to its end" in text
    assert "demo done" not in text and "exited cleanly" not in text.splitlines()[-1]


@pytest.mark.parametrize("level", ["WARNING", "INFO", "DEBUG"])
def test_the_demos_log_level_reaches_its_three_roles(tmp_path: Path, level: str) -> None:
    # Spawned without a level, the server, trainer and worker of --demo --log-level ERROR would log at INFO.
    done = subprocess.run([sys.executable, "-m", "netrl", "--demo", "--config", str(small_config(tmp_path)),
                           "--log-level", level], capture_output=True, text=True, timeout=120)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-2000:]
    lines = {(role, mark): f" {mark} [{role} " in text for role in ("server", "trainer", "worker") for mark in "DI"}
    if level == "WARNING":
        assert not any(lines.values()), text[-2000:]
    elif level == "INFO":  # the worker logs warnings only, so that the trainer's round lines stand out
        assert lines == {("server", "D"): False, ("server", "I"): True, ("trainer", "D"): False,
                         ("trainer", "I"): True, ("worker", "D"): False, ("worker", "I"): False}, text[-2000:]
    else:
        assert all(lines.values()), text[-2000:]


def test_a_demo_with_resume_false_moves_an_earlier_run_aside(tmp_path: Path) -> None:
    # The trainer refuses a folder holding a checkpoint or sample log when trainer.resume is false: with the earlier
    # run left in place, the demo would start all three roles, then fail with exit code 1.
    run_dir = tmp_path / "weights" / "test"
    (run_dir / "samples").mkdir(parents=True)  # as an earlier run leaves it
    text = _run("demo", small_config(tmp_path, trainer={"resume": False}), 120)
    assert f"demo: {run_dir}/ held an earlier run and trainer.resume is false; moved it to" in text, text[-2000:]
    (old,) = [p for p in run_dir.parent.iterdir() if p.name.startswith("test-")]
    assert (old / "samples").is_dir() and (run_dir / "checkpoint" / "CURRENT").exists()


def _demo_to_its_end(tmp_path: Path, **sections: Any) -> tuple[int, str]:
    """Run a demo with ``sections`` of config until it exits by itself: its exit code and output."""
    config = small_config(tmp_path, **sections)
    done = subprocess.run([sys.executable, "-m", "netrl", "--demo", "--config", str(config)], capture_output=True,
                          text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def test_a_demo_with_an_env_id_gymnasium_lacks_exits_2_before_starting_a_role(tmp_path: Path) -> None:
    code, text = _demo_to_its_end(tmp_path, env={"id": "NoSuchEnv-v0"})
    assert code == 2, text[-2000:]
    assert 'env.id "NoSuchEnv-v0" is not a Gymnasium env' in text
    assert not any(f"[{role} " in text for role in ("server", "trainer", "worker")), text[-2000:]


def test_a_demo_whose_trainer_refuses_the_config_exits_2(tmp_path: Path) -> None:
    # A problem only a role can see (a device this machine lacks) is a config error (2), not a crash (1).
    code, text = _demo_to_its_end(tmp_path, trainer={"device": "cuda"})
    assert code == 2, text[-2000:]
    assert 'trainer.device is "cuda", but this torch' in text and "a role of the demo refused it" in text


@pytest.mark.parametrize(("env", "announced"), [({"pipeline": "drone"}, "demo: the drone pipeline on localhost"),
                                                ({}, "demo: Pendulum-v1 (the gym pipeline) on localhost")])
def test_the_demo_announces_the_pipeline_it_runs(tmp_path: Path, env: dict[str, str], announced: str) -> None:
    # The drone and image demos must not announce the gym pipeline's env.id ("demo: Pendulum-v1 on localhost").
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        demo = subprocess.Popen([sys.executable, "-m", "netrl", "--demo", "--config",
                                 str(small_config(tmp_path, env=env))], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "on localhost" not in log.read_text() and time.monotonic() < deadline:
            assert demo.poll() is None, log.read_text()
            time.sleep(0.1)
        demo.send_signal(signal.SIGINT)
        demo.wait(timeout=20)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    assert announced in log.read_text(), log.read_text()[-2000:]


def test_runs_moved_aside_within_one_second_get_folders_of_their_own(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A second rename within the same second would fail with OSError: the timestamped folder is taken.
    from netrl import launch

    monkeypatch.setattr(launch.time, "strftime", lambda fmt: "20261127-101010")
    run = tmp_path / "run"
    for n in range(3):
        (run / "checkpoint").mkdir(parents=True)
        (run / "mark").write_text(str(n))
        launch._move_aside(run, "held an earlier run")
    assert not run.exists()
    assert [(tmp_path / name / "mark").read_text() for name in ("run-20261127-101010", "run-20261127-101010-2",
                                                                "run-20261127-101010-3")] == ["0", "1", "2"]


@pytest.mark.parametrize(("trainer", "state", "moved"), [
    ({}, {"epoch": 10**6, "total_samples": 10**9}, None),  # the default trains until stopped: never finished
    ({"epochs": 3}, {"epoch": 3, "total_samples": 10}, "held a finished run (3 of 3 epochs)"),
    ({"total_frames": 500}, {"epoch": 0, "total_samples": 512},
     "held a finished run (512 of trainer.total_frames 500 env steps)"),
    ({"total_frames": 500}, {"epoch": 0, "total_samples": 499}, None)])
def test_the_demo_starts_a_new_run_only_on_a_finished_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture, trainer: dict[str, int],
                                                          state: dict[str, int], moved: str | None) -> None:
    # With trainer.epochs null (the default), comparing the checkpoint's epoch with it raised TypeError; and a run
    # its total_frames ended was resumed, so the trainer said "nothing to train" and the demo ended at once.
    import threading

    from netrl import launch
    from netrl.config import load_config

    cfg = load_config(small_config(tmp_path, trainer={"epochs": None, **trainer}, security="none"))
    (cfg.run_dir / "checkpoint").mkdir(parents=True)
    monkeypatch.setattr("netrl.storage.checkpoint.load_state", lambda run_dir: state)
    monkeypatch.setattr(launch, "_run_demo", lambda *args: None)  # what follows the decision: the roles
    with caplog.at_level(logging.INFO, "netrl.launch"):
        launch.run_demo(cfg, str(tmp_path / "config.json"), threading.Event())
    if moved is None:
        assert "moved it to" not in caplog.text and (cfg.run_dir / "checkpoint").is_dir()
    else:
        assert f"demo: {cfg.run_dir}/ {moved}; moved it to" in caplog.text, caplog.text
        assert not cfg.run_dir.exists()
