"""Small helpers: those kept from tmrl's ``tmrl.util`` (so that ported code imports the same names),
and the few that log lines in every layer share."""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["cached_property", "count_of", "declared_reward_range", "did_you_mean", "lazy_exports", "partial", "prod",
           "takes_args", "version_label", "worth_logging"]

T = TypeVar("T", bound=Callable[..., Any])

# tmrl.util.cached_property: computed on first access, then kept. Assign it in a class body, e.g.
# ``model_nograd = cached_property(lambda self: no_grad(copy_shared(self.model)))`` (see netrl.nn).
cached_property = functools.cached_property


def partial(func: T, *args: Any, **kwargs: Any) -> T:
    """Partially instantiate a class or function, as
    ``tmrl.util.partial``: ``partial(GenericGymEnv, id=...)``."""
    return functools.partial(func, *args, **kwargs)  # type: ignore[return-value]


def takes_args(fn: Callable[..., Any], n: int) -> bool:
    """Whether ``fn`` can be called with ``n`` positional arguments (True when its signature
    cannot be read, as for some builtins: the first call tells)."""
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


def worth_logging(count: int, first: int = 10, every: int = 1000) -> bool:
    """Whether the ``count``-th occurrence of a problem is logged: the first ``first``, then every
    ``every``-th, so that every kind of problem shows but a flood of one cannot fill the disk."""
    return count <= first or count % every == 0


def version_label(version: Any) -> str:
    """``v3``, or ``none`` before any weights arrived (versions start at 1; -1 means none)."""
    return f"v{version}" if isinstance(version, int) and version >= 0 else "none"


def count_of(n: int, noun: str) -> str:
    """``1 worker``, ``3 workers``: a count with its noun in the right number
    (English plural in -s)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562) for ``exports`` (name -> module):
    each name is imported on first use, so importing the package stays cheap (no torch, OpenCV or
    Gymnasium until a class is needed)."""

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def dir_() -> list[str]:
        return sorted(exports)

    return getattr_, dir_


def did_you_mean(name: str, known: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean "<prefix><nearest>"?)`` for a name that is none of ``known``, or "" when
    none is near: the hint that config keys and the roles' keyword arguments give alike."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f' (did you mean "{prefix}{close[0]}"?)' if close else ""


def declared_reward_range(env: Any, finite: bool = True) -> tuple[float, float] | None:
    """The ``reward_range`` ``env`` (or the env it wraps) declares (gymnasium envs may; 1.x has no
    default), or None; with ``finite``, only a finite one (the trainer's bound on rewards)."""
    for obj in (env, getattr(env, "unwrapped", None)):
        declared = getattr(obj, "reward_range", None)
        try:
            lo, hi = float(declared[0]), float(declared[1])  # type: ignore[index]
        except (TypeError, ValueError, IndexError):
            continue
        if lo <= hi and (not finite or (math.isfinite(lo) and math.isfinite(hi))):
            return lo, hi
    return None
