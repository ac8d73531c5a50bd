"""The training loop, with no network: :class:`TrainingOffline` (``loop``) and what it is made of.

``loop`` runs epochs > rounds > steps against a :class:`SampleSource` (``source``), with netrl's own
settings in one :class:`TrainingSettings` (``settings``); ``ingest`` takes packets into the memory,
``publish`` sends weights out, ``sync`` holds the sync collection's batches, ``rounds`` a round's
counts and its metrics line, ``safeguards`` what the loop refuses and undoes. ``from netrl.training
import TrainingAgent, TrainingOffline`` is tmrl's ``tmrl.training_offline`` path.
"""

from __future__ import annotations

from netrl.util import lazy_exports

_EXPORTS = {
    "SampleSource": "netrl.training.source",
    "TrainingAgent": "netrl.agents.base",
    "TrainingOffline": "netrl.training.loop",
    "TrainingSettings": "netrl.training.settings",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
