"""``python -m netrl --plot RUN``: the learning curve and throughput of a run, as a PNG.

Reads ``<weights_folder>/<run>/metrics.csv`` (one row per training round) and the workers'
``episodes_<worker>.csv`` (one row per episode) and draws four panels: episode returns against env steps, sample
and training-step rates over time, losses, and policy lag.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from netrl.errors import NetrlError
from netrl.metrics import read_table

__all__ = ["plot_run"]

T = TypeVar("T", int, float)


def _rows(path: Path, columns: set[str]) -> list[dict[str, str]]:
    """The file's complete rows (a line cut short by a crash has fewer fields and is skipped); NetrlError if it is
    not a CSV with these ``columns``."""
    try:
        header, rows = read_table(path)  # ([], []) if the trainer has not written it yet: nothing to check
        rows = [r for r in rows if None not in r.values() and None not in r]
        if any(c in name for name in header for c in "\ufffd\x00"):
            raise csv.Error("its first line is not text")
    except (OSError, csv.Error) as exc:
        raise NetrlError(f"{path} cannot be read as a CSV file ({exc}): netrl writes it during a run; move the "
                         "damaged file away to plot the rest") from None
    missing = columns - set(header) if header else set()
    if missing:
        raise NetrlError(f"{path} has no column {', '.join(sorted(missing))}: was it written by netrl?")
    return rows


def _column(path: Path, rows: list[dict[str, str]], key: str, kind: Callable[[str], T]) -> list[T | None]:
    """One column as numbers (None where empty); NetrlError naming the file, line and column for a bad value."""
    out: list[T | None] = []
    for line, row in enumerate(rows, start=2):
        text = row.get(key)
        try:
            out.append(kind(text) if text else None)
        except ValueError:
            raise NetrlError(f"{path} line {line}: {key} is {text!r}, not a number") from None
    return out


def _floats(path: Path, rows: list[dict[str, str]], key: str) -> list[float | None]:
    return _column(path, rows, key, float)


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Render ``run_dir``'s metrics to a PNG and return its path."""
    metrics_file = run_dir / "metrics.csv"
    episode_files = sorted(run_dir.glob("episodes_*.csv"))
    if not metrics_file.exists() and not episode_files:
        if run_dir.is_dir() and any(run_dir.iterdir()):  # a run, but nothing logged yet
            raise NetrlError(f"{run_dir} has no metrics.csv or episodes_*.csv yet: the trainer writes metrics.csv "
                             "after each round, and a worker its episodes_<worker_id>.csv after each episode")
        raise NetrlError(f"{run_dir} has no metrics.csv or episodes_*.csv: is the run name right? "
                         f"(runs live in <weights_folder>/<run_name>/)")
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax_ret, ax_rate, ax_loss, ax_lag = axes.flat
    for path in episode_files:
        episodes = _rows(path, {"test", "env_steps", "return"})
        name = path.stem.removeprefix("episodes_")
        for test, style, label in (("0", ".", "episodes"), ("1", "k^", "test episodes")):
            rows = [r for r in episodes if r["test"] == test]
            steps, rets = _column(path, rows, "env_steps", int), _floats(path, rows, "return")
            if rows:
                ax_ret.plot(steps, rets, style, alpha=0.3 if test == "0" else 1.0, label=f"{name} {label}")
            known = [r for r in rets if r is not None]
            if test == "0" and len(known) == len(rets) >= 10:
                mean = [sum(known[i - 9:i + 1]) / 10 for i in range(9, len(known))]
                ax_ret.plot(steps[9:], mean, "-", label=f"{name} mean of last 10")
    ax_ret.set(title="Episode return", xlabel="env steps", ylabel="return")
    ax_ret.legend(fontsize=7)
    m = _rows(metrics_file, {"wall_s", "samples_per_s", "steps_per_s", "trained_steps", "lag_mean", "lag_max"})
    if m:  # no rows yet: the trainer writes one per round
        wall, t = [], 0.0
        for w in _floats(metrics_file, m, "wall_s"):
            t += w or 0.0
            wall.append(t)
        ax_rate.plot(wall, _floats(metrics_file, m, "samples_per_s"), label="samples/s received")
        ax_rate.plot(wall, _floats(metrics_file, m, "steps_per_s"), label="training steps/s")
        ax_rate.set(title="Throughput", xlabel="training wall time (s)", ylabel="per second")
        ax_rate.legend(fontsize=7)
        trained = _column(metrics_file, m, "trained_steps", int)
        for key in [k for k in m[0] if k.startswith("loss_")]:
            ax_loss.plot(trained, _floats(metrics_file, m, key), label=key.removeprefix("loss_"))
        ax_loss.set(title="Losses", xlabel="training steps", yscale="symlog")
        ax_loss.legend(fontsize=7)
        for key in ("lag_mean", "lag_max"):
            ax_lag.plot(trained, _floats(metrics_file, m, key), label=key)
        ax_lag.set(title="Policy lag (weight versions)", xlabel="training steps")
        ax_lag.legend(fontsize=7)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = out or run_dir / "learning.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
