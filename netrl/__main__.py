"""Command line: ``python -m netrl --server | --worker | --trainer | --demo | --check-env``.

Loads config.json once, applies the flags, sets up logging (role and pid on every line), maps
SIGINT and SIGTERM (and SIGHUP) to a stop event, and runs the role. Exit codes: 0 done, 1 runtime
error, 2 invalid config or usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netrl import __version__

# Only the standard library at the top: a Ctrl+C while this module imports is outside main()'s
# try, and netrl.config imports numpy (a tenth of a second); everything of netrl's own is imported
# inside the functions that need it.
if TYPE_CHECKING:
    from netrl.config.sections import Config

log = logging.getLogger("netrl")

ROLES = ("server", "worker", "trainer", "demo")


def _parser() -> argparse.ArgumentParser:
    from netrl.config.sections import describe_fields

    keys = "\n".join(f"  {k:<44} {d:<12} {h}" for k, d, h in describe_fields())
    p = argparse.ArgumentParser(
        prog="python -m netrl",
        description="netrl: distributed real-time RL. Run --server where the "
                    "others can reach it, --worker on each robot or game PC, "
                    "--trainer on the GPU box, or --demo for all three on localhost.",
        epilog=f"config.json keys (key, default, meaning):\n{keys}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    role = p.add_mutually_exclusive_group(required=True)
    role.add_argument("--server", action="store_const", const="server", dest="role",
                      help="relay samples from workers to the trainer and weights back")
    role.add_argument("--worker", action="store_const", const="worker", dest="role",
                      help="run the policy in the env and send samples")
    role.add_argument("--trainer", action="store_const", const="trainer", dest="role",
                      help="train on received samples and publish weights")
    role.add_argument("--demo", action="store_const", const="demo", dest="role",
                      help="start a server, a trainer and a worker on localhost "
                           "with config.json's pipeline (Pendulum-v1 by default)")
    role.add_argument("--keygen", action="store_const", const="keygen", dest="role",
                      help="create CURVE keys in keys_dir: server, "
                           "trainer, a shared worker key, and --workers")
    role.add_argument("--status", action="store_const", const="status", dest="role",
                      help="print the snapshot of the server "
                           "running on this machine (--json for JSON)")
    role.add_argument("--plot", metavar="RUN",
                      help="render run RUN's learning curve and throughput to a PNG")
    role.add_argument("--check-env", action="store_const", const="check_env", dest="role",
                      help="build the pipeline's env, run it with random actions "
                           "through the sample compressor, the packet checks and the "
                           "memory, and report every mismatch (exit code 0, or 2)")
    p.add_argument("--config", default="config.json",
                   help="path of the config file (default: ./config.json)")
    p.add_argument("--server-ip", help="address workers and the trainer "
                                       "connect to (network.server_ip)")
    p.add_argument("--bind-ip", help="interface the server binds, e.g. 0.0.0.0 (server.bind_ip)")
    p.add_argument("--trainer-port", type=int,
                   help="server port for the trainer (network.trainer_port)")
    p.add_argument("--worker-port", type=int, help="server port for workers (network.worker_port)")
    p.add_argument("--run-name", help="run name; outputs go to "
                                      "<weights_folder>/<run_name>/ (run_name)")
    p.add_argument("--worker-id", help="this worker's name in logs, status and its file "
                                       "names (worker.worker_id; default: the host name)")
    p.add_argument("--wandb", choices=["offline", "online", "disabled"], help="wandb mode (wandb.mode)")
    p.add_argument("--epochs", type=int, help="epochs to train (trainer.epochs)")
    p.add_argument("--episodes", type=int, help="worker: run this many "
                                                "training episodes, then stop")
    p.add_argument("--workers", default="",
                   help="keygen: comma-separated names of workers that get their own key")
    p.add_argument("--keys-dir", help="folder of CURVE keys (keys_dir)")
    p.add_argument("--json", action="store_true", help="status: print JSON instead of a table")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="logging level (default INFO)")
    p.add_argument("--version", action="version", version=f"netrl {__version__}")
    return p



# Flags that only some roles use: given to another, they would be ignored without a word, and
# the user misled (a `--server --run-name B` is no server for run B: its spool, with run A's
# samples, goes to run B's trainer).
_FLAG_ROLES = {"episodes": ("worker",), "workers": ("keygen",), "json": ("status",), "bind_ip": ("server",),
               "worker_id": ("worker",), "epochs": ("trainer", "demo"), "wandb": ("trainer", "demo"),
               "server_ip": ("worker", "trainer"), "trainer_port": ("server", "trainer"),
               "worker_port": ("server", "worker"), "run_name": ("worker", "trainer", "demo"),
               "keys_dir": ("server", "worker", "trainer", "demo", "keygen")}
# Why a role does not use a flag, where that is not plain
_FREE_PORTS = "it picks free ports on localhost"
_WHY_NOT = {("demo", "server_ip"): _FREE_PORTS, ("demo", "trainer_port"): _FREE_PORTS,
            ("demo", "worker_port"): _FREE_PORTS, ("plot", "run_name"): "give the run as --plot RUN",
            ("server", "run_name"): "a server serves every run: its "
                                    "spool, server.spool_dir (default "
                                    "<weights_folder>/server-spool), is shared by them all"}


def _flags_for_other_roles(args: argparse.Namespace) -> list[str]:
    """A problem for each flag given that the chosen role does not use."""
    problems = []
    for flag, roles in _FLAG_ROLES.items():
        if getattr(args, flag) in (None, "", False) or args.role in roles:
            continue
        names = [f"--{r}" for r in roles]
        either = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        why = _WHY_NOT.get((args.role, flag))
        problems.append(f"--{flag.replace('_', '-')} is for {either}; --{args.role} does not use it"
                        + (f" ({why})" if why else ""))
    return problems


def _flag_overrides(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """(dotted config key -> value for each flag given, problems with the flags' values).

    Each value is checked here, on its own, so that a bad flag is reported as the flag, not as
    config.json; a rejected flag is left out of the overrides."""
    from netrl.config.load import check_value
    from netrl.config.sections import FLAG_KEYS

    overrides: dict[str, Any] = {}
    problems: list[str] = []
    for flag, key in FLAG_KEYS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        problem = check_value(key, value)
        if problem:
            problems.append(f"--{flag.replace('_', '-')} {problem} (got {json.dumps(value)})")
        else:
            overrides[key] = value
    if args.episodes is not None and args.episodes < 1:
        problems.append(f"--episodes must be >= 1 (got {args.episodes}); "
                        f"leave it out to run until stopped")
    # here, not in keygen: a bad name is then a usage error (exit 2) that names the flag
    if args.role == "keygen":
        from netrl.net.keys import worker_name_problem

        problems += [f"--workers {json.dumps(name)} {problem}" for name in _worker_names(args)
                     if (problem := worker_name_problem(name))]
    return overrides, problems


def _worker_names(args: argparse.Namespace) -> list[str]:
    """The names in ``--workers robot-1,robot-2`` (spaces around a name and
    empty entries left out)."""
    return [name.strip() for name in args.workers.split(",") if name.strip()]


def setup_logging(role: str, level: str) -> None:
    """One handler on the root logger, with role and pid in every line (only ever called here).

    Roles log to stdout; ``--status`` logs to stderr so that its table or JSON is
    all that stdout carries."""
    handler = logging.StreamHandler(sys.stderr if role == "status" else sys.stdout)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s.%(msecs)03d %(levelname).1s [{role} %(process)d] %(name)s: %(message)s",
        "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("wandb", "urllib3", "git"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def install_stop_signals(stop: threading.Event) -> None:
    """First SIGINT/SIGTERM/SIGHUP sets ``stop`` for a clean shutdown; a second SIGINT interrupts at
    once. (SIGHUP: the terminal or ssh session the role runs in closed; its default action would
    end a trainer without its checkpoint and a worker without delivering its backlog.)"""

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    if hasattr(signal, "SIGHUP"):  # (not on Windows)
        signal.signal(signal.SIGHUP, handler)


def watch_launcher(stop: threading.Event, grace_s: float = 0.0) -> None:
    """A role started by :func:`netrl.launch.spawn_role` (the demo's, a benchmark's) stops cleanly
    once the process that started it is gone, however it went (SIGKILL, a crash): its roles run in
    their own sessions, so no signal reaches them then, and they would run on for ever, holding
    their folders against the next start. A server waits ``grace_s`` first, as the demo stops it
    last: its workers deliver what they hold before it goes."""
    from netrl.launch import LAUNCHER_ENV

    launcher = os.environ.pop(LAUNCHER_ENV, None)  # not for processes this one starts
    if launcher is None or not launcher.isdigit():
        return

    def watch() -> None:
        while not stop.wait(0.5):
            if os.getppid() != int(launcher):
                log.warning("the process that started this one (pid %s) is gone: stopping%s",
                            launcher,
                            f" in {grace_s:.0f} s" if grace_s else "")
                stop.wait(grace_s)
                stop.set()
                return

    threading.Thread(target=watch, name="netrl-launcher-watch", daemon=True).start()


def configure_torch(cfg: Config, role: str) -> None:
    """Every process that runs torch uses ``torch_threads`` threads (1 by default: 2 cores, 2
    busy processes). Only the role's own device is checked: one config.json serves a GPU
    trainer and CPU-only workers."""
    import torch

    from netrl.errors import ConfigError

    wanted = {"worker.device": cfg.worker.device} if role == "worker" else {"trainer.device": cfg.trainer.device}
    if role == "trainer":
        from netrl.memory.device import check_storage_device

        check_storage_device(cfg.memory.device)  # refused here, before the trainer connects
    missing = [f'{key} is "{device}", but this torch {torch.__version__} has no '
               f'{"CUDA" if device.startswith("cuda") else "MPS"} device; '
               f'use "cpu" (or null for the trainer)'
               for key, device in wanted.items()
               if device and ((device.startswith("cuda") and not torch.cuda.is_available())
                              or (device == "mps" and not torch.backends.mps.is_available()))]
    if missing:
        raise ConfigError(missing)
    torch.set_num_threads(cfg.torch_threads)
    if cfg.seed is not None:
        torch.manual_seed(cfg.seed)


def folders_used(role: str, cfg: Config) -> str:
    """The absolute folders ``role`` uses, for its first log line: relative paths in config.json
    are relative to the folder netrl starts in (as in tmrl), not to the config file, so the
    same --config started elsewhere quietly starts a new run, or finds no keys."""
    folders = [("spool folder", cfg.server_spool_dir) if role == "server" else ("run folder", cfg.run_dir)]
    if cfg.security == "curve":
        folders.append(("keys folder", Path(cfg.keys_dir)))
    return ", ".join(f"{what} {os.path.abspath(path)}" for what, path in folders)


def run_keygen(cfg: Config, workers: list[str]) -> None:
    from netrl.net.keys import keygen

    written = keygen(cfg.keys_dir, workers)
    for path in written:
        log.info("wrote %s", path)
    log.info("keys in %s/: keep server/ on the server, copy trainer/ to the trainer "
             "machine and workers/<name>/ to each worker (see docs/security.md)%s",
             os.path.abspath(cfg.keys_dir),
             "" if written else "; nothing new")


def run_role(role: str, cfg: Config, stop: threading.Event, config_path: str = "config.json",
             episodes: int | None = None) -> None:
    """Run ``role`` (one of :data:`ROLES`) until it ends or ``stop`` is set.

    Raises:
        ValueError: ``role`` is not one of :data:`ROLES` (checked first: the last
            branch runs a trainer).
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: run_role runs {', '.join(ROLES)}")
    if cfg.security == "none" and role in ("worker", "trainer"):
        log.warning("SECURITY IS OFF (\"security\": \"none\"): this %s talks to "
                    "the server unencrypted and unauthenticated; anyone on "
                    "the path can read or forge its traffic", role)
    if role == "server":  # the server never imports torch: it only moves bytes
        from netrl.server.server import Server

        Server.from_config(cfg).run(stop)
        return
    if role == "demo":
        from netrl.launch import run_demo

        run_demo(cfg, config_path, stop, logging.getLevelName(logging.getLogger().level))
        return
    configure_torch(cfg, role)
    from netrl.pipelines.make import make_pipeline

    pipeline = make_pipeline(cfg)
    if role == "worker":
        from netrl.errors import NetrlError
        from netrl.worker.worker import RolloutWorker

        worker = RolloutWorker.from_config(cfg, pipeline)
        worker.run(cfg.worker.test_episode_interval, episodes, stop=stop)
        # e.g. --episodes N with the server unreachable: a script must see it
        if worker.samples_unacknowledged:
            raise NetrlError(f"worker {worker.worker_id} stopped with "
                             f"{worker.samples_unacknowledged} samples the server had not "
                             f"acknowledged (see the warnings above): it had neither spooled "
                             f"them nor delivered them to the trainer, so they may be lost")
    else:  # (the trainer: ROLES holds no other)
        from netrl.trainer.trainer import Trainer

        Trainer.from_config(cfg, pipeline).run(stop)


def run_status(cfg: Config, stop: threading.Event, config_path: str, as_json: bool) -> None:
    """``--status``: the snapshot of the server on this machine, as a table or JSON."""
    from netrl.monitor.status import dump_json, format_status, query_status

    snapshot = query_status(cfg.server.status_port, stop=stop)
    ports, mine = snapshot.get("ports") or {}, {"trainer": cfg.network.trainer_port,
                                                 "worker": cfg.network.worker_port}
    # e.g. another server on this machine with the same server.status_port
    if ports and ports != mine:
        log.warning("the server on status port %d listens on trainer port %s and worker "
                    "port %s, not the %d and %d of %s: another server (each needs its own "
                    "server.status_port), or one started with --trainer-port/--worker-port",
                    cfg.server.status_port, ports.get("trainer"),
                    ports.get("worker"), mine["trainer"], mine["worker"], config_path)
    try:
        print(dump_json(snapshot) if as_json else format_status(snapshot), flush=True)
    except BrokenPipeError:  # e.g. `--status --json | head`: the reader has all it wanted
        # or the exit flush fails again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def run_check_env(cfg: Config) -> int:
    """``--check-env``: the pipeline's env through everything its samples meet (see
    :mod:`netrl.envs.preflight`); the report goes to stdout. 0 when nothing is wrong, else 2 (a
    problem of the env or its config)."""
    from netrl.envs.checks import value_limits
    from netrl.envs.preflight import preflight
    from netrl.pipelines.make import make_pipeline
    from netrl.protocol.schema import WireRoute

    configure_torch(cfg, "worker")
    pipeline = make_pipeline(cfg)
    route = WireRoute(cfg.worker.compression,
                      lambda obs, act: value_limits(obs, act, cfg.trainer.max_abs_reward))
    report = preflight(pipeline.env_cls, pipeline.sample_compressor, pipeline.memory_cls, pipeline.overlap,
                       seed=cfg.seed if cfg.seed is not None else 0, through_wire=route)
    print(report.format(), flush=True)
    return 0 if report.ok else 2


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    # before the signal handlers are in place (the first moments), or after they are gone
    except KeyboardInterrupt:
        print("netrl: interrupted", file=sys.stderr)
        return 1


def _main(argv: Sequence[str] | None) -> int:
    from netrl.config.load import load_config
    from netrl.errors import ConfigError, NetrlError

    args = _parser().parse_args(argv)
    # `--plot ""` (an unset shell variable) too, which would otherwise leave no role
    if args.plot is not None:
        args.role = "plot"
    overrides, flag_problems = _flag_overrides(args)
    if args.plot is not None and not args.plot.strip():
        flag_problems.append(f"--plot needs a run name, a run folder or a "
                             f"CSV file (got {json.dumps(args.plot)})")
    flag_problems += _flags_for_other_roles(args)
    errors = [ConfigError(flag_problems, "command line")] if flag_problems else []
    # --plot of a folder or file, and --keygen with --keys-dir, need nothing from a config file:
    # without one, the defaults do (a missing config.json is an error for every other use)
    self_contained = (args.role == "plot" and Path(args.plot).exists()) or (args.role == "keygen" and args.keys_dir)
    if args.role == "plot" and not self_contained and not Path(args.config).exists():
        errors.append(ConfigError([f"--plot {args.plot}: no such run folder or CSV file "
                                   f"here, and no {args.config} to find a run of that "
                                   f"name under its weights_folder"], "command line"))
    try:
        cfg = load_config(None if self_contained or (args.role == "plot" and not Path(args.config).exists())
                          else args.config, overrides, args.role)
    except ConfigError as exc:
        errors.append(exc)
    if errors:  # the flags' problems and the file's, all at once
        for error in errors:
            print(f"netrl: {error}", file=sys.stderr)
        return 2
    setup_logging(args.role, "WARNING" if args.role == "status" else args.log_level)
    stop = threading.Event()
    install_stop_signals(stop)
    watch_launcher(stop, grace_s=3.0 if args.role == "server" else 0.0)
    try:
        if args.role == "keygen":
            run_keygen(cfg, _worker_names(args))
        elif args.role == "status":
            run_status(cfg, stop, args.config, args.json)
        elif args.role == "check_env":
            return run_check_env(cfg)
        elif args.role == "plot":
            from netrl.monitor.plot import plot_run

            # a run folder, one of its CSV files, or a run name under weights_folder
            given = Path(args.plot)
            run_dir = given if given.is_dir() else given.parent if given.is_file() else Path(cfg.weights_folder) / given
            log.info("wrote %s", plot_run(run_dir))
        else:
            log.info("%s", folders_used(args.role, cfg))
            run_role(args.role, cfg, stop, args.config, args.episodes)
    # found once the role started (a device, an env id): still a config problem
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    except NetrlError as exc:
        log.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        log.warning("interrupted")
        return 1
    log.info("%s exited cleanly (pid %d)", args.role, os.getpid())
    return 0


def program() -> int:
    """``python -m netrl`` and the ``netrl`` command: main(), then, once it has returned, a Ctrl+C
    while Python shuts down (joining threads, atexit hooks) ends the process at once with main()'s
    exit code, instead of a KeyboardInterrupt traceback or exit code 130 for work already done.
    In-process callers of main() keep their own SIGINT handling.

    The ``netrl`` command puts the folder it starts in on the import path first, as
    ``python -m netrl`` does, so that config.json's ``env.pipeline`` ("module:function") finds the
    user's module the same way under both."""
    try:
        here = os.getcwd()
    except OSError:  # started in a folder since deleted: nothing to import from there
        here = None
    if here is not None and here not in sys.path:
        sys.path.insert(0, here)
    code = main()

    def handler(signum: int, frame: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: nothing left to save
                pass
        os._exit(code)

    signal.signal(signal.SIGINT, handler)
    return code


if __name__ == "__main__":
    sys.exit(program())
