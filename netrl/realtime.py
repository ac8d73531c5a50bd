"""Watching a real-time control loop keep its clock: step periods as the worker's control path sees them.

rtgym's elastic clock makes every ``step()`` return one time step after the previous one, as long as the control
path calls it in time. :class:`StepTimer` wraps an env and records the period between consecutive ``step()``
returns, so a slow policy, a blocking weight load or a busy machine shows up as a longer period (an *overrun*).
It logs a one-line summary per episode (DEBUG) and overruns (WARNING, at most one line per 10 s)::

    env = StepTimer(GenericGymEnv("rtgym:real-time-gym-ts-v1", {"config": config}), nominal_s=0.05)
    ...
    env.summary()   # {"steps": 1200, "p50_ms": 50.0, "p99_ms": 50.9, "max_ms": 51.4, "overruns": 0}
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import gymnasium
import numpy as np

__all__ = ["StepTimer", "period_stats"]

log = logging.getLogger(__name__)


def period_stats(periods_s: Any) -> dict[str, float]:
    """p50 / p99 / max of step periods, in milliseconds."""
    p = np.asarray(periods_s, np.float64) * 1000
    if p.size == 0:
        return {"steps": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {"steps": int(p.size), "p50_ms": float(np.percentile(p, 50)), "p99_ms": float(np.percentile(p, 99)),
            "max_ms": float(p.max())}


class StepTimer(gymnasium.Wrapper):
    """Records the period between consecutive ``step()`` returns within an episode.

    Args:
        env: the env to time (usually an rtgym env wrapped in ``GenericGymEnv``).
        nominal_s: the env's time step in seconds.
        overrun_s: a period longer than ``nominal_s + overrun_s`` counts (and is logged) as an overrun.
        keep: periods kept in :attr:`periods` (the newest ones).
    """

    def __init__(self, env: gymnasium.Env, nominal_s: float, overrun_s: float = 0.01, keep: int = 100_000) -> None:
        if nominal_s <= 0 or overrun_s <= 0:
            raise ValueError(f"nominal_s and overrun_s must be > 0 (got {nominal_s}, {overrun_s})")
        super().__init__(env)
        self.nominal_s, self.overrun_s, self.keep = nominal_s, overrun_s, keep
        self.periods: list[float] = []
        self.step_times: list[float] = []  # perf_counter() at each step() return, in step with `periods`
        self.overruns = 0
        self.steps = 0
        self._last: float | None = None
        self._reported = (0, -math.inf)  # overruns when last logged, and when
        self._episode: list[float] = []

    def reset(self, **kwargs: Any) -> Any:
        self._flush()
        out = self.env.reset(**kwargs)
        self._last = time.perf_counter()  # the first step's period is measured from the reset
        return out

    def step(self, action: Any) -> Any:
        out = self.env.step(action)
        now = time.perf_counter()
        if self._last is not None:
            period = now - self._last
            self.steps += 1
            self.periods.append(period)
            self.step_times.append(now)
            self._episode.append(period)
            if period > self.nominal_s + self.overrun_s:
                self.overruns += 1
                if now - self._reported[1] > 10:
                    log.warning("real-time step overran: %.1f ms (nominal %.1f ms); %d overruns in %d steps so far",
                                period * 1000, self.nominal_s * 1000, self.overruns, self.steps)
                    self._reported = (self.overruns, now)
            if len(self.periods) > self.keep:
                del self.periods[:-self.keep], self.step_times[:-self.keep]
        self._last = now
        return out

    def _flush(self) -> None:
        if self._episode:
            s = period_stats(self._episode)
            log.debug("step periods over %d steps: p50 %.1f ms, p99 %.1f ms, max %.1f ms", s["steps"], s["p50_ms"],
                      s["p99_ms"], s["max_ms"])
        self._episode = []

    def summary(self) -> dict[str, float]:
        return {**period_stats(self.periods), "overruns": self.overruns}

    def close(self) -> None:
        self._flush()
        super().close()

    @property
    def default_action(self) -> Any:
        """The wrapped env's default action (rtgym's), recorded with an episode's first observation."""
        return getattr(self.env, "default_action", None)
