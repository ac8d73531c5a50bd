"""The collection controls with the three roles as processes: the worker acts at random until the trainer holds
worker.init_random_frames samples, and the trainer finishes by itself once trainer.total_frames have arrived."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from netrl.storage import checkpoint
from tests.conftest import Procs
from tests.fakes import FAST_TRAINER, small_config


@pytest.mark.timeout(360)
def test_the_trainer_finishes_at_total_frames_after_the_worker_acted_at_random_for_init_random_frames(
        tmp_path: Path, procs: Procs) -> None:
    # total_frames leaves the trainer running past the worker's first allowance (worker_lead 300 beyond what the
    # trainer wants): a worker hears the trainer's count in a PACE, and it would never hear one from a finished trainer
    config = small_config(tmp_path, trainer={**FAST_TRAINER, "total_frames": 2000, "start_training": 100},
                          worker={"init_random_frames": 200, "min_samples_per_worker_packet": 10})
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    trainer = procs.spawn("trainer", config)
    worker = procs.spawn("worker", config)
    # by itself: nobody stopped it (2,000 env steps took past 60 s at load 15; the deadline
    # only stops a hang)
    assert trainer.wait(timeout=240) == 0
    out = procs.log(trainer)
    finished = re.search(r"trainer finished: trainer\.total_frames reached \((\d+) env steps arrived from all workers "
                         r"together, of 2000\) after (\d+) training steps", out)
    assert finished, out[-2000:]
    assert "policy saved to" in out and "exited cleanly" in out
    run = tmp_path / "weights" / "test"
    meta = json.loads((run / "policy.pt.json").read_text())
    saved = checkpoint.load_checkpoint(run)
    assert saved is not None
    state = saved[1]
    assert state["total_samples"] == int(finished[1]) >= 2000 and meta["samples"] == state["total_samples"]
    assert state["total_updates"] == int(finished[2]) > 0 and meta["trained_steps"] == state["total_updates"]

    log = procs.wait_for(worker, r"acting with the policy from now on")  # told by the server before it finished
    told = int(re.search(r"the trainer holds (\d+) samples \(worker\.init_random_frames is 200\)", log)[1])
    assert 200 <= told <= 2000
    assert log.index("acts at random until the trainer holds 200 samples") < log.index("acting with the policy")
    for p in (worker, server):
        p.send_signal(signal.SIGINT)
    assert [p.wait(timeout=10) for p in (worker, server)] == [0, 0]
