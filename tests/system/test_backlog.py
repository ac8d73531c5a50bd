"""A backlog after a trainer stall drains without dropping a healthy link: real processes on 127.0.0.1.

The trainer process is stopped (SIGSTOP) while two unthrottled workers keep producing small packets, so the
server spools thousands of them. When it continues, the server sends bundles of up to 4,096 packets as fast as
the trainer grants credit. Heartbeats and liveness must stay on time on every side meanwhile: the only link lost
is the trainer's own, during the stall, and no worker resends a packet.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import Procs
from tests.fakes import FAST_TRAINER, small_config, wait_until
from tests.reliability import delivered, log_time

STALL_S = 8.0


@pytest.mark.slow  # about 45 s; tests/net/test_backlog.py and tests/server/test_backlog.py check each side fast
def test_a_trainer_stall_backlog_drains_without_a_lost_link_or_a_resend(tmp_path: Path, procs: Procs) -> None:
    # small packets: many of them per second of stall, each with its own cost at the server and the trainer
    config = small_config(tmp_path, trainer=FAST_TRAINER,
                          worker={"throttle": False, "min_samples_per_worker_packet": 2},
                          network={"heartbeat_interval_s": 0.2, "heartbeat_liveness": 5})  # lost after 1 s
    run_dir = tmp_path / "weights" / "test"
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    trainer = procs.spawn("trainer", config)
    procs.wait_for(trainer, "connected to trainer server")
    workers = [procs.spawn("worker", config, "--worker-id", f"w{i}") for i in range(2)]
    wait_until(lambda: sum(delivered(run_dir).values()) >= 500, 60, "500 samples at the trainer")
    trainer.send_signal(signal.SIGSTOP)
    time.sleep(STALL_S)  # the stall itself: the workers keep producing, the server spools
    before = sum(delivered(run_dir).values())
    continued = time.time()
    trainer.send_signal(signal.SIGCONT)
    # the backlog drains: bundles of up to 4,096 packets, as fast as the trainer takes them
    wait_until(lambda: sum(delivered(run_dir).values()) >= before + 40_000, 60, "40,000 more samples at the trainer",
               poll=1.0)
    drained = time.time()
    for w in workers:
        w.send_signal(signal.SIGINT)
    for w in workers:  # (exit code 1 when the trainer still lags: what they still hold is not this test's concern)
        assert w.wait(timeout=20) in (0, 1), procs.log(w)[-2000:]
    for p in (trainer, server):
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=20) == 0, procs.log(p)[-2000:]
    server_log, trainer_log = procs.log(server), procs.log(trainer)
    assert re.search(r"spooling packets to .*no trainer is connected", server_log)  # the stall made a backlog
    for w in workers:
        text = procs.log(w)
        assert "lost the server" not in text.split("received SIGINT")[0], text[-3000:]
        assert "resending" not in text, text[-3000:]
    # the server took the stopped trainer for lost once, during the stall, and never again
    trainer_lost = [line for line in server_log.splitlines() if re.search(r"trainer '.*' .* lost", line)]
    assert len(trainer_lost) == 1 and log_time(trainer_lost[0]) < continued, trainer_lost
    # the trainer came back once, and then kept its link while the backlog drained
    back = [line for line in trainer_log.splitlines() if "reconnected to trainer server" in line]
    assert len(back) == 1, back
    lost_after = [line for line in trainer_log.splitlines()
                  if "lost the server" in line and log_time(back[0]) <= log_time(line) < drained]
    assert not lost_after, lost_after
