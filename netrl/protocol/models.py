"""Named models synced from the trainer to the workers (issue 34): the name rule
and the row column of each.

"policy" is the actor; every other model (an observation normaliser, a user's module) has a version
counter of its own, and each sample row carries the version of each such model in use when its
action was chosen, as the extra output column ``"<model>_version"`` (int64, shape ()). A model's
name is therefore both a peer name (it travels in WEIGHTS and ACKs) and the start of an extra
output's name, and follows the stricter of the two rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from netrl.protocol.messages import PEER_NAME
from netrl.protocol.wire import MAX_MODELS

__all__ = ["MODEL_NAME", "MODEL_NAME_RULE", "POLICY", "check_model_names", "version_column", "version_columns"]

POLICY = "policy"
# "<name>_version" must be an extra output name (netrl.samples.EXTRA_NAME, 32 characters)
# and a heartbeat counter
MODEL_NAME = re.compile(r"[a-z][a-z0-9_]{0,23}")
MODEL_NAME_RULE = "a lower-case letter, then up to 23 lower-case letters, digits or _"


def version_column(name: str) -> str:
    """The extra output column a sample row carries the version of model ``name`` in."""
    return f"{name}_version"


def version_columns(names: Iterable[str]) -> dict[str, tuple[tuple[int, ...], str]]:
    """The extra outputs (an ExtraSpec) of the version columns of models ``names``."""
    return {version_column(name): ((), "<i8") for name in names}


def check_model_names(names: Iterable[str], owner: str) -> list[str]:
    """The names of the models besides "policy" that ``owner`` declares, checked;
    ValueError naming each problem."""
    names = list(names)
    problems = []
    for name in names:
        if not isinstance(name, str) or not (PEER_NAME.fullmatch(name) and MODEL_NAME.fullmatch(name)):
            problems.append(f"{name!r:.40} is not a valid model name ({MODEL_NAME_RULE})")
        elif name == POLICY:
            problems.append('"policy" is the actor\'s own name: give the extra model another')
    if len(set(names)) != len(names):
        problems.append(f"names repeat: {sorted(names)}")
    if len(names) + 1 > MAX_MODELS:
        problems.append(f"{len(names)} models besides the policy, and at "
                        f"most {MAX_MODELS} models in all are synced")
    if problems:
        raise ValueError(f"{owner}: " + "; ".join(problems))
    return names
