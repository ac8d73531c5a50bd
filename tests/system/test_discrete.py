"""CartPole through the three roles as processes: the gym pipeline trains DQN, and the epsilon the trainer decays
reaches the worker with the weights."""

from __future__ import annotations

import signal
from pathlib import Path

from netrl.storage.weight_files import read_weights_file
from tests.conftest import Procs
from tests.fakes import FAST_TRAINER, small_config, wait_until


def test_cartpole_trains_dqn_and_the_worker_acts_with_the_trainers_epsilon(tmp_path: Path, procs: Procs) -> None:
    config = small_config(tmp_path, env={"id": "CartPole-v1"}, trainer=FAST_TRAINER, agent={"dqn": {
        "exploration_initial_eps": 1.0, "exploration_final_eps": 0.25, "exploration_steps": 60}})
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    trainer = procs.spawn("trainer", config)
    worker = procs.spawn("worker", config)
    run = tmp_path / "weights" / "test"

    def worker_epsilon() -> float | None:
        files = list(run.glob("worker_policy_*.pt"))
        if not files:
            return None
        try:
            state, meta = read_weights_file(files[0])
        except Exception:  # being replaced as we read: ask again
            return None
        return float(state["epsilon"]) if meta["version"] > 0 else None

    # a version trained past exploration_steps carries the final epsilon, and the worker has it
    wait_until(lambda: worker_epsilon() == 0.25, 60, "the worker's weights to carry epsilon 0.25")
    for p in (worker, trainer, server):
        p.send_signal(signal.SIGINT)
        p.wait(timeout=10)
    assert [p.returncode for p in (worker, trainer, server)] == [0, 0, 0]
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "loss_q" in header and "epsilon" in header  # DQN's metrics, not SAC's
