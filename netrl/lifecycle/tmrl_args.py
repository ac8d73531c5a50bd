"""tmrl's arguments that netrl's roles do not take, refused with what to do instead (internal).

A tmrl script ported to netrl passes tmrl's keywords (``crc_debug``, ``password``,
``checkpoint_path``...) and, at times, arguments in tmrl's positional order, which differs
from netrl's after the first few. Python's own errors for these ("got an unexpected keyword
argument", "'<' not supported between 'str' and 'int'") say neither why nor what to write instead;
:func:`tmrl_arguments` checks a role's call first and says both.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

__all__ = ["SERVER_ONLY", "TMRL_ONLY", "is_count", "is_number", "is_path", "is_text", "tmrl_arguments"]

F = TypeVar("F", bound=Callable[..., Any])

_TLSPYO = ("a setting of tmrl's tlspyo transport, which netrl does not use; remove it (netrl's "
           "network settings are network=NetworkConfig(...), see docs/configuration.md)")
_KEYS = ("netrl encrypts and authenticates with CURVE keys, not a "
         "password or TLS: make them with python -m netrl --keygen and pass "
         "keys=client_keys(keys_dir, role, name) (docs/security.md); remove it")
_CHECKPOINTS = ("netrl checkpoints into run_dir after every epoch and resumes "
                "from there by itself (state_dicts, nothing pickled); "
                "remove it, and give run_dir=... to choose the folder")

# Keywords of tmrl's RolloutWorker and Trainer that netrl does not take, and why
TMRL_ONLY: Mapping[str, str] = {
    "crc_debug": ("tmrl's switch to checksum samples while debugging a pipeline: netrl "
                  "checks every packet (layout, dtypes, shapes and values) always, and "
                  "python -m netrl --check-env runs an env through those checks; remove it"),
    "password": _KEYS, "security": _KEYS, "keys_dir": _KEYS,
    "hostname": "tmrl's TLS host name: CURVE keys need none; remove it",
    "local_port": _TLSPYO, "local_com_port": _TLSPYO, "header_size": _TLSPYO, "max_buf_len": _TLSPYO,
    "checkpoint_path": _CHECKPOINTS, "dump_run_instance_fn": _CHECKPOINTS, "load_run_instance_fn": _CHECKPOINTS,
    "updater_fn": _CHECKPOINTS,
}
SERVER_ONLY: Mapping[str, str] = {
    "port": "netrl's server listens on two ports: give "
            "trainer_port=... and worker_port=... instead",
    "password": _KEYS.replace("client_keys(keys_dir, role, name)", "server_keys(keys_dir)"),
    "security": _KEYS.replace("client_keys(keys_dir, role, name)", "server_keys(keys_dir)"),
    "keys_dir": _KEYS.replace("client_keys(keys_dir, role, name)", "server_keys(keys_dir)"),
    "local_port": _TLSPYO, "header_size": _TLSPYO,
}

Check = tuple[Callable[[Any], bool], str]  # (does the value fit, what the parameter takes)


def is_text(value: Any) -> bool:
    return value is None or isinstance(value, str)


def is_path(value: Any) -> bool:
    return value is None or isinstance(value, (str, os.PathLike))


def is_count(value: Any) -> bool:
    # (numpy's integers too)
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def tmrl_arguments(role: str, tmrl_order: tuple[str, ...], not_taken: Mapping[str, str], after: str,
                   checks: Mapping[str, Check] | None = None) -> Callable[[F], F]:
    """Wrap a role's ``__init__`` so that a call with tmrl's arguments fails with a TypeError that
    says what to do: a keyword in ``not_taken``; a value by position that does not fit the parameter
    netrl has at that place (``checks``: parameter -> (test, what it takes)), naming the one today's
    tmrl has there (``tmrl_order``); or more arguments by position than netrl takes (``after``:
    what tmrl has after them)."""
    checks = checks or {}

    def wrap(init: F) -> F:
        params = list(inspect.signature(init).parameters.values())[1:]  # (self)
        taken = {p.name for p in params}
        positional = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        order = f"({', '.join(positional)})"

        @functools.wraps(init)
        def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
            for name, value in kwargs.items():
                if name in not_taken and name not in taken:
                    raise TypeError(f"{role}() got tmrl's argument {name}={value!r}, "
                                    f"which netrl does not take: {not_taken[name]}")
            for i, (name, value) in enumerate(zip(positional, args, strict=False)):
                test, takes = checks.get(name, (None, ""))
                if test is not None and not test(value):
                    theirs = tmrl_order[i] if i < len(tmrl_order) else None
                    there = f"; tmrl's order has {theirs} there" if theirs and theirs != name else ""
                    raise TypeError(f"{role}(): argument {i + 1} by position is {name}, which "
                                    f"takes {takes}, not {value!r}{there}. netrl's order by "
                                    f"position is {order}: pass the arguments by name to be sure")
            if len(args) > len(positional):
                count = f"{len(positional)} argument{'s' * (len(positional) != 1)}"
                raise TypeError(f"{role}() takes {count} by position {order}, but got {len(args)}: "
                                f"{after}; pass the arguments after {positional[-1]} by name")
            return init(self, *args, **kwargs)

        return cast(F, checked)

    return wrap
