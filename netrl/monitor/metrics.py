"""Where the trainer's round statistics go: the log, a CSV under weights/<run>/, and wandb.

wandb is imported only here, after ``WANDB_MODE`` is set in the environment: its offline
mode still tries to reach the Internet unless the variable is set before the import.
Tests use ``mode="disabled"``.
"""

from __future__ import annotations

import csv
import logging
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

from netrl.errors import ConfigError

__all__ = ["CsvLog", "MetricsLogger", "format_round", "read_rows", "read_table", "resolve_wandb_mode"]

log = logging.getLogger(__name__)

WandbMode = Literal["auto", "offline", "online", "disabled"]


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def format_round(s: dict[str, Any]) -> str:
    """One compact log line for a round."""
    # "loss" first: SAC's loss_entropy_coef would otherwise read as the coefficient
    # itself, which is alpha
    losses = " ".join(f"{k.removeprefix('loss_')} {_fmt(s[k], '.3g')}" for k in sorted(s) if k.startswith("loss_"))
    losses = f"loss {losses}" if losses else ""
    alpha = f" | alpha {_fmt(s['entropy_coef'], '.3g')}" if "entropy_coef" in s else ""
    return (f"epoch {s['epoch']} round {s['round']} | steps {s['trained_steps']} "
            f"({s['steps_per_s']:.0f}/s) | samples {s['samples']} (+{s['round_samples']}) | "
            f"return {_fmt(s['return_mean'])} over {s['episodes']} eps, "
            f"test {_fmt(s['test_return_mean'])} | {losses}{alpha} | lag "
            f"{_fmt(s['lag_min'], 'd')}/{_fmt(s['lag_mean'])}/{_fmt(s['lag_max'], 'd')}"
            f"{', ' + str(s['stale_samples']) + ' stale' if s.get('stale_samples') else ''} | "
            f"policy v{s['policy_version']} | memory {s['memory_len']}"
            f"{' | ' + str(s['duplicates']) + ' duplicates dropped' if s.get('duplicates') else ''}")


def resolve_wandb_mode(mode: WandbMode) -> Literal["offline", "online", "disabled"]:
    """``auto`` follows wandb's own switch ``WANDB_MODE`` when it is set (``disabled``,
    ``offline`` or ``online``); otherwise it is online when the user configured a key
    (``WANDB_API_KEY``), offline without one."""
    if mode == "auto":
        env = os.environ.get("WANDB_MODE", "")
        env = {"dryrun": "offline", "run": "online"}.get(env, env)  # wandb's older names
        if env in ("disabled", "offline", "online"):
            return cast(Literal["offline", "online", "disabled"], env)
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return mode


def read_rows(path: Path) -> list[dict[Any, Any]]:
    """Every row of the CSV at ``path`` as a dict ([] if there is no file);
    see :func:`read_table`."""
    return read_table(path)[1]


def read_table(path: Path) -> tuple[list[str], list[dict[Any, Any]]]:
    """The header and every row (as a dict) of the CSV at ``path``; ([], []) if there is no file. A
    line cut short by a crash reads with fewer fields: missing values are None. Bytes that are not
    UTF-8 (a damaged disk) read as U+FFFD, so the rows around them still read."""
    if not path.exists():
        return [], []
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    fields = _cells(lines[0])
    rows: list[dict[Any, Any]] = []
    for line in lines[1:]:
        cells = _cells(line)
        if not cells:
            continue
        row: dict[Any, Any] = dict(zip(fields, cells, strict=False))
        # csv.DictReader's layout: missing values are None...
        row.update(dict.fromkeys(fields[len(cells):]))
        if len(cells) > len(fields):
            row[None] = cells[len(fields):]  # ...and extra ones are listed under None
        rows.append(row)
    return fields, rows


def _cells(line: str) -> list[str]:
    """One CSV line's cells. Each line is parsed on its own: netrl writes no line break inside a
    cell, so a damaged quote character costs its own line, not every line after it."""
    try:
        return next(csv.reader([line.removesuffix("\r")]), [])
    except csv.Error:  # e.g. longer than csv's field size limit
        return []


