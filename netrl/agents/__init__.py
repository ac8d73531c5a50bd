"""Training agents. They see tensors and return metrics; they never import
zmq, msgpack or netrl.config.

:class:`TrainingAgent` is the interface (tmrl's). The built-in agents: :class:`SACAgent` with
:class:`MLPActorCritic` (vectors) or :class:`CNNActorCritic` (stacked frames) for continuous
actions, and :class:`DQNAgent` with its :class:`DQNActor` (double DQN, dueling head, action masks)
for discrete ones; and on-policy, :class:`PPOAgent` with its :class:`PPOActor` for both (trained on
version-synced batches). For partially observed envs, :class:`RecurrentSACAgent` with its
:class:`RecurrentActor` (a GRU or LSTM, trained on sequences). :class:`ModelSpec` declares a module
synced to the workers besides the actor (``TrainingAgent.extra_models``).

What each algorithm needs (action spaces, collection, memory) is declared in
:mod:`netrl.agents.registry`; the parts the agents share (encoders, networks, distributions, action
masks) are in :mod:`netrl.agents.common`. Loaded on first use, so that the registry can be read
without torch.
"""

from __future__ import annotations

from netrl.util import lazy_exports

_EXPORTS = {
    "Batch": "netrl.samples.batch",
    "CNNActorCritic": "netrl.agents.cnn",
    "DQNActor": "netrl.agents.dqn",
    "DQNAgent": "netrl.agents.dqn",
    "MLPActor": "netrl.agents.sac",
    "MLPActorCritic": "netrl.agents.sac",
    "ModelSpec": "netrl.agents.base",
    "PPOActor": "netrl.agents.ppo",
    "PPOAgent": "netrl.agents.ppo",
    "RecurrentActor": "netrl.agents.recurrent_sac",
    "RecurrentSACAgent": "netrl.agents.recurrent_sac",
    "SACAgent": "netrl.agents.sac",
    "TrainingAgent": "netrl.agents.base",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
