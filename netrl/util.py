"""Small helpers kept from tmrl's ``tmrl.util`` so that ported code imports the same names."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["partial", "prod"]

T = TypeVar("T", bound=Callable[..., Any])


def partial(func: T, *args: Any, **kwargs: Any) -> T:
    """Partially instantiate a class or function, as ``tmrl.util.partial``: ``partial(GenericGymEnv, id=...)``."""
    return functools.partial(func, *args, **kwargs)  # type: ignore[return-value]


def prod(iterable: Iterable[int]) -> int:
    """Product of the items (1 for an empty iterable), as ``tmrl.util.prod``."""
    return math.prod(iterable)
