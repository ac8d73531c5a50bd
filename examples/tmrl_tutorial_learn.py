"""Does tmrl's tutorial learn? Train it through its three processes for a few minutes, then compare its policy with
random actions.

Starts ``tmrl_tutorial.py``'s server, trainer and worker (beside this file) on 127.0.0.1, trains until the trainer's
epochs are done or ``--minutes`` have passed, stops the roles (the trainer saves ``policy.pt``), then runs that
policy deterministically and uniformly random actions on the same ``--evaluate`` fresh episodes with
``deploy_policy.py``'s plain loop. The drone's reward is minus its distance to the target, so this reports the mean
distance over an episode, the distance at its end, and how many episodes came within 0.05 of the target::

    python examples/tmrl_tutorial_learn.py --minutes 5          # then about 3.5 minutes of evaluation

The last line is the result as JSON. Ctrl+C stops the roles cleanly (the trainer saves its checkpoint) and skips
the evaluation; started again on the same ``--run-dir``, the trainer resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from deploy_policy import Episode, evaluate  # beside this file
from tmrl_tutorial import actor_module_cls, env_cls

TUTORIAL = Path(__file__).with_name("tmrl_tutorial.py")


def learn(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    flags = ["--trainer-port", str(args.trainer_port), "--worker-port", str(args.worker_port), "--run-dir",
             str(run_dir), "--parent", str(os.getpid())]

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # also where SIGINT was ignored (a background job) and for SIGTERM

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    start = time.monotonic()
    # each in a session of its own: a Ctrl+C reaches this process alone, which then stops each role once
    procs = {role: subprocess.Popen([sys.executable, str(TUTORIAL), role, *flags], start_new_session=True)
             for role in ("server", "trainer", "worker")}
    interrupted = False
    try:
        while procs["trainer"].poll() is None and time.monotonic() - start < args.minutes * 60:
            for role in ("server", "worker"):
                if procs[role].poll() is not None:
                    raise RuntimeError(f"the {role} exited early (code {procs[role].returncode})")
            time.sleep(0.5)
    except KeyboardInterrupt:
        interrupted = True
    finally:  # the server last, so that it hears the others leave
        codes = {role: stop_process(procs[role]) for role in ("worker", "trainer", "server")}
    print("exit codes:", codes, flush=True)
    if interrupted:
        print(f"interrupted: the trainer saved its policy and checkpoint in {run_dir}; start again to resume")
        return 130
    if codes["trainer"] != 0:
        return 1
    policy = run_dir / "policy.pt"
    trained = evaluate(env_cls, actor_module_cls, policy, args.evaluate)
    random_actions = evaluate(env_cls, actor_module_cls, None, args.evaluate)
    result = {"minutes": round((time.monotonic() - start) / 60, 1), "policy": str(policy),
              "trained": drone_summary(trained), "random": drone_summary(random_actions)}
    print(f"mean distance to the target: trained {result['trained']['mean_distance']:.3f}, "
          f"random actions {result['random']['mean_distance']:.3f}")
    print(json.dumps(result), flush=True)
    return 0


def stop_process(proc: subprocess.Popen[Any], timeout: float = 30.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def drone_summary(episodes: list[Episode]) -> dict[str, float]:
    """Reward is minus the distance to the target: the mean distance over each episode, and where it ended."""
    distances = [-np.asarray(e["rewards"]) for e in episodes]
    return {"episodes": len(episodes), "mean_distance": round(float(np.mean([d.mean() for d in distances])), 4),
            "final_distance": round(float(np.mean([d[-1] for d in distances])), 4),
            "reached_0.05": round(float(np.mean([(d < 0.05).any() for d in distances])), 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=5.0, help="training time (default 5)")
    p.add_argument("--evaluate", type=int, default=20, help="episodes to evaluate each policy on (default 20)")
    p.add_argument("--run-dir", default="weights/tutorial", help="run folder (default weights/tutorial)")
    p.add_argument("--trainer-port", type=int, default=55555)
    p.add_argument("--worker-port", type=int, default=55556)
    return learn(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
