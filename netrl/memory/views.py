"""Declared views: what a row's input needs from earlier rows of its trajectory,
assembled by index arithmetic.

RLlib's trajectory view API lets a model ask for ``prev_actions``, ``prev_rewards`` or a window of
observations (``ViewRequirement(shift=...)``) instead of writing a collector for each; TorchRL and
Gymnasium stack frames the same way. Here a :class:`View` is the last ``length`` values of one
stored column, ending at a row, oldest first::

    window(k) = [col[k - off[k, 0]], ..., col[k - off[k, length - 1]]]      off[k, length - 1] == 0

The offsets (rows back, one byte each) come from the view's *rule*, computed once per packet and
per env segment when the packet is stored, so sampling is one gather of offsets and one gather of
the column. The default rule, :func:`episode_offsets`, clamps at the episode's first row: entries
before it repeat that row (Gymnasium's ``FrameStackObservation(padding_type="reset")``; a reset row
holds the worker's default action and reward 0, so ``prev_actions`` pads with the default action and
``prev_rewards`` with 0). A rule may follow other conventions (rtgym's action buffer, which carries
actions across episodes: :mod:`netrl.memory.action_buffer`).

Guarantees, kept by :class:`~netrl.memory.history.HistoryMemory`:

- a window reads only rows of its own env segment of its own packet (a rule never sees the rows
  before the segment: an entry it cannot know is ``NEVER``), so it never joins two envs or two
  packets; the episode rule never joins two episodes;
- a transition is sampleable only while every row its views read is still stored (the ring's oldest
  rows lose their history first), and never when an entry is unknown: the assembled input is
  exact or absent, never wrong.

Windows *slide*: at a row that continues the previous one (a transition end), ``window(k)`` is
``window(k-1)[1:]`` followed by row ``k``. A transition ending at row ``k`` therefore reads one
window of ``length + 1`` rows; its observation's view is the first ``length`` of them and its next
observation's the last ``length``. This is the same index offset over the same continuation rule
that n-step windows and sequences use, looking back instead of forward.

Where a view goes (``into``):

- ``"extra"``: ``batch.extra[name]`` (``[B, length, *shape]``) for the observation and
  ``batch.extra["next_" + name]`` for the next observation (overlapping views of one tensor);
- ``"obs"``: the observation leaf called ``name`` (``"obs"`` for a single array, ``"obs/1"`` in a
  tuple...) is the window (frame stacks: each row stores one frame, the batch holds stacks).

A recurrent state needs no view: the worker records the state that entered each step as an extra
output of the row (:mod:`netrl.actor`), which a batch carries in ``batch.extra``.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from netrl.samples.columns import Buffer, tree_map

__all__ = ["MAX_NEED", "NEVER", "View", "ViewRule", "declared_views", "episode_offsets", "last_observations",
           "prev_actions", "prev_rewards", "segment_offsets", "sliding_rows", "transition_needs"]

# stored offset of an entry that cannot be known; ``need`` of a row that
# ends no sampleable transition
NEVER = 255
MAX_NEED = NEVER - 1

ViewRule = Callable[[Buffer, int], np.ndarray]
"""``rule(segment, length)``: per row of one env segment of a packet, ``(n, length)`` int64 rows
back of each entry, oldest first; negative where the entry cannot be known from the segment."""

_NAME = re.compile(r"[a-z_][a-z0-9_]*(/[a-z0-9_]+)*")
MAX_LENGTH = MAX_NEED // 2


def episode_offsets(segment: Buffer, length: int) -> np.ndarray:
    """The default rule: the last ``length`` rows, clamped at the episode's first row (which
    the entries before it repeat). Where the episode began before the segment, rows before the
    segment's first are unknown (-1)."""
    n = len(segment)
    rows = np.arange(n)
    back = np.arange(length - 1, -1, -1)  # entry j is the (length-1-j)-th newest
    last_reset = np.maximum.accumulate(np.where(segment.reset, rows, -1))
    # n: the episode began before the segment
    since = np.where(last_reset >= 0, rows - last_reset, n)
    off = np.minimum(back[None, :], since[:, None])
    return np.where(off <= rows[:, None], off, -1)


