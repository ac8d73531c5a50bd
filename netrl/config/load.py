"""Loading the config: config.json read and parsed, command-line overrides applied, every field
checked and the rules between fields applied, with every problem reported at once, its key path, the
value it got and what is allowed::

    invalid config.json (2 problems)
      trainer.steps must be > 0 (got -3)
      unknown key "memory.capasity" (did you mean "memory.memory_size"?)
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from netrl.config.algorithms import algorithm_problems
from netrl.config.build import build_dataclass, field_problem
from netrl.config.checks import sequence_problems
from netrl.config.renamed import rename_old_keys
from netrl.config.sections import CONFIG_VERSION, Config, Problem
from netrl.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["MAX_DEPTH", "check_value", "config_from_dict", "config_to_dict", "load_config"]


# The roles a check between fields applies to (None: a config loaded without a role, as by
# the Python API, gets every check). A worker or trainer on another machine never binds
# the server's ports, so a clash among them is no concern of theirs; the demo's server
# gets free ports of its own.
_SERVER_ROLES = (None, "server")
_RUN_ROLES = (None, "worker", "trainer")  # the roles that write into <weights_folder>/<run_name>/


def _cross_checks(cfg: Config, role: str | None = None) -> list[Problem]:
    """Checks on the whole config (the version, and rules between fields) for ``role``; each
    message names every field."""
    problems: list[Problem] = []
    if cfg.config_version != CONFIG_VERSION:
        problems.append((("config_version",),
                         f"config_version {cfg.config_version} is not "
                         f"supported; this netrl reads {CONFIG_VERSION}"))
    ports = {"network.trainer_port": cfg.network.trainer_port, "network.worker_port": cfg.network.worker_port,
             "server.status_port": cfg.server.status_port}
    for (a, pa), (b, pb) in itertools.combinations(ports.items(), 2):
        if pa == pb and role in _SERVER_ROLES:
            problems.append(((a, b), f"{a} and {b} must differ (both {pa})"))
    if role in _RUN_ROLES and os.path.realpath(cfg.run_dir) == os.path.realpath(cfg.server_spool_dir):
        # the trainer would find the server's lock on its run folder and blame a second trainer
        spool = ("server.spool_dir" if cfg.server.spool_dir else "server.spool_dir is null: "
                                                                 "<weights_folder>/server-spool")
        problems.append((("run_name", "weights_folder", "server.spool_dir"),
                         f'run_name "{cfg.run_name}" makes the run folder '
                         f"{cfg.run_dir} the server's spool folder ({spool}): choose "
                         f"another run_name (--run-name), or another server.spool_dir"))
    if cfg.memory.memory_size < cfg.memory.batch_size:
        problems.append((("memory.memory_size", "memory.batch_size"),
                         f"memory.memory_size ({cfg.memory.memory_size}) "
                         f"must be >= memory.batch_size ({cfg.memory.batch_size})"))
    if cfg.network.reconnect_max_s < cfg.network.reconnect_initial_s:
        problems.append((("network.reconnect_max_s", "network.reconnect_initial_s"),
                         f"network.reconnect_max_s ({cfg.network.reconnect_max_s}) must be >= "
                         f"network.reconnect_initial_s ({cfg.network.reconnect_initial_s})"))
    if cfg.server.max_bundle_bytes >= cfg.network.max_message_bytes:
        problems.append((("server.max_bundle_bytes", "network.max_message_bytes"),
                         f"server.max_bundle_bytes ({cfg.server.max_bundle_bytes}) must be < "
                         f"network.max_message_bytes ({cfg.network.max_message_bytes}): "
                         f"the trainer refuses larger messages"))
    if cfg.trainer.stale_sample_weight != 0.0 and cfg.trainer.max_policy_lag is None:
        problems.append((("trainer.stale_sample_weight", "trainer.max_policy_lag"),
                         f"trainer.stale_sample_weight ({cfg.trainer.stale_sample_weight}) "
                         f"has no effect while trainer.max_policy_lag is "
                         f"null (no sample is stale): set both, or neither"))
    if cfg.server.max_queue_bytes < cfg.server.max_bundle_bytes:
        problems.append((("server.max_queue_bytes", "server.max_bundle_bytes"),
                         f"server.max_queue_bytes ({cfg.server.max_queue_bytes}) "
                         f"must be >= server.max_bundle_bytes "
                         f"({cfg.server.max_bundle_bytes}): a bundle is built from the queue"))
    if cfg.worker.send_window_bytes > cfg.worker.max_backlog_bytes:
        problems.append((("worker.send_window_bytes", "worker.max_backlog_bytes"),
                         f"worker.send_window_bytes ({cfg.worker.send_window_bytes}) must be <= "
                         f"worker.max_backlog_bytes ({cfg.worker.max_backlog_bytes}): "
                         f"what is in flight is kept in the backlog until acknowledged"))
    if (role in (None, "trainer") and cfg.trainer.total_frames is not None
            and cfg.trainer.total_frames < cfg.trainer.start_training):
        problems.append((("trainer.total_frames", "trainer.start_training"),
                         f"trainer.total_frames ({cfg.trainer.total_frames}) must be >= "
                         f"trainer.start_training ({cfg.trainer.start_training}): "
                         f"training would stop before it starts"))
    problems += _cuda_problems(cfg) + _sequence_problems(cfg)
    if cfg.memory.device == "cuda" and cfg.memory.storage == "disk":
        problems.append((("memory.device", "memory.storage"),
                         'memory.device "cuda" keeps the replay columns on the training device, '
                         'and memory.storage "disk" keeps them in files: set one of them to its '
                         'default ("cpu", "ram")'))
    if cfg.env.pipeline in ("drone", "image") and cfg.env.kwargs:
        problems.append((("env.pipeline", "env.kwargs"),
                         f'env.kwargs is only used by the "gym" pipeline and by '
                         f'your own ones (env.pipeline is "{cfg.env.pipeline}")'))
    if role != "server":  # the server relays whatever the agent is
        problems += algorithm_problems(cfg) + sequence_problems(cfg)
    return problems


def _cuda_problems(cfg: Config) -> list[Problem]:
    """Settings that need a CUDA trainer.device, with another one set."""
    device = cfg.trainer.device
    if device is None or device.startswith("cuda"):
        return []
    problems: list[Problem] = []
    if cfg.memory.device == "cuda":
        problems.append((("memory.device", "trainer.device"),
                         f'memory.device "cuda" keeps the replay memory on the '
                         f'training device, but trainer.device is "{device}": set '
                         f'trainer.device to "cuda" (or null), or memory.device to "cpu"'))
    if cfg.trainer.compile == "cudagraphs":
        problems.append((("trainer.compile", "trainer.device"),
                         f'trainer.compile "cudagraphs" captures CUDA '
                         f'graphs, but trainer.device is "{device}": use '
                         f'"compile" there, or a CUDA trainer.device'))
    return problems


def _sequence_problems(cfg: Config) -> list[Problem]:
    """Sequences follow trajectory links kept in host columns; the memories compose them with
    n-step returns and priorities, which the recurrent SAC takes with windows no longer than its
    sequences."""
    m, recurrent = cfg.memory, cfg.agent.recurrent
    problems: list[Problem] = []
    if m.sequence_length >= 2 and m.device != "cpu":
        problems.append((("memory.sequence_length", "memory.device"),
                         f"memory.sequence_length ({m.sequence_length}) cannot be combined with "
                         f"memory.device ({json.dumps(m.device)}): sequences follow links kept in "
                         f"host memory, step by step"))
    if recurrent is not None and m.sequence_length >= 2 and m.n_step > m.sequence_length:
        problems.append((("memory.n_step", "memory.sequence_length", "agent.recurrent"),
                         f"memory.n_step ({m.n_step}) must be <= memory.sequence_length "
                         f"({m.sequence_length}) with agent.recurrent ({json.dumps(recurrent)}): "
                         f"the recurrent SAC unrolls its core over the observations up to each "
                         f"step's n-step bootstrap, and past a sequence's end only the windows' "
                         f"ends are in the batch; raise memory.sequence_length or lower "
                         f"memory.n_step"))
    return problems


def _validate(data: Any, source: str, flagged: Mapping[str, Any] | None = None, role: str | None = None) -> Config:
    """The config, or a :class:`ConfigError` from ``source`` (naming the command-line flags too
    when a problem involves one of the ``flagged`` keys) with every problem found. Every field is
    checked; a whole-config check runs if it concerns ``role``, and unless a field it involves was
    rejected (the config then holds that field's default, which would make its message wrong)."""
    deep = _too_deep(data)
    if deep is not None:
        raise ConfigError([f"{deep} nests objects and lists more than {MAX_DEPTH} levels "
                           f"deep; no setting needs that many"], source)
    renamed = rename_old_keys(data)
    if renamed.notices:
        count = len(renamed.notices)
        lines = "".join(f"\n  {n}" for n in renamed.notices)
        log.warning("%s uses %d old key name%s, which still work%s: rename them%s", source, count,
                    "s" if count != 1 else "", "s" if count == 1 else "", lines)
    rejected: list[tuple[str, str]] = []
    cfg = typing.cast(Config, build_dataclass(Config, renamed.data, "", rejected))
    bad = {key for key, _ in rejected}

    def involves_bad(key: str) -> bool:
        return any(b == "" or key == b or key.startswith(b + ".") for b in bad)

    # a value set under an old name is refused under that name
    problems: list[Problem] = [
        ((key,), message.replace(key, f"{renamed.origin[key]} (now {key})", 1)
         if key in renamed.origin else message) for key, message in rejected]
    problems += renamed.clashes
    problems += [p for p in _cross_checks(cfg, role) if not any(involves_bad(k) for k in p[0])]
    if problems:
        if any(key in (flagged or {}) for keys, _ in problems for key in keys):
            source = f"{source} with the command-line flags"
        raise ConfigError([message for _, message in problems], source)
    return cfg


# The deepest nesting of objects and lists a config may have (env.kwargs is the user's): deeper
# nesting would overflow the stack when the config is saved beside a checkpoint
MAX_DEPTH = 32


def _too_deep(data: Any) -> str | None:
    """The key (at most section.field, e.g. env.kwargs) under which ``data`` nests deeper than
    :data:`MAX_DEPTH`, or None. Walked without recursion: recursion is what the limit is for."""
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(data, 1, ())]
    while stack:
        node, depth, where = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            return ".".join(where) or "the config"
        # objects all the way down from the top
        named = isinstance(node, dict) and len(where) == depth - 1 < 2
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack += [(child, depth + 1, (*where, str(key)) if named else where) for key, child in items]
    return None


