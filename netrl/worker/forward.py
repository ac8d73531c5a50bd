"""Attributes of the worker that are attributes of its parts: code written
before the worker had parts (tmrl-style scripts, the single-process mode) reads
``worker.version``, ``worker.produced``..."""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["Via"]

T = TypeVar("T")


class Via(Generic[T]):
    """``Via("policy", "version")``: the worker's ``version`` is its policy's, read
    and written; ``Via("settings", "standalone", writable=False)`` is read only (the
    parts took it when built)."""

    def __init__(self, part: str, name: str, writable: bool = True) -> None:
        self.part, self.name, self.writable = part, name, writable

    def __get__(self, obj: object, owner: type | None = None) -> T:
        return getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: object, value: T) -> None:
        if not self.writable:
            raise AttributeError(
                f"{type(obj).__name__}.{self.name} is a setting, fixed when the worker is built: "
                f"pass {self.name}= to the constructor or to from_config (or in WorkerSettings)")
        setattr(getattr(obj, self.part), self.name, value)
