"""Batches prepared ahead: ``memory.sample()`` for batch k+1 runs in a thread while
the agent trains on batch k.

Calling sequence (the training loop's)::

    batches = BatchesAhead(memory, device)   # ahead=False: sample() when asked, as without it
    batch = batches.next()             # the batch gathered ahead (the first one: gathered now);
                                       # starts the next
    metrics = agent.train(batch)
    batches.batch_workers()            # whose samples were in the batch next() returned last
    batches.settle()                   # before the memory changes (append_buffer): waits for the
                                       # gather under way
    memory.append_buffer(packet)
    batches.close()                    # idempotent

*Batch lifetime.* Batch k must stay intact while batch k+1 is gathered, so
the memory is asked to keep each batch valid through the next ``sample()``
(:meth:`~netrl.memory.base.MemoryDataloading.keep_batches`): ReplayMemory gathers into two
sets of buffers in turn. A memory that cannot promise it is sampled when asked, as before; so is
one whose batches depend on when they are drawn (an on-policy rollout memory must not be
sampled ahead of its new samples).

*On CUDA* the gather and the copy to the device run on a side stream, from page-locked buffers. The
thread waits for the copy before it hands the batch over, so a page-locked buffer is never rewritten
while a copy reads it; the training stream waits for the side stream's event and records its use of
the batch's tensors, so that the caching allocator does not hand their memory to the side stream
while the update still reads them.

*On CPU* the thread helps only where a core is free beside torch's threads (:func:`core_free`,
checked at each epoch): numpy's copies run beside the update, but a gather that has to take turns
with it for a core (or for the GIL: its Python parts) gains nothing and adds a hand-over. It gains
what the gather costs: little for vector batches (0.15 ms for 256 Pendulum transitions), more for
image batches (1.7 ms for 64 stacks of 4x64x64).
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

import torch

from netrl.memory.base import MemoryDataloading
from netrl.samples.batch import Batch
from netrl.samples.columns import tree_map

__all__ = ["BatchesAhead", "core_free"]

log = logging.getLogger(__name__)

_Gathered = tuple[Batch, "list[str] | None", "torch.cuda.Event | None"]


def core_free() -> bool:
    """Whether a core is free beside torch's intra-op threads: this process may use more cores than
    those threads take, and the last minute's load average (which counts them, and any worker or
    server on this machine) leaves one idle."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except OSError:  # no load average here: count torch's threads only
        busy = float(torch.get_num_threads())
    return cores > torch.get_num_threads() and cores - busy >= 1.0


class BatchesAhead:
    """``memory.sample()`` one batch ahead, in a thread. See the module docstring
    for the calling sequence.

    Args:
        memory: the memory batches come from; nothing else may sample it while this is open.
        device: the training device (a CUDA one gets the side stream and page-locked buffers).
        ahead: True to gather ahead, False to sample when asked, None to decide: on CUDA always, on
            CPU where a core is free (:func:`core_free`). Either way only if the memory keeps
            two batches (``keep_batches``).
    """

    def __init__(self, memory: MemoryDataloading, device: str | torch.device = "cpu", ahead: bool | None = None
                 ) -> None:
        self.memory = memory
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        wanted = (cuda or core_free()) if ahead is None else ahead
        if ahead is None and not wanted:
            log.info("batches are sampled when the agent asks for them, not ahead: no "
                     "core is free beside torch's %d thread(s) (the load average is "
                     "%.1f); this is checked again each epoch", torch.get_num_threads(),
                     os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"))
        self.ahead = wanted and memory.keep_batches(2, pinned=cuda)
        if wanted and not self.ahead:
            log.info("%s does not say that its batches stay valid through the next sample() "
                     "(keep_batches): each batch is sampled when the agent asks for it, not ahead",
                     type(memory).__name__)
        self._stream = (torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
                        if self.ahead and cuda else None)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="netrl-batches") if self.ahead else None
        self._next: Future[_Gathered] | None = None
        self._workers: list[str] | None = None

    def next(self) -> Batch:
        """The next batch; starts gathering the one after it."""
        if self._pool is None:
            return self.memory.sample()
        pending, self._next = self._next, None
        # raises what sample() raised
        batch, self._workers, event = (pending or self._submit()).result()
        if event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            tree_map(lambda t: t.record_stream(stream) if isinstance(t, torch.Tensor) and t.is_cuda else None,
                     (tuple(batch), batch.extra))
        self._next = self._submit()
        return batch

    def batch_workers(self) -> list[str] | None:
        """The workers whose samples were in the batch :meth:`next` returned last (see
        :meth:`~netrl.memory.base.MemoryDataloading.batch_workers`)."""
        return self._workers if self._pool is not None else self.memory.batch_workers()

    def settle(self) -> None:
        """Wait until no gather is under way: call before changing the memory. The
        batch it gathered comes next."""
        if self._next is not None:
            wait_futures([self._next])

    def close(self) -> None:
        """Wait for the gather under way and stop the thread; the memory is sampled
        when asked from then on."""
        pool, self._pool, self._next = self._pool, None, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _submit(self) -> Future[_Gathered]:
        assert self._pool is not None
        # what the training stream wrote into the memory comes before the gather
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
        return self._pool.submit(self._gather)

    def _gather(self) -> _Gathered:
        if self._stream is None:
            batch = self.memory.sample()
            return batch, self.memory.batch_workers(), None
        with torch.cuda.stream(self._stream):
            batch = self.memory.sample()
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self._stream)
        # the copies from the page-locked buffers are done: the next gather may refill them
        event.synchronize()
        return batch, self.memory.batch_workers(), event

    def __enter__(self) -> BatchesAhead:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
