"""Samples as columns: what a worker packs, the wire carries and ``MemoryDataloading.append_buffer``
receives (a memory hands a ``TrainingAgent`` :class:`~netrl.samples.batch.Batch` es in turn).

A worker produces one *row* per env step, tmrl style: ``(act, obs, rew, terminated, truncated,
info)``, where ``act`` is the action that led to ``obs``. After ``reset()`` it adds a row
for the first observation, flagged ``reset`` (its ``act`` and ``rew`` are placeholders). A
transition therefore ends at every row that is neither a ``reset`` row nor a ``context`` row,
and starts at the row before it::

    row      k-1        k          k+1 (reset)   k+2
    obs      o1         o2         o'0           o'1
    act      a0         a1         -             a'0
    ->       transition (o1, a1, r, o2, term, trunc) ends at k; none ends at k+1;
             (o'0, a'0, ...) ends at k+2

Every packet after the first starts with ``overlap`` *context* rows copied from the end of the
previous packet (``reset`` flags included), so every packet is self-contained: a memory never has to
stitch rows from two packets together, and packets from several workers may arrive interleaved.

A worker that runs several envs (``worker.num_envs``) sends one packet per cut holding every env's
rows as *env-major segments*: ``[env 0's rows][env 1's rows]...``, each segment starting with that
env's own context rows (or, in its first packet, its reset row), and the ``env`` column says which
env each row came from. Each env's transitions are therefore stitched within its own segment,
exactly as a one-env packet's are, and each env's trajectory is contiguous in a memory's ring.

Observations and actions may be nested tuples, lists or dicts of arrays (rtgym's Tuple spaces);
they travel as flat named leaves (``obs/0``, ``obs/1``, ...) plus a small *spec* that rebuilds
the nesting. Of ``info``, the entries a pipeline declares (``Buffer.info``, see
:mod:`netrl.samples.info`) travel as leaves ``info/<name>``; the rest stays on the worker.

*Extra outputs* (``Buffer.extra``): named per-row arrays an actor returns with its actions, as its
``ActorModule.extra_outputs()`` declares them (an :data:`ExtraSpec`), e.g. ``action_log_prob`` and
``state_value``. They belong to the row of the action they came with: row ``k`` holds the action
chosen from row ``k-1``'s observation, and the log-probability and value the actor computed with
it. Reset rows, random actions and the worker's default action hold zeros. They travel as leaves
``extra/<name>`` and reach the agent as ``Batch.extra``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from netrl.samples.info import EXTRA_NAME as EXTRA_NAME  # (its home before info keys)
from netrl.samples.info import store_info

__all__ = ["Buffer", "BufferBuilder", "EpisodeStats", "ExtraSpec", "Spec", "check_extra_spec",
           "concat_segments", "flatten", "row", "tree_map", "unflatten"]

Spec = Any  # str (leaf name) | list[Spec] (tuple) | dict[str, Spec]
MAX_TREE_LEAVES = 64
MAX_TREE_DEPTH = 8
ExtraSpec = dict[str, tuple[tuple[int, ...], str]]  # extra output name -> (per-row shape, numpy
                                                    # dtype string)
MAX_EXTRAS = 16
_EXTRA_KINDS = "biuf"  # numbers and flags: what the wire carries


def check_extra_spec(spec: Any, owner: str) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
    """``spec`` (what ``owner.extra_outputs()`` returned) as name -> (shape, dtype); ValueError
    naming the entry that is not a lowercase identifier of at most 32 characters mapped to (a
    shape of at most 8 non-negative ints, a numeric or boolean numpy dtype)."""
    if not isinstance(spec, dict) or len(spec) > MAX_EXTRAS:
        raise ValueError(f"{owner}.extra_outputs() must return a dict of at most "
                         f"{MAX_EXTRAS} entries name -> (shape, dtype), e.g. "
                         f"{{'action_log_prob': ((), 'float32')}} (got {spec!r:.80})")
    out: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {}
    for name, entry in spec.items():
        if not isinstance(name, str) or not EXTRA_NAME.fullmatch(name):
            raise ValueError(f"{owner}.extra_outputs() names an output {name!r}: "
                             f"use a lowercase identifier of at most 32 characters "
                             f"([a-z_][a-z0-9_]*), e.g. 'action_log_prob'")
        try:
            shape, dtype = entry
            shape = tuple(shape)
            dtype = np.dtype(dtype)
        except (TypeError, ValueError):
            raise ValueError(f"{owner}.extra_outputs()[{name!r}] is {entry!r:.80}, not "
                             f"(per-row shape, numpy dtype), e.g. ((), 'float32')") from None
        if (len(shape) > 8 or not all(type(d) is int and d >= 0 for d in shape) or dtype.kind not in _EXTRA_KINDS
                or dtype.itemsize > 8):
            raise ValueError(f"{owner}.extra_outputs()[{name!r}] is {entry!r:.80}: the "
                             f"shape must be at most 8 non-negative ints and the dtype a "
                             f"number or bool of at most 8 bytes (float32, int64...)")
        out[name] = (shape, dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)
    return out


class EpisodeStats(NamedTuple):
    """One finished episode, reported by the worker that ran it."""

    ret: float
    length: int
    test: bool
    policy_version: int
    env: int = 0  # which of its worker's envs ran it (worker.num_envs)


def flatten(tree: Any, prefix: str) -> tuple[Spec, list[tuple[str, Any]]]:
    """Split a nested tuple/list/dict of leaves into a spec and ``(name, leaf)``
    pairs, depth first."""
    leaves: list[tuple[str, Any]] = []

    def walk(node: Any, name: str, depth: int) -> Spec:
        if depth > MAX_TREE_DEPTH:
            raise ValueError(f"{prefix} is nested deeper than {MAX_TREE_DEPTH} levels")
        if isinstance(node, (tuple, list)):
            return [walk(child, f"{name}/{i}", depth + 1) for i, child in enumerate(node)]
        if isinstance(node, dict):
            return {str(k): walk(node[k], f"{name}/{k}", depth + 1) for k in sorted(node)}
        leaves.append((name, node))
        return name

    spec = walk(tree, prefix, 0)
    if len(leaves) > MAX_TREE_LEAVES:
        raise ValueError(f"{prefix} has {len(leaves)} leaves; at "
                         f"most {MAX_TREE_LEAVES} are allowed")
    return spec, leaves


def unflatten(spec: Spec, leaves: dict[str, Any]) -> Any:
    """Inverse of :func:`flatten`: lists in the spec become tuples."""
    if isinstance(spec, str):
        return leaves[spec]
    if isinstance(spec, list):
        return tuple(unflatten(s, leaves) for s in spec)
    return {k: unflatten(s, leaves) for k, s in spec.items()}


def spec_leaves(spec: Spec) -> list[str]:
    """Leaf names of a spec, in order. Raises ValueError for anything that is not a valid spec."""
    names: list[str] = []
    stack: list[tuple[Any, int]] = [(spec, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH or len(names) > MAX_TREE_LEAVES:
            raise ValueError(f"spec is deeper than {MAX_TREE_DEPTH} levels or "
                             f"has over {MAX_TREE_LEAVES} leaves")
        if isinstance(node, str):
            names.append(node)
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in reversed(node))
        elif isinstance(node, dict):
            stack.extend((child, depth + 1) for child in reversed(list(node.values())))
        else:
            raise ValueError(f"spec node of type {type(node).__name__} is not a name, list or map")
    return names


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Apply ``fn`` to every leaf, keeping tuples, lists and dicts."""
    if isinstance(tree, (tuple, list)):
        return type(tree)(tree_map(fn, t) for t in tree)
    if isinstance(tree, dict):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    return fn(tree)


