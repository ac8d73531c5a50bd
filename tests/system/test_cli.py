"""The netrl command as a process of its own: --help, Ctrl+C once a role is done, and a pipeline module in the
folder it starts in."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from netrl.config.sections import describe_fields
from tests.fakes import OWN_PIPELINE


def test_help_documents_every_flag_and_key() -> None:
    out = subprocess.run([sys.executable, "-m", "netrl", "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--server", "--worker", "--trainer", "--demo", "--config", "--server-ip", "--bind-ip",
                 "--trainer-port", "--worker-port", "--run-name", "--worker-id", "--log-level"):
        assert flag in out
    for key, _, _ in describe_fields():
        assert key in out


def test_ctrl_c_after_a_role_is_done_ends_the_process_at_once_with_its_exit_code(tmp_path: Path) -> None:
    # a role that returned 0 but whose interpreter is still shutting down (here: a non-daemon thread, as a
    # library's atexit work would be) must exit with 0 on Ctrl+C, not print a KeyboardInterrupt traceback or wait
    program = ("import runpy, sys, threading, time\n"
               "threading.Thread(target=time.sleep, args=(30,)).start()\n"
               f"sys.argv = ['netrl', '--keygen', '--keys-dir', {str(tmp_path / 'keys')!r}]\n"
               "try:\n"
               "    runpy.run_module('netrl', run_name='__main__', alter_sys=True)\n"
               "finally:\n"  # sys.exit(program()) raises SystemExit once program() set its Ctrl+C handler
               "    print('program() returned', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until main() and program() have returned
            if "program() returned" in line:
                break
        assert "program() returned" in line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0  # not 30 s later, and not 130
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_netrl_command_finds_a_pipeline_module_in_the_folder_it_starts_in(tmp_path: Path) -> None:
    command = Path(sys.executable).parent / "netrl"  # the console script that `pip install` wrote next to python
    assert command.exists(), f"{command} is missing: scripts/setup.sh installs it"
    (tmp_path / "my_pipeline.py").write_text(OWN_PIPELINE)
    (tmp_path / "config.json").write_text(json.dumps({"env": {"pipeline": "my_pipeline:not_a_pipeline"},
                                                      "security": "none"}))
    # The module is found (its function ran and returned a dict), rather than "cannot import my_pipeline".
    done = subprocess.run([str(command), "--worker"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "not_a_pipeline(cfg) returned a dict, not a netrl.pipelines.Pipeline" in done.stdout  # the log
