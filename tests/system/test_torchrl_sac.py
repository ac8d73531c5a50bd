"""examples/torchrl_sac.py as a user runs it: TorchRL's SAC trained through netrl's three processes
(real processes on free ports, 600 env steps), and the same script on TorchRL's own
Collector and ReplayBuffer, which the learning row ``torchrl-sac`` compares with. These check that
it trains (finite losses, the trainer's weights reaching the worker), not that it learns: that is
the learning row's (``python -m benchmarks learning --rows torchrl-sac``)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchrl")

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "torchrl_sac.py"
LOSSES = ("loss_actor", "loss_qvalue", "loss_alpha")


def run_example(args: list[str], cwd: Path, timeout: float) -> tuple[dict[str, Any], str]:
    """``python examples/torchrl_sac.py *args`` in ``cwd`` (its own process group, killed on a
    hang): its last JSON line and its output; fails with the output unless it exits 0."""
    environ = {**os.environ, "WANDB_MODE": "disabled",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), *args], cwd=cwd, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{EXAMPLE.name} {' '.join(args)} did not finish in {timeout} s:\n"
                    f"{out[-4000:]}")
    assert proc.returncode == 0, f"{EXAMPLE.name} exited {proc.returncode}:\n{out[-4000:]}"
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1]), out


@pytest.mark.timeout(300)
def test_the_example_trains_torchrls_sac_through_netrls_three_processes(tmp_path: Path) -> None:
    result, out = run_example(["--smoke", "--run-dir", "run/sac"], tmp_path, timeout=280)
    assert "exit codes worker/trainer/server: [0, 0, 0]" in out, out[-3000:]
    assert result["collector"] == "netrl" and result["losses_finite"], result
    # the worker is paced to one gradient step per env step: 600 env steps need ~300 steps
    assert result["trained_steps"] >= 200 and result["frames"] >= 600, result
    assert all(math.isfinite(result[k]) for k in LOSSES), result
    # the trainer's weights reached the worker as it trained (a version every 20 steps)
    assert result["worker_weights_version"] >= 5, result
    config = json.loads((tmp_path / "run" / "sac" / "config.json").read_text())
    assert config["env"]["pipeline"] == "torchrl_sac:sac_pipeline"
    assert config["worker"]["init_random_frames"] == config["trainer"]["start_training"] == 200
    metrics = (tmp_path / "run" / "sac" / "metrics.csv").read_text().splitlines()
    assert all(k in metrics[0].split(",") for k in LOSSES), metrics[0]  # the loss's own terms


@pytest.mark.timeout(300)
def test_the_same_script_trains_on_torchrls_own_collector_and_replay_buffer(
        tmp_path: Path) -> None:
    result, _ = run_example(["--smoke", "--collector", "torchrl"], tmp_path, timeout=280)
    assert result["collector"] == "torchrl" and result["losses_finite"], result
    assert result["frames"] == 600, result
    # one gradient step per frame past init_random_frames (200), from the batch that reaches it
    assert result["trained_steps"] == 420, result
    assert all(math.isfinite(result[k]) for k in LOSSES), result


def test_its_config_runs_the_roles_one_by_one_from_the_scripts_folder(tmp_path: Path) -> None:
    """--config-only writes the config and keys the roles need; a role started in the script's
    folder builds the script's pipeline from it (``--check-env`` runs its env through it)."""
    shutil.copy(EXAMPLE, tmp_path / EXAMPLE.name)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                            os.environ.get("PYTHONPATH", "")])}
    written = subprocess.run([sys.executable, EXAMPLE.name, "--config-only"], cwd=tmp_path,
                             env=environ, capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stdout + written.stderr
    config = Path("weights/torchrl-sac/config.json")
    assert f"--config {config}" in written.stdout
    assert (tmp_path / "weights" / "keys").is_dir()
    assert not (tmp_path / "weights" / "torchrl-sac" / "metrics.csv").exists()  # nothing ran
    check = subprocess.run([sys.executable, "-m", "netrl", "--check-env", "--config", str(config)],
                           cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]


@pytest.mark.parametrize("start_training", [None, 200])
def test_the_learning_rows_two_sides_run_the_scripts_hyperparameters(
        tmp_path: Path, start_training: int | None) -> None:
    from benchmarks.learning.torchrl_sac import PIPELINE, torchrl_sac_row
    from examples.torchrl_sac import HP

    row = torchrl_sac_row(start_training)
    netrl = row.variants["netrl"](1, tmp_path, row.max_steps)
    torchrl = row.variants["torchrl"](1, tmp_path, row.max_steps)
    random_frames = HP.init_random_frames if start_training is None else start_training
    assert torchrl.hp == dataclasses.replace(HP, init_random_frames=random_frames)
    cfg = netrl.cfg
    assert cfg.env.pipeline == PIPELINE and cfg.seed == 1
    assert (cfg.memory.batch_size, cfg.memory.memory_size) == (HP.batch_size, HP.buffer_size)
    assert cfg.worker.init_random_frames == cfg.trainer.start_training == random_frames
    assert cfg.trainer.max_training_steps_per_env_step == HP.utd_ratio
    assert cfg.worker.min_samples_per_worker_packet == HP.frames_per_batch
    assert cfg.trainer.update_model_interval == cfg.trainer.update_buffer_interval == 20
    assert (row.reference, row.judged, row.target_ratio) == ("torchrl", ("netrl",), 1.2)
    assert (row.judge.threshold, row.judge.env_id, row.judge.every) == (-200.0, "Pendulum-v1", 500)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_learning_row_runs_its_smoke_setting(tmp_path: Path) -> None:
    """Both sides learn for 600 env steps and are judged on their frozen policies."""
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "learning", "--smoke", "--rows",
                           "torchrl-sac", "--out", str(out), "--json", str(tmp_path / "rows.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert {r["row"] for r in rows} == {"torchrl-sac: netrl", "torchrl-sac: torchrl"}
    lines = (out / "torchrl-sac" / "runs.jsonl").read_text().splitlines()
    runs = [json.loads(line) for line in lines]
    assert {r["variant"] for r in runs} == {"netrl", "torchrl"}
    # each judged on its frozen policy (every 300 env steps; netrl's once its worker has weights)
    assert all(r["evaluations"] for r in runs), runs