@dataclass(frozen=True)
class View:
    """The last ``length`` values of the stored column ``source`` ending at each row
    (see the module docstring).

    Args:
        name: the ``batch.extra`` key (``into="extra"``), or the observation leaf it
            fills (``into="obs"``).
        source: a stored column: ``"act"`` (or ``"act/0"``... for nested actions), ``"rew"``, an
            observation leaf (``"obs"``, ``"obs/1"``...), an extra output ``"extra/<name>"``, or a
            column a memory subclass stores.
        length: entries per window, oldest first, the row's own value last.
        into: ``"extra"`` or ``"obs"``.
        rule: rows back per entry for one env segment (:data:`ViewRule`);
            None: :func:`episode_offsets`.
        reach: the most rows back ``rule`` can read (``length - 1`` for the default rule).
    """

    name: str
    source: str
    length: int
    into: Literal["extra", "obs"] = "extra"
    rule: ViewRule | None = None
    reach: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"view name {self.name!r} must be a lowercase "
                             f"identifier, or a path such as 'obs/1'")
        if not isinstance(self.source, str) or not _NAME.fullmatch(self.source):
            raise ValueError(f"view {self.name!r}: source {self.source!r} must name a stored "
                             f"column such as 'act', 'rew', 'obs', 'obs/1' or 'extra/<name>'")
        if type(self.length) is not int or not 1 <= self.length <= MAX_LENGTH:
            raise ValueError(f"view {self.name!r}: length must be an int "
                             f"between 1 and {MAX_LENGTH} (got {self.length!r})")
        if self.into not in ("extra", "obs"):
            raise ValueError(f"view {self.name!r}: into must be "
                             f"'extra' or 'obs' (got {self.into!r})")
        if self.into == "obs" and not (self.name == "obs" or self.name.startswith("obs/")):
            raise ValueError(f"view {self.name!r} goes into the observation, so "
                             f"its name must be the observation leaf it fills: "
                             f"'obs' for a single array, 'obs/<i>' in a tuple")
        reach = self.max_reach
        if not 0 <= reach < MAX_NEED:
            raise ValueError(f"view {self.name!r}: reach must be between 0 "
                             f"and {MAX_NEED - 1} rows (got {reach})")

    @property
    def max_reach(self) -> int:
        """The most rows back a window reads."""
        return self.length - 1 if self.reach is None else self.reach

    def offsets(self, segment: Buffer) -> np.ndarray:
        """Rows back per entry for one env segment, ``(n, length)`` int64,
        negative where unknown."""
        rule = self.rule or episode_offsets
        off = np.asarray(rule(segment, self.length))
        if off.shape != (len(segment), self.length) or off.dtype.kind not in "iu":
            raise ValueError(f"view {self.name!r}: its rule returned {off.dtype} {off.shape}, "
                             f"not int rows back of shape {(len(segment), self.length)}")
        return off.astype(np.int64, copy=False)


def prev_actions(length: int, name: str = "prev_actions") -> View:
    """The last ``length`` actions up to each row's own (the one that led to its observation), as
    RLlib's ``prev_actions``; padded at an episode's start with the reset row's action (the
    worker's default action)."""
    return View(name, "act", length)


def prev_rewards(length: int, name: str = "prev_rewards") -> View:
    """The last ``length`` rewards up to each row's own; padded at an episode's start
    with 0 (the reset row's)."""
    return View(name, "rew", length)


def last_observations(length: int, leaf: str = "obs", into: Literal["extra", "obs"] = "obs",
                      name: str | None = None) -> View:
    """The last ``length`` values of observation leaf ``leaf`` (a frame stack when each row
    stores one frame), padded with the episode's first. ``into="obs"`` puts the stack in
    place of the leaf; ``"extra"`` adds it as ``batch.extra[name]`` (default ``"last_<leaf>"``),
    next to the observation."""
    return View(name or (leaf if into == "obs" else "last_" + leaf.replace("/", "_")), leaf, length, into)


def segments(buffer: Buffer) -> list[tuple[int, int]]:
    """``[start, stop)`` of each env segment of a packet (env-major: one run of rows per env)."""
    env = buffer.envs
    cuts = np.flatnonzero(env[1:] != env[:-1]) + 1
    edges = [0, *cuts.tolist(), len(buffer)]
    return list(itertools.pairwise(edges))


