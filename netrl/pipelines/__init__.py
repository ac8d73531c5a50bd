"""Ready-made pipelines: the classes a worker and a trainer must agree on, built from config.

:class:`Pipeline` bundles them; :func:`make_pipeline` builds the one ``env.pipeline`` names: ``gym``
(:func:`gym_pipeline`), ``drone`` (:func:`drone_pipeline`), ``image`` (:func:`image_pipeline`), or
your own ``module:function``. Loaded on first use, so that naming one pipeline does not
import the others' dependencies.
"""

from __future__ import annotations

from netrl.util import lazy_exports

_EXPORTS = {
    "Pipeline": "netrl.pipelines.base",
    "drone_pipeline": "netrl.pipelines.drone",
    "gym_pipeline": "netrl.pipelines.gym",
    "image_pipeline": "netrl.pipelines.image",
    "make_pipeline": "netrl.pipelines.make",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
