"""Training agents. They see tensors and return metrics; they never import zmq or netrl.config."""

from netrl.agents.base import TrainingAgent
from netrl.samples import Batch

__all__ = ["Batch", "TrainingAgent"]
