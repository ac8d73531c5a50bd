"""``python -m netrl --plot RUN``: the learning curve and throughput of a run, as a PNG.

Reads ``<weights_folder>/<run>/metrics.csv`` (one row per training round) and the workers'
``episodes_<worker>.csv`` (one row per episode) and draws four panels: episode returns against env steps, sample
and training-step rates over time, losses, and policy lag.
"""

from __future__ import annotations

from pathlib import Path

from netrl.errors import NetrlError
from netrl.metrics import read_rows

__all__ = ["plot_run"]


def _rows(path: Path) -> list[dict[str, str]]:
    """The file's complete rows: a line cut short by a crash has fewer fields (None) and is skipped."""
    return [r for r in read_rows(path) if None not in r.values() and None not in r]


def _floats(rows: list[dict[str, str]], key: str) -> list[float | None]:
    return [float(r[key]) if r.get(key) not in (None, "") else None for r in rows]


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Render ``run_dir``'s metrics to a PNG and return its path."""
    metrics_file = run_dir / "metrics.csv"
    episode_files = sorted(run_dir.glob("episodes_*.csv"))
    if not metrics_file.exists() and not episode_files:
        raise NetrlError(f"{run_dir} has no metrics.csv or episodes_*.csv: is the run name right? "
                         f"(runs live in <weights_folder>/<run_name>/)")
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax_ret, ax_rate, ax_loss, ax_lag = axes.flat
    for path in episode_files:
        rows = [r for r in _rows(path) if r["test"] == "0"]
        steps, rets = [int(r["env_steps"]) for r in rows], [float(r["return"]) for r in rows]
        name = path.stem.removeprefix("episodes_")
        ax_ret.plot(steps, rets, ".", alpha=0.3, label=f"{name} episodes")
        if len(rets) >= 10:
            mean = [sum(rets[i - 9:i + 1]) / 10 for i in range(9, len(rets))]
            ax_ret.plot(steps[9:], mean, "-", label=f"{name} mean of last 10")
        tests = [r for r in _rows(path) if r["test"] == "1"]
        if tests:
            ax_ret.plot([int(r["env_steps"]) for r in tests], [float(r["return"]) for r in tests], "k^",
                        label=f"{name} test episodes")
    ax_ret.set(title="Episode return", xlabel="env steps", ylabel="return")
    ax_ret.legend(fontsize=7)
    if metrics_file.exists():
        m = _rows(metrics_file)
        wall, t = [], 0.0
        for w in _floats(m, "wall_s"):
            t += w or 0.0
            wall.append(t)
        ax_rate.plot(wall, _floats(m, "samples_per_s"), label="samples/s received")
        ax_rate.plot(wall, _floats(m, "steps_per_s"), label="training steps/s")
        ax_rate.set(title="Throughput", xlabel="training wall time (s)", ylabel="per second")
        ax_rate.legend(fontsize=7)
        trained = [int(r["trained_steps"]) for r in m]
        for key in [k for k in m[0] if k.startswith("loss_")]:
            ax_loss.plot(trained, _floats(m, key), label=key.removeprefix("loss_"))
        ax_loss.set(title="Losses", xlabel="training steps", yscale="symlog")
        ax_loss.legend(fontsize=7)
        for key in ("lag_mean", "lag_max"):
            ax_lag.plot(trained, _floats(m, key), label=key)
        ax_lag.set(title="Policy lag (weight versions)", xlabel="training steps")
        ax_lag.legend(fontsize=7)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = out or run_dir / "learning.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
