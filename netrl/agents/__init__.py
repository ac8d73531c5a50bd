"""Training agents. They see tensors and return metrics; they never import zmq, msgpack or netrl.config.

:class:`TrainingAgent` is the interface (tmrl's); :class:`SACAgent` with :class:`MLPActorCritic` (vectors) or
:class:`CNNActorCritic` (stacked frames) is the built-in agent.
"""

from netrl.agents.base import TrainingAgent
from netrl.agents.cnn import CNNActorCritic
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.samples import Batch

__all__ = ["Batch", "CNNActorCritic", "MLPActor", "MLPActorCritic", "SACAgent", "TrainingAgent"]
