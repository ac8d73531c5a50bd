"""The benchmark runner (benchmarks/): every family is on the entry point's list, a family's
quickest setting runs through ``python -m benchmarks`` and writes rows in the one results format,
bad options fail naming the option, and the shared learning loop judges runs as its docstring says.

The families that run in a few seconds in one process are smoke-run in the default suite; those that
start the roles as processes or learn for tens of seconds run under ``-m slow``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib
import json
import pkgutil
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import benchmarks
from benchmarks.learning import figures, seed_list
from benchmarks.learning.learners import diagnosis
from benchmarks.learning.loop import Judge, Progress, medians, run_one, run_seeds
from benchmarks.learning.rows import LearningRow
from benchmarks.results import Row, number, table, write
from benchmarks.run import FAMILIES
from benchmarks.settings import resolve

ROOT = Path(__file__).resolve().parent.parent
FIELDS = {f.name for f in dataclasses.fields(Row)}
FAST = {"replay": [], "replay_disk": [], "sequences": [], "trainer": [], "prefetch": [],
        "server-memory": [], "pipelines": ["--parts", "wire,memory"], "transforms": [], "torchrl-envs": []}
SLOW = {"relay": [], "broadcast": [], "overhead": [], "pipelines": ["--parts", "jitter"],
        "learning": ["--rows", "pendulum,nstep,weights,pomdp,vector"], "throughput": [],
        "sync": [], "wan": [], "weights": [], "server_scale": []}


def run_benchmarks(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def smoke(family: str, extra: list[str], tmp_path: Path, timeout: float) -> list[dict[str, Any]]:
    out = tmp_path / f"{family}.json"
    proc = run_benchmarks(family, "--smoke", "--json", str(out), *extra, timeout=timeout)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert f"{family}: runs with " in proc.stdout  # the settings it ran with, before it runs
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    assert rows, proc.stdout[-3000:]
    for row in rows:
        assert set(row) == FIELDS, row
        assert row["family"] == family and row["params"], row
    assert "| row | figure | value | baseline | ratio | target |" in proc.stdout
    return rows


@pytest.mark.parametrize("family", sorted(FAST))
def test_a_fast_family_runs_its_smoke_setting(family: str, tmp_path: Path) -> None:
    rows = smoke(family, FAST[family], tmp_path, timeout=110)
    assert all(r["value"] is not None for r in rows), rows  # every figure was measured


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", sorted(SLOW))
def test_a_slow_family_runs_its_smoke_setting(family: str, tmp_path: Path) -> None:
    smoke(family, SLOW[family], tmp_path, timeout=880)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_watchdog_figure_runs_its_smoke_setting(tmp_path: Path) -> None:
    rows = smoke("throughput", ["--watchdog"], tmp_path, timeout=280)
    labels = {r["row"] for r in rows if r["value"] is not None}
    for env in ("Pendulum-v1", "CartPole-v1"):  # the three ways each, measured in the same process
        assert {f"{env} standalone, watchdog {way}" for way in ("off", "main", "handed over")} <= labels, labels


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_drone_and_image_rows_by_env_steps_run_their_smoke_setting(tmp_path: Path) -> None:
    """The rows of the drone without its action buffer and of the image pipeline's replay: each
    variant runs through the three processes on its own pipeline's env and is judged on it."""
    out = tmp_path / "runs"
    rows = smoke("learning", ["--rows", "drone-pomdp,image-nstep-per", "--out", str(out)],
                 tmp_path, timeout=580)
    assert {r["row"] for r in rows} == {
        "drone-pomdp: full-mlp", "drone-pomdp: pomdp-recurrent", "drone-pomdp: pomdp-mlp",
        "image-nstep-per: plain", "image-nstep-per: nstep3-prioritized"}
    assert all(r["params"]["config"]["env"]["pipeline"] for r in rows)  # what each ran with
    for name in ("drone-pomdp", "image-nstep-per"):
        runs = [json.loads(line) for line in (out / name / "runs.jsonl").read_text().splitlines()]
        # each judged on its frozen policy at least once, with what its trainer did
        assert all(r["evaluations"] and "trainer" in r for r in runs), runs


