"""Ctrl+C in a terminal running a script of the classes, one role per process: each role stops cleanly, its run()
returns, and no process prints a traceback. The roles keep the classes' defaults, so their files meet in
weights/run, where --plot finds them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from netrl.launch import free_port
from tests.fakes import wait_until

SCRIPT = """
import logging, sys, threading
from netrl import GenericGymEnv, ReplayMemory, RolloutWorker, Server, Trainer, TrainingOffline, partial
from netrl.agents import MLPActor, MLPActorCritic, SACAgent

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
role, trainer_port, worker_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
env_cls = partial(GenericGymEnv, id="Pendulum-v1")
if role == "server":
    Server(10, trainer_port=trainer_port, worker_port=worker_port).run(threading.Event())
elif role == "trainer":
    training_cls = partial(TrainingOffline, env_cls=env_cls, memory_cls=ReplayMemory, epochs=1000, rounds=1, steps=20,
                           training_agent_cls=partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(16,))),
                           start_training=40, batch_size=16, update_model_interval=10)
    Trainer(training_cls, "127.0.0.1", server_port=trainer_port, wandb_mode="disabled").run()
else:
    RolloutWorker(env_cls, partial(MLPActor, hidden_sizes=(16,)), server_ip="127.0.0.1", server_port=worker_port,
                  min_samples_per_worker_packet=10, max_samples_per_episode=20, throttle=True,
                  worker_id="w1").run(test_episode_interval=0)
print(role, "run() returned", flush=True)
"""


def test_ctrl_c_stops_each_role_of_a_script_cleanly_and_run_returns(tmp_path: Path) -> None:
    (tmp_path / "roles.py").write_text(SCRIPT)
    ports = [str(free_port()), str(free_port())]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {role: tmp_path / f"{role}.log" for role in ("server", "trainer", "worker")}
    try:
        for role, log in logs.items():  # one process group, as a terminal's job: Ctrl+C reaches each process
            group = {"process_group": 0} if not procs else {"process_group": next(iter(procs.values())).pid}
            with log.open("wb") as out:
                procs[role] = subprocess.Popen([sys.executable, "roles.py", role, *ports], cwd=tmp_path, stdout=out,
                                               stderr=subprocess.STDOUT, **group)  # type: ignore[call-overload]
        wait_until(lambda: "round 0" in logs["trainer"].read_text() or procs["trainer"].poll() is not None, 90,
                   "the trainer's first round")
        os.killpg(procs["server"].pid, signal.SIGINT)  # Ctrl+C
        codes = {role: p.wait(timeout=30) for role, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    out = {role: log.read_text(errors="replace") for role, log in logs.items()}
    assert codes == {"server": 0, "trainer": 0, "worker": 0}, out
    for role, text in out.items():
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
        assert f"Ctrl+C: stopping the {'worker w1' if role == 'worker' else role} cleanly" in text, text[-3000:]
        assert f"{role} run() returned" in text, text[-3000:]
    assert re.search(r"checkpoint saved to .*weights/run/checkpoint", out["trainer"]), out["trainer"][-3000:]
    assert re.search(r"trainer stopped; policy saved to weights/run/policy.pt", out["trainer"]), out["trainer"][-3000:]
    assert "trainer: torch uses 1 thread" in out["trainer"] and "worker w1: torch uses 1 thread" in out["worker"]
    run = tmp_path / "weights" / "run"
    assert {"metrics.csv", "episodes_w1.csv", "policy.pt", "worker_policy_w1.pt"} <= {p.name for p in run.iterdir()}
