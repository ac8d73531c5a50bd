"""How the library roles (Server, Trainer, RolloutWorker) run: one thread at a time, stopped by
``close()`` from another thread, never run again once closed.

A role keeps one :class:`Runs`. Its ``run()`` enters with the caller's ``stop`` and watches
the :class:`RunStop` it gets back; its ``close()`` calls :meth:`Runs.close` first, which, from
another thread than the running one, stops that run and waits for it to end (the run closes the
role on its way out: sockets, the env and the training loop belong to its thread), and then tears
down once (:meth:`Runs.shut_once`).

In a script, :func:`ctrl_c_stops` makes Ctrl+C stop a role the way ``python -m netrl`` does.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from netrl.errors import NetrlError

__all__ = ["RunStop", "Runs", "ctrl_c_stops"]

log = logging.getLogger(__name__)


class RunStop(threading.Event):
    """The event a role's ``run()`` watches: set when the caller's ``stop`` is, or by the role's
    ``close()`` called from another thread. close() sets this one, not the caller's, which other
    roles in the process may watch too."""

    def __init__(self, stop: threading.Event | None) -> None:
        super().__init__()
        self.outer = stop

    def is_set(self) -> bool:
        return super().is_set() or (self.outer is not None and self.outer.is_set())

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():  # the caller's event cannot wake this one: look at it every 50 ms
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                return False
            super().wait(left)
        return True


class Runs:
    """Which thread runs a role, whether it may run (again), and its teardown, done once."""

    def __init__(self, closed_error: Callable[[], NetrlError], busy_error: Callable[[threading.Thread], NetrlError]
                 ) -> None:
        self._closed_error, self._busy_error = closed_error, busy_error
        self._lock = threading.Lock()  # run() and close() may come from two threads
        self.closed = False  # close() was called (or a run that runs once began): no run may start
        self._shut = False  # the teardown has begun
        self.runner: threading.Thread | None = None
        self.stop = RunStop(None)  # what the runner watches
        self._idle = threading.Event()  # no thread is running
        self._idle.set()

    def enter(self, stop: threading.Event | None, once: bool = False) -> RunStop:
        """Make the calling thread the runner and return the event it is to watch;
        ``once``: no later run may start. Raises the role's error when another thread runs
        it, or when it is closed."""
        with self._lock:
            if self.runner is not None:
                raise self._busy_error(self.runner)
            if self.closed:
                raise self._closed_error()
            self.closed = self.closed or once
            self.runner, self.stop = threading.current_thread(), RunStop(stop)
            self._idle.clear()
            return self.stop

    def leave(self) -> None:
        with self._lock:
            self.runner = None
            self._idle.set()

    def close(self) -> bool:
        """Close: no run may start any more. Called from another thread than the runner, stop the
        run and wait for it to end; returns True then (the run has closed the role on its way
        out, or left that to the caller)."""
        with self._lock:
            self.closed = True
            runner = self.runner if self.runner is not threading.current_thread() else None
            if runner is not None:
                self.stop.set()
        if runner is None:
            return False
        self._idle.wait()
        return True

    def shut_once(self) -> bool:
        """True the first time only: the caller tears the role down."""
        with self._lock:
            first, self._shut = not self._shut, True
            return first

    @property
    def shutting(self) -> bool:
        """The teardown has begun (:meth:`shut_once` was called)."""
        return self._shut

    def check_open(self) -> None:
        """Raise the role's error if it is closed (before building what a run needs)."""
        if self.closed:
            raise self._closed_error()


@contextlib.contextmanager
def ctrl_c_stops(stop: threading.Event, what: str) -> Iterator[None]:
    """While a role runs on the main thread of a script that leaves SIGINT to Python, the first
    Ctrl+C sets ``stop`` (the role saves, flushes and its ``run()`` returns) and a second one
    raises KeyboardInterrupt at once.

    Python's own handler would raise KeyboardInterrupt wherever the main thread happens to be
    (mid-save, mid-send), with a traceback from every process of the script. A handler the script or
    ``python -m netrl`` installed is kept, and so is everything on other threads (only the main
    thread may set a handler)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        log.warning("Ctrl+C: stopping the %s cleanly (Ctrl+C again to interrupt it at once)", what)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)

