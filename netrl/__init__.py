"""netrl: distributed real-time reinforcement learning over ZeroMQ.

RolloutWorkers run a policy on robots or game PCs and send compressed sample packets through a central Server
to a Trainer, which keeps a replay memory, optimises a TrainingAgent (SAC by default) and sends versioned
actor weights back. Importing netrl is cheap: the classes below load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ActorModule": "netrl.actor",
    "Buffer": "netrl.samples",
    "Config": "netrl.config.sections",
    "GenericGymEnv": "netrl.envs.gym",
    "MemoryDataloading": "netrl.memory.base",
    "NetrlError": "netrl.errors",
    "ReplayMemory": "netrl.memory.replay",
    "RolloutWorker": "netrl.worker.worker",
    "Server": "netrl.server.server",
    "Trainer": "netrl.trainer.trainer",
    "TrainingAgent": "netrl.training",
    "TrainingOffline": "netrl.training",
    "load_config": "netrl.config.load",
    "partial": "netrl.util",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'netrl' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
