"""Training agents. They see tensors and return metrics; they never import zmq or netrl.config."""

from netrl.agents.base import Batch, TrainingAgent

__all__ = ["Batch", "TrainingAgent"]
