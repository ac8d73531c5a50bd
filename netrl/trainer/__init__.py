"""The Trainer role: everything only the trainer process runs.

Internal apart from the role class, :class:`netrl.Trainer`."""

from __future__ import annotations

from netrl.util import lazy_exports

# lazily: a module of this package (a benchmark's light trainer child, say)
# need not load the whole role
__getattr__, __dir__ = lazy_exports(__name__, {"Trainer": "netrl.trainer.trainer"})
__all__ = ["Trainer"]
