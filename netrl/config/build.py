"""Building the config's dataclasses from parsed JSON, generically: every value is converted to its
field's type and checked, and every rejected key is collected rather than raised.

:mod:`netrl.config.sections` owns what the config is (the dataclasses, the rules between fields)
and calls :func:`build_dataclass` on the whole tree. This module knows only type hints and field
metadata: a field's ``check`` (see :mod:`netrl.config.checks`) runs on the converted value, and a
key the dataclass lacks is reported with the closest known key as a suggestion.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, Literal

from netrl.util import did_you_mean

__all__ = ["build_dataclass", "field_problem", "setting"]


def setting(default: Any, help: str, check: Callable[[Any], str | None] | None = None,
            convert: Callable[[Any], Any] | None = None) -> Any:
    """A config field with its ``help`` line, the ``check`` its value must pass, and a ``convert``
    applied before the check (see :func:`field_problem`)."""
    metadata = {"help": help, "check": check, "convert": convert}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(json.dumps(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin is list:
        plural = {int: "integers", float: "finite numbers", str: "strings"}
        item = typing.get_args(tp)[0]
        if typing.get_origin(item) is dict:
            return "a list of objects"
        return f"a list of {plural[item]}" if item in plural else f"a list of {_type_name(item)}"
    if origin is dict:
        return "an object"
    return {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _convert(value: Any, tp: Any) -> tuple[bool, Any]:
    """Return (ok, converted) for a JSON value against a field type."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp), value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None):
                if value is None:
                    return True, None
                continue
            ok, conv = _convert(value, arg)
            if ok:
                return True, conv
        return False, value
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list):
            return False, value
        items = [_convert(v, inner) for v in value]
        return all(ok for ok, _ in items), [conv for _, conv in items]
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value), value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:  # bounded like a C long long: torch and ZeroMQ take these values
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63, value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return ok, float(value) if ok else value
    if tp is str:
        return isinstance(value, str), value
    return False, value


def field_problem(f: dataclasses.Field[Any], tp: Any, value: Any) -> tuple[str | None, Any]:
    """(what is wrong with ``value`` for the leaf field ``f``, or None; the converted value). A
    field's ``convert`` (e.g. expanding ``~`` in a folder) runs before its ``check``, so the check
    sees the value the config holds."""
    ok, conv = _convert(value, tp)
    if not ok:
        return f"must be {_type_name(tp)}", value
    convert = f.metadata.get("convert")
    if convert:
        conv = convert(conv)
    check = f.metadata.get("check")
    return (check(conv) if check else None), conv


def build_dataclass(cls: type, data: Any, path: str, problems: list[tuple[str, str]]) -> Any:
    """``cls`` from ``data``; each rejected key is appended to ``problems`` as
    (key path, message)."""
    if not isinstance(data, Mapping):
        problems.append((path, f"{path or 'the top level'} must be an "
                               f"object (got {json.dumps(data)})"))
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else key
        if key not in fields:
            hint = did_you_mean(key, fields, f"{path}." if path else "")
            problems.append((key_path, f'unknown key "{key_path}"{hint}'))
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = build_dataclass(typing.cast(type, tp), value, key_path, problems)
            continue
        message, conv = field_problem(fields[key], tp, value)
        if message:
            problems.append((key_path, f"{key_path} {message} (got {json.dumps(value)})"))
            continue
        kwargs[key] = conv
    return cls(**kwargs)
