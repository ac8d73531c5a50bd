"""Small helpers kept from tmrl's ``tmrl.util`` so that ported code imports the same names."""

from __future__ import annotations

import functools
import inspect
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["cached_property", "partial", "prod", "takes_args"]

T = TypeVar("T", bound=Callable[..., Any])

# tmrl.util.cached_property: computed on first access, then kept. Assign it in a class body, e.g.
# ``model_nograd = cached_property(lambda self: no_grad(copy_shared(self.model)))`` (see netrl.nn).
cached_property = functools.cached_property


def partial(func: T, *args: Any, **kwargs: Any) -> T:
    """Partially instantiate a class or function, as ``tmrl.util.partial``: ``partial(GenericGymEnv, id=...)``."""
    return functools.partial(func, *args, **kwargs)  # type: ignore[return-value]


def takes_args(fn: Callable[..., Any], n: int) -> bool:
    """Whether ``fn`` can be called with ``n`` positional arguments (True when its signature cannot be read, as for
    some builtins: the first call tells)."""
    try:
        inspect.signature(fn).bind(*range(n))
    except ValueError:
        return True
    except TypeError:
        return False
    return True


def prod(iterable: Iterable[int]) -> int:
    """Product of the items (1 for an empty iterable), as ``tmrl.util.prod``."""
    return math.prod(iterable)


class RunStop(threading.Event):
    """The event a role's ``run()`` watches: set when the caller's ``stop`` is, or by the role's ``close()`` called
    from another thread. close() sets this one, not the caller's, which other roles in the process may watch too."""

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