def check_value(key: str, value: Any) -> str | None:
    """What is wrong with setting the dotted ``key`` to ``value``, checked on its own (e.g.
    "must be >= 1"), or None. :mod:`netrl.config.flags` checks the flags with this, so that a bad
    flag is not blamed on config.json.

    Raises:
        KeyError: ``key`` is not a setting.
    """
    cls: Any = Config
    *parents, leaf = key.split(".")
    for part in parents:
        cls = typing.get_type_hints(cls)[part]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return field_problem(fields[leaf], typing.get_type_hints(cls)[leaf], value)[0]


def config_from_dict(data: Any, source: str = "config", role: str | None = None) -> Config:
    """Build a :class:`Config` from parsed JSON, raising :class:`ConfigError` with every problem
    found (for ``role``, as :func:`load_config`)."""
    return _validate(data, source, role=role)


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key set twice (json.loads would silently keep the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _read_text(path: Path) -> str:
    """The file's text; a file that cannot be read raises :class:`ConfigError`
    saying why and what to do."""
    try:
        # a byte-order mark, as some Windows editors write, is fine
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        problem = (f"{path} does not exist; copy config.json "
                   f"from the netrl repository or pass --config")
        raise ConfigError([problem], str(path)) from None
    except IsADirectoryError:
        problem = (f"{path} is a directory; pass the config file with "
                   f"--config, e.g. --config {path / 'config.json'}")
    except PermissionError:
        problem = (f"{path} cannot be read (permission denied); make it "
                   f"readable by this user or pass another --config")
    except UnicodeDecodeError as exc:
        problem = (f"{path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                   f"offset {exc.start}); save it as UTF-8 JSON")
    except OSError as exc:
        problem = (f"{path} cannot be read ({exc.strerror or exc}); "
                   f"check the path or pass another --config")
    raise ConfigError([problem], str(path))


def load_config(path: str | Path | None, overrides: Mapping[str, Any] | None = None,
                role: str | None = None) -> Config:
    """Load config.json (None: the defaults), apply ``overrides`` (dotted key -> value,
    from CLI flags) and validate.

    ``role`` (``"server"``, ``"worker"``...) limits the checks between fields to those that concern
    it: a remote worker is not refused for a clash between ports only the server binds. None
    (the default) checks everything.

    Raises:
        ConfigError: the file is missing, unreadable or not JSON, or has invalid values (all
            problems listed). When a problem involves an overridden key, the error names the
            command-line flags as well as the file.
    """
    if path is None:
        return _validate(_apply(overrides or {}, {}), "defaults", overrides, role)
    path = Path(path)
    text = _read_text(path)
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ConfigError([f"{path} is not valid JSON: {exc}"], str(path)) from None
    except _DuplicateKey as exc:
        raise ConfigError([f'{path} sets "{exc}" twice in one object; '
                           f'keep one of them'], str(path)) from None
    # JSON, but deeper than Python's parser goes: a ConfigError, not a traceback
    except RecursionError:
        raise ConfigError([f"{path} is not valid JSON here: its objects and lists "
                           f"nest deeper than Python reads; no setting needs "
                           f"more than {MAX_DEPTH} levels"], str(path)) from None
    # JSON, but a number Python refuses to read (an integer of thousands of digits)
    except ValueError as exc:
        why = (f"a number in it has more than "
               f"{sys.get_int_max_str_digits()} digits, which Python refuses to read"
               if "integer string conversion" in str(exc) else str(exc))
        raise ConfigError([f"{path} is not valid JSON here: {why}; no setting "
                           f"takes such a value"], str(path)) from None
    return _validate(_apply(overrides or {}, data), path.name, overrides, role)


def _apply(overrides: Mapping[str, Any], data: Any) -> Any:
    """``data`` with each dotted key of ``overrides`` set (where its parents are objects)."""
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else node
        if isinstance(node, dict):
            node[leaf] = value
    return data


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as JSON-ready data (saved next to checkpoints)."""
    return dataclasses.asdict(cfg)
