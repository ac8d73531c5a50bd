"""--plot's return panel: the workers' episodes, else each round's mean from metrics.csv, and the log says which
(or exactly what is missing)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from netrl.__main__ import main
from netrl.monitor.metrics import MetricsLogger
from netrl.monitor.plot import draw_run


def rounds(run_dir: Path, returns: list[tuple[float | None, float | None]]) -> None:
    """metrics.csv as a trainer writes it: one round per (return_mean, test_return_mean), 100 samples apart."""
    metrics = MetricsLogger(run_dir, "run", "disabled")
    for i, (ret, test) in enumerate(returns):
        metrics.log_round({"epoch": 0, "round": i, "trained_steps": 50 * i, "steps_per_s": 10.0,
                           "samples": 100 * (i + 1), "round_samples": 100, "return_mean": ret,
                           "episodes": 0 if ret is None else 2, "test_return_mean": test, "lag_min": 0,
                           "lag_mean": 0.5, "lag_max": 1, "policy_version": i, "memory_len": 100 * (i + 1),
                           "wall_s": 1.0, "samples_per_s": 100.0, "loss_actor": 0.1})
    metrics.close()


def return_lines(run_dir: Path) -> list[tuple[str, list[Any], list[Any]]]:
    import matplotlib.pyplot as plt

    fig = draw_run(run_dir)
    ax = fig.axes[0]
    lines = [(line.get_label(), list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()]
    texts = [t.get_text() for t in ax.texts]
    plt.close(fig)
    return [*lines, ("text", [], texts)] if texts else lines


def test_plot_falls_back_to_metrics_csv_for_returns_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    rounds(run, [(-1200.0, None), (None, None), (-400.0, -300.0)])  # a Python-API run: no worker wrote episodes
    with caplog.at_level(logging.INFO, logger="netrl.monitor.plot"):
        lines = return_lines(run)
    assert lines == [("round mean return (metrics.csv)", [100, 300], [-1200.0, -400.0]),
                     ("round mean test return (metrics.csv)", [100, 300], [None, -300.0])]
    assert caplog.messages == [
        f"returns from metrics.csv (the mean of each round's episodes), as no episodes_*.csv in {run} (a "
        "RolloutWorker writes episodes_<worker_id>.csv in its run_dir, weights/run by default: give the worker the "
        "trainer's run_dir)"]
    # the workers' episodes, once there, come first
    (run / "episodes_w1.csv").write_text("time,episode,env,test,return,length,env_steps,policy_version\n"
                                         "0,1,0,0,-1100.5,200,200,-1\n")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="netrl.monitor.plot"):
        assert return_lines(run)[0] == ("w1 episodes", [200], [-1100.5])
    assert caplog.messages == ["returns from episodes_w1.csv (one point per episode)"]
    (run / "episodes_w1.csv").unlink()
    assert main(["--plot", str(run)]) == 0  # the command says it too (last: it sets up logging of its own)
    assert "returns from metrics.csv" in capsys.readouterr().out


def test_plot_says_exactly_what_is_missing_when_no_return_is_known(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = tmp_path / "run"
    rounds(run, [(None, None), (None, None)])  # rounds shorter than any episode
    (run / "episodes_w1.csv").write_text("time,episode,env,test,return,length,env_steps,policy_version\n")
    with caplog.at_level(logging.INFO, logger="netrl.monitor.plot"):
        lines = return_lines(run)
    missing = (f"episodes_w1.csv in {run} hold no episode yet, and metrics.csv has no return_mean in any round (no "
               "episode ended within a round)")
    assert caplog.messages == [f"no returns to plot: {missing}"]
    assert lines == [("text", [], [f"no returns:\n{missing.replace(', and ', chr(10))}"])]  # in the panel too
    (run / "metrics.csv").write_text("epoch,round,trained_steps,wall_s,samples_per_s,steps_per_s,lag_mean,lag_max\n")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="netrl.monitor.plot"):
        return_lines(run)
    assert caplog.messages == [f"no returns to plot: episodes_w1.csv in {run} hold no episode yet, and metrics.csv "
                               "has no rows yet (the trainer writes one per round)"]
