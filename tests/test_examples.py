"""The scripts in examples/ run as a user runs them (in subprocesses, on free ports, with tiny settings), so they
never rot: tmrl's tutorial in three processes, a custom ``env.pipeline`` module under ``python -m netrl --demo``, and
the deployment of each trained policy without a server. The tutorial's list-based memory is also checked against
what the env really produced, as its action-buffer rebuild is the part of the tutorial that is easy to get wrong.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from netrl.launch import free_port
from tests.recording import local_packets, over_the_wire, recorded, same

ROOT = Path(__file__).parents[1]
EXAMPLES = ROOT / "examples"

pytestmark = [pytest.mark.filterwarnings("ignore:Time-step timed out"),
              pytest.mark.filterwarnings("ignore:.*share an object")]


def run_example(args: list[str], cwd: Path, timeout: float = 90.0, **env: str) -> str:
    """Run ``python *args`` in ``cwd`` and return its output; fail with the output unless it exits 0. The example
    runs in its own process group, so that a hang cannot leave its children behind."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "WANDB_MODE": "disabled", **env}
    proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(args)} did not finish within {timeout} s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def last_json(out: str) -> dict[str, Any]:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def import_tutorial(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("TUTORIAL_SMOKE", "1")
    spec = importlib.util.spec_from_file_location("tmrl_tutorial_under_test", EXAMPLES / "tmrl_tutorial.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- tmrl's tutorial ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tutorial_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The tutorial's three processes, trained for its smoke settings' one short epoch, then evaluated."""
    cwd = tmp_path_factory.mktemp("tutorial")
    out = run_example([str(EXAMPLES / "tmrl_tutorial_learn.py"), "--run-dir", "run", "--trainer-port",
                       str(free_port()), "--worker-port", str(free_port()), "--evaluate", "2", "--minutes", "1.5"],
                      cwd, TUTORIAL_SMOKE="1")
    yield cwd / "run", out


def test_the_tmrl_tutorial_trains_through_three_processes_and_compares_with_random_actions(
        tutorial_run: tuple[Path, str]) -> None:
    run_dir, out = tutorial_run
    assert "exit codes: {'worker': 0, 'trainer': 0, 'server': 0}" in out
    result = last_json(out)
    for policy in ("trained", "random"):
        assert result[policy]["episodes"] == 2 and 0 < result[policy]["mean_distance"] < 2, result
    assert (run_dir / "policy.pt").is_file() and json.loads((run_dir / "policy.pt.json").read_text())["version"] >= 1
    metrics = (run_dir / "metrics.csv").read_text().splitlines()
    assert len(metrics) >= 2, "the trainer logged no round"  # a header and the smoke epoch's one round
    assert (run_dir / "episodes_drone.csv").read_text().count("\n") >= 2  # the worker's episode log, in the run folder
    assert "0 sample packets rejected" in out  # the trainer took the compressed layout: it was given the compressor


def test_a_trained_tutorial_policy_is_deployed_without_a_server(tutorial_run: tuple[Path, str]) -> None:
    run_dir, _ = tutorial_run
    policy = str(run_dir / "policy.pt")
    version = json.loads((run_dir / "policy.pt.json").read_text())["version"]
    # through RolloutWorker(standalone=True) here; the plain loop ran in tutorial_run and runs in the pipeline test
    out = run_example([str(EXAMPLES / "deploy_policy.py"), policy, "--episodes", "2", "--worker"], run_dir.parent,
                      TUTORIAL_SMOKE="1")
    summary = last_json(out)
    assert summary["policy"] == f"{policy} (version {version})" and summary["episodes"] == 2
    assert 1 <= summary["mean_length"] <= 20 and summary["mean_return"] < 0  # the drone's reward: -distance
    assert len(re.findall(r"^episode \d+: return -[\d.]+ in \d+ steps$", out, re.M)) == 2


def test_the_tutorial_memory_rebuilds_every_observation_the_env_produced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker -> compressor -> wire -> the tutorial's list memory -> transitions equal to the env's own, across
    episode ends (rtgym carries the action buffer over a reset and replaces its last action): then a SAC step."""
    tut = import_tutorial(monkeypatch)
    torch.manual_seed(0)
    fast = {**tut.my_config, "time_step_duration": 0.005, "start_obs_capture": 0.005, "ep_max_length": 12}
    env_cls, recorders = recorded(tut.partial(tut.GenericGymEnv, id="rtgym:real-time-gym-ts-v1",
                                              gym_kwargs={"config": fast}))
    worker = tut.RolloutWorker(env_cls, tut.actor_module_cls, tut.my_sample_compressor,
                               min_samples_per_worker_packet=7, seed=0)
    memory = tut.MyMemory(act_buf_len=4, memory_size=1000, batch_size=8)
    for buf in local_packets(worker, [False] * 10):
        memory.append_buffer(over_the_wire(buf))
    rows = len(memory.data[tut.ACT])  # 10 episodes of a reset row and up to 12 steps, less the rows not yet sent
    assert rows > 100 and sum(memory.data[tut.RESET]) >= 9 and len(memory) == rows - 8
    truth = recorders[0].truth
    for item in range(len(memory)):
        last_obs, new_act, _, new_obs, *_ = memory.get_transition(item)
        prev, now = truth[np.asarray(new_act).tobytes()]
        assert same(last_obs, prev) and same(new_obs, now), f"item {item}: the rebuilt action buffer differs"
    env = env_cls()
    agent = tut.training_agent_cls(env.observation_space, env.action_space)
    metrics = agent.train(memory.sample())  # the base class collates get_transition items
    assert set(metrics) >= {"loss_actor", "loss_critic"} and all(np.isfinite(v) for v in metrics.values())
    state = agent.state_dict()
    agent.load_state_dict(state)  # the optional pair a trainer checkpoints with


# -- a custom env.pipeline for python -m netrl --------------------------------------------------------------------
def test_a_custom_pipeline_module_runs_with_python_m_netrl_and_deploys(tmp_path: Path) -> None:
    folder = tmp_path / "custom_pipeline"  # as a user copies it
    folder.mkdir()
    for name in ("reach.py", "config.json", ".gitignore"):
        (folder / name).write_text((EXAMPLES / "custom_pipeline" / name).read_text())
    cfg = json.loads((folder / "config.json").read_text())
    cfg["trainer"].update(epochs=1, rounds=1, steps=10, start_training=100, update_model_interval=5,
                          update_buffer_interval=5)
    cfg.update(memory={"batch_size": 16}, wandb={"mode": "disabled"})
    cfg["agent"]["hidden_sizes"] = [16]
    (folder / "smoke.json").write_text(json.dumps(cfg))
    out = run_example(["-m", "netrl", "--demo", "--config", "smoke.json"], folder)
    assert "policy saved to weights/reach/policy.pt; exit codes worker/trainer/server: [0, 0, 0]" in out
    assert "the reach:reach_pipeline pipeline" in out
    out = run_example([str(EXAMPLES / "deploy_policy.py"), "weights/reach/policy.pt", "--config", "smoke.json",
                       "--episodes", "2"], folder)
    summary = last_json(out)
    assert summary["episodes"] == 2 and summary["mean_return"] < 0 and summary["mean_length"] <= 50
    # Run where it lies, it left an untracked weights/ folder in the checkout: what the runs wrote
    # is ignored (a repository of its own here, as the folder is when copied to a machine).
    subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=folder,
                            check=True, capture_output=True, text=True).stdout
    untracked = sorted(line[3:] for line in status.splitlines())
    assert untracked == [".gitignore", "config.json", "reach.py", "smoke.json"], status


@pytest.mark.parametrize(("policy", "run"), [
    ("weights/pendulum-sac/policy.pt", "the demo, python -m netrl --demo"),
    ("weights/tutorial/policy.pt", "examples/tmrl_tutorial_learn.py --minutes 5"),
    ("weights/mine/policy.pt", "a trainer (python -m netrl --demo, or --trainer")])
def test_deploying_before_training_says_which_run_writes_the_policy(
        tmp_path: Path, policy: str, run: str) -> None:
    # Deploying the demo's policy needed the demo run first, and nothing said so: the error said
    # only that the file did not exist.
    path = os.pathsep.join([str(ROOT), str(EXAMPLES)])
    proc = subprocess.run([sys.executable, str(EXAMPLES / "deploy_policy.py"), policy],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": path})
    assert proc.returncode == 2, proc.stderr
    needs = f"{policy} does not exist: deploying needs a trained policy, so train one first: {run}"
    assert needs in proc.stderr
    assert f"writes {policy} after every epoch and when you stop it (Ctrl+C)" in proc.stderr


def test_every_example_is_linked_from_the_docs() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    docs = "\n".join(p.read_text() for p in pages)
    for path in [*EXAMPLES.glob("*.py"), EXAMPLES / "custom_pipeline"]:
        assert f"examples/{path.name}" in docs, f"no page of the docs links examples/{path.name}"
    named = set(re.findall(r"(?<![\w./-])(examples/[\w./-]*\w)", docs))
    assert sorted(path for path in named if not (ROOT / path).exists()) == []  # none renamed under the docs


def test_the_examples_page_links_resolve() -> None:
    from tests.test_docs import link_problems

    assert link_problems(EXAMPLES / "README.md") == []
