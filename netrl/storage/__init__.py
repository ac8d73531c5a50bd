"""Files on disk: append-only segment logs, folder locks, trainer checkpoints and weight files.

Internal: the roles use it; user code should not need it."""