class CsvLog:
    """Append rows to a CSV; when a row brings a new column, the file is rewritten
    with the wider header.

    The CSV is a record for people and plots, never needed to resume: a row that cannot be
    written (a full disk, a read-only file) is skipped with a warning, and the first row written
    again says how many were skipped, so neither the trainer nor a worker's control loop stops for
    it. A file the disk refuses to read is treated the same way: rows are skipped until its header
    reads, so that none is written under the wrong columns.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fields: list[str] = []
        self.skipped = 0  # rows not written since the last one that was
        self._unread = False  # its header could not be read: write() tries again first
        try:
            self._read_header()
        except OSError:  # the first row's warning names the error
            self._unread = True

    def _read_header(self) -> None:
        if self.path.exists():
            with self.path.open(newline="", encoding="utf-8", errors="replace") as f:
                self.fields = _cells(f.readline().removesuffix("\n"))
            try:
                # a line cut short by a crash must not run into the next row appended
                with self.path.open("rb+") as f:
                    size = f.seek(0, os.SEEK_END)
                    if size:
                        f.seek(size - 1)
                        if f.read(1) != b"\n":
                            f.write(b"\n")
            except OSError:  # not writable now: the first row written says so
                pass

    def _read_header_again(self) -> None:
        """If the header could not be read before, read it now (OSError if it still cannot): nothing
        may be written to the file, or rewritten, under columns that are not its own."""
        if self._unread:
            self._read_header()
            self._unread = False

    def write(self, row: dict[str, Any]) -> None:
        doing = "read"
        try:
            self._read_header_again()
            doing = "write to"
            new = [k for k in row if k not in self.fields]
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if new:
                self._rewrite(read_rows(self.path), self.fields + new)
                self.fields += new
            with self.path.open("a", newline="", encoding="utf-8") as f:
                csv.DictWriter(f, self.fields).writerow({k: "" if v is None else v for k, v in row.items()})
        except OSError as exc:
            if not self.skipped:
                log.warning("could not %s %s (%s): its rows are skipped until that works "
                            "again (training and checkpoints go on)", doing, self.path, exc)
            self.skipped += 1
            return
        if self.skipped:
            log.info("writing to %s again; %d rows before this one were skipped",
                     self.path, self.skipped)
            self.skipped = 0

    def last_ints(self, *keys: str) -> list[int]:
        """``keys`` of the last row that holds them all as integers (zeros if none does, or if the
        file cannot be read), e.g. to continue counts."""
        try:
            rows = read_rows(self.path)
        except OSError as exc:
            log.warning("could not read %s (%s): %s count from 0 again",
                        self.path, exc, " and ".join(keys))
            return [0] * len(keys)
        for row in reversed(rows):
            try:
                return [int(row[k]) for k in keys]
            except (KeyError, TypeError, ValueError):  # an older header, or a line torn by a crash
                continue
        return [0] * len(keys)

    def keep(self, predicate: Callable[[dict[str, str]], bool]) -> int:
        """Rewrite the file (atomically) without the rows ``predicate`` rejects; returns
        how many were dropped."""
        try:
            self._read_header_again()
            rows = read_rows(self.path)
        except OSError as exc:
            log.warning("could not read %s (%s): rows it should drop stay in it", self.path, exc)
            return 0
        kept = [r for r in rows if predicate(r)]
        if len(kept) < len(rows):
            try:
                self._rewrite(kept, self.fields)
            except OSError as exc:
                log.warning("could not rewrite %s without %d rows (%s): they stay in it", self.path,
                            len(rows) - len(kept), exc)
                return 0
        return len(rows) - len(kept)

    def _rewrite(self, rows: list[dict[str, str]], fields: list[str]) -> None:
        """Replace the file (atomically) with the header ``fields`` and ``rows``."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", newline="", encoding="utf-8") as f:
            # a damaged line can hold extra fields
            writer = csv.DictWriter(f, fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.path)


def _wandb_id(run_dir: Path) -> str | None:
    """The wandb run id kept in ``run_dir/wandb_id``, made on the first call; None (a new wandb run
    each time) if the folder refuses it."""
    path = run_dir / "wandb_id"
    try:
        if path.exists():
            found = path.read_text(encoding="utf-8").strip()
            if found and len(found) <= 64 and all(c.isalnum() or c in "-_" for c in found):
                return found
            log.warning("%s does not hold a wandb run id (%r): starting a new wandb run",
                        path, found[:64])
        run_id = secrets.token_hex(4)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(run_id + "\n", encoding="utf-8")
        return run_id
    except OSError as exc:
        log.warning("could not keep the wandb run id in %s (%s): a "
                    "restarted trainer starts a new wandb run", path,
                    exc)
        return None


class MetricsLogger:
    """Sends each round's statistics to the log, the CSV and wandb. ``close()`` is idempotent."""

    def __init__(self, run_dir: Path, run_name: str, wandb_mode: WandbMode = "offline", project: str = "netrl",
                 entity: str | None = None, config: dict[str, Any] | None = None, run_id: str | None = None) -> None:
        self.csv = CsvLog(run_dir / "metrics.csv")
        self._wandb_run: Any = None
        mode = resolve_wandb_mode(wandb_mode)
        if mode != "disabled":
            os.environ["WANDB_MODE"] = mode  # must happen before `import wandb`
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            # one wandb run per netrl run: a restarted trainer logs on into the run it started
            if run_id is None:
                run_id = _wandb_id(run_dir)
            try:
                self._wandb_run = wandb.init(project=project, entity=entity, name=run_name, dir=str(run_dir),
                                             config=config or {}, mode=mode, reinit="create_new", id=run_id,
                                             resume="allow" if run_id else None)
            # online without a key: a one-line message, not a traceback
            except wandb.errors.UsageError as exc:
                raise ConfigError([f'wandb.mode is "{mode}", but wandb cannot start '
                                   f'({exc}): set WANDB_API_KEY (or run `wandb '
                                   f'login`), or use --wandb offline']) from None
            log.info("wandb run %s in %s mode", self._wandb_run.id, mode)

    def rewind(self, trained_steps: int) -> None:
        """Drop rounds logged past ``trained_steps``, where a resumed trainer
        continues from its checkpoint.

        A trainer that crashed logged rounds its checkpoint does not hold, and trains them
        again. Dropping them keeps metrics.csv the history of the agent being trained, with
        ``trained_steps`` increasing, for --plot and every other reader. A trainer stopped cleanly
        resumes mid-round from a checkpoint taken at the stop, so nothing is dropped then.
        """
        def before(row: dict[str, str]) -> bool:
            try:
                return int(row["trained_steps"]) <= trained_steps
            except (KeyError, TypeError, ValueError):  # a line torn by the crash
                return False

        dropped = self.csv.keep(before)
        if dropped:
            log.info("dropped %d rounds from %s that were logged after the checkpoint (%d training "
                     "steps); they are trained again", dropped, self.csv.path, trained_steps)

    def log_round(self, stats: dict[str, Any]) -> None:
        log.info("%s", format_round(stats))
        self.csv.write(stats)
        if self._wandb_run is not None:
            self._wandb_run.log({k: v for k, v in stats.items() if v is not None}, step=stats["trained_steps"])

    def close(self) -> None:
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None
