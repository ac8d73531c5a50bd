"""Synchronous collection on the worker (``trainer.collection: sync``, see
:mod:`netrl.training.sync` for the trainer's half).

The trainer announces the collection mode, ``rollout_fragment_length`` and ``batch_mode`` with every
weight version (the WEIGHTS body's ``collect``), so the worker config does not repeat them and they
cannot disagree. In sync mode the control path, for each version v it takes:

1. collects a *fragment*: ``rollout_fragment_length`` vector steps of every env under v (no weight
   swap meanwhile); with ``complete_episodes`` an env then runs on to the end of its episode and
   waits, recording nothing, while the others finish theirs (its steps meanwhile are dropped and it
   starts the next fragment with a reset);
2. sends what it holds (the fragment's last packet; a fragment longer than
   ``min_samples_per_worker_packet`` rows per env leaves in several packets, which the trainer's
   RolloutMemory joins);
3. waits, stepping no env (the network thread keeps the heartbeats going), until it holds a version
newer than v.

A worker that joins while the trainer's batch of the cached version already holds samples (its
WELCOME says how many) skips that version and starts with the next: its fragment would most likely
arrive after the batch is full, and be counted late. When the batch holds none yet (the trainer just
started, or every worker is still collecting), it takes the version: skipping it could leave the
trainer with no worker collecting for it.

A real-time env (rtgym) pauses between fragments: the wait is a pause of its control loop, as
rtgym's ``wait()`` between episodes, so its step timing starts again with the next fragment.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from netrl.util import version_label
from netrl.worker.link import WorkerLink
from netrl.worker.policy import PolicyHandle
from netrl.worker.sink import PacketSink

__all__ = ["SyncFragments"]

log = logging.getLogger("netrl.worker.worker")


class SyncFragments:
    """A worker's fragments in sync mode: when to keep its version, when to send and wait for the
    next.

    Takes the worker's ``policy`` (whose versions it waits for and swaps in), its ``sink`` (which
    sends each fragment) and ``check`` (raises once the network thread cannot go on); :attr:`link`
    is the network thread (None: no server, never sync), :attr:`reset_parked` a vector runner's
    reset of the envs that waited.
    """

    def __init__(self, worker_id: str, num_envs: int, policy: PolicyHandle, sink: PacketSink,
                 check: Callable[[], None]) -> None:
        self.worker_id, self.n = worker_id, num_envs
        self.policy, self.sink, self.check = policy, sink, check
        self.link: WorkerLink | None = None
        self.reset_parked: Callable[[np.ndarray], None] | None = None
        self.version: int | None = None  # the version of the fragment under way (None: none)
        self.last = -1  # the version of the last fragment sent: the next takes a newer one
        self.steps = 0  # vector steps of the fragment under way
        # complete_episodes: envs done with this fragment
        self.parked = np.zeros(num_envs, np.bool_)
        self.wait_s = 0.0  # in all, waiting for weights
        self.last_wait_s = 0.0
        self.waiting = False
        self.fragments = 0
        self.first: int | None = None  # the version of this worker's first fragment
        # in all, collecting fragments (from a fragment's start to its last packet)
        self.collect_s = 0.0
        self._started = 0.0
        self.skipped: int | None = None  # a version skipped on joining mid-batch
        # the server session and version of the join decided last
        self._joined: tuple[str, int] | None = None

    @property
    def announcement(self) -> dict[str, Any] | None:
        link = self.link
        return None if link is None else link.collect

    @property
    def active(self) -> bool:
        collect = self.announcement
        return collect is not None and collect["mode"] == "sync"

    @property
    def holding(self) -> bool:
        """A fragment is under way: its version stays in use."""
        return self.version is not None and self.active

    def collecting(self, i: int) -> bool:
        """Whether env ``i`` records its steps (a parked env does not)."""
        return not (self.holding and self.parked[i])

    def swap(self) -> None:
        """Between two env steps: the newest weights, unless a fragment holds its version."""
        if not self.holding:
            self.policy.swap()

    def before_step(self, stop: threading.Event) -> bool:
        """Before a (vector) step: start a fragment if none is under way, waiting for a newer
        version; False on stop."""
        if self.version is not None:
            return True
        candidate = self._wait_for_version(stop)
        if candidate is None:
            return False
        policy = self.policy
        policy.swap()
        self.version, self.steps = policy.version, 0
        if self.first is None:
            self.first = policy.version
        self._started = time.monotonic()
        # complete_episodes: envs that waited start their next episode now (one env
        if self.parked.any():
            if self.reset_parked is not None:  # starts it anyway: its episode loop resets it)
                self.reset_parked(self.parked)
            self.parked[:] = False
        return True

    def after_step(self, ended: np.ndarray) -> None:
        """After a step of the fragment under way, with the envs whose episode ended in it: send the
        fragment once it is complete."""
        if self.version is None:
            return
        collect = self.announcement
        assert collect is not None
        self.steps += 1
        if self.steps < collect["fragment"]:
            return
        if collect["batch_mode"] == "complete_episodes":
            self.parked |= ended
            if not self.parked.all():
                return
        self.sink.send()
        self.collect_s += time.monotonic() - self._started
        self.fragments += 1
        self.last, self.version = self.version, None

    def _skips(self, version: int) -> bool:
        """Whether ``version`` is the one the server cached when this worker joined, and the
        trainer's batch of it already held samples then (see the module docstring)."""
        welcome = self.link.link.welcome if self.link is not None else {}
        key = (welcome.get("server_session", ""), int(welcome.get("weights_version", -1)))
        if self._joined == key:
            return False  # decided on this connection already
        self._joined = key
        if version == key[1] and int(welcome.get("batch_steps", 0)) > 0 and self.last < version:
            self.skipped = version
            log.info("worker %s joined while the trainer's batch of weights %s already held %d env "
                     "steps: it starts with the next version", self.worker_id,
                     version_label(version), welcome["batch_steps"])
            return True
        return False

    def _wait_for_version(self, stop: threading.Event) -> int | None:
        """Wait (no env step) until the worker holds a version newer than its last fragment's, and
        one it does not skip; that version, or None on stop."""
        weights = self.policy.weights
        started = time.monotonic()
        self.waiting = True
        try:
            while not stop.is_set():
                self.check()
                newest = self.policy.newest()
                if newest > self.last and newest != self.skipped and not self._skips(newest):
                    return newest
                if weights is not None:
                    weights.slot.arrived.wait(0.05)
                    weights.slot.arrived.clear()
                else:
                    stop.wait(0.05)
            return None
        finally:
            self.waiting = False
            self.last_wait_s = time.monotonic() - started
            self.wait_s += self.last_wait_s
            if self.link is not None:
                self.link.sync_stats = self.stats()

    def stats(self) -> dict[str, Any]:
        """For the worker's heartbeats (and so the server's --status)."""
        return {"worker_wait_s": round(self.wait_s, 3), "last_wait_s": round(self.last_wait_s, 3),
                "collect_s": round(self.collect_s, 3), "fragments": self.fragments}
