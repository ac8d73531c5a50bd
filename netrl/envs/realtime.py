"""Watching a real-time control loop keep its clock: step periods as the worker's
control path sees them.

rtgym's elastic clock makes every ``step()`` return one time step after the previous one, as
long as the control path calls it in time. :class:`StepTimer` wraps an env and records the period
between consecutive ``step()`` returns, so a slow policy, a blocking weight load or a busy machine
shows up as a longer period (an *overrun*). It also records the *caller time*: how long the control
path took between a ``step()`` return and its next call (policy, bookkeeping, anything that blocked
it). An overrun whose caller time exceeds the time step was the control path's doing (a *late
call*); any other overrun happened inside the env's own time step (its threads, its device, or a
machine too busy to wake them). It logs a one-line summary per episode (DEBUG) and overruns
(WARNING, at most one line per 10 s)::

    env = StepTimer(GenericGymEnv("rtgym:real-time-gym-ts-v1", {"config": config}), nominal_s=0.05)
    ...
    env.summary()   # {"steps": 1200, "p50_ms": 50.0, "p99_ms": 50.9, "max_ms": 51.4,
                    #  "overruns": 0, "late_calls": 0}

rtgym itself warns once per time step that times out ("Time-step timed out. Elapsed since last
time-step: ..."), each message differing by its number, so Python's warning filters print every one:
on a busy machine most of a worker's output. :func:`rtgym_timeouts` counts them instead, logs the
first, then one summary line at most every 10 s and one when the env closes
(:class:`~netrl.envs.gym.GenericGymEnv` installs it for rtgym envs).
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import gymnasium
import numpy as np

__all__ = ["StepTimer", "TimeoutWarnings", "period_stats", "rtgym_timeouts"]

log = logging.getLogger(__name__)


def period_stats(periods_s: Any) -> dict[str, float]:
    """p50 / p99 / max of step periods, in milliseconds."""
    p = np.asarray(periods_s, np.float64) * 1000
    if p.size == 0:
        return {"steps": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {"steps": int(p.size), "p50_ms": float(np.percentile(p, 50)), "p99_ms": float(np.percentile(p, 99)),
            "max_ms": float(p.max())}


class StepTimer(gymnasium.Wrapper):
    """Records the period between consecutive ``step()`` returns within an episode, and
    the caller time before each.

    Args:
        env: the env to time (usually an rtgym env wrapped in ``GenericGymEnv``).
        nominal_s: the env's time step in seconds.
        overrun_s: a period longer than ``nominal_s + overrun_s`` counts (and is
            logged) as an overrun.
        keep: periods (and caller times) kept in :attr:`periods` and :attr:`caller_times`
            (the newest ones).
        clock: the clock read around each call, in seconds (tests pass a fake one).
    """

    def __init__(self, env: gymnasium.Env, nominal_s: float, overrun_s: float = 0.01, keep: int = 100_000,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if nominal_s <= 0 or overrun_s <= 0:
            raise ValueError(f"nominal_s and overrun_s must be > 0 (got {nominal_s}, {overrun_s})")
        super().__init__(env)
        self.nominal_s, self.overrun_s, self.keep, self.clock = nominal_s, overrun_s, keep, clock
        self.periods: list[float] = []
        self.step_times: list[float] = []  # perf_counter() at each step() return, in step
                                           # with `periods`
        self.caller_times: list[float] = []  # seconds from the previous return to this call, in
                                             # step with `periods`
        self.overruns = 0
        # overruns with a caller time above the time step: the control path was late
        self.late_calls = 0
        self.steps = 0
        self._last: float | None = None
        self._reported = (0, -math.inf)  # overruns when last logged, and when
        self._episode: list[float] = []

    def reset(self, **kwargs: Any) -> Any:
        self._flush()
        out = self.env.reset(**kwargs)
        self._last = self.clock()  # the first step's period is measured from the reset
        return out

    def step(self, action: Any) -> Any:
        called = self.clock()
        out = self.env.step(action)
        now = self.clock()
        if self._last is not None:
            period, caller = now - self._last, called - self._last
            self.steps += 1
            self.periods.append(period)
            self.caller_times.append(caller)
            self.step_times.append(now)
            self._episode.append(period)
            if period > self.nominal_s + self.overrun_s:
                self.overruns += 1
                late = caller > self.nominal_s
                self.late_calls += late
                if now - self._reported[1] > 10:
                    log.warning("real-time step overran: %.1f ms (nominal %.1f ms), "
                                "%s; %d overruns (%d late calls) in %d steps so far",
                                period * 1000, self.nominal_s * 1000,
                                f"the control path called step() "
                                f"{caller * 1000:.1f} ms after the last return"
                                if late else "inside the env's time step "
                                             "(the control path was on time)",
                                self.overruns, self.late_calls, self.steps)
                    self._reported = (self.overruns, now)
            if len(self.periods) > self.keep:
                del self.periods[:-self.keep], self.step_times[:-self.keep], self.caller_times[:-self.keep]
        self._last = now
        return out

    def _flush(self) -> None:
        if self._episode:
            s = period_stats(self._episode)
            log.debug("step periods over %d steps: p50 %.1f ms, p99 %.1f ms, max %.1f ms",
                      s["steps"], s["p50_ms"],
                      s["p99_ms"], s["max_ms"])
        self._episode = []

    def summary(self) -> dict[str, float]:
        return {**period_stats(self.periods), "overruns": self.overruns, "late_calls": self.late_calls}

    def close(self) -> None:
        self._flush()
        super().close()

    @property
    def default_action(self) -> Any:
        """The wrapped env's default action (rtgym's), recorded with an episode's
        first observation."""
        return getattr(self.env, "default_action", None)


_RTGYM_TIMEOUT = "Time-step timed out"


class TimeoutWarnings:
    """rtgym's "Time-step timed out" warnings, counted and summarised instead of printed one per
    step: the first is logged (WARNING), then a summary line at most every ``every_s`` seconds
    while they go on, and one by :meth:`flush` (an env's close). Every other warning goes on to the
    ``warnings.showwarning`` found at :meth:`install`, and the warning filters still apply first
    (``-W error`` or an ignore filter act as before).

    It hooks ``warnings.showwarning``, the interface the warnings module offers for this (as
    ``logging.captureWarnings`` does): rtgym warns from a thread of its own, which a
    ``catch_warnings`` around ``step()`` would not see, and costs nothing on steps that keep time.
    """

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self.count = 0  # in all
        self._pending, self._worst_s = 0, 0.0  # since the last line
        self._logged_at = -math.inf
        self._lock = threading.Lock()
        self._previous: Callable[..., None] | None = None
        self._passing = threading.local()  # a warning on its way to the previous hook

    def install(self) -> None:
        """Route warnings through :meth:`show`, again if another hook took its place since
        (``catch_warnings`` puts back what it found)."""
        with self._lock:
            if warnings.showwarning != self.show:  # (a new bound method each time: not `is`)
                self._previous = warnings.showwarning
                warnings.showwarning = self.show

    def show(self, message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        text = str(message)
        if text.startswith(_RTGYM_TIMEOUT) and "rtgym" in Path(filename).parts:
            try:  # "... Elapsed since last time-step: 0.0123"
                late_s = float(text.rpartition(":")[2])
            except ValueError:
                late_s = 0.0
            self.note(late_s)
        elif self._previous is None or getattr(self._passing, "on", False):
            # a hook this one passed the warning to passed it back (each chained to the other):
            # print it as Python does
            (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno,
                                                              line))
        else:
            self._passing.on = True
            try:
                self._previous(message, category, filename, lineno, file, line)
            finally:
                self._passing.on = False

    def note(self, late_s: float) -> None:
        """One more time step timed out, ``late_s`` seconds after it should have ended."""
        with self._lock:
            self.count += 1
            self._pending += 1
            self._worst_s = max(self._worst_s, late_s)
            if self.count == 1:
                log.warning("rtgym: a time step timed out, %.0f ms after it should have ended: "
                            "step() came late (a busy machine, a slow policy), so rtgym "
                            "restarted its clock; further timeouts are counted and summarised "
                            "every %.0f s", late_s * 1000, self.every_s)
                self._pending, self._worst_s, self._logged_at = 0, 0.0, self.clock()
            elif self.clock() - self._logged_at >= self.every_s:
                self._summary()

    def flush(self) -> None:
        """Log the timeouts not summarised yet, if any."""
        with self._lock:
            if self._pending:
                self._summary()

    def _summary(self) -> None:  # (under the lock)
        now = self.clock()
        since = "" if math.isinf(self._logged_at) else f" in the last {now - self._logged_at:.0f} s"
        log.warning("rtgym: %d more time steps timed out%s (up to %.0f ms late); %d in all",
                    self._pending, since, self._worst_s * 1000, self.count)
        self._pending, self._worst_s, self._logged_at = 0, 0.0, now


_timeouts: list[TimeoutWarnings] = []  # the process's one hook, made on first use
_timeouts_lock = threading.Lock()


def rtgym_timeouts() -> TimeoutWarnings:
    """The process's :class:`TimeoutWarnings`, installed (warnings are process-wide: one hook)."""
    with _timeouts_lock:
        if not _timeouts:
            _timeouts.append(TimeoutWarnings())
        hook = _timeouts[0]
    hook.install()
    return hook