def test_every_family_module_is_on_the_entry_points_list() -> None:
    listed = {module for module, _ in FAMILIES.values()}
    found = set()
    for info in pkgutil.walk_packages(benchmarks.__path__, "benchmarks."):
        module = importlib.import_module(info.name)
        if hasattr(module, "add_options"):  # the mark of a family
            found.add(info.name)
    assert found == listed
    for name, (module_name, what) in FAMILIES.items():
        module = importlib.import_module(module_name)
        assert module.__doc__ and what, name
        assert dataclasses.is_dataclass(module.Settings), name
        assert module.Settings.__dataclass_params__.frozen, name
        assert isinstance(module.SMOKE, module.Settings), name
        assert callable(module.run) and callable(module.add_options), name
    listing = run_benchmarks("--list", timeout=60)
    assert listing.returncode == 0
    assert [line.split()[0] for line in listing.stdout.splitlines()] == list(FAMILIES)


def test_a_bad_option_or_family_fails_naming_it() -> None:
    bad = run_benchmarks("replay", "--parts", "batch,nope", timeout=60)
    assert bad.returncode == 2
    assert "--parts: unknown nope; choose among batch, prioritized" in bad.stderr
    unknown = run_benchmarks("replays", timeout=60)
    assert unknown.returncode == 2 and "invalid choice: 'replays'" in unknown.stderr
    child = run_benchmarks("_child", "os.system", "true", timeout=60)
    assert child.returncode != 0 and "not a benchmark's helper" in child.stderr


@dataclasses.dataclass(frozen=True)
class _Settings:
    rows: int = 1_000_000
    rounds: int = 10


def test_settings_start_from_the_preset_and_take_each_option_given() -> None:
    import argparse

    full, smoke_preset, quick = _Settings(), _Settings(rows=100, rounds=1), _Settings(rows=500)
    given = argparse.Namespace(smoke=False, quick=False, rows=None, rounds=None)
    assert resolve(full, smoke_preset, quick, given) == full
    quick_given = argparse.Namespace(**{**vars(given), "quick": True})
    assert resolve(full, smoke_preset, quick, quick_given) == _Settings(rows=500)
    assert resolve(full, smoke_preset, None, quick_given) == full  # a family without --quick
    smoke_rounds = argparse.Namespace(**{**vars(given), "smoke": True, "rounds": 3})
    assert resolve(full, smoke_preset, quick, smoke_rounds) == _Settings(rows=100, rounds=3)


def test_rows_print_as_one_table_and_write_as_json(tmp_path: Path) -> None:
    rows = [Row("replay", "vector", "batches/s", np.float64(15839.4), "batches/s", 477.1,
                "tmrl's per-item loop", 33.2, "x", ">= 20x", True, {"rows": 1000}),
            Row("overhead", "pipeline", "outside agent.train", 0.057, "share", target="<= 10%",
                met=False),
            Row("learning", "pomdp: mlp", "env steps", None, "env steps")]
    lines = table(rows)
    assert lines[2] == ("| vector | batches/s | 15,839 batches/s | 477.1 batches/s (tmrl's "
                        "per-item loop) | 33.20x | >= 20x (met) |")
    assert lines[3] == "| pipeline | outside agent.train | 5.7% |  |  | <= 10% (NOT met) |"
    assert lines[4] == "| pomdp: mlp | env steps | - |  |  |  |"
    assert number(600.0, "env steps") == "600 env steps" and number(0.0963, "s") == "0.0963 s"
    write(rows, tmp_path / "rows.json")
    back = json.loads((tmp_path / "rows.json").read_text())
    assert [r["value"] for r in back] == [15839.4, 0.057, None]
    assert back[0]["params"] == {"rows": 1000} and set(back[0]) == FIELDS


