"""The RolloutWorker role: everything only a worker process runs.

Internal apart from the role class, :class:`netrl.RolloutWorker`."""
