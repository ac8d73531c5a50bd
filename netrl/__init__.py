"""netrl: distributed real-time reinforcement learning over ZeroMQ.

RolloutWorkers run a policy on robots or game PCs and send compressed sample packets
through a central Server to a Trainer, which keeps a replay memory, optimises a TrainingAgent
(SAC by default) and sends versioned actor weights back. Importing netrl is cheap: the
classes below load on first use.

The public API is this package's ``__all__`` and that of :mod:`netrl.agents`, :mod:`netrl.memory`,
:mod:`netrl.envs`, :mod:`netrl.pipelines`, :mod:`netrl.config` and :mod:`netrl.errors`.
The packages under ``protocol``, ``net``, ``storage`` and ``monitor``, and the role
packages' modules, are internal.
"""

from __future__ import annotations

from netrl.util import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "ActorModule": "netrl.actor",
    "Batch": "netrl.samples.batch",
    "Buffer": "netrl.samples.columns",
    "Config": "netrl.config.sections",
    "GenericGymEnv": "netrl.envs.gym",
    "MemoryDataloading": "netrl.memory.base",
    "NetrlError": "netrl.errors",
    "Pipeline": "netrl.pipelines.base",
    "ReplayMemory": "netrl.memory.replay",
    "RolloutWorker": "netrl.worker.worker",
    "Server": "netrl.server.server",
    "Trainer": "netrl.trainer.trainer",
    "TrainingAgent": "netrl.agents.base",
    "TrainingOffline": "netrl.training.loop",
    "load_config": "netrl.config.load",
    "partial": "netrl.util",
}

__all__ = ["__version__", *sorted(_EXPORTS)]

__getattr__ = lazy_exports(__name__, _EXPORTS)[0]  # __dir__ below also lists __version__


def __dir__() -> list[str]:
    return __all__