class _Learner:
    """A learner that reports ``steps`` one after the other, with a training episode logged at each
    (returns from ``returns``) and a policy that always pushes left."""

    def __init__(self, folder: Path, returns: list[float]) -> None:
        self.episodes, self.returns = folder / "episodes.csv", returns
        folder.mkdir(parents=True)

    def learn(self, progress: Callable[[Progress], bool]) -> None:
        for i, ret in enumerate(self.returns):
            steps = 100 * (i + 1)
            with self.episodes.open("a", newline="") as f:
                writer = csv.writer(f)
                if i == 0:
                    writer.writerow(["env_steps", "time", "return", "test"])
                writer.writerow([steps, time.time(), ret, 0])
            if progress(Progress(steps, lambda: (lambda obs: 0), self.episodes)):
                return

    def problems(self) -> list[str]:
        return ["a warning"]


def test_the_loop_judges_training_returns_over_the_last_episodes(tmp_path: Path) -> None:
    judge = Judge(-200.0, window=3)
    got = run_one("sac", 1, _Learner(tmp_path / "a", [-900, -300, -200, -100, -50]), judge, 10_000)
    assert got["steps"] == 400  # the mean of the last 3 first reaches -200 at the 4th episode
    assert got["best_mean_return"] == -200.0  # the run stopped there
    assert 0 <= got["wall_s"] < 60
    missed = run_one("sac", 2, _Learner(tmp_path / "b", [-900] * 8), judge, 600)
    assert missed["steps"] is None and missed["env_steps_run"] == 600  # stopped at the budget
    assert medians([got, missed], 600) == {"sac": {"steps": 500, "wall_s": pytest.approx(
        (got["wall_s"] + missed["wall_s"]) / 2)}}  # the run that never got there counts as 600


def test_the_loop_evaluates_a_frozen_policy_every_n_env_steps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # always pushing left keeps CartPole up for about 9 steps: a mean of 9 passes 8, never 20
    easy, hard = Judge(8.0, "CartPole-v1", 300, 2), Judge(20.0, "CartPole-v1", 300, 2)
    reached = run_one("dqn", 1, _Learner(tmp_path / "a", [0.0] * 9), easy, 900)
    assert reached["steps"] == 300  # the first evaluation, at 300 env steps
    missed = run_one("dqn", 1, _Learner(tmp_path / "b", [0.0] * 9), hard, 900)
    assert missed["steps"] is None
    out = capsys.readouterr().out
    assert out.count("dqn seed 1: 300 env steps, policy's mean") == 2
    assert "dqn seed 1: 600 env steps, policy's mean" in out  # every 300 env steps
    assert "not reached; its last warnings and errors:\n    a warning" in out


def test_a_ratio_target_is_not_met_by_runs_that_never_got_there() -> None:
    """A run that never reaches the return counts as the budget in the medians; two such budgets
    make a ratio, but no verdict: the target is met only when every judged run got there."""
    judge = Judge(threshold=-200.0)
    row = LearningRow("test", judge, {}, max_steps=600, reference="single", judged=("pipeline",),
                      target_ratio=1.5, compare="wall_s")

    def run(variant: str, steps: int | None, wall_s: float) -> dict[str, Any]:
        return {"variant": variant, "seed": 1, "steps": steps, "wall_s": wall_s}

    def verdict(pipeline_steps: int | None) -> Any:
        runs = [run("single", 500, 40.0), run("pipeline", pipeline_steps, 30.0)]
        rows = figures("test", row, runs, (1,), 600)
        return next(r.met for r in rows if r.row == "test: pipeline" and r.unit == "s")

    assert verdict(500) is True
    assert verdict(None) is False  # 30 s against 40 s, but it never got there


def test_seeds_take_ranges_and_a_backward_or_bad_one_is_refused() -> None:
    assert seed_list("1-20") == tuple(range(1, 21))
    assert seed_list("1-3,9,2") == (1, 2, 3, 9)
    for bad in ("3-1", "1-x", "a"):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(bad)):
            seed_list(bad)


