"""RoundStats: what the training loop counts in the round under way, and the
round's line of metrics.csv."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["RoundStats"]


@dataclass
class RoundStats:
    """What the round under way has counted; a checkpoint keeps it (see :meth:`to_state`), so that a
    round a stop cut short reports all of itself after the resume."""

    started: float = field(default_factory=time.monotonic)
    metric_sums: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    samples: int = 0
    returns: list[float] = field(default_factory=list)
    test_returns: list[float] = field(default_factory=list)
    lag_count: int = 0  # the policy lag of each sample counted: count, sum, min and max
    lag_sum: int = 0
    lag_min: int = 0
    lag_max: int = 0
    stale: int = 0
    waited_s: float = 0.0
    sample_s: float = 0.0
    train_s: float = 0.0

    def add_step(self, metrics: dict[str, Any]) -> None:
        self.steps += 1
        for k, v in metrics.items():
            self.metric_sums[k] = self.metric_sums.get(k, 0.0) + float(v)

    def add_lags(self, lags: np.ndarray) -> None:
        if lags.size:
            low, high = int(lags.min()), int(lags.max())
            self.lag_min = min(self.lag_min, low) if self.lag_count else low
            self.lag_max = max(self.lag_max, high) if self.lag_count else high
            self.lag_sum += int(lags.sum())
            self.lag_count += int(lags.size)

    def lag(self) -> tuple[int, float, int] | None:
        """(min, mean, max) policy lag, or None before any sample."""
        count = self.lag_count  # read once: the network thread asks while the loop adds
        return (self.lag_min, self.lag_sum / count, self.lag_max) if count else None

    def to_state(self) -> dict[str, Any]:
        """JSON-ready; the wall time so far replaces the start, which means
        nothing to another process."""
        state = {k: v for k, v in vars(self).items() if k != "started"}
        state["returns"], state["test_returns"] = list(map(float, self.returns)), list(map(float, self.test_returns))
        return {**state, "elapsed_s": time.monotonic() - self.started}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RoundStats:
        fields = {k: v for k, v in state.items() if k in cls.__dataclass_fields__ and k != "started"}
        return cls(started=time.monotonic() - float(state.get("elapsed_s", 0.0)), **fields)

    def summary(self) -> dict[str, Any]:
        """The round's figures for metrics.csv: rates, where the time went, returns, policy lag, and
        the mean of each of the agent's metrics."""
        wall = time.monotonic() - self.started
        lag = self.lag()
        stats: dict[str, Any] = {
            "round_samples": self.samples, "steps_per_s": self.steps / wall if wall > 0 else 0.0,
            "samples_per_s": self.samples / wall if wall > 0 else 0.0, "wall_s": wall,
            "waiting_fraction": self.waited_s / wall if wall > 0 else 0.0,
            "train_fraction": self.train_s / wall if wall > 0 else 0.0,  # inside agent.train
            # waiting for a batch (sampled or ahead)
            "sample_fraction": self.sample_s / wall if wall > 0 else 0.0,
            "episodes": len(self.returns),
            "return_mean": float(np.mean(self.returns)) if self.returns else None,
            "return_max": float(np.max(self.returns)) if self.returns else None,
            "test_return_mean": float(np.mean(self.test_returns)) if self.test_returns else None,
            "lag_min": lag[0] if lag else None, "lag_mean": lag[1] if lag else None, "lag_max": lag[2] if lag else None,
            "stale_samples": self.stale,
        }
        for k, total in self.metric_sums.items():
            stats[k] = total / self.steps if self.steps else None
        return stats
