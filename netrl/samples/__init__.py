"""What crosses every boundary: rows as columns (:class:`Buffer`) in, transitions
(:class:`Batch`) out.

``columns`` holds the rows, ``batch`` the batches, ``spaces`` how each kind of Gymnasium
space travels, ``value_limits`` what a sample's values may be, ``info`` the env info entries a
pipeline declares. This package's names are those of ``columns`` and ``batch``, and ``InfoKey``;
it loads numpy only.
"""

from __future__ import annotations

from netrl.samples.batch import Batch
from netrl.samples.columns import (
    Buffer,
    BufferBuilder,
    EpisodeStats,
    ExtraSpec,
    Spec,
    check_extra_spec,
    concat_segments,
    flatten,
    row,
    tree_map,
    unflatten,
)
from netrl.samples.info import InfoKey

__all__ = ["Batch", "Buffer", "BufferBuilder", "EpisodeStats", "ExtraSpec", "InfoKey", "Spec",
           "check_extra_spec", "concat_segments", "flatten", "row", "tree_map", "unflatten"]
