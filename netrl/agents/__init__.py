"""Training agents. They see tensors and return metrics; they never import zmq, msgpack or netrl.config.

:class:`TrainingAgent` is the interface (tmrl's). The built-in agents: :class:`SACAgent` with
:class:`MLPActorCritic` (vectors) or :class:`CNNActorCritic` (stacked frames) for continuous actions, and
:class:`DQNAgent` with its :class:`DQNActor` (double DQN, dueling head, action masks) for discrete ones; and
on-policy, :class:`PPOAgent` with its :class:`PPOActor` for both (trained on version-synced batches). For partially
observed envs, :class:`RecurrentSACAgent` with its :class:`RecurrentActor` (a GRU or LSTM, trained on sequences).
:class:`ModelSpec` declares a module synced to the workers besides the actor (``TrainingAgent.extra_models``).
"""

from netrl.agents.base import ModelSpec, TrainingAgent
from netrl.agents.cnn import CNNActorCritic
from netrl.agents.dqn import DQNActor, DQNAgent
from netrl.agents.ppo import PPOActor, PPOAgent
from netrl.agents.recurrent_sac import RecurrentActor, RecurrentSACAgent
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.samples.batch import Batch

__all__ = ["Batch", "CNNActorCritic", "DQNActor", "DQNAgent", "MLPActor", "MLPActorCritic", "ModelSpec", "PPOActor",
           "PPOAgent", "RecurrentActor", "RecurrentSACAgent", "SACAgent", "TrainingAgent"]
