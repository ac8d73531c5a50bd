"""netrl's benchmarks, one entry point, run from the repository root:

    python -m benchmarks <family> [--smoke | --quick] [--json FILE] [the family's options]
    python -m benchmarks <family> --help     what the family measures, against what, its options
    python -m benchmarks --list              the families

Each family measures its figures beside their baselines in the same run. It prints the settings it
runs with, a line per measurement as it goes and, at the end, a table of rows in the one results
format (benchmarks/results.py); ``--json FILE`` writes those rows. ``--smoke`` runs the family's
quickest setting (seconds: it shows the family runs, its figures mean nothing); ``--quick``, where
a family has it, a shorter and noisier run. docs/benchmarks.md lists every figure, the command
that reproduces it, and each old script's equivalent.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from pathlib import Path
from types import FrameType, ModuleType

from benchmarks.results import machine, table, write
from benchmarks.settings import described, resolve
from netrl.util import count_of

FAMILIES: dict[str, tuple[str, str]] = {  # name -> (module, what it measures): one module each
    "relay": ("benchmarks.relay", "samples/s worker -> server -> trainer, against raw ZeroMQ"),
    "broadcast": ("benchmarks.broadcast", "a weight version to every worker, against raw ZeroMQ"),
    "replay": ("benchmarks.replay", "replay batches against tmrl's per-item loop; prioritized"),
    "sequences": ("benchmarks.sequences", "batches of sequences against item by item"),
    "replay_disk": ("benchmarks.replay_disk", "replay columns in memory-mapped files against RAM"),
    "trajectories": ("benchmarks.trajectories", "sequences across packets; prioritized sequences"),
    "overhead": ("benchmarks.overhead", "the trainer's time outside agent.train"),
    "trainer": ("benchmarks.trainer", "SAC steps/s per trainer.compile mode, beside CleanRL's"),
    "prefetch": ("benchmarks.prefetch", "SAC steps/s with trainer.prefetch off and on"),
    "learning": ("benchmarks.learning", "env steps to a return over seeds, against baselines"),
    "pipelines": ("benchmarks.pipelines", "image samples on the wire, the 20 Hz worker loop"),
    "throughput": ("benchmarks.throughput", "env steps/s of many envs per worker"),
    "sync": ("benchmarks.sync", "sync collection: the share of an iteration spent waiting"),
    "wan": ("benchmarks.wan", "a worker over an emulated long lossy link"),
    "weights": ("benchmarks.weights", "weight versions over an emulated slow link, per format"),
    "server-memory": ("benchmarks.server_memory", "the server's memory with workers connected"),
    "transforms": ("benchmarks.transforms", "the worker's step with and without env transforms"),
    "torchrl-envs": ("benchmarks.torchrl_envs", "a TorchRL env's step through netrl's adapter"),
    "server_scale": ("benchmarks.server_scale", "one server with up to 1,024 simulated workers"),
    "collector": ("benchmarks.collector", "netrl's RemoteCollector against TorchRL's MultiSyncCollector"),
}
CHILD = "_child"  # python -m benchmarks _child <module>.child_<name> <args>: a family's helper


def listing() -> str:
    return "\n".join(f"  {name:<14} {what}" for name, (_, what) in FAMILIES.items())


def family_parser(name: str, module: ModuleType) -> argparse.ArgumentParser:
    """The options of one family: the runner's own, then the family's (``add_options``)."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {name}",
                                     description=module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    runner = parser.add_argument_group("every family")
    runner.add_argument("--smoke", action="store_true",
                        help="the quickest setting: seconds, to show the family runs (its "
                        "figures mean nothing)")
    if getattr(module, "QUICK", None) is not None:
        runner.add_argument("--quick", action="store_true", help="a shorter, noisier run")
    runner.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="write the result rows to FILE (a JSON list: benchmarks/results.py)")
    module.add_options(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [CHILD]:
        return child_main(argv[1:])
    if argv[:1] == ["--list"]:
        print(listing())
        return 0
    top = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog=f"families:\n{listing()}")
    top.add_argument("family", choices=list(FAMILIES), metavar="family",
                     help="which to run (below)")
    if not argv or argv[0] not in FAMILIES:
        top.parse_args(argv[:1])  # says what is wrong (or prints the help) and exits
    name = argv[0]
    module = importlib.import_module(FAMILIES[name][0])
    parser = family_parser(name, module)
    args = parser.parse_args(argv[1:])
    try:
        settings = resolve(module.Settings(), module.SMOKE, getattr(module, "QUICK", None), args)
        complete = getattr(module, "complete", None)
        settings = complete(settings) if complete is not None else settings
    except ValueError as exc:
        parser.error(str(exc))
    os.environ.setdefault("WANDB_MODE", "disabled")  # the roles a family starts never log to wandb
    stop_on_signals()
    print(f"{name}: on {machine()}", flush=True)
    print(f"{name}: runs with {described(settings)}", flush=True)
    try:
        rows = module.run(settings)
    except KeyboardInterrupt:  # the family's finally clauses have stopped what it started
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    title = f"\n{name}{' (smoke: figures mean nothing)' if args.smoke else ''}"
    print("\n".join([title, *table(rows)]))
    if args.json is not None:
        write(rows, args.json)
        print(f"{count_of(len(rows), 'row')} written to {args.json}")
    return 0


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, so that a family stops the processes it started.

    A shell starts a background job with SIGINT ignored and children inherit that; SIGINT is set
    back to Python's own handler, or a run started with ``&`` could not be stopped cleanly."""
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def child_main(argv: list[str]) -> int:
    """A family's helper process (``benchmarks.common.child``): its function, until it returns or
    the parent stops it with SIGINT."""
    target, *args = argv or [""]
    module_name, _, function = target.rpartition(".")
    if not module_name.startswith("benchmarks.") or not function.startswith("child_"):
        raise SystemExit(f"python -m benchmarks {CHILD}: {target!r} is not a benchmark's helper "
                         "(expected benchmarks.<module>.child_<name>)")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):  # how the parent stops a child
        getattr(importlib.import_module(module_name), function)(*args)
    return 0
