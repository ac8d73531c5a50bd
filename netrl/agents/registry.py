"""What each built-in algorithm needs, stated once: the table that the config checks, the gym
pipeline's choice of algorithm, ``make_pipeline``'s checks and the agents themselves read.

Each agent class declares what it trains with in its class attribute ``supports``, a
:class:`Supports` (as SB3's ``supported_action_spaces``); :data:`ALGORITHMS` maps
``agent.algorithm`` to those declarations and to the function that builds the gym pipeline's parts,
and one checker reads the declarations (as RLlib's ``AlgorithmConfig.validate()``, in
:mod:`netrl.config.algorithms`). The declarations below are the only statement of what an
algorithm needs: the messages that refuse a config are made from them.

The recurrent SAC is what ``sac`` runs with ``agent.recurrent`` set. ``agent.algorithm`` "auto"
takes the first algorithm marked ``auto`` whose declaration takes the env's actions. Neither torch
nor gymnasium is imported here: ``netrl.config`` reads this table, and the server loads the config.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from netrl.samples.spaces import space_kind

__all__ = ["ALGORITHMS", "DQN", "NAMES", "PPO", "RECURRENT_SAC", "SAC", "ActionKind", "Algorithm",
           "Collection", "MemoryKind", "Supports", "choose", "either", "entries"]

ActionKind = Literal["Box", "Discrete", "MultiDiscrete", "MultiBinary"]
Collection = Literal["async", "sync"]  # trainer.collection
# replay: transitions drawn at random from all that arrived; rollout: one weight version's batch in
# the order it was stored (RolloutMemory); sequences: consecutive steps with the recurrent state the
# worker recorded (a ReplayMemory with memory.sequence_length >= 2)
MemoryKind = Literal["replay", "rollout", "sequences"]


def either(words: Sequence[str], last: str = "or") -> str:
    """``a, b or c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {last} {words[-1]}"


@dataclass(frozen=True)
class Supports:
    """What an agent class trains with: the action spaces it takes, the collection its batches need
    (``trainer.collection``), the memory that holds them, whether a worker may act at random before
    the policy does (``worker.init_random_frames``) and whether its actor is recurrent. ``label``
    names it in messages ("PPO")."""

    label: str
    action_spaces: tuple[ActionKind, ...]
    collection: Collection
    memory: MemoryKind
    random_actions: bool
    recurrent: bool = False

    def takes(self, space: Any) -> bool:
        """Whether ``space`` (a gymnasium space, or a subclass of one) is among
        :attr:`action_spaces`."""
        return space_kind(space) in self.action_spaces

    def spaces_text(self, last: str = "or") -> str:
        """``Discrete, MultiDiscrete or MultiBinary``."""
        return either(self.action_spaces, last)

    def action_space_problem(self, space: Any) -> str | None:
        """What an actor of this algorithm says of actions ``space`` it cannot take, naming the
        algorithms that can; None when it takes them."""
        if self.takes(space):
            return None
        kind = space_kind(space)
        others = [a.supports.label for a in ALGORITHMS
                  if a.supports.takes(space) and not a.supports.recurrent]
        verb = "takes" if len(others) == 1 else "take"
        hint = f": {either(others, 'and')} {verb} {kind} actions" if others else ""
        return f"{self.label} needs {self.spaces_text()} actions (got {space}){hint}"


_DISCRETE: tuple[ActionKind, ...] = ("Discrete", "MultiDiscrete", "MultiBinary")

SAC = Supports("SAC", ("Box",), "async", "replay", random_actions=True)
RECURRENT_SAC = Supports("recurrent SAC", ("Box",), "async", "sequences", random_actions=True,
                         recurrent=True)
DQN = Supports("DQN", _DISCRETE, "async", "replay", random_actions=True)
# on-policy: a batch holds one weight version's samples, each with its action's log-probability
PPO = Supports("PPO", ("Box", *_DISCRETE), "sync", "rollout", random_actions=False)


@dataclass(frozen=True)
class Algorithm:
    """A value of ``agent.algorithm`` (with ``agent.recurrent`` set when ``supports.recurrent``),
    what it needs, and ``build``: the ``"module:function"`` that makes the gym pipeline's actor,
    memory and agent from the config, imported when used (as gymnasium's entry points)."""

    name: str
    supports: Supports
    build: str
    auto: bool  # "auto" may pick it


_BUILD = "netrl.pipelines.algorithms"
ALGORITHMS: tuple[Algorithm, ...] = (
    Algorithm("sac", SAC, f"{_BUILD}:sac", auto=True),
    Algorithm("sac", RECURRENT_SAC, f"{_BUILD}:recurrent_sac", auto=True),
    Algorithm("dqn", DQN, f"{_BUILD}:dqn", auto=True),
    Algorithm("ppo", PPO, f"{_BUILD}:ppo", auto=False),
)
# agent.algorithm's values besides "auto"
NAMES: tuple[str, ...] = tuple(dict.fromkeys(a.name for a in ALGORITHMS))


def entries(name: str, recurrent: bool) -> list[Algorithm]:
    """The algorithms that ``agent.algorithm`` ``name`` (or "auto") may run, recurrent or not."""
    return [a for a in ALGORITHMS if (a.auto if name == "auto" else a.name == name)
            and a.supports.recurrent == recurrent]


def choose(name: str, recurrent: bool, space: Any) -> Algorithm | None:
    """What ``name`` (or "auto") runs for actions ``space``; None when none of its algorithms
    takes them."""
    return next((a for a in entries(name, recurrent) if a.supports.takes(space)), None)
