"""Test helpers: an env wrapper that records what the env really produced, and a worker driven without a network.

Each transition is keyed by its action's bytes: a stochastic policy's float actions are unique, and a memory
returns the action with each transition, so a sampled transition can be looked up and compared leaf by leaf.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import numpy as np

from netrl.protocol.wire import buffer_from_message, decode, encode, samples_message
from netrl.samples import Buffer, flatten
from netrl.worker.worker import RolloutWorker


class Recorder(gymnasium.Wrapper):
    """Keeps ``(previous obs, obs)`` of every step, keyed by the action's bytes, and counts resets."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.truth: dict[bytes, tuple[Any, Any]] = {}
        self.first_obs: list[Any] = []
        self._last: Any = None

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        self._last = obs
        self.first_obs.append(obs)
        return obs, info

    def step(self, action: Any) -> Any:
        obs, rew, terminated, truncated, info = self.env.step(action)
        key = np.asarray(action).tobytes()
        assert key not in self.truth, "two steps took the same action: the test cannot tell them apart"
        self.truth[key] = (self._last, obs)
        self._last = obs
        return obs, rew, terminated, truncated, info

    @property
    def default_action(self) -> Any:
        return self.env.default_action  # type: ignore[attr-defined]


def recorded(env_cls: Callable[[], Any]) -> tuple[Callable[[], Recorder], list[Recorder]]:
    """An env class that wraps ``env_cls()`` in a :class:`Recorder`, and the list the recorders land in."""
    made: list[Recorder] = []

    def make() -> Recorder:
        rec = Recorder(env_cls())
        made.append(rec)
        return rec

    return make, made


def over_the_wire(buf: Buffer, compression: str = "zstd") -> Buffer:
    """What the trainer receives for ``buf``: encoded, compressed and decoded by the real wire code."""
    return buffer_from_message(decode(encode(samples_message(buf, "w", "s", 1, len(buf)), compression)))  # type: ignore[arg-type]


def local_packets(worker: RolloutWorker, episodes: list[bool]) -> Iterator[Buffer]:
    """Run ``worker`` without a network, one episode per entry (True: a test episode), yielding its packets."""
    worker.local_packets = []
    worker.start()
    try:
        for test in episodes:
            worker.run_episode(test=test)
            yield from worker.local_packets
            worker.local_packets.clear()
    finally:
        worker.close()


def same(a: Any, b: Any) -> bool:
    """Equal trees of arrays (tuples, lists and arrays compared leaf by leaf, exactly)."""
    (sa, la), (sb, lb) = flatten(a, "x"), flatten(b, "x")
    return sa == sb and all(np.array_equal(np.asarray(x), np.asarray(y)) for (_, x), (_, y) in zip(la, lb, strict=True))
