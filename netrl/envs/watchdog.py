"""The watchdog of an env's calls: a thread that looks at the call under way ten times a second,
tells a call starved of CPU from a stuck one, and has a stuck one interrupted.

A call is judged by its *run time*: its wall time less the time the process could not run it,
which is the larger of

- the time the process did not run at all: stopped (SIGSTOP, a suspended VM) or kept off the
  CPUs of a loaded machine. The watchdog sees it as its own wake-ups coming late while the process
  used no CPU;
- the time the thread making the call waited for a CPU (Linux: ``/proc/self/task/<tid>/schedstat``),
  as when CPU hogs share its core.

A call past its time limit whose run time is still within it is *starved*, not stuck: it is
logged once (WARNING) and waited for, and its duration does not enter the mean the limits follow.
A call whose run time passes the limit is stuck: the watchdog records an
:class:`~netrl.errors.EnvFailure` for it (:attr:`Watchdog.verdict`), which the caller raises. A
caller waiting on the env's own thread sees it at its next look; a call made on the main thread
is interrupted with a signal (:class:`Interrupts`), whose handler raises :class:`CallInterrupted`
inside the env's code.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from netrl.errors import EnvFailure

__all__ = ["Call", "CallInterrupted", "Interrupts", "Watchdog", "interrupts", "queued_s"]

log = logging.getLogger("netrl.envs.guard")  # the guard's lines, under one logger

TICK_S = 0.1  # how often the watchdog looks at the call under way
SIGNAL = getattr(signal, "SIGUSR2", None)  # the interrupt (none on Windows)
TRIES = 3  # interrupts sent to a stuck call before the process gives up on it

# A call under way: (kind, its start on time.monotonic(), made on the main thread). A new tuple
# for every call: the watchdog and the signal handler tell calls apart by identity.
Call = tuple[str, float, bool]


class CallInterrupted(BaseException):
    """Raised inside a stuck env call by the interrupt's handler; a BaseException, so that an
    env's ``except Exception`` does not swallow it."""


