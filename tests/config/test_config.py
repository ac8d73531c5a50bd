"""Config: defaults, the shipped config.json, and the error text for bad configs (all problems at once)."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from netrl.__main__ import main
from netrl.config.load import config_from_dict, config_to_dict, load_config
from netrl.config.sections import Config, describe_fields
from netrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def problems(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "config.json")
    return info.value.problems


def test_shipped_config_holds_every_setting_and_loads() -> None:
    shipped = json.loads((ROOT / "config.json").read_text())
    cfg = load_config(ROOT / "config.json")
    assert cfg.network.trainer_port == 55555 and cfg.network.worker_port == 55556  # tmrl's ports
    assert cfg.env.id == "Pendulum-v1"
    keys = {k for k, _, _ in describe_fields()}
    flat = set()

    def walk(d: dict, prefix: str = "") -> None:
        for k, v in d.items():
            if isinstance(v, dict) and k != "kwargs":
                walk(v, f"{prefix}{k}.")
            else:
                flat.add(prefix + k)

    walk(shipped)
    assert flat == keys  # config.json lists every setting, and nothing else
    assert shipped == config_to_dict(Config())  # and its values are the documented defaults


def test_defaults_round_trip() -> None:
    assert config_from_dict(config_to_dict(Config())) == Config()


def test_every_problem_is_listed_with_key_value_and_rule() -> None:
    found = problems({
        "seed": -1,
        "trainer": {"steps": -3, "max_training_steps_per_env_step": 0},
        "memory": {"capasity": 10},
        "network": {"worker_port": 70000, "server_ip": 5, "handshake_timeout_s": 3e6},
        "env": {"pipeline": "atari"},
        "wandb": {"mode": "loud"},
        "agent": {"learn_entropy_coef": "yes"},
        "worker": {"compression": "gzip", "worker_id": "robot 1"},
    })
    assert found == [
        "seed must be >= 0 (got -1)",  # gymnasium and numpy refuse it: a traceback once the role started
        "trainer.steps must be >= 1 (got -3)",
        "trainer.max_training_steps_per_env_step must be > 0 (got 0)",
        'unknown key "memory.capasity"',  # nothing close enough to suggest
        "network.worker_port must be a TCP port between 1 and 65535 (got 70000)",
        'network.server_ip must be a string (got 5)',
        "network.handshake_timeout_s must be > 0 and at most 86400 (a day) (got 3000000.0)",  # int32 milliseconds
        'env.pipeline must be "gym", "drone", "image", or "module:function" naming a function of the config that '
        'returns a netrl.pipelines.Pipeline (got "atari")',
        'wandb.mode must be "auto" or "offline" or "online" or "disabled" (got "loud")',
        'agent.learn_entropy_coef must be true or false (got "yes")',
        'worker.compression must be "none" or "zstd" or "lz4" (got "gzip")',
        "worker.worker_id must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit (got "
        '"robot 1")',
    ]


def test_misspelt_keys_get_a_suggestion() -> None:
    assert problems({"trainer": {"epoch": 3}, "run_nme": "x"}) == [
        'unknown key "trainer.epoch" (did you mean "trainer.epochs"?)',
        'unknown key "run_nme" (did you mean "run_name"?)',
    ]


def test_cross_field_problems_name_both_fields() -> None:
    assert problems({"network": {"trainer_port": 6000, "worker_port": 6000, "max_message_bytes": 1 << 20},
                     "memory": {"memory_size": 10, "batch_size": 64}}) == [
        "network.trainer_port and network.worker_port must differ (both 6000)",
        "memory.memory_size (10) must be >= memory.batch_size (64)",
        "server.max_bundle_bytes (4194304) must be < network.max_message_bytes (1048576): the trainer refuses larger "
        "messages",
    ]
    assert problems({"trainer": {"stale_sample_weight": 0.5}, "server": {"max_queue_bytes": 1000},
                     "worker": {"send_window_bytes": 2000, "max_backlog_bytes": 1000}}) == [
        "trainer.stale_sample_weight (0.5) has no effect while trainer.max_policy_lag is null (no sample is stale): "
        "set both, or neither",
        "server.max_queue_bytes (1000) must be >= server.max_bundle_bytes (4194304): a bundle is built from the queue",
        "worker.send_window_bytes (2000) must be <= worker.max_backlog_bytes (1000): what is in flight is kept in the "
        "backlog until acknowledged",
    ]


def test_types_are_strict() -> None:
    assert problems({"trainer": {"epochs": 2.5, "start_training": True}, "network": "x"}) == [
        "trainer.epochs must be an integer (got 2.5)",
        "trainer.start_training must be an integer (got true)",
        "network must be an object (got \"x\")",
    ]


def test_values_that_would_fail_later_are_refused_up_front() -> None:
    assert problems({"network": {"heartbeat_interval_s": float("inf"), "server_ip": "not an ip"},
                     "server": {"bind_ip": "::"}, "torch_threads": 10**20, "run_name": "../../tmp/x"}) == [
        "network.heartbeat_interval_s must be a finite number (got Infinity)",
        "network.server_ip must be an IPv4 address or a host name, e.g. 192.168.1.20 (got \"not an ip\")",
        "server.bind_ip must be an IPv4 address or a host name (IPv6 addresses are not supported) (got \"::\")",
        "torch_threads must be an integer (got 100000000000000000000)",
        "run_name must be a folder name (no '/' or '\\'; set weights_folder for where runs go) (got \"../../tmp/x\")",
    ]
    assert problems({"torch_threads": 5000}) == ["torch_threads must be between 1 and 1024 (got 5000)"]
    assert problems({"agent": {"hidden_sizes": "256"}}) == ['agent.hidden_sizes must be a list of integers (got "256")']
    cfg = config_from_dict({"network": {"server_ip": "gpu-box.lan"}, "server": {"bind_ip": "0.0.0.0"}})
    assert (cfg.network.server_ip, cfg.server.bind_ip) == ("gpu-box.lan", "0.0.0.0")


def test_a_run_name_too_long_for_the_file_system_is_refused(tmp_path: Path) -> None:
    # 300 characters passed, then the role stopped with "OSError: File name too long" making the folder
    long = "r" * 300
    assert problems({"run_name": long}) == [
        "run_name must be at most 200 bytes in UTF-8, not 300: file systems allow 255 for a name, and netrl makes "
        f'longer names from it (got "{long}")']
    assert len(problems({"run_name": "é" * 101})) == 1  # bytes, not characters: 202 of them
    longest = "r" * 200
    (tmp_path / f".{longest}.demo-lock").touch()  # the longest name netrl makes from it fits (the demo's)
    (tmp_path / f"{longest}-20250101-120000").mkdir()
    assert config_from_dict({"run_name": longest}).run_name == longest


def test_every_seconds_field_is_bounded_like_the_network_ones() -> None:
    # worker.flush_timeout_s 1e12 stopped the worker with OverflowError (beyond threading.TIMEOUT_MAX) at its end
    assert problems({"status_interval_s": 1e12, "worker": {"flush_timeout_s": 1e12, "max_packet_delay_s": 1e12},
                     "server": {"max_packet_delay_s": 1e12, "spool_after_s": 86400.5}}) == [
        "status_interval_s must be >= 0 and at most 86400 (a day) (got 1000000000000.0)",
        "worker.flush_timeout_s must be >= 0 and at most 86400 (a day) (got 1000000000000.0)",
        "worker.max_packet_delay_s must be > 0 and at most 86400 (a day) (got 1000000000000.0)",
        "server.max_packet_delay_s must be > 0 and at most 86400 (a day) (got 1000000000000.0)",
        "server.spool_after_s must be > 0 and at most 86400 (a day) (got 86400.5)",
    ]
    cfg = config_from_dict({"status_interval_s": 0, "worker": {"flush_timeout_s": 0}})  # 0: none, no wait
    assert (cfg.status_interval_s, cfg.worker.flush_timeout_s) == (0.0, 0.0)


def test_devices_env_ids_and_env_kwargs_that_cannot_work_are_config_errors() -> None:
    from netrl.__main__ import configure_torch
    from netrl.envs.gym import GenericGymEnv
    from netrl.pipelines.make import make_pipeline

    assert problems({"trainer": {"device": "tpu"}}) == [
        'trainer.device must be a torch device: "cpu", "cuda", "cuda:N" or "mps" (got "tpu")']
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r'worker\.device is "cuda:0", but this torch .* has no CUDA device'):
            configure_torch(config_from_dict({"worker": {"device": "cuda:0"}}), "worker")
        configure_torch(config_from_dict({"worker": {"device": "cuda:0"}}), "trainer")  # a CPU trainer is fine
        configure_torch(config_from_dict({"trainer": {"device": "cuda"}}), "worker")  # so is a CPU robot
    with pytest.raises(ConfigError, match=r'env\.id "NoSuchEnv-v0" is not a Gymnasium env this machine has'):
        make_pipeline(config_from_dict({"env": {"id": "NoSuchEnv-v0"}}))
    with pytest.raises(ConfigError, match=r'env\.id "CartPole-v1" has Discrete actions, but the gym pipeline trains '
                                          r"SAC, which needs continuous \(Box\) actions"):
        make_pipeline(config_from_dict({"env": {"id": "CartPole-v1"}}))
    with pytest.raises(ConfigError, match=r"(?s)invalid GenericGymEnv gym_kwargs \(env\.kwargs in config\.json\) "
                                          r".* unexpected keyword argument 'bogus'"):
        GenericGymEnv("Pendulum-v1", {"bogus": 1})


def test_folders_that_are_files_are_refused(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    assert problems({"weights_folder": str(afile), "keys_dir": str(afile / "keys")}) == [
        f'weights_folder must be a folder, but {afile} is a file (got "{afile}")',
        f'keys_dir lies inside {afile}, which is a file (got "{afile / "keys"}")',
    ]


def test_the_spool_folder_is_checked_like_the_other_folders(tmp_path: Path) -> None:
    # "afile/spool" failed only when the server started, without naming the key; "" was silently null
    afile = tmp_path / "afile"
    afile.write_text("")
    assert problems({"server": {"spool_dir": str(afile / "spool")}}) == [
        f'server.spool_dir lies inside {afile}, which is a file (got "{afile / "spool"}")']
    assert problems({"server": {"spool_dir": ""}}) == [
        'server.spool_dir must not be empty (null: the default) (got "")']
    assert config_from_dict({"server": {"spool_dir": None}}).server_spool_dir == Path("weights/server-spool")


def test_a_leading_tilde_in_a_folder_is_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # JSON has no shell to expand it: "~/netrl-keys" made a folder named "~" in the current one
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    cfg = config_from_dict({"keys_dir": "~/k", "weights_folder": "~", "server": {"spool_dir": "~/s"}})
    assert (cfg.keys_dir, cfg.weights_folder, cfg.server.spool_dir) == (
        str(tmp_path / "home" / "k"), str(tmp_path / "home"), str(tmp_path / "home" / "s"))
    assert main(["--keygen", "--keys-dir", "~/keys"]) == 0  # a quoted flag, as config.json
    assert (tmp_path / "home" / "keys" / "server" / "server.key").exists() and not (tmp_path / "~").exists()
    assert problems({"keys_dir": "~no-such-user-netrl/k"}) == [
        "keys_dir starts with ~no-such-user-netrl, but this machine has no such home folder (is HOME set?): give the "
        'full path, or ./~... for a folder of that name (got "~no-such-user-netrl/k")']


def test_a_key_set_twice_is_an_error_and_a_byte_order_mark_is_fine(tmp_path: Path) -> None:
    twice = tmp_path / "config.json"
    twice.write_text('{"trainer": {"epochs": 3, "epochs": 30}}')
    with pytest.raises(ConfigError, match='sets "epochs" twice in one object; keep one of them'):
        load_config(twice)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"trainer": {"epochs": 3}}')
    assert load_config(bom).trainer.epochs == 3


def test_json_that_python_cannot_read_is_a_config_error_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    digits = tmp_path / "digits.json"  # JSON allows any number of digits; Python refuses more than 4300
    digits.write_text('{"seed": ' + "9" * 5000 + "}")
    assert main(["--server", "--config", str(digits)]) == 2
    assert capsys.readouterr().err == (
        f"netrl: invalid {digits} (1 problem)\n  {digits} is not valid JSON here: a number in it has more than "
        f"{sys.get_int_max_str_digits()} digits, which Python refuses to read; no setting takes such a value\n")
    deep = tmp_path / "deep.json"  # deeper than Python's parser goes: RecursionError
    deep.write_text('{"env": {"kwargs": {"a": ' + "[" * 100_000 + "]" * 100_000 + "}}}")
    with pytest.raises(ConfigError, match="is not valid JSON here: its objects and lists nest deeper than Python "
                                          "reads; no setting needs more than 32 levels"):
        load_config(deep)
    # deep enough to parse, but a trainer stopped with RecursionError saving its config beside its checkpoints
    deep.write_text('{"env": {"kwargs": {"a": ' + "[" * 500 + "]" * 500 + "}}}")
    with pytest.raises(ConfigError) as info:
        load_config(deep)
    assert info.value.problems == ["env.kwargs nests objects and lists more than 32 levels deep; no setting needs "
                                   "that many"]


def test_error_message_counts_problems() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict({"trainer": {"steps": 0}, "x": 1}, "config.json")
    assert str(info.value).splitlines()[0] == "invalid config.json (2 problems)"


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
    # its imports run outside main()'s try: a Ctrl+C while netrl.config imported numpy (a tenth of a second)
    # was a KeyboardInterrupt traceback and exit code -2, not "netrl: interrupted" and 1
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
    # it said "invalid config.json: config.json does not exist", as if the config were the problem
    assert capsys.readouterr().err == ("netrl: invalid command line (1 problem)\n  --plot run-name-only: no such run "
                                       "folder or CSV file here, and no config.json to find a run of that name under "
                                       "its weights_folder\n")


def test_keygen_worker_names_are_checked_as_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # "robot 1" was a runtime error (exit 1) naming no flag; "worker" silently meant the shared key
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
    assert main(["--worker", "--config", str(empty), "--episodes", "0"]) == 2  # once ran and did nothing
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


def test_field_problems_do_not_hide_each_other() -> None:
    assert problems({"agent": {"hidden_sizes": [0]}, "config_version": 2, "status_interval_s": -1}) == [
        "agent.hidden_sizes must be a non-empty list of sizes >= 1 (got [0])",
        "status_interval_s must be >= 0 and at most 86400 (a day) (got -1)",
        "config_version 2 is not supported; this netrl reads 1",
    ]
    # a check between fields still runs next to a field problem, but not on a field that was rejected
    assert problems({"trainer": {"steps": 0}, "memory": {"memory_size": 10, "batch_size": 64},
                     "network": {"trainer_port": 0, "worker_port": 55557}}) == [
        "trainer.steps must be >= 1 (got 0)",
        "network.trainer_port must be a TCP port between 1 and 65535 (got 0)",
        "network.worker_port and server.status_port must differ (both 55557)",
        "memory.memory_size (10) must be >= memory.batch_size (64)",
    ]
    assert problems({"config_version": "2", "network": []}) == [
        'config_version must be an integer (got "2")',
        "network must be an object (got [])",
    ]


def test_port_clashes_concern_only_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # a remote worker was refused for --worker-port 55557 because of server.status_port, which it never uses
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


def test_a_run_folder_that_is_the_server_spool_folder_is_refused() -> None:
    # run_name "server-spool" made the trainer find the server's lock on its run folder, and blame a second trainer
    assert problems({"run_name": "server-spool"}) == [
        'run_name "server-spool" makes the run folder weights/server-spool the server\'s spool folder '
        "(server.spool_dir is null: <weights_folder>/server-spool): choose another run_name (--run-name), or another "
        "server.spool_dir"]
    assert problems({"run_name": "a", "weights_folder": "w", "server": {"spool_dir": "./w/a"}}) == [
        'run_name "a" makes the run folder w/a the server\'s spool folder (server.spool_dir): choose another run_name '
        "(--run-name), or another server.spool_dir"]
    config_from_dict({"run_name": "server-spool"}, role="server")  # a server has no run folder
    config_from_dict({"run_name": "server-spool", "server": {"spool_dir": "spool"}})
    config_from_dict({"server": {"spool_dir": "weights/pendulum-sac/server-spool"}})  # the demo's: inside the run


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
               "runpy.run_module('netrl', run_name='__main__', alter_sys=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until main() has returned
            if "exited cleanly" in line:
                break
        time.sleep(0.5)  # main() logs this line just before it returns
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0  # not 30 s later, and not 130
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_flag_the_chosen_role_does_not_use_is_an_error_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--trainer", "--config", str(ROOT / "config.json"), "--episodes", "3", "--json"]) == 2
    err = capsys.readouterr().err
    assert "--episodes is for --worker; --trainer does not use it" in err
    assert "--json is for --status; --trainer does not use it" in err
    assert main(["--demo", "--config", str(ROOT / "config.json"), "--trainer-port", "56555"]) == 2
    assert ("--trainer-port is for --server and --trainer; --demo does not use it (it picks free ports on localhost)"
            in capsys.readouterr().err)
    # a server has no run: `--server --run-name expB` served run B the samples run A left in the server's spool
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
    assert "--keys-dir is for --server, --worker, --trainer, --demo and --keygen; --status does not use it\n" in err
    assert main(["--plot", str(ROOT), "--run-name", "x", "--keys-dir", "k"]) == 2
    err = capsys.readouterr().err
    assert ("--run-name is for --worker, --trainer and --demo; --plot does not use it (give the run as --plot RUN)\n"
            in err)
    assert "--keys-dir is for --server, --worker, --trainer, --demo and --keygen; --plot does not use it\n" in err


def test_plot_of_an_empty_name_is_a_usage_error_not_a_trainer(capsys: pytest.CaptureFixture[str]) -> None:
    # `--plot "$RUN"` with RUN unset: "" is false, so no role was set, and run_role() fell through to the trainer
    assert main(["--plot", "", "--config", str(ROOT / "config.json")]) == 2
    assert capsys.readouterr().err == ('netrl: invalid command line (1 problem)\n  --plot needs a run name, a run '
                                       'folder or a CSV file (got "")\n')
    from netrl.__main__ import run_role

    with pytest.raises(ValueError, match="unknown role 'plot': run_role runs server, worker, trainer, demo"):
        run_role("plot", Config(), threading.Event())


OWN_PIPELINE = '''
import gymnasium, numpy as np
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.memory import ReplayMemory
from netrl.pipelines.base import Pipeline
from netrl.util import partial


class Drift(gymnasium.Env):
    """The user's env: its one setting comes from config.json's env.kwargs."""
    observation_space = gymnasium.spaces.Box(-10, 10, (2,), np.float32)
    action_space = gymnasium.spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self, drift):
        self.drift, self.t = drift, 0

    def reset(self, seed=None, options=None):
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([self.drift, self.t / 10], np.float32)
        return obs, -float(abs(action[0] - self.drift)), False, self.t >= 5, {}


def build(cfg):
    return Pipeline(env_cls=partial(Drift, drift=cfg.env.kwargs["drift"]),
                    actor_module_cls=partial(MLPActor, hidden_sizes=(8,)), memory_cls=ReplayMemory,
                    training_agent_cls=partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(8,))))


def not_a_pipeline(cfg):
    return {"env_cls": Drift}
'''


def test_config_json_runs_your_own_classes_through_a_module_function_pipeline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from netrl.pipelines.make import make_pipeline
    from netrl.trainer.trainer import Trainer
    from netrl.worker.worker import RolloutWorker

    (tmp_path / "my_pipeline.py").write_text(OWN_PIPELINE)
    monkeypatch.syspath_prepend(str(tmp_path))  # what `python -m netrl` does for the folder it starts in
    cfg = config_from_dict({"env": {"pipeline": "my_pipeline:build", "kwargs": {"drift": 0.5}},
                            "weights_folder": str(tmp_path / "weights"), "security": "none"})
    pipeline = make_pipeline(cfg)
    worker = RolloutWorker.from_config(cfg, pipeline)
    worker.standalone = True
    episode = worker.run_episode()  # the user's env, with config.json's kwargs, driven by the user's actor class
    assert episode.length == 5 and type(worker.env).__name__ == "Drift" and worker.env.drift == 0.5
    worker.close()
    trainer = Trainer.from_config(cfg, pipeline)
    training = trainer.training_cls()
    assert training.env_cls is pipeline.env_cls and training.memory_cls is pipeline.memory_cls
    assert problems({"env": {"pipeline": "my pipeline"}}) == [
        'env.pipeline must be "gym", "drone", "image", or "module:function" naming a function of the config that '
        'returns a netrl.pipelines.Pipeline (got "my pipeline")']
    for name, error in [("no_such_module:build", r"cannot import no_such_module \(No module named 'no_such_module'\); "
                                                 r"start netrl from the folder that holds it"),
                        ("my_pipeline:nothing", r"my_pipeline has no function nothing"),
                        ("my_pipeline:not_a_pipeline", r"not_a_pipeline\(cfg\) returned a dict, not a "
                                                       r"netrl\.pipelines\.Pipeline")]:
        with pytest.raises(ConfigError, match=rf'env\.pipeline "{name}": {error}'):
            make_pipeline(config_from_dict({"env": {"pipeline": name}}))
    (tmp_path / "needs_dep.py").write_text("import some_missing_dependency\n")
    with pytest.raises(ModuleNotFoundError, match="some_missing_dependency"):  # the user's own import: a traceback
        make_pipeline(config_from_dict({"env": {"pipeline": "needs_dep:build"}}))
    assert problems({"env": {"pipeline": "drone", "kwargs": {"a": 1}}}) == [
        'env.kwargs is only used by the "gym" pipeline and by your own ones (env.pipeline is "drone")']


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


def test_the_gym_pipeline_takes_module_colon_env_id_as_its_own_error_advises(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # gymnasium.spec() neither imports nor strips a "module:" prefix, so the gym pipeline refused the form its own
    # error message suggests, which GenericGymEnv (gymnasium.make) accepts.
    (tmp_path / "my_robot_envs.py").write_text(
        "import gymnasium\n"
        "gymnasium.register(id='MyPendulum-v0', entry_point='gymnasium.envs.classic_control:PendulumEnv')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from netrl.pipelines.make import make_pipeline

    pipeline = make_pipeline(config_from_dict({"env": {"id": "my_robot_envs:MyPendulum-v0"}}))
    env = pipeline.env_cls()
    assert env.action_space.shape == (1,)
    env.close()
    with pytest.raises(ConfigError, match=r'env\.id "no_such_module:MyPendulum-v0" names the module "no_such_module" '
                                          r"to import first, which does not import \(No module named"):
        make_pipeline(config_from_dict({"env": {"id": "no_such_module:MyPendulum-v0"}}))
