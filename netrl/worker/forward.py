"""Attributes of the worker that are attributes of its parts: code written before the worker had
parts (tmrl-style scripts, the single-process mode) reads ``worker.version``, ``worker.produced``..."""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["Via"]

T = TypeVar("T")


class Via(Generic[T]):
    """``Via("policy", "version")``: the worker's ``version`` is its policy's, read and written."""

    def __init__(self, part: str, name: str) -> None:
        self.part, self.name = part, name

    def __get__(self, obj: object, owner: type | None = None) -> T:
        return getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj: object, value: T) -> None:
        setattr(getattr(obj, self.part), self.name, value)
