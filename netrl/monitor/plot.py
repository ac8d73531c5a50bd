"""``python -m netrl --plot RUN``: the learning curve and throughput of a run, as a PNG.

Reads ``<weights_folder>/<run>/metrics.csv`` (one row per training round) and the workers'
``episodes_<worker>.csv`` (one row per episode) and draws four panels: episode returns against env
steps, sample and training-step rates over time, losses, and policy lag. Without episode rows (a
worker given no run folder writes none), the returns come from metrics.csv: each round's mean
return and mean test return, against the env steps the trainer had received. The log says which
source it used, or what is missing.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from netrl.errors import NetrlError
from netrl.monitor.metrics import read_table

__all__ = ["plot_run"]

log = logging.getLogger(__name__)

T = TypeVar("T", int, float)


def _rows(path: Path, columns: dict[str, Callable[[str], object]]) -> list[dict[str, str]]:
    """The file's complete rows whose ``columns`` read as numbers of their kind (or are empty);
    NetrlError if it is not a CSV with these columns. The last line, cut short by a crash, has fewer
    fields and is skipped; any other row with the wrong number of fields (a line a crash cut short
    before the run resumed, or a damaged disk) or a value that is not a number (a damaged disk) is
    skipped with a warning, so the rest of the run still plots."""
    try:
        # ([], []) if the trainer has not written it yet: nothing to check
        header, rows = read_table(path)
        if rows and None in rows[-1].values() and None not in rows[-1]:
            rows.pop()  # the line a crash was writing
        misshapen = len(rows)
        rows = [r for r in rows if None not in r.values() and None not in r]
        misshapen -= len(rows)
        if any(c in name for name in header for c in "\ufffd\x00"):
            raise csv.Error("its first line is not text")
    except (OSError, csv.Error) as exc:
        raise NetrlError(f"{path} cannot be read as a CSV file ({exc}): netrl writes it "
                         f"during a run; move the damaged file away to plot the rest") from None
    missing = set(columns) - set(header) if header else set()
    if missing:
        raise NetrlError(f"{path} has no column {', '.join(sorted(missing))}: "
                         f"was it written by netrl?")
    kinds = {**columns, **{name: float for name in header if name.startswith("loss_")}}
    kept, damaged = [], []
    for row in rows:
        bad = next(((key, row[key]) for key, kind in kinds.items() if row.get(key) and not _reads(row[key], kind)),
                   None)
        if bad is None:
            kept.append(row)
        else:
            damaged.append(bad)
    if misshapen:
        log.warning("%s: skipped %d row(s) with other than %d fields (a line a crash "
                    "cut short, or a damaged disk); the other %d rows are plotted",
                    path, misshapen, len(header), len(kept))
    if damaged:
        log.warning("%s: skipped %d row(s) with a value that is not a number, the first "
                    "where %s is %r (a damaged disk?); the other %d rows are plotted",
                    path, len(damaged), *damaged[0], len(kept))
    return kept


def _reads(text: str, kind: Callable[[str], object]) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


def _column(rows: list[dict[str, str]], key: str, kind: Callable[[str], T]) -> list[T | None]:
    """One column as numbers (None where empty); :func:`_rows` kept only rows
    where it reads as ``kind``."""
    return [kind(row[key]) if row.get(key) else None for row in rows]


def _floats(rows: list[dict[str, str]], key: str) -> list[float | None]:
    return _column(rows, key, float)


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Render ``run_dir``'s metrics to a PNG and return its path."""
    import matplotlib.pyplot as plt

    fig = draw_run(run_dir)
    out = out or run_dir / "learning.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _legend(ax: Any) -> None:
    """A legend, if anything in ``ax`` has a label (matplotlib warns on an empty one)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _round_returns(ax: Any, run_dir: Path, m: list[dict[str, str]], episode_files: list[Path]) -> None:
    """Draw each round's mean return from metrics.csv (``m``) in ``ax``, the panel of episode
    returns; or, with none, write in it what is missing. Either way the log says which."""
    why = (f"{', '.join(p.name for p in episode_files)} in "
           f"{run_dir} hold no episode yet" if episode_files else
           f"no episodes_*.csv in {run_dir} (a RolloutWorker writes episodes_<worker_id>.csv in "
           f"its run_dir, weights/run by default: give the worker the trainer's run_dir)")
    keys = ("return_mean", "test_return_mean")
    rows = [{k: r[k] if r.get(k) and _reads(r[k], float) else "" for k in ("samples", *keys)} for r in m
            # (_rows checked only the columns every plot needs)
            if r.get("samples") and _reads(r["samples"], int)]
    rows = [r for r in rows if any(r[k] for k in keys)]
    if not rows:
        missing = ("metrics.csv has no rows yet (the trainer writes one per round)" if not m else
                   "metrics.csv has no return_mean in any round "
                   "(no episode ended within a round)" if m and
                   "return_mean" in m[0] else "metrics.csv has no return_mean column")
        log.warning("no returns to plot: %s, and %s", why, missing)
        ax.text(0.5, 0.5, f"no returns:\n{why}\n{missing}", ha="center", va="center", wrap=True, fontsize=7,
                transform=ax.transAxes)
        return
    log.info("returns from metrics.csv (the mean of each round's episodes), as %s", why)
    steps = _column(rows, "samples", int)
    for key, style, label in zip(keys, (".-", "k^"), ("round mean return", "round mean test return"), strict=True):
        values = _floats(rows, key)
        if any(v is not None for v in values):
            ax.plot(steps, values, style, label=f"{label} (metrics.csv)")


def draw_run(run_dir: Path) -> Any:
    """The figure :func:`plot_run` saves (the caller closes it)."""
    metrics_file = run_dir / "metrics.csv"
    episode_files = sorted(run_dir.glob("episodes_*.csv"))
    if not metrics_file.exists() and not episode_files:
        if run_dir.is_dir() and any(run_dir.iterdir()):  # a run, but nothing logged yet
            raise NetrlError(f"{run_dir} has no metrics.csv or episodes_*.csv yet: "
                             f"the trainer writes metrics.csv after each round, and a "
                             f"worker its episodes_<worker_id>.csv after each episode")
        raise NetrlError(f"{run_dir} has no metrics.csv or episodes_*.csv: is the run name right? "
                         f"(runs live in <weights_folder>/<run_name>/)")
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax_ret, ax_rate, ax_loss, ax_lag = axes.flat
    episode_rows = {path: _rows(path, {"test": int, "env_steps": int, "return": float}) for path in episode_files}
    m = _rows(metrics_file, {"wall_s": float, "samples_per_s": float, "steps_per_s": float,
                             "trained_steps": int, "lag_mean": float, "lag_max": float})
    if any(episode_rows.values()):
        log.info("returns from %s (one point per episode)",
                 ", ".join(path.name for path, rows in episode_rows.items() if rows))
    else:
        _round_returns(ax_ret, run_dir, m, episode_files)
    for path, episodes in episode_rows.items():
        name = path.stem.removeprefix("episodes_")
        for test, style, label in (("0", ".", "episodes"), ("1", "k^", "test episodes")):
            rows = [r for r in episodes if r["test"] == test]
            steps, rets = _column(rows, "env_steps", int), _floats(rows, "return")
            if rows:
                ax_ret.plot(steps, rets, style, alpha=0.3 if test == "0" else 1.0, label=f"{name} {label}")
            known = [r for r in rets if r is not None]
            if test == "0" and len(known) == len(rets) >= 10:
                mean = [sum(known[i - 9:i + 1]) / 10 for i in range(9, len(known))]
                ax_ret.plot(steps[9:], mean, "-", label=f"{name} mean of last 10")
    ax_ret.set(title="Episode return", xlabel="env steps", ylabel="return")
    _legend(ax_ret)
    if m:  # no rows yet: the trainer writes one per round
        line = "-" if len(m) > 1 else "o"  # a line through one point draws nothing
        wall, t = [], 0.0
        for w in _floats(m, "wall_s"):
            t += w or 0.0
            wall.append(t)
        ax_rate.plot(wall, _floats(m, "samples_per_s"), line, label="samples/s received")
        ax_rate.plot(wall, _floats(m, "steps_per_s"), line, label="training steps/s")
        ax_rate.set(title="Throughput", xlabel="training wall time (s)", ylabel="per second")
        _legend(ax_rate)
        trained = _column(m, "trained_steps", int)
        for key in [k for k in m[0] if k.startswith("loss_")]:
            ax_loss.plot(trained, _floats(m, key), line, label=key.removeprefix("loss_"))
        ax_loss.set(title="Losses", xlabel="training steps", yscale="symlog")
        _legend(ax_loss)
        for key in ("lag_mean", "lag_max"):
            ax_lag.plot(trained, _floats(m, key), line, label=key)
        ax_lag.set(title="Policy lag (weight versions)", xlabel="training steps")
        _legend(ax_lag)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    return fig
