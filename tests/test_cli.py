"""The command line (netrl/__main__.py) run in this process: flags, exit codes, and what it prints for bad input."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from netrl.__main__ import main
from netrl.config.load import load_config
from netrl.config.sections import Config
from netrl.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_cli_prints_every_problem_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"trainer": {"steps": -1}, "memry": {}}))
    assert main(["--trainer", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("netrl: invalid config.json (2 problems)")
    assert "trainer.steps must be >= 1 (got -1)" in err and 'unknown key "memry" (did you mean "memory"?)' in err


def test_cli_reports_missing_and_unparsable_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--server", "--config", str(tmp_path / "nope.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main(["--server", "--config", str(broken)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err


def test_ctrl_c_before_the_signal_handlers_is_one_line_not_a_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("netrl.config.load.load_config", interrupted)  # what Ctrl+C in the first moments looks like
    assert main(["--server"]) == 1
    assert capsys.readouterr().err == "netrl: interrupted\n"


def test_the_command_line_module_imports_only_the_standard_library_before_main() -> None:
    # its imports run outside main()'s try: a Ctrl+C while netrl.config imports numpy (a tenth of a second)
    # would be a KeyboardInterrupt traceback and exit code -2, not "netrl: interrupted" and 1
    out = subprocess.run([sys.executable, "-c", "import sys, netrl.__main__; print(sorted(m for m in sys.modules if "
                          "m.split('.')[0] in ('numpy', 'zmq', 'torch') or m.startswith('netrl.')))"],
                         capture_output=True, text=True, check=True).stdout
    assert out == "['netrl.__main__', 'netrl.util']\n"  # util: the lazy exports of netrl/__init__, stdlib only


def test_plot_of_a_folder_and_keygen_with_keys_dir_need_no_config_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no config.json here
    assert main(["--keygen", "--keys-dir", str(tmp_path / "keys")]) == 0
    assert (tmp_path / "keys" / "server" / "server.key").exists()
    run = tmp_path / "run"
    run.mkdir()
    (run / "episodes_w1.csv").write_text("env_steps,return,test\n200,-1200.5,0\n")
    assert main(["--plot", str(run)]) == 0 and (run / "learning.png").exists()
    assert main(["--plot", "run-name-only"]) == 2  # a run name is looked up under weights_folder: config needed
    # not "invalid config.json: config.json does not exist", as if the config were the problem
    assert capsys.readouterr().err == ("netrl: invalid command line (1 problem)\n  --plot run-name-only: no such run "
                                       "folder or CSV file here, and no config.json to find a run of that name under "
                                       "its weights_folder\n")


def test_keygen_worker_names_are_checked_as_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # unchecked, "robot 1" would fail at run time (exit 1) naming no flag, and "worker" silently mean the shared key
    keys = str(tmp_path / "keys")
    assert main(["--keygen", "--keys-dir", keys, "--workers", "robot-1,robot 1, worker ,server"]) == 2
    assert capsys.readouterr().err == (
        "netrl: invalid command line (3 problems)\n"
        '  --workers "robot 1" is not a valid worker name: it must be 1 to 64 letters, digits, \'.\', \'_\' or \'-\', '
        "starting with a letter or digit\n"
        '  --workers "worker" is reserved: it names the shared worker key, which --keygen always makes; give this '
        "worker another name\n"
        '  --workers "server" is reserved: a worker\'s key folder holds the server\'s public key as server.key; give '
        "this worker another name\n")
    assert not (tmp_path / "keys").exists()
    from netrl.errors import SecurityError
    from netrl.net.keys import keygen

    with pytest.raises(SecurityError, match="'worker' is reserved"):  # the Python API refuses them too
        keygen(keys, ["worker"])


def test_cli_flags_override_config_and_are_validated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(ROOT / "config.json", {"network.server_ip": "10.0.0.2", "run_name": "x",
                                             "network.worker_port": 6001})
    assert (cfg.network.server_ip, cfg.run_name, cfg.network.worker_port) == ("10.0.0.2", "x", 6001)
    assert main(["--worker", "--config", str(ROOT / "config.json"), "--worker-port", "0"]) == 2
    assert "--worker-port must be a TCP port between 1 and 65535 (got 0)" in capsys.readouterr().err


def test_cli_reports_unreadable_config_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["--server", "--config", str(tmp_path)]) == 2  # a directory
    assert capsys.readouterr().err == (f"netrl: invalid {tmp_path} (1 problem)\n  {tmp_path} is a directory; pass "
                                       f"the config file with --config, e.g. --config {tmp_path / 'config.json'}\n")
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe{}")
    assert main(["--server", "--config", str(binary)]) == 2
    assert capsys.readouterr().err == (f"netrl: invalid {binary} (1 problem)\n  {binary} is not UTF-8 text (byte 0xff "
                                       "at offset 0); save it as UTF-8 JSON\n")

    locked = tmp_path / "locked.json"
    locked.write_text("{}")
    read_text = Path.read_text

    def unreadable(self: Path, encoding: str | None = None, errors: str | None = None) -> str:  # root reads chmod 000
        if self.name == "locked.json":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        if self.name == "broken-disk.json":
            raise OSError(errno.EIO, "Input/output error", str(self))
        return read_text(self, encoding, errors)

    monkeypatch.setattr(Path, "read_text", unreadable)
    assert main(["--server", "--config", str(locked)]) == 2
    assert f"{locked} cannot be read (permission denied); make it readable" in capsys.readouterr().err
    assert main(["--server", "--config", str(tmp_path / "broken-disk.json")]) == 2
    assert "broken-disk.json cannot be read (Input/output error)" in capsys.readouterr().err


def test_a_bad_flag_is_blamed_on_the_flag_not_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    assert main(["--trainer", "--config", str(empty), "--trainer-port", "70000", "--run-name", " "]) == 2
    assert capsys.readouterr().err == ("netrl: invalid command line (2 problems)\n"
                                       "  --trainer-port must be a TCP port between 1 and 65535 (got 70000)\n"
                                       '  --run-name must not be empty (got " ")\n')
    assert main(["--worker", "--config", str(empty), "--episodes", "0"]) == 2  # it would run and do nothing
    assert "--episodes must be >= 1 (got 0); leave it out to run until stopped" in capsys.readouterr().err
    bad = tmp_path / "config.json"  # a bad flag and a bad file: both reported, each under its own heading
    bad.write_text(json.dumps({"trainer": {"steps": -1}}))
    assert main(["--server", "--config", str(bad), "--epochs", "0"]) == 2
    assert capsys.readouterr().err == ("netrl: invalid command line (1 problem)\n  --epochs must be >= 1 (got 0)\n"
                                       "netrl: invalid config.json (1 problem)\n"
                                       "  trainer.steps must be >= 1 (got -1)\n")
    # a flag that is fine on its own but clashes with the file: the heading names both
    assert main(["--server", "--config", str(empty), "--trainer-port", "55556"]) == 2
    assert capsys.readouterr().err == ("netrl: invalid empty.json with the command-line flags (1 problem)\n"
                                       "  network.trainer_port and network.worker_port must differ (both 55556)\n")


def test_port_clashes_concern_only_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # a remote worker must not be refused for --worker-port 55557 because of server.status_port, which it never uses
    ran = []
    monkeypatch.setattr("netrl.__main__.run_role", lambda role, cfg, *args: ran.append((role, cfg)))
    monkeypatch.setattr("netrl.__main__.install_stop_signals", lambda stop: None)  # keep pytest's SIGINT
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    assert main(["--worker", "--config", str(empty), "--server-ip", "203.0.113.7", "--worker-port", "55557"]) == 0
    assert main(["--trainer", "--config", str(empty), "--server-ip", "203.0.113.7", "--trainer-port", "55556"]) == 0
    assert [(role, cfg.network.worker_port, cfg.network.trainer_port) for role, cfg in ran] == [
        ("worker", 55557, 55555), ("trainer", 55556, 55556)]
    assert main(["--server", "--config", str(empty), "--worker-port", "55557"]) == 2  # the server binds them all
    assert capsys.readouterr().err.endswith("  network.worker_port and server.status_port must differ (both 55557)\n")
    with pytest.raises(ConfigError, match=r"network\.trainer_port and network\.worker_port must differ"):
        load_config(empty, {"network.trainer_port": 55556})  # without a role (the Python API): every check


def test_each_role_logs_the_absolute_folders_it_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # relative folders are relative to the folder netrl starts in, not to the config file: say which ones those are
    monkeypatch.setattr("netrl.__main__.run_role", lambda *args: None)
    monkeypatch.setattr("netrl.__main__.install_stop_signals", lambda stop: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "config.json").write_text('{"weights_folder": "w", "server": {"spool_dir": "../s"}}')
    assert main(["--worker", "--config", "project/config.json"]) == 0
    assert f"run folder {tmp_path}/w/pendulum-sac, keys folder {tmp_path}/keys\n" in capsys.readouterr().out
    assert main(["--server", "--config", "project/config.json"]) == 0
    assert f"spool folder {tmp_path.parent}/s, keys folder {tmp_path}/keys\n" in capsys.readouterr().out
    assert main(["--keygen", "--keys-dir", "k"]) == 0
    assert f"keys in {tmp_path}/k/: keep server/ on the server" in capsys.readouterr().out


def test_a_flag_the_chosen_role_does_not_use_is_an_error_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--trainer", "--config", str(ROOT / "config.json"), "--episodes", "3", "--json"]) == 2
    err = capsys.readouterr().err
    assert "--episodes is for --worker; --trainer does not use it" in err
    assert "--json is for --status; --trainer does not use it" in err
    assert main(["--demo", "--config", str(ROOT / "config.json"), "--trainer-port", "56555"]) == 2
    assert ("--trainer-port is for --server, --trainer, --revoke, --unrevoke and --lift; --demo does not use it "
            "(it picks free ports on localhost)"
            in capsys.readouterr().err)
    # a server has no run: `--server --run-name expB` would serve run B the samples run A left in the server's spool
    assert main(["--server", "--config", str(ROOT / "config.json"), "--run-name", "expB"]) == 2
    assert capsys.readouterr().err == (
        "netrl: invalid command line (1 problem)\n  --run-name is for --worker, --trainer and --demo; --server does "
        "not use it (a server serves every run: its spool, server.spool_dir (default <weights_folder>/server-spool), "
        "is shared by them all)\n")
    assert main(["--keygen", "--keys-dir", "k", "--run-name", "x"]) == 2
    assert "--run-name is for --worker, --trainer and --demo; --keygen does not use it\n" in capsys.readouterr().err
    assert main(["--status", "--config", str(ROOT / "config.json"), "--run-name", "x", "--keys-dir", "k"]) == 2
    err = capsys.readouterr().err
    assert "--run-name is for --worker, --trainer and --demo; --status does not use it\n" in err
    assert ("--keys-dir is for --server, --worker, --trainer, --demo, --keygen, --revoke, --unrevoke and "
            "--lift; --status does not use it\n") in err
    assert main(["--plot", str(ROOT), "--run-name", "x", "--keys-dir", "k"]) == 2
    err = capsys.readouterr().err
    assert ("--run-name is for --worker, --trainer and --demo; --plot does not use it (give the run as --plot RUN)\n"
            in err)
    assert ("--keys-dir is for --server, --worker, --trainer, --demo, --keygen, --revoke, --unrevoke and "
            "--lift; --plot does not use it\n") in err


def test_plot_of_an_empty_name_is_a_usage_error_not_a_trainer(capsys: pytest.CaptureFixture[str]) -> None:
    # `--plot "$RUN"` with RUN unset: "" is false, so no role would be set, and run_role() would run the trainer
    assert main(["--plot", "", "--config", str(ROOT / "config.json")]) == 2
    assert capsys.readouterr().err == ('netrl: invalid command line (1 problem)\n  --plot needs a run name, a run '
                                       'folder or a CSV file (got "")\n')
    from netrl.__main__ import run_role

    with pytest.raises(ValueError, match="unknown role 'plot': run_role runs server, worker, trainer, demo"):
        run_role("plot", Config(), threading.Event())


def test_every_port_has_a_flag_and_the_status_port_reaches_the_server_and_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # server.status_port had no flag: two servers on one machine needed two config files to be told apart
    from netrl.config.sections import describe_fields, flag_for

    ports = [key for key, _, _ in describe_fields() if key.endswith("_port")]
    assert ports and all(flag_for(key) for key in ports), [key for key in ports if not flag_for(key)]
    ran, asked = [], []
    monkeypatch.setattr("netrl.__main__.run_role", lambda role, cfg, *args: ran.append((role, cfg)))
    monkeypatch.setattr("netrl.__main__.install_stop_signals", lambda stop: None)  # keep pytest's SIGINT
    monkeypatch.setattr("netrl.monitor.status.query_status", lambda port, stop=None: asked.append(port) or {})
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    assert main(["--server", "--config", str(empty), "--status-port", "56001"]) == 0
    assert [(role, cfg.server.status_port) for role, cfg in ran] == [("server", 56001)]
    assert main(["--status", "--config", str(empty), "--status-port", "56001"]) == 0
    assert asked == [56001]
    capsys.readouterr()
    assert main(["--server", "--config", str(empty), "--status-port", "70000"]) == 2
    assert "--status-port must be a TCP port between 1 and 65535 (got 70000)" in capsys.readouterr().err
    assert main(["--server", "--config", str(empty), "--status-port", "55556"]) == 2  # the clash names the key
    assert "network.worker_port and server.status_port must differ (both 55556)" in capsys.readouterr().err
    assert main(["--worker", "--config", str(empty), "--status-port", "56001"]) == 2
    assert "--status-port is for --server and --status; --worker does not use it\n" in capsys.readouterr().err
    assert main(["--demo", "--config", str(empty), "--status-port", "56001"]) == 2
    assert ("--status-port is for --server and --status; --demo does not use it (it picks free ports on localhost)"
            in capsys.readouterr().err)


def test_training_runs_until_stopped_unless_epochs_or_total_frames_are_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The default config stopped training after 3 epochs x 4 rounds x 1,000 steps, whatever the env: a harder env
    # stopped mid-learning. Now a trainer trains until stopped unless one of the two keys (or flags) says otherwise.
    import math

    from netrl.pipelines.make import make_pipeline
    from netrl.trainer.trainer import Trainer

    assert Config().trainer.epochs is None and Config().trainer.total_frames is None
    assert load_config(ROOT / "config.json").trainer.epochs is None  # the shipped config.json too
    unencrypted = Config(security="none", weights_folder=str(tmp_path / "weights"))
    training = Trainer.from_config(unencrypted, make_pipeline(unencrypted)).training_cls()
    assert training.epochs == math.inf and training.settings.total_frames is None
    ran = []
    monkeypatch.setattr("netrl.__main__.run_role", lambda role, cfg, *args: ran.append(cfg.trainer))
    monkeypatch.setattr("netrl.__main__.install_stop_signals", lambda stop: None)
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    assert main(["--trainer", "--config", str(empty), "--epochs", "5", "--total-frames", "20000"]) == 0
    assert (ran[0].epochs, ran[0].total_frames) == (5, 20000)
    assert main(["--trainer", "--config", str(empty), "--total-frames", "0"]) == 2
    assert "--total-frames must be >= 1 (got 0)" in capsys.readouterr().err
    assert main(["--worker", "--config", str(empty), "--total-frames", "10"]) == 2
    assert "--total-frames is for --trainer and --demo; --worker does not use it" in capsys.readouterr().err


def test_a_role_that_returned_leaves_its_objects_out_of_the_collection_at_exit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A demo's Ctrl+C took 6.4 s at load 10, 2 s of it after every role had said it stopped:
    # Python's shutdown collected what torch and the role left (3 s for `import torch` alone
    # beside two CPU hogs). program() freezes them once main() has returned; the shutdown's other
    # steps (atexit hooks, thread joins) stay.
    import gc
    import signal

    from netrl import __main__ as cli

    monkeypatch.setattr(cli, "main", lambda: 0)
    previous = signal.getsignal(signal.SIGINT)
    gc.unfreeze()
    try:
        assert cli.program() == 0
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        signal.signal(signal.SIGINT, previous)
