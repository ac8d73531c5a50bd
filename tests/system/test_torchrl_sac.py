"""examples/torchrl_sac.py as a user runs it: TorchRL's SAC trained through netrl's three processes
(real processes on free ports, a few seconds of training), and the same script on TorchRL's own
Collector and ReplayBuffer, which the learning row ``torchrl-sac`` compares with. These check that
it trains (finite losses, the trainer's weights reaching the worker), not that it learns: that is
the learning row's (``python -m benchmarks learning --rows torchrl-sac``)."""

from __future__ import annotations

import json
import math
import os
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
        pytest.fail(f"{EXAMPLE.name} {' '.join(args)} did not finish in {timeout} s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"{EXAMPLE.name} exited {proc.returncode}:\n{out[-4000:]}"
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1]), out


@pytest.mark.timeout(300)
def test_the_example_trains_torchrls_sac_through_netrls_three_processes(tmp_path: Path) -> None:
    result, out = run_example(["--smoke", "--run-dir", "run/sac"], tmp_path, timeout=280)
    assert "exit codes worker/trainer/server: [0, 0, 0]" in out, out[-3000:]
    assert result["collector"] == "netrl" and result["losses_finite"], result
    assert result["trained_steps"] > 0 and result["frames"] >= 400, result
    assert all(math.isfinite(result[k]) for k in LOSSES), result
    # the trainer's weights reached the worker: it saved a version past its initial one
    assert result["worker_weights_version"] >= 2, result
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
    assert result["frames"] == 400, result
    # one gradient step per frame past init_random_frames (200), from the batch that reaches it
    assert result["trained_steps"] == 220, result
    assert all(math.isfinite(result[k]) for k in LOSSES), result
