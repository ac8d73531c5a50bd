"""The command line's flags: the parser (one flag per role, and the flags that override config.json
keys), which roles use which flag, and the overrides and problems the flags given make.

Nothing here runs a role or reads a file: ``netrl.__main__`` parses with :func:`parse_args`, hands
:func:`flag_overrides` to :func:`netrl.config.load.load_config`, and reports the problems of
:func:`flag_overrides` and :func:`misused_flags` with the config file's, all at once.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from netrl import __version__
from netrl.config.load import check_value
from netrl.config.sections import FLAG_KEYS, describe_fields
from netrl.protocol.messages import PEER_NAME, PEER_NAME_RULE

__all__ = ["flag_overrides", "misused_flags", "parse_args", "parser", "worker_names"]


def parser() -> argparse.ArgumentParser:
    """``python -m netrl``'s parser; its epilog lists every config.json key."""
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
    role.add_argument("--revoke", metavar="NAME",
                      help="revoke worker key (or name) NAME on the running server: its "
                           "connections are dropped, its HELLOs refused, its rows dropped by "
                           "the trainer (uses the trainer's keys; --reason says why)")
    role.add_argument("--unrevoke", metavar="NAME",
                      help="lift the revocation of worker key (or name) NAME on the running "
                           "server: it may connect again (uses the trainer's keys)")
    role.add_argument("--lift", metavar="NAME",
                      help="end worker NAME's quarantine on the running trainer (through the "
                           "server): its rows kept aside go into the replay memory (uses the "
                           "trainer's keys)")
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
    p.add_argument("--bind-ip",
                   help="interface the server binds, e.g. 0.0.0.0 (server.bind_ip)")
    p.add_argument("--trainer-port", type=int,
                   help="server port for the trainer (network.trainer_port)")
    p.add_argument("--worker-port", type=int,
                   help="server port for workers (network.worker_port)")
    p.add_argument("--status-port", type=int,
                   help="loopback port the server answers --status on, and the port --status asks "
                        "(server.status_port)")
    p.add_argument("--run-name", help="run name; outputs go to "
                                      "<weights_folder>/<run_name>/ (run_name)")
    p.add_argument("--worker-id", help="this worker's name in logs, status and its file "
                                       "names (worker.worker_id; default: the host name)")
    p.add_argument("--wandb", choices=["offline", "online", "disabled"],
                   help="wandb mode (wandb.mode)")
    p.add_argument("--epochs", type=int, help="epochs to train (trainer.epochs; default: "
                                              "until stopped)")
    p.add_argument("--total-frames", type=int, help="stop training once this many env steps "
                                                    "have arrived (trainer.total_frames)")
    p.add_argument("--episodes", type=int, help="worker: run this many "
                                                "training episodes, then stop")
    p.add_argument("--workers", default="",
                   help="keygen: comma-separated names of workers that get their own key")
    p.add_argument("--keys-dir", help="folder of CURVE keys (keys_dir)")
    p.add_argument("--json", action="store_true", help="status: print JSON instead of a table")
    p.add_argument("--reason", default="", help="revoke, unrevoke, lift: why, logged (and, for "
                                                 "revoke, shown to the worker)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="logging level (default INFO)")
    p.add_argument("--version", action="version", version=f"netrl {__version__}")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line ``argv`` (None: ``sys.argv``) parsed; ``args.role`` names the role, "plot"
    for ``--plot RUN``. Usage errors exit with code 2, as argparse does."""
    args = parser().parse_args(argv)
    # `--plot ""` (an unset shell variable) too, which would otherwise leave no role
    if args.plot is not None:
        args.role = "plot"
    for operator in ("revoke", "unrevoke", "lift"):  # each takes the worker's name
        if getattr(args, operator) is not None:
            args.role = operator
    return args


# The operator's commands on a running server: they ask on its trainer port, with the trainer's keys
_OPERATOR = ("revoke", "unrevoke", "lift")
# Flags that only some roles use: given to another, they would be ignored without a word, and
# the user misled (a `--server --run-name B` is no server for run B: its spool, with run A's
# samples, goes to run B's trainer).
_FLAG_ROLES = {"episodes": ("worker",), "workers": ("keygen",), "json": ("status",),
               "reason": _OPERATOR,
               "bind_ip": ("server",), "worker_id": ("worker",), "epochs": ("trainer", "demo"),
               "total_frames": ("trainer", "demo"), "wandb": ("trainer", "demo"),
               "server_ip": ("worker", "trainer", *_OPERATOR),
               "trainer_port": ("server", "trainer", *_OPERATOR),
               "worker_port": ("server", "worker"), "status_port": ("server", "status"),
               "run_name": ("worker", "trainer", "demo"),
               "keys_dir": ("server", "worker", "trainer", "demo", "keygen", *_OPERATOR)}
# Why a role does not use a flag, where that is not plain
_FREE_PORTS = "it picks free ports on localhost"
_WHY_NOT = {("demo", "server_ip"): _FREE_PORTS, ("demo", "trainer_port"): _FREE_PORTS,
            ("demo", "worker_port"): _FREE_PORTS, ("demo", "status_port"): _FREE_PORTS,
            ("plot", "run_name"): "give the run as --plot RUN",
            ("server", "run_name"): "a server serves every run: its "
                                    "spool, server.spool_dir (default "
                                    "<weights_folder>/server-spool), is shared by them all"}


def misused_flags(args: argparse.Namespace) -> list[str]:
    """A problem for ``--plot`` without a run, and one for each flag given that the chosen role
    does not use."""
    problems = []
    if args.plot is not None and not args.plot.strip():
        problems.append(f"--plot needs a run name, a run folder or a "
                        f"CSV file (got {json.dumps(args.plot)})")
    # a key's name, as the server's allow-lists and logs spell it
    for operator in _OPERATOR:
        name = getattr(args, operator)
        if name is not None and not PEER_NAME.fullmatch(name):
            problems.append(f"--{operator} {json.dumps(name)} is not a worker key or name "
                            f"({PEER_NAME_RULE})")
    for flag, roles in _FLAG_ROLES.items():
        if getattr(args, flag) in (None, "", False) or args.role in roles:
            continue
        names = [f"--{r}" for r in roles]
        either = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        why = _WHY_NOT.get((args.role, flag))
        problems.append(f"--{flag.replace('_', '-')} is for {either}; --{args.role} does not use it"
                        + (f" ({why})" if why else ""))
    return problems


def flag_overrides(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """(dotted config key -> value for each flag given, problems with the flags' values).

    Each value is checked here, on its own, so that a bad flag is reported as the flag, not as
    config.json; a rejected flag is left out of the overrides. (The names of ``--workers`` are
    checked by ``netrl.__main__``: their rule is the CURVE keys', which config does not import.)"""
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
    return overrides, problems


def worker_names(args: argparse.Namespace) -> list[str]:
    """The names in ``--workers robot-1,robot-2`` (spaces around a name and
    empty entries left out)."""
    return [name.strip() for name in args.workers.split(",") if name.strip()]
