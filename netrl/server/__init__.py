"""The Server role: everything only the relay process runs. It never imports torch.

Internal apart from the role class, :class:`netrl.Server`."""

from __future__ import annotations

from netrl.util import lazy_exports

# lazily: a module of this package (a benchmark's light server child, say)
# need not load the whole role
__getattr__, __dir__ = lazy_exports(__name__, {"Server": "netrl.server.server"})
__all__ = ["Server"]