def test_each_run_is_logged_as_it_ends_and_failures_are_counted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A long run stopped half way keeps its finished runs in the log; the summary counts the
    seeds that never got there, and names them."""
    judge = Judge(-200.0, window=1)

    def variant(seed: int, folder: Path, max_steps: int) -> _Learner:
        return _Learner(folder, [-100.0] if seed != 2 else [-900.0] * 3)

    log = tmp_path / "runs.jsonl"
    runs = run_seeds({"sac": variant}, (1, 2, 3), judge, 300, tmp_path, log=log)
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["seed"], r["steps"]) for r in logged] == [(1, 100), (2, None), (3, 100)]
    assert logged == runs
    row = LearningRow("test", judge, {}, max_steps=300)
    figures("test", row, runs, (1, 2, 3), 300)
    assert "failed 1 of 3 (seeds 2)" in capsys.readouterr().out


def test_a_failed_run_says_which_weights_each_side_saved_and_its_last_metrics(
        tmp_path: Path) -> None:
    (tmp_path / "worker_policy_w.pt.json").write_text(json.dumps({"version": 50}))
    (tmp_path / "policy.pt.json").write_text(json.dumps({"version": 4000}))
    (tmp_path / "metrics.csv").write_text("trained_steps,q,dead_units,lag_max\n500,1.0,0.2,0\n"
                                          "1000,3.5,1.0,0\n")
    assert diagnosis(tmp_path, "w") == [
        "worker_policy_w.pt: weights v50", "policy.pt: weights v4000",
        "last metrics: trained_steps 1000, q 3.5, dead_units 1.0"]
    assert diagnosis(tmp_path / "none", "w") == []


class _CountingActor:
    """A recurrent actor whose action is the number of steps since its state was the initial
    one: acting from the initial state at every step would play 0 for ever."""

    def recurrent_state(self) -> dict[str, Any]:
        return {"recurrent_state": ((1,), "float32")}

    def act_(self, obs: Any, test: bool = False, state: dict[str, Any] | None = None) -> Any:
        count = 0.0 if state is None else float(state["recurrent_state"][0])
        return np.float32(count), {"recurrent_state": np.array([count + 1], np.float32)}


class _RewardIsAction:
    """An env of 3 steps whose reward is the action played."""

    def reset(self, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return np.zeros(1, np.float32), float(action), False, self.t == 3, {}

    def close(self) -> None:
        pass


def test_a_recurrent_policy_is_judged_with_its_state_carried_and_reset_per_episode() -> None:
    from benchmarks.learning.learners import Acting
    from benchmarks.learning.loop import evaluate

    # 0 + 1 + 2 in each episode: the state carried from step to step, reset before each episode
    assert evaluate(Acting(_CountingActor()), _RewardIsAction(), 2) == 3.0


def test_a_judge_without_an_env_id_plays_the_runs_own_env_at_each_multiple_of_every(
        tmp_path: Path) -> None:
    made: list[int] = []

    def own_env() -> _RewardIsAction:
        made.append(1)
        return _RewardIsAction()

    class Learner:
        def learn(self, progress: Callable[[Progress], bool]) -> None:
            for steps in (250, 700, 1100, 1450, 2100):  # reports come when they come
                if progress(Progress(steps, lambda: Acting(_CountingActor()), None, own_env)):
                    return

        def problems(self) -> list[str]:
            return []

    from benchmarks.learning.learners import Acting

    got = run_one("recurrent", 1, Learner(), Judge(4.0, None, 500, 2), 10_000)
    # at the first report at or past 500, 1,000, 1,500 and 2,000 env steps; never reached 4
    assert got["evaluations"] == [[700, 3.0], [1100, 3.0], [2100, 3.0]] and got["steps"] is None
    assert len(made) == 3  # a new env for each evaluation
    with pytest.raises(ValueError, match="gives none"):
        run_one("x", 1, _Learner(tmp_path / "a", [0.0] * 9), Judge(4.0, None, 100, 1), 900)
