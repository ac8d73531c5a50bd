"""Config: defaults, the shipped config.json, and the error text for bad configs (all problems at once)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from netrl.__main__ import main
from netrl.config.load import config_from_dict, config_to_dict, load_config
from netrl.config.sections import Config, describe_fields
from netrl.errors import ConfigError
from tests.fakes import OWN_PIPELINE

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
        "agent": {"sac": {"learn_entropy_coef": "yes"}},
        "worker": {"compression": "gzip", "worker_id": "robot 1"},
    })
    assert found == [
        "seed must be >= 0 (got -1)",  # gymnasium and numpy refuse it: a traceback once the role starts
        "trainer.steps must be >= 1 (got -3)",
        "trainer.max_training_steps_per_env_step must be > 0 (got 0)",
        'unknown key "memory.capasity"',  # nothing close enough to suggest
        "network.worker_port must be a TCP port between 1 and 65535 (got 70000)",
        'network.server_ip must be a string (got 5)',
        "network.handshake_timeout_s must be > 0 and at most 86400 (a day) (got 3000000.0)",  # int32 milliseconds
        'env.pipeline must be "gym", "drone", "image", or "module:function" naming a function of the config that '
        'returns a netrl.pipelines.Pipeline (got "atari")',
        'wandb.mode must be "auto" or "offline" or "online" or "disabled" (got "loud")',
        'agent.sac.learn_entropy_coef must be true or false (got "yes")',
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
        "trainer.epochs must be an integer or null (got 2.5)",  # null: until stopped
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
    # unchecked, 300 characters would pass, then stop the role with "OSError: File name too long" making the folder
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
    # worker.flush_timeout_s 1e12 would stop the worker with OverflowError (beyond threading.TIMEOUT_MAX) at its end
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
    # unchecked, "afile/spool" would fail only when the server starts, without naming the key; "" would mean null
    afile = tmp_path / "afile"
    afile.write_text("")
    assert problems({"server": {"spool_dir": str(afile / "spool")}}) == [
        f'server.spool_dir lies inside {afile}, which is a file (got "{afile / "spool"}")']
    assert problems({"server": {"spool_dir": ""}}) == [
        'server.spool_dir must not be empty (null: the default) (got "")']
    assert config_from_dict({"server": {"spool_dir": None}}).server_spool_dir == Path("weights/server-spool")


def test_a_leading_tilde_in_a_folder_is_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # JSON has no shell to expand it: unexpanded, "~/netrl-keys" would make a folder named "~" in the current one
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
    # deep enough to parse, but it would overflow the stack when a trainer saves its config beside its checkpoints
    deep.write_text('{"env": {"kwargs": {"a": ' + "[" * 500 + "]" * 500 + "}}}")
    with pytest.raises(ConfigError) as info:
        load_config(deep)
    assert info.value.problems == ["env.kwargs nests objects and lists more than 32 levels deep; no setting needs "
                                   "that many"]


def test_error_message_counts_problems() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict({"trainer": {"steps": 0}, "x": 1}, "config.json")
    assert str(info.value).splitlines()[0] == "invalid config.json (2 problems)"


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


def test_a_run_folder_that_is_the_server_spool_folder_is_refused() -> None:
    # run_name "server-spool" would make the trainer find the server's lock on its run folder and blame a second one
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
    worker = RolloutWorker.from_config(cfg, pipeline, standalone=True)
    with pytest.raises(AttributeError, match=r"RolloutWorker\.standalone is a setting, fixed when the worker is built"):
        worker.standalone = False  # the parts took it when built: a later change would reach only some
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


def test_the_gym_pipeline_takes_module_colon_env_id_as_its_own_error_advises(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # gymnasium.spec() neither imports nor strips a "module:" prefix: a gym pipeline that passed the name to it as
    # it is would refuse the form its own error message suggests, which GenericGymEnv (gymnasium.make) accepts.
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