def queued_s(native_id: int | None) -> float:
    """Seconds the thread ``native_id`` of this process has waited for a CPU, from Linux's
    schedstat; 0 where there is none (another OS, a kernel without it, no thread)."""
    if native_id is None:
        return 0.0
    try:
        with open(f"/proc/self/task/{native_id}/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Watchdog:
    """Watches the calls of one env (see the module), on a daemon thread of its own.

    The caller sets :attr:`current` to a new :data:`Call` before each call and to None after it,
    and raises :attr:`verdict`'s failure when it names that call.

    Args:
        owner: named in messages ("worker robot-1").
        limit: a call kind's time limit in seconds (None: none), read at every look.
        limit_text: how that limit is set, for the message of a stuck call.
        grace_s: the run time a stuck call gets to unwind after each interrupt.
        native_id: the thread whose waits for a CPU count as starvation (the one running the
            env's code), or None.
        interrupt: interrupt stuck calls made on the main thread with a signal (it must then
            be registered with :data:`interrupts`).
    """

    def __init__(self, owner: str, limit: Callable[[str], float | None],
                 limit_text: Callable[[str], str], grace_s: float, native_id: int | None,
                 interrupt: bool) -> None:
        self.owner, self._limit, self._limit_text = owner, limit, limit_text
        self.grace_s, self.native_id, self.interrupt = grace_s, native_id, interrupt
        self.current: Call | None = None
        # the stuck call and its failure, for the caller to raise
        self.verdict: tuple[Call, EnvFailure] | None = None
        self.pending: Call | None = None  # interrupted, and the handler has not raised yet
        self.starved_call: Call | None = None  # the last call found starved
        self.starved = 0  # calls found starved (warned about and waited for)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watchdog of {owner}",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """End the thread. Idempotent."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def fail(self, call: Call, failure: EnvFailure) -> None:
        """Record ``failure`` for ``call`` (a thread of the env died during it) and interrupt it."""
        self.verdict = (call, failure)
        self._send(call)

    def _run(self) -> None:
        last, cpu = time.monotonic(), time.process_time()
        queued = queued_s(self.native_id)
        seen: Call | None = None
        lost = queued_then = 0.0
        sent: list[float] = []  # run times at which interrupts went to the stuck call
        while not self._stop.wait(TICK_S):
            now, cpu_now, queued_before = time.monotonic(), time.process_time(), queued
            queued = queued_s(self.native_id)
            # a wake-up late while the process used no CPU: the process did not run
            late = max(0.0, now - last - TICK_S - (cpu_now - cpu))
            last, cpu = now, cpu_now
            call = self.current
            if call is None:
                seen = None
                continue
            if call is not seen:  # a new call: what was lost before it started is not its own
                seen, lost, queued_then, sent = call, min(late, now - call[1]), queued_before, []
            else:
                lost += late
            self._judge(call, now - call[1], max(lost, queued - queued_then), sent)

    def _judge(self, call: Call, took: float, lost: float, sent: list[float]) -> None:
        kind = call[0]
        limit = self._limit(kind)
        if limit is None or took <= limit:
            return
        ran = took - lost
        verdict = self.verdict
        if verdict is not None and verdict[0] is call:  # interrupted, and not back yet
            if not (self.interrupt and call[2]):  # the caller raises it, or cannot
                return
            if not sent:  # interrupted by fail(): a thread of the env died
                sent.append(ran)
            elif ran - sent[-1] > self.grace_s:
                self._insist(call, took, sent, ran)
            return
        if ran <= limit:
            # a few late wake-ups are no news: say so once the loss is a tenth of the limit
            if self.starved_call is not call and lost >= max(TICK_S, 0.1 * limit):
                self.starved_call = call
                self.starved += 1
                log.warning("%s: env.%s() has taken %.1f s, beyond its limit of %.1f s, but the "
                            "process could run it for only %.1f s of them (the rest it was "
                            "stopped or waiting for a CPU): starved, not stuck; waiting for it",
                            self.owner, kind, took, limit, max(ran, 0.0))
            return
        without = f", {lost:.1f} s of them without CPU" if lost >= 0.1 else ""
        failure = EnvFailure(f"{self.owner}: env.{kind}() has not returned after {took:.1f} s, "
                             f"{self._limit_text(kind)}{without} (worker.env_timeout_factor and "
                             f"worker.env_timeout_min_s set this limit; 0 for "
                             f"env_timeout_factor turns it off)")
        self.verdict = (call, failure)
        if self.interrupt and call[2]:
            sent.append(ran)
            self._send(call)
        elif self.interrupt:  # the caller raises it only if the call ever returns
            log.error("%s (the call cannot be interrupted: it was made on a thread other than "
                      "the main one)", failure)

    def _send(self, call: Call) -> None:
        if self.interrupt and call[2]:
            self.pending = call
            interrupts.send()

    def _insist(self, call: Call, took: float, sent: list[float], ran: float) -> None:
        """A stuck call that did not unwind: interrupt it again, or end the process."""
        if len(sent) < TRIES:
            log.warning("%s: env.%s() has not unwound %.1f s after its interrupt: sending "
                        "another", self.owner, call[0], ran - sent[-1])
            sent.append(ran)
            self._send(call)
            return
        # The main thread is held in code that neither returns nor looks at signals (C code,
        # or an env that catches BaseException): the worker can do nothing more.
        log.critical("%s: env.%s() has not returned after %.1f s and ignored %d interrupts (it "
                     "runs code that does not look at signals): the process ends with exit "
                     "code 1", self.owner, call[0], took, len(sent))
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(1)


class Interrupts:
    """The one signal handler that interrupts stuck env calls made on the main thread, shared by
    every :class:`Watchdog` of the process, installed while one is registered."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.dogs: set[Watchdog] = set()
        self.previous: Any = None
        self.main = threading.main_thread()
        self.handler = self._handler  # one bound method, so that `is` finds it installed

    def why_not(self) -> str | None:
        """Why a signal cannot interrupt calls made on this thread, or None where it can: the main
        thread, on an OS with ``pthread_kill``, with the signal's handler the default or ours."""
        if SIGNAL is None or not hasattr(signal, "pthread_kill"):
            return "this OS has no signal to interrupt a thread with"
        if threading.current_thread() is not self.main:
            return ("not on the main thread, the only one a signal reaches, so a stuck call "
                    "could not be interrupted")
        if signal.getsignal(SIGNAL) not in (signal.SIG_DFL, self.handler):
            return f"{signal.Signals(SIGNAL).name} has a handler of its own"
        return None

    def add(self, dog: Watchdog) -> None:
        """Count ``dog`` in, installing the handler (from the main thread, where :meth:`why_not`
        is None)."""
        assert SIGNAL is not None  # (why_not says so)
        with self.lock:
            if signal.getsignal(SIGNAL) is not self.handler:
                self.previous = signal.signal(SIGNAL, self.handler)
            self.dogs.add(dog)

    def remove(self, dog: Watchdog) -> None:
        """Count ``dog`` out; the last one out restores the previous handler (from the main
        thread: elsewhere the handler stays, doing nothing)."""
        with self.lock:
            self.dogs.discard(dog)
            if self.dogs or SIGNAL is None or threading.current_thread() is not self.main:
                return
            if signal.getsignal(SIGNAL) is self.handler:
                signal.signal(SIGNAL, self.previous or signal.SIG_DFL)

    def send(self) -> None:
        """Interrupt the main thread: its handler raises in the call a watchdog marked pending."""
        if SIGNAL is not None and self.main.ident is not None:
            signal.pthread_kill(self.main.ident, SIGNAL)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        # no lock: the main thread may hold it (tuple() of a set is atomic under the GIL)
        for dog in tuple(self.dogs):
            call = dog.pending
            # still in the call it was sent for (one exception per interrupt)
            if call is not None and dog.current is call:
                dog.pending = None
                raise CallInterrupted(call[0])


interrupts = Interrupts()
