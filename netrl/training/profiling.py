"""``TrainingOffline(profiling=True)``, tmrl's: cProfile over each epoch's training steps (the
batch drawn and the agent's update, with async and sync collection alike), and the 20 costliest
functions logged when the epoch ends.

An epoch may train nothing (stopped, or ``total_frames`` reached before its first step): its
report says so, since ``pstats`` refuses a profile that never ran.
"""

from __future__ import annotations

import cProfile
import io
import pstats

__all__ = ["EpochProfile"]


class EpochProfile:
    """One epoch's profile: :meth:`enable` and :meth:`disable` around each training step, then
    :meth:`report`."""

    def __init__(self) -> None:
        self._profile = cProfile.Profile()
        self.steps = 0  # training steps profiled

    def enable(self) -> None:
        self._profile.enable()

    def disable(self) -> None:
        self._profile.disable()
        self.steps += 1

    def report(self, epoch: int) -> str:
        """The log text for epoch ``epoch``: its costliest functions, or that it trained nothing."""
        if not self.steps:
            return f"profile of epoch {epoch}: no training step ran in it, so nothing was profiled"
        out = io.StringIO()
        pstats.Stats(self._profile, stream=out).sort_stats("cumulative").print_stats(20)
        return f"profile of epoch {epoch} ({self.steps} training steps):\n{out.getvalue()}"
