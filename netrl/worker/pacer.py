"""When a worker may take its next env step: its network thread is sound, the trainer's PACE allows
another sample (``worker.throttle``), and, in sync collection, it holds the version of a fragment
(:mod:`netrl.worker.runners.sync`)."""

from __future__ import annotations

import threading

from netrl.errors import NetrlError
from netrl.worker.link import WorkerLink
from netrl.worker.policy import PolicyHandle
from netrl.worker.runners.sync import SyncFragments
from netrl.worker.sink import PacketSink

__all__ = ["Pacer"]


class Pacer:
    """Before each env step (see the module docstring); its :attr:`sync` is the worker's sync
    collection."""

    def __init__(self, worker_id: str, throttle: bool, num_envs: int, policy: PolicyHandle,
                 sink: PacketSink) -> None:
        self.worker_id = worker_id
        self.throttle = throttle  # (the single-process mode turns it off)
        self.sink = sink
        self.policy = policy
        self.version = -1  # the newest version it had received at its latest step
        self.link: WorkerLink | None = None  # (connect)
        # active while the trainer announces sync collection
        self.sync = SyncFragments(worker_id, num_envs, policy, sink, self.check_net)

    def connect(self, link: WorkerLink) -> None:
        self.link = self.sync.link = link

    def pace(self, stop: threading.Event, collect: bool = True, rows: int = 1) -> bool:
        """Before an env step that records ``rows`` samples (a vector step: one per env that
        collects): check the network thread and, if paced, wait until the trainer's PACE allows
        them all; False on stop."""
        if stop.is_set():
            return False
        if self.link is None:  # standalone, single-process: nothing to wait for
            return True
        self.check_net()
        sync = self.sync
        if collect and rows and self.throttle and not sync.active:
            newest = self.policy.newest()  # (two attribute reads: the hot loop)
            if newest != self.version:
                # a new version came in: send the old one's rows now, not when the packet fills.
                # With several workers the trainer trains on the others' samples meanwhile, so rows
                # held back for a packet would arrive beyond max_policy_lag.
                self.version = newest
                self.sink.send()
            self.wait_for_pace(stop, rows)
        if collect and sync.active:  # the wait for each version paces a sync worker; also when the
            return sync.before_step(stop)  # announcement came during the wait for PACE
        return not stop.is_set()

    def wait_for_pace(self, stop: threading.Event, rows: int = 1) -> None:
        """Block while the trainer's PACE does not allow ``rows`` further samples (see
        :meth:`WorkerLink.wait_for_pace`)."""
        if self.link is not None:
            self.link.wait_for_pace(self.sink.count, stop, self.sink.send, self.check_net, rows)

    def check_net(self) -> None:
        """Raise NetrlError once the network thread cannot go on (e.g. the server refused this
        worker)."""
        net = self.link
        if net is not None and (net.link.fatal or net.error):
            raise NetrlError(f"worker {self.worker_id} cannot continue: "
                             f"{net.link.fatal or net.error}")
