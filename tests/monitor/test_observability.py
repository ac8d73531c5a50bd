"""Seeing what runs, piece by piece: status lines and tables, rates, the status query, plots, and wandb's mode."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from netrl.launch import free_port
from netrl.monitor.metrics import resolve_wandb_mode
from netrl.monitor.status import Rates, StatusClock, format_status
from netrl.server.status import status_line
from netrl.util import worth_logging


def test_rates_are_per_second_over_a_window() -> None:
    rates = Rates(window_s=5.0)
    for t in range(10):
        rates.record({"samples": 100.0 * t}, now=float(t))
    assert rates.rates() == pytest.approx({"samples": 100.0})


def test_wandb_auto_mode_follows_wandbs_own_switch_then_the_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert resolve_wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_wandb_mode("auto") == "online"
    assert resolve_wandb_mode("disabled") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "disabled")  # wandb's off switch: offline runs on disk must not override it
    assert resolve_wandb_mode("auto") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "dryrun")  # wandb's old name for offline
    assert resolve_wandb_mode("auto") == "offline"
    assert resolve_wandb_mode("online") == "online"  # what config.json or --wandb names explicitly stands


def test_a_restarted_trainer_logs_on_into_the_same_wandb_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import wandb

    from netrl.monitor.metrics import MetricsLogger

    started: list[dict[str, object]] = []

    def init(**kwargs: object) -> object:  # records what netrl asks wandb for; no wandb process, no files
        started.append(kwargs)
        return types.SimpleNamespace(id=kwargs["id"], log=lambda *a, **k: None, finish=lambda: None)

    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.setenv("WANDB_MODE", "disabled")  # restored after: MetricsLogger sets it for the process
    for _ in range(2):  # a trainer, then the same run restarted
        MetricsLogger(tmp_path / "run", "run", "offline").close()
    assert started[0]["id"] and started[0]["id"] == started[1]["id"]
    assert started[1]["resume"] == "allow"
    assert (tmp_path / "run" / "wandb_id").read_text().strip() == started[0]["id"]
    MetricsLogger(tmp_path / "other", "other", "offline").close()
    assert started[2]["id"] != started[0]["id"]  # another run folder, another wandb run
    MetricsLogger(tmp_path / "run", "run", "offline", run_id="chosen").close()  # run_with_wandb(run_id=...)
    assert started[3]["id"] == "chosen"


def test_status_before_any_weights_says_none_not_minus_one() -> None:
    worker = {"name": "robot-1", "address": "127.0.0.1", "key": "worker", "version": -1, "samples": 0,
              "reported": {}, "last_seen": None}
    snapshot = {"session": "abcdef0123", "uptime_s": 3.0, "workers": [worker], "trainer": None, "progress": None,
                "weights_version": -1, "rates": {}, "rejected": 0, "refused": 0, "dropped": 0, "stats": {}}
    table, line = format_status(snapshot), status_line(snapshot)
    assert "v-1" not in table + line
    assert "weights none" in table and "robot-1:none" in line
    assert "unknown keys: none checked (security none)" in table
    worker["version"] = 4
    assert "robot-1:v4" in status_line({**snapshot, "workers": [worker]})


def test_status_counts_workers_in_the_right_number() -> None:
    snapshot = {"session": "abcdef0123", "uptime_s": 3.0, "trainer": None, "progress": None, "weights_version": 2,
                "rates": {}, "rejected": 0, "refused": 0, "dropped": 0, "stats": {}}
    worker = {"address": "127.0.0.1", "key": "worker", "version": 2, "samples": 0, "reported": {}, "last_seen": None}
    for n, words in ((0, "0 workers"), (1, "1 worker"), (2, "2 workers")):
        s = {**snapshot, "workers": [{**worker, "name": f"robot-{i}"} for i in range(n)]}
        assert f"status | {words} [" in status_line(s)
        assert f"\n{words}:\n" in format_status(s)


def test_status_of_many_workers_with_long_names_tells_them_apart_and_keeps_the_line_short() -> None:
    # Names cut to 20 characters (keys to 10) would make default names like <long-host>-2 and -3 look the same, and
    # a status line that named all of 300 workers would take 7,000 characters.
    snapshot = {"session": "abcdef0123", "uptime_s": 3.0, "trainer": None, "progress": None, "weights_version": 2,
                "rates": {}, "rejected": 0, "refused": 0, "dropped": 0, "stats": {}}
    host = "gpu-lab-workstation-17"
    workers = [{"name": f"{host}-{i}", "address": "127.0.0.1", "key": f"{host}-{i}", "version": 2, "samples": i,
                "reported": {}, "last_seen": None} for i in range(2, 302)]
    s = {**snapshot, "workers": workers}
    rows = format_status(s).splitlines()[-300:]
    assert len({row.split()[0] for row in rows}) == 300 and len({row.split()[2] for row in rows}) == 300
    line = status_line(s)
    assert len(line) < 600 and "300 workers [" in line and "and 290 more (--status lists them)" in line


def test_a_flood_of_one_problem_is_logged_sparsely() -> None:
    assert [n for n in range(1, 3001) if worth_logging(n)] == [*range(1, 11), 1000, 2000, 3000]
    assert [n for n in range(1, 301) if worth_logging(n, first=5, every=100)] == [1, 2, 3, 4, 5, 100, 200, 300]


def test_status_lines_report_rates_since_the_previous_line() -> None:
    assert not StatusClock(0.0, {"n": 0}).due()  # 0: no status lines
    started = StatusClock(1e-9, {"n": 0})  # started with the role: the first line has rates
    rates = started.rates({"n": 50})
    assert rates is not None and rates["n"] > 0
    resumed = StatusClock(1e-9)  # counters that need not start at zero: the first call only starts the clock
    assert resumed.due() and resumed.rates({"n": 10**6}) is None
    rates = resumed.rates({"n": 10**6})
    assert rates == {"n": 0.0}


def test_plot_explains_a_damaged_run_folder_and_draws_a_run_with_no_rounds_yet(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from netrl.errors import NetrlError
    from netrl.monitor.plot import plot_run

    header = "epoch,round,trained_steps,wall_s,samples_per_s,steps_per_s,lag_mean,lag_max,loss_actor\n"
    metrics, episodes = tmp_path / "metrics.csv", tmp_path / "episodes_w1.csv"
    metrics.write_text(header)  # the trainer has not finished a round yet
    episodes.write_text("env_steps,return,test\n200,-1200.5,0\n400,-900.0,1\n")
    assert plot_run(tmp_path).exists()
    # A value a damaged disk garbled costs its row, with a warning; the rest of the run is plotted.
    metrics.write_text(header + "0,0,100,1.5,1,1,0,0,0.5\n0,1,200,oops,1,1,0,0,0.5\n0,2,300,1.5,1,1,0,0,x\n"
                       "0,3,400,1.5,1,1,0,0,0.25\n")
    episodes.write_text("env_steps,return,test\n200,-1200.5,0\n4\x0000,-900.0,0\n600,-800.0,1\n")
    with caplog.at_level(logging.WARNING, logger="netrl.monitor.plot"):
        assert plot_run(tmp_path).read_bytes()[:4] == b"\x89PNG"
    assert [r.getMessage() for r in caplog.records] == [
        f"{episodes}: skipped 1 row(s) with a value that is not a number, the first where env_steps is '4\\x0000' (a "
        "damaged disk?); the other 2 rows are plotted",
        f"{metrics}: skipped 2 row(s) with a value that is not a number, the first where wall_s is 'oops' (a damaged "
        "disk?); the other 2 rows are plotted"]
    # A crash's cut line is expected at the end; one a resumed run left in the middle, or a row with a field too
    # many, is counted in a warning, not dropped unseen.
    metrics.write_text(header + "0,0,100,1.5,1,1,0,0,0.5\n0,1,2\n0,2,300,1.5,1,1,0,0,0.5,7\n0,3,400,1.5,1,1,0,0,0.25\n"
                       "0,4,50")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="netrl.monitor.plot"):
        assert plot_run(tmp_path).exists()
    assert [r.getMessage() for r in caplog.records if "metrics" in r.getMessage()] == [
        f"{metrics}: skipped 2 row(s) with other than 9 fields (a line a crash cut short, or a damaged disk); the "
        "other 2 rows are plotted"]
    metrics.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(NetrlError, match=r"metrics\.csv cannot be read as a CSV file"):
        plot_run(tmp_path)
    metrics.unlink()
    episodes.write_text("env_steps,return\n200,-1200.5\n")
    with pytest.raises(NetrlError, match=r"episodes_w1\.csv has no column test: was it written by netrl"):
        plot_run(tmp_path)


def test_status_gives_weights_and_samples_for_workers_only() -> None:
    from netrl.net.liveness import Liveness
    from netrl.server.peers import Peer

    def described(role: str) -> dict[str, object]:
        return Peer(b"id", role, role, "s1", "127.0.0.1", Liveness(1.0, 3)).describe()

    trainer, worker = described("trainer"), described("worker")
    assert not {"version", "samples", "packets"} & set(trainer)  # its -1 and 0 read as broken; see "progress"
    assert (worker["version"], worker["samples"], worker["packets"]) == (-1, 0, 0)
    restarted = Peer(b"id", "worker", "w", "s1", "127.0.0.1", Liveness(1.0, 3))
    restarted.report({"version": 330})  # a new trainer session: the server forgot what it sent, the worker did not
    assert restarted.describe()["version"] == 330  # not "none" in --status
    restarted.version = 2
    assert restarted.describe()["version"] == 2


def test_status_stops_waiting_when_asked_to(tmp_path: Path) -> None:
    import threading
    import time

    from netrl.errors import NetrlError, TransportError
    from netrl.monitor.status import query_status

    stop = threading.Event()
    stop.set()  # Ctrl+C, as __main__ maps it
    t0 = time.monotonic()
    with pytest.raises(NetrlError, match="interrupted while waiting for the server's status"):
        query_status(free_port(), timeout_s=3.0, stop=stop)
    assert time.monotonic() - t0 < 1.0  # not the 3 s timeout
    with pytest.raises(TransportError, match="no netrl server answered"):
        query_status(free_port(), timeout_s=0.3)


def test_plot_of_a_run_with_one_round_draws_its_points(tmp_path: Path) -> None:
    # A line through one point draws nothing: drawn as lines, a run with one round would show three empty panels,
    # and a run with no episodes would print matplotlib's "No artists with labels found to put in legend" warning.
    import warnings

    import matplotlib.pyplot as plt

    from netrl.monitor.plot import draw_run

    (tmp_path / "metrics.csv").write_text("epoch,round,trained_steps,wall_s,samples_per_s,steps_per_s,lag_mean,"
                                          "lag_max,loss_actor\n0,0,100,1.5,10,20,0.5,1,0.25\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        fig = draw_run(tmp_path)
    try:
        ax_ret, ax_rate, ax_loss, ax_lag = fig.axes
        drawn = [line for ax in (ax_rate, ax_loss, ax_lag) for line in ax.lines]
        assert len(drawn) == 5 and all(line.get_marker() == "o" for line in drawn)  # visible as points
        assert ax_ret.get_legend() is None and ax_rate.get_legend() is not None
    finally:
        plt.close(fig)
    (tmp_path / "metrics.csv").write_text("epoch,round,trained_steps,wall_s,samples_per_s,steps_per_s,lag_mean,"
                                          "lag_max,loss_actor\n0,0,100,1.5,10,20,0.5,1,0.25\n0,1,200,1.5,10,20,0.5,1,"
                                          "0.2\n")
    fig = draw_run(tmp_path)
    try:
        assert all(line.get_marker() == "None" and line.get_linestyle() == "-" for line in fig.axes[1].lines)
    finally:
        plt.close(fig)


def test_a_snapshot_of_thousands_of_workers_still_answers_listing_what_fits() -> None:
    # Each worker takes up to ~1.5 KB of the snapshot (32 reported counters): listing them all, from about 700 such
    # workers the reply would pass the 1 MiB header limit and --status would fail with "header ... exceeds".
    import threading

    import zmq

    from netrl.monitor.status import query_status
    from netrl.server.status import answer_status

    workers = [{"name": f"robot-{i:05d}", "address": "10.0.0.1", "key": "worker", "version": 3, "samples": i,
                "last_seen": None, "reported": {f"counter_number_{j:02d}": 10**12 + j for j in range(32)}}
               for i in range(3000)]
    snapshot = {"session": "abcdef0123", "uptime_s": 3.0, "trainer": None, "progress": None, "weights_version": 3,
                "rates": {}, "rejected": 0, "refused": 0, "dropped": 0, "stats": {}, "workers": workers}
    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    port = rep.bind_to_random_port("tcp://127.0.0.1")
    answered = threading.Thread(target=lambda: rep.poll(10_000) and answer_status(rep, lambda: snapshot))
    answered.start()
    try:
        got = query_status(port, timeout_s=10.0)
    finally:
        answered.join(10)
        rep.close(0)
        ctx.term()
    listed, omitted = len(got["workers"]), got["workers_omitted"]
    assert 0 < listed < 3000 and listed + omitted == 3000
    table = format_status(got)
    assert "3,000 workers:" in table and f"({omitted:,} not listed: the snapshot of so many" in table
