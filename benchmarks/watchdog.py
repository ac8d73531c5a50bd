"""What the env watchdog costs a one-env worker: ``python -m benchmarks throughput --watchdog``.

Three standalone RolloutWorkers (no server, no trainer: nothing but the worker's own loop) in one
process step the same env (Pendulum-v1, then CartPole-v1) with the gym pipeline's actor (SAC's
MLP, DQN's MLP) on one torch thread, each its own way:

- ``off``: ``worker.env_timeout_factor`` 0, the env called directly, no watchdog: the baseline;
- ``main``: the default, on the process's main thread: env calls on that thread, watched by the
  watchdog thread (a stuck one is interrupted with a signal);
- ``handed over``: on a second thread, where no signal reaches: each env call is handed to a
  thread of the env's own, as every call was before (the fallback, and the old cost).

The ways take turns in slices of ``--seconds`` / 40 (whole episodes; the order rotates each
round), so that the load of a shared machine falls on all three alike; each counts its env steps
and its time, and the process's CPU time per step (steps per CPU second against ``off``'s: the
cost alone, whatever share of a loaded machine's cores the process got). After ``--warmup``
seconds of turns, the measured turns last ``--seconds`` in all. ``--repeat`` processes per env;
medians of their figures. Target: ``main`` at least 90% of ``off``'s steps/s.

Then what one call costs alone (``child_calls``): ``EnvCaller.call`` on an env whose ``step``
returns at once, the three ways in turns, ``CALLS`` calls a turn, three turns per process;
microseconds a call, medians over the turns of ``--repeat`` processes.
"""

from __future__ import annotations

import json
import logging
import queue
import statistics
import tempfile
import threading
import time
from typing import Any

from benchmarks.common import child, result
from benchmarks.results import Row

ENVS = ("Pendulum-v1", "CartPole-v1")
WAYS = ("off", "main", "handed over")
CALLS = 100_000  # calls a turn of child_calls


def child_standalone(env: str, warmup: str, seconds: str, folder: str) -> None:
    """Print ``{way: {"steps", "time", "cpu"}}`` for three standalone workers taking turns."""
    import torch

    from netrl.config.load import config_from_dict, config_to_dict
    from netrl.config.sections import Config
    from netrl.pipelines.make import make_pipeline
    from netrl.worker.worker import RolloutWorker

    torch.set_num_threads(1)
    logging.getLogger("netrl").setLevel(logging.ERROR)  # no line per episode
    workers = {}
    for i, way in enumerate(WAYS):
        data = config_to_dict(Config())
        data.update(run_name=f"w{i}", weights_folder=folder, security="none", seed=1)
        data["env"]["id"] = env
        data["worker"].update(test_episode_interval=0, worker_id=f"w{i}")
        data["wandb"]["mode"] = "disabled"
        cfg = config_from_dict(data)
        workers[way] = RolloutWorker.from_config(
            cfg, make_pipeline(cfg), standalone=True,
            **({"env_timeout_factor": 0.0} if way == "off" else {}))

    def turn(worker: Any, slice_s: float) -> tuple[int, float, float]:
        """Whole episodes for ``slice_s``: (steps, seconds, CPU seconds of the process)."""
        steps, t0, cpu = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < slice_s:
            stats = worker.run_episode()
            assert stats is not None
            steps += stats.length
        return steps, time.perf_counter() - t0, time.process_time() - cpu

    # the third worker lives on a thread of its own (its env is built there, on its first turn)
    asks: queue.Queue[float | None] = queue.Queue()
    answers: queue.Queue[tuple[int, float, float]] = queue.Queue()

    def serve() -> None:
        while (slice_s := asks.get()) is not None:
            answers.put(turn(workers["handed over"], slice_s))

    helper = threading.Thread(target=serve, name="handed-over worker")
    helper.start()
    totals = {way: [0, 0.0, 0.0] for way in WAYS}
    slice_s, started, rounds = float(seconds) / 40, time.perf_counter(), 0
    try:
        while True:
            measuring = time.perf_counter() - started >= float(warmup)
            if measuring and totals["off"][1] >= float(seconds) / 3:
                break
            order = WAYS[rounds % 3:] + WAYS[:rounds % 3]
            rounds += 1
            for way in order:
                if way == "handed over":
                    asks.put(slice_s)
                    got = answers.get()
                else:
                    got = turn(workers[way], slice_s)
                if measuring:
                    for k in range(3):
                        totals[way][k] += got[k]
    finally:
        asks.put(None)
        helper.join()
    handed = {way: w.host.calls is not None and w.host.calls._thread is not None
              for way, w in workers.items()}
    for w in workers.values():
        w.close()
    print(json.dumps({way: {"steps": t[0], "time": t[1], "cpu": t[2], "handed_over": handed[way]}
                      for way, t in totals.items()}), flush=True)


class _Instant:
    def step(self, action: int) -> int:
        return action

    def close(self) -> None:
        pass


