"""The Trainer role: everything only the trainer process runs.

Internal apart from the role class, :class:`netrl.Trainer`."""
