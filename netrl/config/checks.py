"""The checks config fields carry: each takes a value and returns what is wrong with it, or None.

:mod:`netrl.config.sections` attaches them to its dataclass fields; :mod:`netrl.config.build` runs
them and ``_validate`` in :mod:`netrl.config.sections` lists every problem. The rules between
``agent.algorithm`` and the keys it needs are in :mod:`netrl.config.algorithms`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["BUILT_IN_PIPELINES", "MAX_NAME_BYTES", "Check", "between", "file_name", "folder", "ge",
           "gt", "hidden_indices", "home", "host", "info_keys", "nonempty", "optional",
           "optional_folder", "pipeline_name", "port", "sequence_problems", "sizes", "torch_device"]

Check = Callable[[Any], "str | None"]


def gt(bound: float) -> Check:
    return lambda v: None if v > bound else f"must be > {bound}"


def ge(bound: float) -> Check:
    return lambda v: None if v >= bound else f"must be >= {bound}"


def between(lo: float, hi: float) -> Check:
    return lambda v: None if lo <= v <= hi else f"must be between {lo} and {hi}"


def port(v: int) -> str | None:
    return None if 1 <= v <= 65535 else "must be a TCP port between 1 and 65535"


def nonempty(v: str) -> str | None:
    return None if v.strip() else "must not be empty"


BUILT_IN_PIPELINES = ("gym", "drone", "image")


def pipeline_name(v: str) -> str | None:
    """A built-in pipeline, or ``module:function`` (dotted module path, then a function name)."""
    if v in BUILT_IN_PIPELINES:
        return None
    module, _, function = v.partition(":")
    if module and all(part.isidentifier() for part in module.split(".")) and function.isidentifier():
        return None
    return ('must be "gym", "drone", "image", or "module:function" naming a '
            "function of the config that returns a netrl.pipelines.Pipeline")


HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*")


def host(v: str) -> str | None:
    """An IPv4 address or a host name (ZeroMQ resolves it); IPv6 literals are not supported."""
    if ":" in v:
        return "must be an IPv4 address or a host name (IPv6 addresses are not supported)"
    return None if HOST_NAME.fullmatch(v) else ("must be an IPv4 address or a "
                                                "host name, e.g. 192.168.1.20")


# The longest run_name, in bytes: file systems allow 255 for a name, and netrl makes
# longer ones from it (the demo moves a finished run to <run_name>-<date>-<time>, beside
# its lock .<run_name>.demo-lock)
MAX_NAME_BYTES = 200


def file_name(v: str) -> str | None:
    if not v.strip():
        return "must not be empty"
    if v in (".", "..") or set("/\\") & set(v):
        return "must be a folder name (no '/' or '\\'; set weights_folder for where runs go)"
    size = len(v.encode("utf-8", "surrogatepass"))
    # else it passes here and stops the role that makes the folder: "File name too long"
    if size > MAX_NAME_BYTES:
        return (f"must be at most {MAX_NAME_BYTES} bytes in UTF-8, not {size}: file "
                f"systems allow 255 for a name, and netrl makes longer names from it")
    return None


DEVICE = re.compile(r"cpu|cuda(:\d{1,2})?|mps")


def torch_device(v: str) -> str | None:
    return None if DEVICE.fullmatch(v) else ('must be a torch device: "cpu", '
                                             '"cuda", "cuda:N" or "mps"')


def home(v: Any) -> Any:
    """A folder path with a leading ``~`` or ``~user`` made the home folder (a field's ``convert``,
    run before its check): JSON has no shell to expand it, and a literal ``~`` folder would
    appear in the current one."""
    return os.path.expanduser(v) if isinstance(v, str) else v


def folder(v: str) -> str | None:
    """A folder path that is, or can become, a folder: neither it nor a parent of it is a file. A
    leading ``~`` is expanded before (see :func:`home`): one still there names no home folder."""
    if not v.strip():
        return "must not be empty"
    if v.startswith("~"):
        return (f"starts with {v.split('/')[0]}, but this machine has no such home folder "
                f"(is HOME set?): give the full path, or ./~... for a folder of that name")
    path = Path(v)
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            return f"must be a folder, but {part} is a file" if part == path else f"lies inside {part}, which is a file"
    return None


def sizes(v: list[int]) -> str | None:
    return None if v and all(h >= 1 for h in v) else "must be a non-empty list of sizes >= 1"


def hidden_indices(v: list[int]) -> str | None:
    if any(i < 0 for i in v) or len(set(v)) != len(v):
        return "must list distinct indices >= 0"
    return None


def env_transforms(v: list[Any]) -> str | None:
    """env.transforms: each entry a known transform with valid options (named by its place)."""
    from netrl.envs.transform_config import transform_problems

    problems = transform_problems(v)
    return "; ".join(problems) if problems else None


def info_keys(v: list[dict[str, Any]]) -> str | None:
    """env.info_keys: each entry {"name", "dtype", "shape", "default"} (all but name optional)."""
    from netrl.samples.info import check_info_keys  # numpy: loaded when the key is set

    try:
        check_info_keys(v, "the list")
    except ValueError as exc:
        return f"must list info keys ({exc})"
    return None


def optional(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


def optional_folder(v: str | None) -> str | None:
    """:func:`folder`, or null for the default; "" is not taken for null (a user who
    wrote it meant something)."""
    if v is not None and not v.strip():
        return "must not be empty (null: the default)"
    return optional(folder)(v)


def sequence_problems(cfg: Any) -> list[tuple[tuple[str, ...], str]]:
    """The rules between the sequence keys (``memory.sequence_length``, ``memory.burn_in``) and the
    memory; those with ``agent.recurrent`` are in :mod:`netrl.config.algorithms`."""
    m = cfg.memory
    problems: list[tuple[tuple[str, ...], str]] = []
    if m.sequence_length > m.memory_size:
        problems.append((("memory.sequence_length", "memory.memory_size"),
                         f"memory.sequence_length ({m.sequence_length}) "
                         f"must be <= memory.memory_size ({m.memory_size}): a "
                         f"sequence cannot be longer than the memory"))
    if m.burn_in and m.burn_in >= m.sequence_length:
        problems.append((("memory.burn_in", "memory.sequence_length"),
                         f"memory.burn_in ({m.burn_in}) must be < "
                         f"memory.sequence_length ({m.sequence_length}): a sequence "
                         f"needs steps left to learn from after its burn-in"))
    return problems