def child_calls() -> None:
    """Print ``{way: [microseconds a call, one per turn]}`` for EnvCaller.call itself."""
    from netrl.envs.guard import EnvCaller

    callers = {"off": EnvCaller(_Instant, "off", timeout_factor=0.0),
               "main": EnvCaller(_Instant, "main", same_thread=True)}
    # built off the main thread, so handed over; called from the main thread like the others
    built = threading.Thread(target=lambda: callers.update(
        {"handed over": EnvCaller(_Instant, "handed over", same_thread=True)}))
    built.start()
    built.join()
    if callers["main"]._thread is not None or callers["handed over"]._thread is None:
        raise SystemExit("the env calls did not run where this benchmark measures them")
    took: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(3):
        for way in WAYS:
            calls = callers[way]
            step, t0 = calls.env.step, time.perf_counter()
            for _ in range(CALLS):
                calls.call("step", step, 0)
            took[way].append((time.perf_counter() - t0) / CALLS * 1e6)
    for calls in callers.values():
        calls.close()
    print(json.dumps(took), flush=True)


def call_rows(repeat: int) -> list[Row]:
    """What one call costs alone: microseconds a call, each way, against ``off``."""
    took: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(repeat):
        got = result(child(child_calls), timeout=300)
        for way in WAYS:
            took[way] += got[way]
    print("EnvCaller.call: " + ", ".join(
        f"{way} {min(took[way]):.2f}-{max(took[way]):.2f} us" for way in WAYS), flush=True)
    base = statistics.median(took["off"])
    return [Row("throughput", f"EnvCaller.call, watchdog {way}", "time a call",
                statistics.median(took[way]), "us", base if way != "off" else None,
                "watchdog off" if way != "off" else "",
                statistics.median(took[way]) / base if way != "off" else None, "x",
                params={"calls": CALLS, "turns": 3 * repeat, "watchdog": way},
                detail={"us_per_call": took[way]})
            for way in WAYS]


def run(warmup: float, seconds: float, repeat: int) -> list[Row]:
    rates: dict[tuple[str, str], list[float]] = {(e, w): [] for e in ENVS for w in WAYS}
    ratios: dict[tuple[str, str], list[float]] = {(e, w): [] for e in ENVS for w in WAYS}
    cpu: dict[tuple[str, str], list[float]] = {(e, w): [] for e in ENVS for w in WAYS}
    # steps per CPU second against off's: the cost alone, whatever share of the cores the process
    # got (a loaded machine gives more of them to a process that hands work between threads)
    by_cpu: dict[tuple[str, str], list[float]] = {(e, w): [] for e in ENVS for w in WAYS}
    with tempfile.TemporaryDirectory(prefix="netrl-watchdog-") as d:
        for r in range(repeat):
            for env in ENVS:
                p = child(child_standalone, env, str(warmup), str(seconds), f"{d}/{r}-{env}")
                got = result(p, timeout=warmup + seconds + 300)
                for way in WAYS:
                    g = got[way]
                    if g["handed_over"] != (way == "handed over"):
                        raise SystemExit(f"{env} {way}: the env calls were "
                                         f"{'' if g['handed_over'] else 'not '}handed over")
                    rates[env, way].append(g["steps"] / g["time"])
                    ratios[env, way].append(rates[env, way][-1] / rates[env, "off"][-1])
                    cpu[env, way].append(g["cpu"] / g["steps"] * 1e6)
                    by_cpu[env, way].append(cpu[env, "off"][-1] / cpu[env, way][-1])
                print(f"{env}: " + ", ".join(
                    f"{way} {rates[env, way][-1]:,.0f} steps/s ({ratios[env, way][-1]:.1%}, "
                    f"{cpu[env, way][-1]:.0f} us CPU a step, {by_cpu[env, way][-1]:.1%})"
                    for way in WAYS), flush=True)
    params = {"warmup": warmup, "seconds": seconds, "repeat": repeat, "torch_threads": 1}
    rows = []
    for env in ENVS:
        base = statistics.median(rates[env, "off"])
        for way in WAYS:
            judged, ratio = way == "main", statistics.median(ratios[env, way])
            rows.append(Row(
                "throughput", f"{env} standalone, watchdog {way}", "env steps/s",
                statistics.median(rates[env, way]), "steps/s", base if way != "off" else None,
                "watchdog off, same process, in turns" if way != "off" else "",
                ratio if way != "off" else None, "%", ">= 90%" if judged else "",
                ratio >= 0.9 if judged else None, {**params, "env": env, "watchdog": way},
                {"steps_s": rates[env, way], "ratio_to_off": ratios[env, way],
                 "cpu_us_per_step": cpu[env, way], "cpu_ratio_to_off": by_cpu[env, way],
                 "cpu_ratio_median": statistics.median(by_cpu[env, way])}))
    return rows + call_rows(repeat)
