"""Env calls that cannot hang the worker: each runs under watch, for time and for dead threads.

An env may do its work in threads of its own: rtgym runs the user's interface in one, and when
that thread raises, the traceback is printed and the next ``step()`` waits for an observation that
never comes. Called directly, such an env would hold the worker for ever, connected and silent.
:class:`EnvCaller` builds the env, and then calls its ``reset``, ``step`` and ``close``, under the
watch of a :class:`~netrl.envs.watchdog.Watchdog` (a thread that looks ten times a second):

- an exception that ends any other thread of the process (``threading.excepthook``)
  fails the call at once;
- a call that runs longer than ``timeout_factor`` times the mean duration of earlier calls of
  its kind (and at least ``min_timeout_s``) fails it too. The first call of each kind has
  ``timeout_factor * min_timeout_s``, since a first ``reset()`` may load a game or home a robot.
  Time in which the process could not run the call (stopped, or waiting for a CPU on a loaded
  machine) does not count: such a call is starved, not stuck, and is warned about and waited for.

Where the calls run:

- on the caller's thread, when it is the main thread and ``same_thread`` is set (a worker's own
  process): nothing is handed over, and the watch costs a call a few microseconds. A stuck call
  is interrupted with a signal (SIGUSR2) whose handler raises inside the env's code; a call that
  lets three interrupts pass (code that never looks at signals) ends the process, exit code 1.
- otherwise (a worker on another thread, as in ``netrl.local``; SIGUSR2 handled by someone else;
  Windows), on one thread of the env's own that builds it and runs each call (so an env that must
  stay on the thread that built it, such as one with a window or a GPU context, still does) while
  the caller waits: the hand-over costs tens of microseconds per call. A stuck call stays stuck
  there: its thread is a daemon, left behind.

With ``timeout_factor`` 0 the calls run on the caller's thread, with no watchdog and no time
limit (a dead thread still fails the call that returns after it).

Either way :class:`~netrl.errors.EnvFailure` names the call, the thread and the exception, and an
env whose call failed so is not used again (:attr:`EnvCaller.stuck`).

"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from netrl.envs.watchdog import Call, CallInterrupted, Watchdog, interrupts
from netrl.errors import EnvFailure

__all__ = ["EnvCaller"]

log = logging.getLogger(__name__)

_WATCH_S = 0.1  # how often a caller waiting on the env's thread looks for a verdict


class _DeadThreads:
    """Exceptions that ended threads of this process, seen through one
    chained ``threading.excepthook``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.callers: set[EnvCaller] = set()
        self.installed = False

    def watch(self, caller: EnvCaller) -> None:
        with self.lock:
            if not self.installed:
                previous = threading.excepthook

                def hook(args: threading.ExceptHookArgs) -> None:
                    self.died(args)
                    previous(args)  # the traceback is still printed where the user expects it

                threading.excepthook = hook
                self.installed = True
            self.callers.add(caller)

    def unwatch(self, caller: EnvCaller) -> None:
        with self.lock:
            self.callers.discard(caller)

    def died(self, args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:  # a thread that chose to end
            return
        name = args.thread.name if args.thread is not None else "a thread"
        text = "".join(traceback.format_exception_only(args.exc_type, args.exc_value)).strip()
        with self.lock:
            callers = list(self.callers)
        for caller in callers:
            caller.thread_died(name, text, args.exc_value)


_dead = _DeadThreads()


class EnvCaller:
    """Builds an env and runs each of its calls under watch (see the module).

    Args:
        env_cls: called (on the thread the calls run on) to build the env.
        owner: named in messages ("worker robot-1").
        timeout_factor: a call longer than this multiple of its kind's mean duration fails. 0: no
            time limit, and the calls run on the caller's thread (a dead thread still fails the
            call that returns after it).
        min_timeout_s: no call fails for time before this; the first call of each kind gets
            ``timeout_factor * min_timeout_s``.
        same_thread: run the calls on the caller's thread, a stuck one interrupted with a signal,
            where the caller is the main thread (else on a thread of the env's own, logged).
    """

    def __init__(self, env_cls: Callable[[], Any], owner: str, timeout_factor: float = 50.0,
                 min_timeout_s: float = 5.0, same_thread: bool = False) -> None:
        self.owner, self.timeout_factor, self.min_timeout_s = owner, timeout_factor, min_timeout_s
        self.stuck = False  # a call failed for time or a dead thread: the env is not used again
        self._means: dict[str, float] = {}
        # Two bare locks hand each call over and back: about 5 microseconds each way on an
        # idle core, several times less than a Condition or an Event, which make a
        # new lock for every wait.
        self._go, self._finished = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._finished.acquire()
        self._job: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None = None
        self._result: tuple[bool, Any] = (True, None)
        # from another thread's death, for the call under way or the next
        self._failure: EnvFailure | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self._watch: Watchdog | None = None
        self._main = threading.main_thread().ident  # the one thread a signal can interrupt
        if timeout_factor > 0:
            why_not = interrupts.why_not() if same_thread else "not asked for"
            native_id: int | None = None
            if why_not is None:
                native_id = threading.get_native_id()
            else:
                if same_thread:
                    log.info("%s: env calls run on a thread of their own, handed over (%s)",
                             owner, why_not)
                self._thread = threading.Thread(target=self._serve, name=f"env of {owner}",
                                                daemon=True)
                self._thread.start()
                native_id = self._thread.native_id
            self._watch = Watchdog(owner, self._limit, self._limit_text, min_timeout_s,
                                   native_id, interrupt=why_not is None)
            if why_not is None:
                interrupts.add(self._watch)
        _dead.watch(self)
        try:
            self.env = self.call("build", env_cls)
        except BaseException:
            self.close()
            raise

    @property
    def starved(self) -> int:
        """Calls found starved of CPU past their limit, warned about and waited for."""
        return 0 if self._watch is None else self._watch.starved

    def call(self, kind: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` under watch; its result, or its exception re-raised here.
        ``kind`` ("step", "reset") names the call in messages and keeps its own mean duration."""
        if self.stuck:
            raise EnvFailure(f"{self.owner}: the env is still stuck in an "
                             f"earlier call and cannot be used")
        if self._failure is not None:
            self._raise_failure(kind)
        watch = self._watch
        if watch is None:  # no time limit: the caller's own thread runs it
            value = fn(*args, **kwargs)
            if self._failure is not None:
                self._raise_failure(kind)
            return value
        if self._thread is not None:
            return self._hand_over(watch, kind, fn, args, kwargs)
        # the hot path of a one-env worker: a few attribute stores around the call
        started = time.monotonic()
        call: Call = (kind, started, threading.get_ident() == self._main)
        watch.current = call
        try:
            value = fn(*args, **kwargs)
            watch.current = None
        except BaseException as exc:
            watch.current = None
            self._failed(watch, call, exc)
            raise
        if watch.starved_call is not call:  # a starved call's duration is not the env's
            mean = self._means.get(kind)
            took = time.monotonic() - started
            self._means[kind] = took if mean is None else 0.95 * mean + 0.05 * took
        if self._failure is not None or watch.verdict is not None:
            # a thread died while the call returned, or it returned past its limit
            self._failed(watch, call, None)
        return value

    def _failed(self, watch: Watchdog, call: Call, exc: BaseException | None) -> None:
        """After a call on this thread raised ``exc`` (or returned): raise the env's failure if
        it has one (a dead thread, a stuck call interrupted), else return."""
        verdict = watch.verdict
        if isinstance(exc, CallInterrupted) or self._failure is not None or (
                verdict is not None and verdict[0] is call):
            self.stuck = True
            self._raise_failure(call[0])
            if verdict is not None and verdict[0] is call:
                raise verdict[1] from None
            raise EnvFailure(f"{self.owner}: env.{call[0]}() was interrupted") from None

    def _hand_over(self, watch: Watchdog, kind: str, fn: Callable[..., Any],
                   args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``call`` on the env's own thread, waited for under watch."""
        started = time.monotonic()
        call: Call = (kind, started, False)
        self._job = (fn, args, kwargs)
        watch.current = call
        self._go.release()
        while not self._finished.acquire(timeout=_WATCH_S):
            if self._failure is not None:
                # the call is still inside the env, waiting for the thread that died
                self.stuck = True
                watch.current = None  # given up on: nothing more to judge
                self._raise_failure(kind)
            verdict = watch.verdict
            if verdict is not None and verdict[0] is call:
                self.stuck = True  # the env's thread stays in the call, left behind
                watch.current = None
                raise verdict[1]
        watch.current = None
        ok, value = self._result
        if watch.starved_call is not call:
            mean = self._means.get(kind)
            took = time.monotonic() - started
            self._means[kind] = took if mean is None else 0.95 * mean + 0.05 * took
        if not ok:
            raise value
        # a thread died while the call returned: the env's state is not to be trusted
        if self._failure is not None:
            self._raise_failure(kind)
        return value

    def _limit(self, kind: str) -> float | None:
        if self.timeout_factor <= 0 or kind in ("build", "close"):
            return None
        mean = self._means.get(kind)
        if mean is None:
            return self.timeout_factor * self.min_timeout_s
        return max(self.min_timeout_s, self.timeout_factor * mean)

    def _limit_text(self, kind: str) -> str:
        mean = self._means.get(kind)
        if mean is None:
            return (f"the limit for a first {kind}() "
                    f"({self.timeout_factor:g} x {self.min_timeout_s:g} s)")
        return (f"beyond {self.timeout_factor:g} times its mean of {mean * 1000:.1f} ms "
                f"(at least {self.min_timeout_s:g} s)")

    def _raise_failure(self, kind: str) -> None:
        failure = self._failure
        if failure is not None:
            self.stuck = True  # found before or after a call too: the env is not to be used again
            raise EnvFailure(f"{failure} (found during env.{kind}())") from failure.__cause__

    def thread_died(self, name: str, text: str, exc: BaseException | None) -> None:
        """Called from the dying thread: it may be the env's own, or one the env started."""
        failure = EnvFailure(f"{self.owner}: thread {name!r} ended with {text}: the env's "
                             f"calls cannot be trusted after it (its traceback is on stderr)")
        failure.__cause__ = exc
        self._failure = failure
        watch = self._watch
        call = None if watch is None or self._thread is not None else watch.current
        if watch is not None and call is not None:  # a call on the main thread waits for it
            watch.fail(call, failure)

    def close(self) -> None:
        """Close the env (unless a call of it is stuck), end its thread and its watchdog.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        _dead.unwatch(self)
        env = getattr(self, "env", None)
        try:
            if env is not None and not self.stuck:
                self._failure = None  # closing is still worth a try after another thread's death
                try:
                    self.call("close", env.close)
                finally:
                    self._stop_thread()
            else:
                if self.stuck:
                    log.warning("%s: the env is not closed: %s", self.owner,
                                "its thread is still stuck in a call" if self._thread else
                                "one of its calls failed")
                self._stop_thread()
        finally:
            if self._watch is not None:
                self._watch.close()
                if self._watch.interrupt:
                    interrupts.remove(self._watch)

    def _stop_thread(self) -> None:
        # the thread is inside the env: it never takes another job
        if self._thread is None or self.stuck:
            return
        self._job = None
        self._go.release()
        self._thread.join(timeout=1.0)

    def _serve(self) -> None:
        while True:
            self._go.acquire()
            job, self._job = self._job, None
            if job is None:
                return
            fn, args, kwargs = job
            try:
                self._result = (True, fn(*args, **kwargs))
            except BaseException as exc:  # handed to the caller, who raises it
                self._result = (False, exc)
            self._finished.release()
