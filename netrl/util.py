"""Small helpers kept from tmrl's ``tmrl.util`` so that ported code imports the same names."""

from __future__ import annotations

import functools
import inspect
import math
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
