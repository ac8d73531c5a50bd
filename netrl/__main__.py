"""Command line: ``python -m netrl --server | --worker | --trainer | --demo | --check-env``.

Loads config.json once, applies the flags (parsed and checked by :mod:`netrl.config.flags`), sets
up logging (role and pid on every line), maps SIGINT and SIGTERM (and SIGHUP) to a stop event, and
runs the role. Exit codes: 0 done, 1 runtime error, 2 invalid config or usage.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Only the standard library at the top: a Ctrl+C while this module imports is outside main()'s
# try, and netrl.config imports numpy (a tenth of a second); everything of netrl's own is imported
# inside the functions that need it.
if TYPE_CHECKING:
    from netrl.config.sections import Config

log = logging.getLogger("netrl")

ROLES = ("server", "worker", "trainer", "demo")


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

    wanted = ({"worker.device": cfg.worker.device} if role == "worker"
              else {"trainer.device": cfg.trainer.device})
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
    folders = [("spool folder", cfg.server_spool_dir) if role == "server"
               else ("run folder", cfg.run_dir)]
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


def run_revoke(cfg: Config, stop: threading.Event, name: str, reason: str) -> None:
    """``--revoke NAME``: the running server drops worker key (or name) NAME's links and refuses
    it from now on; the trainer drops its rows. Asked on the trainer port with the trainer's keys
    (see :mod:`netrl.server.revocation`)."""
    from netrl.net.keys import client_keys
    from netrl.server.revocation import ask_revoke

    keys = client_keys(cfg.keys_dir, "trainer", "trainer") if cfg.security == "curve" else None
    answer = ask_revoke(cfg.network.server_ip, cfg.network.trainer_port, name, reason, keys,
                        stop=stop)
    print(f"revoked {name!r}: {answer.get('links', 0)} connection(s) dropped; "
          f"{answer.get('reason', '')}", flush=True)


def run_operator(cfg: Config, stop: threading.Event, what: str, name: str, reason: str) -> int:
    """``--unrevoke NAME`` (the server lifts a revocation) or ``--lift NAME`` (the trainer ends a
    quarantine, through the server), with the trainer's keys; the answer is printed. 0 when it was
    done, 1 when NAME was not revoked or quarantined."""
    from netrl.net.keys import client_keys
    from netrl.protocol.messages import Message, MsgType
    from netrl.server.revocation import ask_operator, ask_revoke
    from netrl.server.standing import LIFT_TIMEOUT_S

    keys = client_keys(cfg.keys_dir, "trainer", "trainer") if cfg.security == "curve" else None
    net = cfg.network
    if what == "unrevoke":
        answer = ask_revoke(net.server_ip, net.trainer_port, name, reason, keys, stop=stop,
                            undo=True)
    else:
        body = {"worker": name, "reason": reason} if reason else {"worker": name}
        answer = ask_operator(net.server_ip, net.trainer_port,
                              Message(MsgType.LIFT, "operator", body=body), keys,
                              timeout_s=LIFT_TIMEOUT_S + 5.0, stop=stop)
    print(answer.get("reason", ""), flush=True)
    return 0 if answer.get("was") else 1


def run_check_env(cfg: Config) -> int:
    """``--check-env``: the pipeline's env through everything its samples meet (see
    :mod:`netrl.envs.preflight`); the report goes to stdout. 0 when nothing is wrong, else 2 (a
    problem of the env or its config)."""
    from netrl.envs.checks import value_limits
    from netrl.envs.preflight import preflight
    from netrl.pipelines.make import make_pipeline
    from netrl.protocol.schema import WireRoute
    from netrl.samples.info import info_spec
    from netrl.training.plausibility import reward_bound

    configure_torch(cfg, "worker")
    pipeline = make_pipeline(cfg)
    route = WireRoute(cfg.worker.compression,
                      lambda obs, act: value_limits(obs, act, reward_bound(
                          cfg.trainer.max_abs_reward, None)), info_spec(pipeline.info_keys))
    report = preflight(pipeline.env_cls, pipeline.sample_compressor, pipeline.memory_cls,
                       pipeline.overlap, seed=cfg.seed if cfg.seed is not None else 0,
                       through_wire=route, info_keys=pipeline.info_keys)
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
    from netrl.config.flags import flag_overrides, misused_flags, parse_args, worker_names
    from netrl.config.load import load_config
    from netrl.errors import ConfigError, NetrlError

    args = parse_args(argv)
    overrides, flag_problems = flag_overrides(args)
    # here, not in keygen: a bad name is then a usage error (exit 2) that names the flag; and not in
    # netrl.config.flags, as the rule is net/'s (the CURVE keys'), above config in the layers
    if args.role == "keygen":
        from netrl.net.keys import worker_name_problem

        flag_problems += [f"--workers {json.dumps(name)} {problem}" for name in worker_names(args)
                          if (problem := worker_name_problem(name))]
    flag_problems += misused_flags(args)
    errors = [ConfigError(flag_problems, "command line")] if flag_problems else []
    # --plot of a folder or file, and --keygen with --keys-dir, need nothing from a config file:
    # without one, the defaults do (a missing config.json is an error for every other use)
    self_contained = ((args.role == "plot" and Path(args.plot).exists())
                      or (args.role == "keygen" and args.keys_dir))
    plot_without_file = args.role == "plot" and not Path(args.config).exists()
    if plot_without_file and not self_contained:
        errors.append(ConfigError([f"--plot {args.plot}: no such run folder or CSV file "
                                   f"here, and no {args.config} to find a run of that "
                                   f"name under its weights_folder"], "command line"))
    try:
        cfg = load_config(None if self_contained or plot_without_file else args.config,
                          overrides, args.role)
    except ConfigError as exc:
        errors.append(exc)
    if errors:  # the flags' problems and the file's, all at once
        for error in errors:
            print(f"netrl: {error}", file=sys.stderr)
        return 2
    quiet = ("status", "revoke", "unrevoke", "lift")  # their answer is what they print
    setup_logging(args.role, "WARNING" if args.role in quiet else args.log_level)
    stop = threading.Event()
    install_stop_signals(stop)
    watch_launcher(stop, grace_s=3.0 if args.role == "server" else 0.0)
    try:
        if args.role == "keygen":
            run_keygen(cfg, worker_names(args))
        elif args.role == "status":
            run_status(cfg, stop, args.config, args.json)
        elif args.role == "revoke":
            run_revoke(cfg, stop, args.revoke, args.reason)
        elif args.role in ("unrevoke", "lift"):
            return run_operator(cfg, stop, args.role, getattr(args, args.role), args.reason)
        elif args.role == "check_env":
            return run_check_env(cfg)
        elif args.role == "plot":
            from netrl.monitor.plot import plot_run

            # a run folder, one of its CSV files, or a run name under weights_folder
            given = Path(args.plot)
            run_dir = (given if given.is_dir() else given.parent if given.is_file()
                       else Path(cfg.weights_folder) / given)
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
    # What the role leaves is garbage only because the process ends, yet Python's shutdown collects
    # it: with torch loaded that took 2-6 s of CPU at load 10 (a demo's Ctrl+C took 6.4 s, 4.3 of
    # them until every role had said it stopped). Frozen, the collector skips it (0.6-0.9 s);
    # atexit hooks and thread joins run as before.
    gc.freeze()

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
