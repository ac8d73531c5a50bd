"""The drone end to end: a real server and trainer (processes) and a real worker (here, instrumented) at 20 Hz.

The worker must apply every new weight version between two steps, with the weights received and loaded on its
network thread, so that no step whose period contains a weight load or a weight swap overruns the 50 ms clock.
Each load is made 150 ms slower than it is (a large model, a slow disk): were it on the control path, the step
containing it would last 150 ms instead of 50 (rtgym's elastic clock absorbs a stall only up to one time step).
The jitter of real 1M-parameter loads is measured by scripts/bench_pipelines.py, not here.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from pathlib import Path
from typing import Any, ClassVar

import gymnasium
import numpy as np

from netrl.agents.sac import MLPActor
from netrl.config import load_config
from netrl.launch import stop_processes
from netrl.pipelines import make_pipeline
from netrl.realtime import StepTimer, period_stats
from netrl.util import partial
from netrl.worker import RolloutWorker
from tests.conftest import Procs, small_config

SLOW_LOAD_S = 0.15
TOLERANCE_S = 0.03  # above machine noise on a busy 2-core box, below the injected load time


class SlowLoadActor(MLPActor):
    """The pipeline's actor, but loading weights takes SLOW_LOAD_S longer (timed when it happens on the worker's
    network thread). netrl's loader reaches the tensors with ``state_dict(keep_vars=True)``; ``load_state_dict``
    is slowed too, whichever path a loader takes. Plain ``state_dict()`` (saving a weights file) is not."""

    loads: ClassVar[list[tuple[float, float]]] = []

    def _slow(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        time.sleep(SLOW_LOAD_S)
        out = method(*args, **kwargs)
        if threading.current_thread().name.startswith("netrl-worker-net"):
            SlowLoadActor.loads.append((t0, time.perf_counter()))
        return out

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("keep_vars"):
            return self._slow(super().state_dict, *args, **kwargs)
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._slow(super().load_state_dict, *args, **kwargs)


class VersionTap(gymnasium.Wrapper):
    """Notes the worker's policy version at each step, i.e. the version that chose the action."""

    def __init__(self, env: gymnasium.Env, worker: list[RolloutWorker]) -> None:
        super().__init__(env)
        self.worker, self.versions = worker, []

    def step(self, action: Any) -> Any:
        self.versions.append(self.worker[0].version)
        return self.env.step(action)

    @property
    def default_action(self) -> Any:
        return self.env.default_action  # type: ignore[attr-defined]


def test_drone_worker_applies_new_weights_between_steps_without_overrunning(tmp_path: Path, procs: Procs) -> None:
    config = small_config(tmp_path, env={"pipeline": "drone"}, agent={"hidden_sizes": [256, 256]},
                          worker={"min_samples_per_worker_packet": 20, "max_packet_delay_s": 0.2},
                          trainer={"epochs": 1000, "rounds": 1, "steps": 50, "start_training": 60,
                                   "update_model_interval": 15, "max_training_steps_per_env_step": 2.0})
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    trainer = procs.spawn("trainer", config)
    cfg = load_config(config)
    pipe = make_pipeline(cfg)
    holder: list[RolloutWorker] = []
    taps: list[VersionTap] = []

    def env_cls() -> VersionTap:
        taps.append(VersionTap(pipe.env_cls(), holder))
        return taps[-1]

    loads = SlowLoadActor.loads  # weight loads, wherever the worker runs them (its network thread)
    loads.clear()
    actor_cls = partial(SlowLoadActor, hidden_sizes=tuple(cfg.agent.hidden_sizes))
    worker = RolloutWorker.from_config(cfg, dataclasses.replace(pipe, env_cls=env_cls, actor_module_cls=actor_cls))
    holder.append(worker)
    stop = threading.Event()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rtgym warns when the busy test machine delays a step
        thread = threading.Thread(target=worker.run, kwargs={"stop": stop}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and thread.is_alive():
            versions = taps[0].versions if taps else []
            if len(set(versions) - {-1}) >= 4:
                break
            time.sleep(0.2)
        stop.set()
        thread.join(10)
    assert not thread.is_alive(), "the worker did not stop within 10 s"
    timer = taps[0].env
    assert isinstance(timer, StepTimer)
    versions = np.array(taps[0].versions)
    periods, ends = np.array(timer.periods), np.array(timer.step_times)
    n = min(len(versions), len(periods))  # the last step may have been cut by the stop
    versions, periods, ends = versions[:n], periods[:n], ends[:n]
    assert len(set(versions) - {-1}) >= 3, f"the worker applied versions {sorted(set(versions))}"
    swapped = np.flatnonzero(np.diff(versions) != 0) + 1  # steps whose action came from a newly swapped actor
    starts = ends - periods
    loaded = [k for k in range(n) for t0, t1 in loads if starts[k] <= t1 and t0 <= ends[k]]
    affected = sorted(set(swapped) | set(loaded))
    assert len(loads) >= 3 and len(swapped) >= 3
    assert 0.045 < np.median(periods) < 0.055  # the loop ran at 20 Hz
    slow = {k: round(periods[k] * 1000, 1) for k in affected if periods[k] > timer.nominal_s + TOLERANCE_S}
    assert not slow, f"steps with a weight load or swap overran the 50 ms clock: {slow}; all: {period_stats(periods)}"
    assert trainer.poll() is None  # still training: the worker stopped first
    assert stop_processes([trainer, server]) == [0, 0]
