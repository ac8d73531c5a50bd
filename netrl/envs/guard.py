"""Env calls that cannot hang the worker: each runs on the env's own thread, watched
for time and for dead threads.

An env may do its work in threads of its own: rtgym runs the user's interface in one, and when
that thread raises, the traceback is printed and the next ``step()`` waits for an observation that
never comes. Called directly, such an env would hold the worker for ever, connected and silent.
:class:`EnvCaller` builds the env, and then calls its ``reset``, ``step`` and ``close``, on one
thread of its own (so an env that must stay on the thread that built it, such as one with a
window or a GPU context, still does), while the worker's thread waits for each call and watches:

- an exception that ends any other thread of the process (``threading.excepthook``)
  fails the call at once;
- a call that runs longer than ``timeout_factor`` times the mean duration of earlier calls of
  its kind (and at least ``min_timeout_s``) fails it too. The first call of each kind has
  ``timeout_factor * min_timeout_s``, since a first ``reset()`` may load a game or home a robot.

With ``timeout_factor`` 0 the calls run on the caller's thread: no hand-over
(tens of microseconds on a busy machine, which an env that steps in microseconds may
notice), and no time limit.

Either way :class:`~netrl.errors.EnvFailure` names the call, the thread and the exception. A
call stuck in the env stays stuck: its thread is a daemon, left behind, and the env is not used
again (:attr:`EnvCaller.stuck`).

"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from netrl.errors import EnvFailure

__all__ = ["EnvCaller"]

log = logging.getLogger(__name__)

_WATCH_S = 0.1  # how often a waiting call looks at the clock and at dead threads


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
    """Builds an env on a thread of its own and runs each of its calls there,
    under watch (see the module).

    Args:
        env_cls: called on the env thread to build the env.
        owner: named in messages ("worker robot-1").
        timeout_factor: a call longer than this multiple of its kind's mean duration fails. 0: no
            time limit, and the calls run on the caller's thread (a dead thread still fails the
            call that returns after it).
        min_timeout_s: no call fails for time before this; the first call of each kind gets
            ``timeout_factor * min_timeout_s``.
    """

    def __init__(self, env_cls: Callable[[], Any], owner: str, timeout_factor: float = 50.0,
                 min_timeout_s: float = 5.0) -> None:
        self.owner, self.timeout_factor, self.min_timeout_s = owner, timeout_factor, min_timeout_s
        self.stuck = False  # a call never came back: the env thread is lost with it
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
        if timeout_factor > 0:
            self._thread = threading.Thread(target=self._serve, name=f"env of {owner}", daemon=True)
            self._thread.start()
        _dead.watch(self)
        try:
            self.env = self.call("build", env_cls)
        except BaseException:
            self.close()
            raise

    def call(self, kind: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the env thread; its result, or its exception re-raised here.
        ``kind`` ("step", "reset") names the call in messages and keeps its own mean duration."""
        if self.stuck:
            raise EnvFailure(f"{self.owner}: the env is still stuck in an "
                             f"earlier call and cannot be used")
        self._raise_failure(kind)
        if self._thread is None:  # no time limit: the caller's own thread runs it
            value = fn(*args, **kwargs)
            self._raise_failure(kind)
            return value
        started = time.monotonic()
        self._job = (fn, args, kwargs)
        self._go.release()
        limit = self._limit(kind)
        while not self._finished.acquire(timeout=_WATCH_S if limit is None else min(_WATCH_S, limit)):
            if self._failure is not None:
                # the call is still inside the env, waiting for the thread that died
                self.stuck = True
                self._raise_failure(kind)
            took = time.monotonic() - started
            if limit is not None and took > limit:
                self.stuck = True
                raise EnvFailure(f"{self.owner}: env.{kind}() has not returned "
                                 f"after {took:.1f} s, {self._limit_text(kind)} "
                                 f"(worker.env_timeout_factor and worker.env_timeout_min_s "
                                 f"set this limit; 0 for env_timeout_factor turns it off)")
        ok, value = self._result
        mean = self._means.get(kind)
        took = time.monotonic() - started
        self._means[kind] = took if mean is None else 0.95 * mean + 0.05 * took
        if not ok:
            raise value
        # a thread died while the call returned: the env's state is not to be trusted
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

    def close(self) -> None:
        """Close the env on its thread (unless a call is stuck there) and end
        the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _dead.unwatch(self)
        env = getattr(self, "env", None)
        if env is not None and not self.stuck:
            self._failure = None  # closing is still worth a try after another thread's death
            try:
                self.call("close", env.close)
            finally:
                self._stop_thread()
        else:
            if self.stuck:
                log.warning("%s: the env is not closed: its thread is still stuck in a call",
                            self.owner)
            self._stop_thread()

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