def row(tree: Any, i: int) -> Any:
    """Row ``i`` of every leaf of a tree of column arrays."""
    return tree_map(lambda col: col[i], tree)


@dataclass
class Buffer:
    """A packet of consecutive rows from one worker, stored as columns (leading dimension ``n``).

    ``memory`` gives tmrl's per-sample view ``[(act, obs, rew, terminated, truncated,
    info), ...]`` for memories ported from tmrl; fast memories read the columns directly.
    """

    act: Any
    obs: Any
    rew: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    reset: np.ndarray
    context: np.ndarray
    policy_version: np.ndarray
    worker: str = ""
    seq: int = 0
    episodes: list[EpisodeStats] = field(default_factory=list)
    weight: np.ndarray | None = None  # per-row loss weight set by the trainer (0 drops a
                                      # stale transition)
    recv_version: int = -1  # the trainer's weight version when the packet arrived (for policy lag)
    env: np.ndarray | None = None  # per-row env index within the worker (uint16); None:
                                   # every row is env 0's
    extra: dict[str, np.ndarray] | None = None  # the actor's extra outputs per row (module
                                                # docstring); None: none
    info: dict[str, np.ndarray] | None = None  # the declared info entries per row
                                               # (netrl.samples.info); None: none

    @property
    def envs(self) -> np.ndarray:
        """The ``env`` column, zeros when the packet has none (a one-env worker of an
        older netrl, a dataset)."""
        return np.zeros(len(self), np.uint16) if self.env is None else self.env

    def __len__(self) -> int:
        return int(self.rew.shape[0])

    @property
    def transition_end(self) -> np.ndarray:
        """True at rows where a transition (previous row -> this row) ends."""
        ends = ~(self.reset | self.context)
        return ends if self.weight is None else ends & (self.weight > 0)

    @property
    def memory(self) -> list[tuple[Any, Any, float, bool, bool, dict[str, Any]]]:
        """tmrl's view: one ``(act, obs, rew, terminated, truncated,
        info)`` tuple per new row (slow path).

        Context rows are left out: they repeat rows of the previous packet, so a memory that appends
        these rows one packet after another holds each worker's rows once and in order, as in tmrl.
        ``info["reset"]`` marks an episode's first observation, and ``info["weight"]`` is the row's
        loss weight (0: a stale transition); the declared info entries follow, by name."""
        rows = []
        for i in np.flatnonzero(~self.context).tolist():
            act, obs = row(self.act, i), row(self.obs, i)
            info = {name: col[i] for name, col in (self.info or {}).items()}
            info["reset"] = bool(self.reset[i])
            info["weight"] = 1.0 if self.weight is None else float(self.weight[i])
            rows.append((act, obs, float(self.rew[i]), bool(self.terminated[i]), bool(self.truncated[i]), info))
        return rows


