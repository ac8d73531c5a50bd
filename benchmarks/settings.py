"""How a family's options become the settings it runs with, one frozen dataclass per family.

A family module declares ``Settings`` (its defaults are the documented full run), ``SMOKE`` (the
quickest setting, seconds, to show that the family runs; its figures mean nothing) and, where it
has one, ``QUICK`` (a shorter, noisier run). Its command-line options are named after the fields
and default to None, so that :func:`resolve` can tell an option given from one left out: the
preset (``--smoke``, ``--quick`` or none) first, then every option given on top of it.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

S = TypeVar("S", bound="DataclassInstance")


def ints(text: str) -> tuple[int, ...]:
    """``"1,4,16"`` -> ``(1, 4, 16)``: an option that takes a comma-separated list of integers."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}") from None


def names(text: str) -> tuple[str, ...]:
    """``"mlp,cnn"`` -> ``("mlp", "cnn")``: an option that takes a comma-separated list of names."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def choose(given: tuple[str, ...], allowed: Any, option: str) -> None:
    """Raise a ValueError naming ``option`` when ``given`` holds a name that is not ``allowed``."""
    unknown = [x for x in given if x not in allowed]
    if unknown or not given:
        raise ValueError(f"{option}: unknown {', '.join(unknown) or '(none given)'}; "
                         f"choose among {', '.join(allowed)}")


def positive(option: str, value: float, minimum: float = 0.0, *, strict: bool = True) -> None:
    """Raise a ValueError naming ``option`` when ``value`` is not above (or at least)
    ``minimum``."""
    if value < minimum or (strict and value == minimum):
        raise ValueError(f"{option} must be {'>' if strict else '>='} {minimum:g} (got {value:g})")


def resolve(defaults: S, smoke: S, quick: S | None, args: argparse.Namespace) -> S:
    """The settings a run uses: the preset its flags pick, then each option given on top.

    Raises:
        ValueError: an option's value is out of range (the settings' own checks say which).
    """
    if getattr(args, "smoke", False):
        base = smoke
    elif getattr(args, "quick", False) and quick is not None:
        base = quick
    else:
        base = defaults
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(base)
             if getattr(args, f.name, None) is not None}
    return dataclasses.replace(base, **given)


def described(settings: Any) -> str:
    """``key=value`` for each setting, as the run prints them before it starts."""
    def show(value: Any) -> str:
        if isinstance(value, tuple):
            return ",".join(str(v) for v in value)
        return str(value)

    return ", ".join(f"{k}={show(v)}" for k, v in dataclasses.asdict(settings).items())

