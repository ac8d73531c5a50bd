"""The rules between the agent and the rest of the config, read off the algorithm table
(:mod:`netrl.agents.registry`), as RLlib's ``AlgorithmConfig.validate()`` reads an algorithm's
needs: the collection its batches need, whether random first actions are allowed, the memory it
learns from. :func:`algorithm_problems` applies them to the algorithm ``agent.algorithm`` names
(the gym pipeline's); ``make_pipeline`` applies :func:`supports_problems` to any pipeline's agent
class that declares what it supports. Each problem names every key involved and the reason.
"""

from __future__ import annotations

from typing import Any

from netrl.agents.registry import ALGORITHMS, Collection, Supports, either, entries

__all__ = ["algorithm_problems", "supports_problems"]

Problem = tuple[tuple[str, ...], str]

# why an algorithm that declares a collection needs it
_COLLECTION_WHY: dict[Collection, str] = {
    "sync": "{label} trains each batch on samples of one weight version",
    "async": "{label} learns from a replay memory that the workers fill as they go",
}


def supports_problems(supports: Supports, cfg: Any, who: str, key: str, instead: str
                      ) -> list[Problem]:
    """What in ``cfg`` the agent that declares ``supports`` cannot train with. ``who`` names it
    ('agent.algorithm "ppo"'), ``key`` is the key that chose it, ``instead`` the way out that
    messages offer besides changing the other key ("choose another agent.algorithm")."""
    problems: list[Problem] = []
    collection = cfg.trainer.collection
    if collection != supports.collection:
        why = _COLLECTION_WHY[supports.collection].format(label=supports.label)
        problems.append(((key, "trainer.collection"),
                         f'{who} needs trainer.collection "{supports.collection}" (got '
                         f'"{collection}"): {why}; set trainer.collection to '
                         f'"{supports.collection}", or {instead}'))
    frames = cfg.worker.init_random_frames
    if frames > 0 and not supports.random_actions:
        problems.append(((key, "worker.init_random_frames"),
                         f"worker.init_random_frames ({frames}) must be 0 with {who}: "
                         f"{supports.label} learns from the actions its own policy chose, with "
                         "their log-probabilities, and a random action has none"))
    return problems


def algorithm_problems(cfg: Any) -> list[Problem]:
    """The rules between ``agent.algorithm`` (and ``agent.recurrent``) and the keys the algorithm
    needs. "auto" decides by the env's actions, in the gym pipeline, which checks then."""
    a, m = cfg.agent, cfg.memory
    recurrent = a.recurrent is not None
    chosen = entries(a.algorithm, recurrent)
    problems: list[Problem] = []
    if recurrent and not chosen:
        names = list(dict.fromkeys(e.name for e in ALGORITHMS if e.supports.recurrent))
        labels = either([e.supports.label for e in ALGORITHMS
                         if e.name in names and not e.supports.recurrent])
        quoted = either([f'"{n}"' for n in names])
        problems.append((("agent.recurrent", "agent.algorithm"),
                         f'agent.recurrent "{a.recurrent}" is for {labels}, not agent.algorithm '
                         f'"{a.algorithm}": set agent.algorithm to {quoted}, or agent.recurrent '
                         "to null"))
    if m.sequence_length < 2 and any(e.supports.memory == "sequences" for e in chosen):
        problems.append((("agent.recurrent", "memory.sequence_length"),
                         f'agent.recurrent "{a.recurrent}" needs memory.sequence_length >= 2 (got '
                         f"{m.sequence_length}): a recurrent agent learns from sequences of "
                         "steps; set it (e.g. 16, with memory.burn_in 4), or set agent.recurrent "
                         "to null"))
    if a.algorithm != "auto":
        for e in chosen:
            problems += supports_problems(e.supports, cfg, f'agent.algorithm "{a.algorithm}"',
                                          "agent.algorithm", "choose another agent.algorithm")
    frames = cfg.trainer.frames_per_batch
    if a.algorithm == "ppo" and a.ppo.minibatch_size > frames:  # PPO's own keys
        problems.append((("agent.ppo.minibatch_size", "trainer.frames_per_batch"),
                         f"agent.ppo.minibatch_size ({a.ppo.minibatch_size}) must be <= "
                         f"trainer.frames_per_batch ({frames}): a PPO minibatch is drawn from one "
                         "batch"))
    return problems
