"""The RolloutWorker role: everything only a worker process runs.

Internal apart from the role class, :class:`netrl.RolloutWorker`, and its settings,
:class:`~netrl.worker.settings.WorkerSettings` (``RolloutWorker(..., settings=...)``)."""

from __future__ import annotations

from netrl.util import lazy_exports

# lazily: a module of this package (a benchmark's light worker child, say)
# need not load the whole role
__getattr__, __dir__ = lazy_exports(__name__, {"RolloutWorker": "netrl.worker.worker",
                                                "WorkerSettings": "netrl.worker.settings"})
__all__ = ["RolloutWorker", "WorkerSettings"]