def _slice(buffer: Buffer, a: int, b: int) -> Buffer:
    cut: Callable[[Any], Any] = lambda x: None if x is None else x[a:b]  # noqa: E731
    return dataclasses.replace(
        buffer, act=tree_map(cut, buffer.act), obs=tree_map(cut, buffer.obs), rew=cut(buffer.rew),
        terminated=cut(buffer.terminated), truncated=cut(buffer.truncated), reset=cut(buffer.reset),
        context=cut(buffer.context), policy_version=cut(buffer.policy_version), weight=cut(buffer.weight),
        env=cut(buffer.env), extra=None if buffer.extra is None else {k: cut(v) for k, v in buffer.extra.items()},
        episodes=[])


def segment_offsets(view: View, buffer: Buffer) -> np.ndarray:
    """A packet's offsets for ``view``: ``(n, length)`` uint8 rows back, ``NEVER`` where an entry is
    unknown (its rule said so, or it would read before its env segment's first row or further
    back than the view's reach)."""
    parts = []
    for a, b in segments(buffer):
        seg = buffer if (a, b) == (0, len(buffer)) else _slice(buffer, a, b)
        off = view.offsets(seg)
        rows = np.arange(b - a)[:, None]
        known = (off >= 0) & (off <= rows) & (off <= view.max_reach)
        parts.append(np.where(known, off, NEVER).astype(np.uint8))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def sliding_rows(view: View, off: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Among transition ends ``ends`` whose windows at the row and the row before are known, those
    where the window does not slide (``window(k) != window(k-1)[1:] + [k]``): a rule that breaks the
    convention the memory relies on."""
    now, prev = off[ends].astype(np.int64), off[ends - 1].astype(np.int64)
    known = (now != NEVER).all(axis=1) & (prev != NEVER).all(axis=1)
    slides = (now[:, -1] == 0) & (now[:, :-1] == prev[:, 1:] + 1).all(axis=1)
    return ends[known & ~slides]


def transition_needs(buffer: Buffer, row_needs: np.ndarray) -> np.ndarray:
    """Rows back a transition ending at each row reads: its own observation's and, one
    row further, the previous one.

    ``row_needs[k]`` is how many rows back row ``k``'s observation reads (``NEVER`` if it cannot be
    rebuilt). Rows that end no transition get ``NEVER``.
    """
    need = np.full(len(buffer), NEVER, np.int64)
    ends = np.flatnonzero(buffer.transition_end)
    ends = ends[ends > 0]  # a transition needs its previous row in the same packet
    now, prev = row_needs[ends].astype(np.int64), row_needs[ends - 1].astype(np.int64) + 1
    both = np.maximum(now, prev)
    ok = (row_needs[ends] != NEVER) & (row_needs[ends - 1] != NEVER) & (both <= MAX_NEED)
    need[ends[ok]] = both[ok]
    return need.astype(np.uint8)


def declared_views(owner: Any) -> list[View]:
    """What ``owner`` (an agent, or an actor) declares with an optional ``views()`` method: a list
    of :class:`View`; for an agent without one, its actor's (``get_actor()``); ``[]`` for none.
    TypeError naming the owner for anything else; ValueError for an agent whose views leave out
    one of its actor's (the workers build those at act time, so its batches must hold them)."""
    method = getattr(owner, "views", None)
    get_actor = getattr(owner, "get_actor", None)
    if method is None:  # an agent of its own (tmrl's style) without views(): its actor's
        return declared_views(get_actor()) if get_actor is not None else []
    views = method()
    name = type(owner).__name__
    if not isinstance(views, Sequence) or not all(isinstance(v, View) for v in views):
        raise TypeError(f"{name}.views() must return a list of "
                        f"netrl.memory.views.View (got {views!r:.80})")
    if get_actor is not None:  # an agent: its batches must hold what its actor acts on
        actor = get_actor()
        for view in declared_views(actor) if getattr(actor, "views", None) else ():
            if view not in views:
                raise ValueError(f"{name}.views() leaves out {type(actor).__name__}'s view "
                                 f"{view.name!r}, which the workers build at act time: "
                                 f"return the actor's views too (the default views() does)")
    return check_views(views, name)


def check_views(views: Sequence[View], owner: str) -> list[View]:
    """``views`` as a list; ValueError naming ``owner`` and the name if two views share a
    name (or a next_ name)."""
    seen: set[str] = set()
    for view in views:
        keys = {view.name} if view.into == "obs" else {view.name, "next_" + view.name}
        if keys & seen:
            raise ValueError(f"{owner}: two views are named {view.name!r} (or one is "
                             f"next_ of the other): each view needs a name of its own")
        seen |= keys
    return list(views)