def _casts(have: np.dtype[Any], want: np.dtype[Any]) -> bool:
    """Whether a leaf of dtype ``have`` is stored as ``want``: within its kind (float64 to
    float32), and any integer or bool into an integer (an env's int64 Discrete value into uint8;
    each value is checked to fit)."""
    return np.can_cast(have, want, "same_kind") or (have.kind in "biu" and want.kind in "iu")


def _check_int_fits(name: str, leaf: Any, dtype: np.dtype[Any]) -> None:
    """Raise ValueError unless every value of an integer ``leaf`` fits ``dtype``: numpy
    would wrap it silently."""
    arr = np.asarray(leaf)
    if arr.dtype.kind not in "biu" or arr.size == 0:
        return  # another kind: refused by the schema check, naming the field
    info = np.iinfo(dtype)
    low, high = int(arr.min()), int(arr.max())
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        raise ValueError(f"{name} holds {bad}, which {dtype} ({info.min}..{info.max}), "
                         f"the dtype its space's values travel in, cannot hold: "
                         f"keep observations and actions within their spaces")


class BufferBuilder:
    """Accumulates rows into preallocated columns and cuts them into self-contained
    :class:`Buffer` packets.

    Args:
        capacity: rows per column block; a packet is cut before the block overflows.
        overlap: rows of history a memory needs before a transition (1 for plain observations, the
            stack length for memories that rebuild frame stacks).
        extra: the extra outputs every row carries (:data:`ExtraSpec`, from the actor's
            ``extra_outputs()``); set it, or :attr:`extra`, before the first row. A row added
            without them holds zeros. :attr:`info`, the info entries (the pipeline's), likewise.
    """

    def __init__(self, capacity: int, overlap: int = 1, extra: ExtraSpec | None = None) -> None:
        if capacity <= overlap:
            raise ValueError(f"capacity ({capacity}) must exceed overlap ({overlap})")
        self.capacity = capacity
        self.overlap = overlap
        self.extra: ExtraSpec = dict(extra or {})
        self.info: ExtraSpec = {}
        # name -> column (views of self._cols' "extra/<name>", "info/<name>")
        self._extra_cols: dict[str, np.ndarray] = {}
        self._info_cols: dict[str, np.ndarray] = {}
        # Leaf dtypes the packets must carry (e.g. the spaces' float32, for an env that returns
        # float64): a leaf that casts to its dtype within its kind is stored as that dtype; others
        # keep their own (and are refused later).
        self.dtypes: dict[str, np.dtype[Any]] = {}
        self._act_spec: Spec = None
        self._obs_spec: Spec = None
        self._cols: dict[str, np.ndarray] = {}
        self._n = 0  # rows in the current block, context rows included
        self._fresh = 0  # rows not sent yet

    def __len__(self) -> int:
        """Rows that have not been sent yet."""
        return self._fresh

    def _allocate(self, act: Any, obs: Any) -> None:
        self._act_spec, act_leaves = flatten(act, "act")
        self._obs_spec, obs_leaves = flatten(obs, "obs")
        cols: dict[str, np.ndarray] = {}
        for name, leaf in act_leaves + obs_leaves:
            arr = np.asarray(leaf)
            want = self.dtypes.get(name, arr.dtype)
            cols[name] = np.empty((self.capacity, *arr.shape), dtype=want if _casts(arr.dtype, want) else arr.dtype)
        cols["rew"] = np.empty(self.capacity, np.float32)
        for flag in ("terminated", "truncated", "reset", "context"):
            cols[flag] = np.empty(self.capacity, np.bool_)
        cols["policy_version"] = np.empty(self.capacity, np.int64)
        for name, (shape, dtype) in check_extra_spec(self.extra, "the actor").items():
            cols[f"extra/{name}"] = self._extra_cols[name] = np.zeros((self.capacity, *shape), dtype)
        for name, (shape, dtype) in check_extra_spec(self.info, "the pipeline's info keys").items():
            cols[f"info/{name}"] = self._info_cols[name] = np.zeros((self.capacity, *shape), dtype)
        self._cols = cols

    def add(self, act: Any, obs: Any, rew: float, terminated: bool, truncated: bool, reset: bool,
            policy_version: int, extra: dict[str, Any] | None = None,
            info: dict[str, Any] | None = None) -> None:
        """Append one row. Leaves are copied: envs such as rtgym reuse their arrays between
        steps. ``extra``: the row's extra outputs, exactly those declared (None: zeros, as for a
        reset row or a random action); ``info``: its info entries, likewise."""
        if not self._cols:
            self._allocate(act, obs)
        if self._n >= self.capacity:
            raise RuntimeError("BufferBuilder is full: call cut() before adding more rows")
        i = self._n
        cols = self._cols
        for tree, prefix in ((act, "act"), (obs, "obs")):
            _, leaves = flatten(tree, prefix)
            for name, leaf in leaves:
                if name not in cols:
                    raise ValueError(f"sample structure changed: new leaf "
                                     f"{name!r}; keep observations fixed")
                col = cols[name]
                # numpy would broadcast (1,) or a scalar into every value
                if np.shape(leaf) != col.shape[1:]:
                    raise ValueError(f"{name} has the shape {np.shape(leaf)} in this "
                                     f"step, and {col.shape[1:]} in the first: keep "
                                     f"observations and actions the same shape every step")
                if col.dtype.kind in "iu" and np.asarray(leaf).dtype != col.dtype:
                    _check_int_fits(name, leaf, col.dtype)
                col[i] = leaf
        cols["rew"][i] = rew
        cols["terminated"][i] = terminated
        cols["truncated"][i] = truncated
        cols["reset"][i] = reset
        cols["context"][i] = False
        cols["policy_version"][i] = policy_version
        if extra is not None or self._extra_cols:
            self._add_extra(i, extra)
        if info is not None or self._info_cols:
            store_info(self._info_cols, i, info)
        self._n += 1
        self._fresh += 1

    def _add_extra(self, i: int, extra: dict[str, Any] | None) -> None:
        cols = self._extra_cols
        if extra is None:
            for col in cols.values():
                col[i] = 0
            return
        if extra.keys() != cols.keys():
            undeclared, missing = sorted(set(extra) - set(cols)), sorted(set(cols) - set(extra))
            raise ValueError(f"a row's extra outputs {sorted(extra)} differ "
                             f"from those the actor declares ({sorted(cols)}): "
                             f"missing {missing}, undeclared {undeclared}; return "
                             f"exactly the ones ActorModule.extra_outputs() names")
        for name, value in extra.items():
            col = cols[name]
            # numpy would broadcast a scalar into every element
            if np.shape(value) != col.shape[1:]:
                raise ValueError(f"extra output {name!r} has the shape {np.shape(value)} in a "
                                 f"row; the actor declares {col.shape[1:]}")
            col[i] = value

    @property
    def transitions(self) -> int:
        """Unsent rows that end a transition (all but an episode's first observation)."""
        if not self._fresh:
            return 0
        return int(np.count_nonzero(~self._cols["reset"][self._n - self._fresh:self._n]))

    @property
    def full(self) -> bool:
        return self._n >= self.capacity

    @property
    def row_nbytes(self) -> int:
        """Bytes one row takes in a packet, uncompressed (0 before the first row)."""
        return sum(col.nbytes // self.capacity for col in self._cols.values())

    def cut(self) -> Buffer | None:
        """Return the unsent rows as a packet (with context rows in front) and
        start the next block."""
        if self._fresh == 0:
            return None
        n = self._n
        cols = {name: col[:n].copy() for name, col in self._cols.items()}
        leaves = {name: cols[name] for name in cols}
        buf = Buffer(
            act=unflatten(self._act_spec, leaves),
            obs=unflatten(self._obs_spec, leaves),
            rew=cols["rew"], terminated=cols["terminated"], truncated=cols["truncated"],
            reset=cols["reset"], context=cols["context"], policy_version=cols["policy_version"],
            extra={name: cols[f"extra/{name}"] for name in self._extra_cols} or None,
            info={name: cols[f"info/{name}"] for name in self._info_cols} or None,
        )
        # Keep the tail as context for the next packet, even after an episode ended: some
        # observations (rtgym's action buffer without reset_act_buf) carry history across a reset.
        keep = min(self.overlap, n)
        if keep:
            for col in self._cols.values():
                col[:keep] = col[n - keep:n]
            self._cols["context"][:keep] = True
        self._n = keep
        self._fresh = 0
        return buf

    def spec(self) -> tuple[Spec, Spec]:
        return self._act_spec, self._obs_spec


def concat_segments(segments: list[tuple[int, Buffer]]) -> Buffer:
    """One packet from several envs' packets ``(env index, packet)``, env-major,
    with the ``env`` column set.

    Each packet keeps its own context rows in front, so no transition joins two envs
    (see the module docstring)."""
    segments = sorted(segments, key=lambda s: s[0])
    if len(segments) == 1:
        env, buf = segments[0]
        buf.env = np.full(len(buf), env, np.uint16)
        return buf
    bufs = [b for _, b in segments]

    def cat(*cols: np.ndarray) -> np.ndarray:
        return np.concatenate(cols)

    def cat_tree(trees: list[Any]) -> Any:
        first = trees[0]
        if isinstance(first, (tuple, list)):
            return type(first)(cat_tree([t[i] for t in trees]) for i in range(len(first)))
        if isinstance(first, dict):
            return {k: cat_tree([t[k] for t in trees]) for k in first}
        return cat(*trees)

    return Buffer(
        act=cat_tree([b.act for b in bufs]), obs=cat_tree([b.obs for b in bufs]),
        rew=cat(*(b.rew for b in bufs)), terminated=cat(*(b.terminated for b in bufs)),
        truncated=cat(*(b.truncated for b in bufs)), reset=cat(*(b.reset for b in bufs)),
        context=cat(*(b.context for b in bufs)), policy_version=cat(*(b.policy_version for b in bufs)),
        episodes=[e for b in bufs for e in b.episodes],
        env=cat(*(np.full(len(b), env, np.uint16) for env, b in segments)),
        extra={k: cat(*(b.extra[k] for b in bufs if b.extra is not None)) for k in bufs[0].extra} if bufs[0].extra
        else None,
        info={k: cat(*(b.info[k] for b in bufs if b.info is not None))
              for k in bufs[0].info} if bufs[0].info else None,
    )
