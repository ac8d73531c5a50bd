"""Single-process mode: one RolloutWorker and one TrainingOffline in one thread, with no networking.

The worker steps exactly as many env steps as the training loop asks for, so the update-to-data
schedule is the same as the networked pipeline's. Used as the baseline in `python -m benchmarks
learning` and for debugging pipelines.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from netrl.protocol.weights import load_weights, state_arrays
from netrl.samples.columns import Buffer
from netrl.training.loop import TrainingOffline
from netrl.worker.worker import RolloutWorker

__all__ = ["LocalSource", "run_local"]


class LocalSource:
    """A :class:`~netrl.training.loop.SampleSource` that runs a local worker on demand."""

    def __init__(self, worker: RolloutWorker) -> None:
        self.worker = worker
        worker.local_packets = []
        worker.throttle = False
        self.wanted = 0
        self.stop = threading.Event()
        self._episode: Any = None

    def fetch(self) -> list[Buffer]:
        w = self.worker
        if w.env is None:
            w.start()
        while w.produced < self.wanted:
            if self._episode is None:
                self._episode = w.episode_steps(False, self.stop)
            try:
                next(self._episode)
            except StopIteration:
                self._episode = None
        w.sink.send()  # hand over whatever was produced, even a partial packet
        assert w.local_packets is not None
        out, w.local_packets[:] = list(w.local_packets), []
        return out

    def wait(self, timeout: float) -> None:
        """Nothing to wait for: :meth:`fetch` produces samples on demand."""

    def publish(self, actor: torch.nn.Module, version: int, trained_steps: int, model: str = "policy") -> None:
        """Load a version into the worker's actor, or into its target of an extra model
        (env.normalize_obs's ``obs_norm``: the worker normalises with the statistics the
        trainer's batches use)."""
        w = self.worker
        if w.env is None:
            w.start()
        if model == "policy":
            load_weights(w.actor, state_arrays(actor))
            w.version = version
            return
        if model not in w.models.current:
            raise KeyError(f"the local worker has no target for model {model!r}; its models: "
                           f"{sorted(w.models.current)}")
        load_weights(w.models.current[model], state_arrays(actor))
        w.models.versions[model] = version

    def progress(self, trained_steps: int, samples: int, wanted: int) -> None:
        self.wanted = wanted
        self.worker.trainer_samples = samples  # what a networked worker hears from the server

    def taken_version(self) -> int:
        return -1  # one process, one trainer: no other weights share its numbers


def run_local(training: TrainingOffline, worker: RolloutWorker, stop: threading.Event,
              on_round: Any = None) -> None:
    """Train ``training`` on samples from ``worker`` in this thread until its epochs
    are done or ``stop``. Closes the worker; ``training`` stays the caller's, memory included
    (with ``memory.storage`` disk, :func:`netrl.memory.disk.close_ring_storage` removes its files
    once the caller is done reading it)."""
    source = LocalSource(worker)
    training.start(source)
    try:
        while training.epoch < training.epochs and not stop.is_set() and not training.frames_done():
            for stats in training.run_epoch(source, stop):
                if on_round is not None:
                    on_round(stats)
    finally:
        worker.close()
