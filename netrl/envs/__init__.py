"""Environments: tmrl's :class:`GenericGymEnv` wrapper and the checks run on every env, the
:class:`ImageReachEnv` image env, and :class:`StepTimer` for real-time step periods. Loaded on first
use: ``import netrl.envs`` imports neither Gymnasium nor OpenCV.
"""

from __future__ import annotations

from netrl.util import lazy_exports

_EXPORTS = {
    "GenericGymEnv": "netrl.envs.gym",
    "ImageReachEnv": "netrl.envs.image",
    "StepTimer": "netrl.envs.realtime",
    "check_spaces": "netrl.envs.checks",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
