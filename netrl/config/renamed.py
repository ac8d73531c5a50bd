"""Keys of config.json that have a new name: the old name still works, with a deprecation message
that names the new key, logged once per load in the style of the config's problem list::

    config.json uses 2 old key names, which still work: rename them
      agent.alpha is now agent.sac.entropy_coef
      memory.alpha is now memory.priority_alpha

A config that sets both an old key and its new one is refused, naming both. The keys of each
algorithm moved into a section of its own (:mod:`netrl.config.agent`), and the prioritized replay
keys took a ``priority_`` prefix, so that ``agent.alpha`` (SAC's entropy coefficient) and
``memory.alpha`` (the priority exponent) no longer share a name. ``agent.lr_critic`` was also DQN's
learning rate: it sets both new keys. Code that reads a config by the old attribute names
(``cfg.agent.lr_actor``) gets the new key's value and a FutureWarning.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, NamedTuple

__all__ = ["RENAMED", "Renamed", "old_attribute", "rename_old_keys"]

_SAC = ("lr_actor", "lr_critic", "lr_entropy", "learn_entropy_coef", "target_entropy")
_DQN = ("target_update_interval", "exploration_initial_eps", "exploration_final_eps",
        "exploration_steps")
_PPO = ("minibatch_size", "clip_range", "clip_range_vf", "gae_lambda", "ent_coef", "vf_coef",
        "max_grad_norm")

# old key -> the new keys its value goes to
RENAMED: dict[str, tuple[str, ...]] = {
    "agent.alpha": ("agent.sac.entropy_coef",),
    **{f"agent.{k}": (f"agent.sac.{k}",) for k in _SAC},
    "agent.lr_critic": ("agent.sac.lr_critic", "agent.dqn.lr"),
    **{f"agent.{k}": (f"agent.dqn.{k}",) for k in _DQN},
    "agent.lr_ppo": ("agent.ppo.lr",),
    "agent.ppo_epochs": ("agent.ppo.epochs",),
    "agent.ppo_anneal_frames": ("agent.ppo.anneal_frames",),
    **{f"agent.{k}": (f"agent.ppo.{k}",) for k in _PPO},
    **{f"memory.{k}": (f"memory.priority_{k}",) for k in ("alpha", "beta", "beta_steps", "eps")},
}


class Renamed(NamedTuple):
    """What :func:`rename_old_keys` found: the data with old keys moved, one notice per old key,
    the old key each new key's value came from, and the clashes as (keys, message)."""

    data: Any
    notices: list[str]
    origin: dict[str, str]
    clashes: list[tuple[tuple[str, ...], str]]


def _node(data: Any, path: list[str], create: bool) -> dict[str, Any] | None:
    """The object at ``path`` in ``data`` (made where missing when ``create``), or None where the
    path meets something that is not an object (the builder reports that)."""
    node = data
    for part in path:
        if not isinstance(node, dict):
            return None
        if part not in node and create:
            node[part] = {}
        node = node.get(part)
    return node if isinstance(node, dict) else None


def _holds(data: Any, key: str) -> bool:
    *parents, leaf = key.split(".")
    return leaf in (_node(data, parents, False) or {})


def rename_old_keys(data: Any) -> Renamed:
    """``data`` (parsed config.json, left unchanged) with each old key's value moved to its new
    keys."""
    if not any(_holds(data, old) for old in RENAMED):
        return Renamed(data, [], {}, [])
    data = copy.deepcopy(data)
    notices: list[str] = []
    origin: dict[str, str] = {}
    clashes: list[tuple[tuple[str, ...], str]] = []
    for old, new_keys in RENAMED.items():
        *parents, leaf = old.split(".")
        section = _node(data, parents, False)
        if section is None or leaf not in section:
            continue
        value = section.pop(leaf)
        notices.append(f"{old} is now {' and '.join(new_keys)}")
        for new in new_keys:
            *new_parents, new_leaf = new.split(".")
            target = _node(data, new_parents, True)
            if target is None:
                continue
            if new_leaf in target:
                clashes.append(((old, new), f"{old} and {new} are one setting ({old} is its old "
                                             f"name): keep {new} only"))
                continue
            target[new_leaf] = value
            origin[new] = old
    return Renamed(data, notices, origin, clashes)


def old_attribute(config: Any, section: str, name: str) -> Any:
    """The value the new key of ``<section>.<name>`` holds in ``config`` (a section's dataclass),
    with a FutureWarning; AttributeError when ``name`` is no old key of ``section``."""
    new_keys = RENAMED.get(f"{section}.{name}")
    if new_keys is None:
        raise AttributeError(f"{type(config).__name__!r} object has no attribute {name!r}")
    warnings.warn(f"{section}.{name} is deprecated: read {new_keys[0]}", FutureWarning,
                  stacklevel=3)
    value = config
    for part in new_keys[0].split(".")[1:]:
        value = getattr(value, part)
    return value
