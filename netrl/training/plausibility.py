"""Values that are valid but implausible for this run, per worker, and what the trainer does.

A packet within the spaces and ``trainer.max_abs_reward`` (:mod:`netrl.training.safeguards`) may
still be far from anything the run has seen: one worker's rewards of 1e5 on Pendulum (whose
rewards lie in [-16, 0]) pushed the critic loss to 7.8e11. Each packet's rewards and small
observation leaves (at most 64 numbers a row; images are left out) are compared, in one vectorised
step, with what recent packets held: a value is implausible beyond ``trainer.implausible_factor``
robust scales from the median of a ring of rows sampled from recent plausible packets (the scale of
a feature: the larger of 1.4826 times its median absolute deviation, a tenth of its median's
magnitude, and 1). A reward outside the env's declared ``reward_range`` is implausible too. No
judgement is made until the ring holds ``MIN_ROWS`` rows; a minority of workers cannot move a
median, so none can widen what passes.

What happens to a worker's implausible packet (``trainer.implausible``), each counted and logged
per worker (a log line for the first packets, then every hundredth):

- ``warn``: it is trained on;
- ``quarantine`` (the default): the worker's packets from then on are kept aside, in memory and
  never sampled (at most ``hold_rows`` rows; the oldest go beyond it, counted), and the rows it
  wrote before are hidden where the memory can (``set_quarantined``), until :meth:`lift` or the
  run ends;
- ``refuse``: the trainer asks the server to revoke the worker's key (:mod:`netrl.server.
  revocation`); its packets are refused and its rows dropped from the memory at once.

A worker the server revoked (``--revoke``, or this trainer's refuse) is :meth:`revoked`: its rows
are dropped from the memory (``drop_worker``) and its packets still on their way refused. The
checkpoint keeps who is quarantined and revoked (:meth:`state`).
"""

from __future__ import annotations

import collections
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from netrl.samples.columns import Buffer, flatten
from netrl.util import declared_reward_range, worth_logging

__all__ = ["DEFAULT_MAX_ABS_REWARD", "Implausible", "Plausibility", "declared_reward_range",
           "reward_bound", "worker_name"]

log = logging.getLogger(__name__)

Implausible = Literal["warn", "quarantine", "refuse"]
DEFAULT_MAX_ABS_REWARD = 1e6  # the bound when neither the config nor the env gives one
RING_ROWS = 2048  # rows kept to judge by
SAMPLED_PER_PACKET = 16  # rows of a plausible packet added to the ring
MIN_ROWS = 256  # rows in the ring before anything is judged
REFRESH_EVERY = 128  # plausible packets between recomputations of the medians and scales
MAX_LEAF_FEATURES = 64  # an observation leaf with more numbers a row (an image) is not judged
MAX_FEATURES = 256


def _memory_name(rows: Any) -> str:
    return type(getattr(rows, "memory", rows)).__name__


def worker_name(worker: str) -> str:
    """A packet's worker (``name/session``) as the server's keys and revocations name it."""
    return worker.split("/", 1)[0]


def reward_bound(setting: float | None, declared: tuple[float, float] | None) -> float:
    """``trainer.max_abs_reward``: the user's value when set, else the env's declared range's
    larger magnitude, else :data:`DEFAULT_MAX_ABS_REWARD` (the robust statistic judges those)."""
    if setting is not None:
        return float(setting)
    if declared is not None:
        return max(abs(declared[0]), abs(declared[1]), 1e-6)
    return DEFAULT_MAX_ABS_REWARD


@dataclass
class _Worker:
    implausible: int = 0  # its packets found implausible
    quarantined: bool = False
    revoked: bool = False
    held: collections.deque[Buffer] = field(default_factory=collections.deque)
    held_rows: int = 0
    reason: str = ""  # why it was quarantined
    gone: int = 0  # rows it sent while quarantined, dropped beyond hold_rows


class Plausibility:
    """The check of every packet (module docstring). ``rows`` hides and drops a worker's rows by
    its name: ``set_quarantined(name, flag)`` and ``drop_worker(name)``, each returning the rows
    it changed (the loop's :class:`~netrl.training.ingest.Ingester`, which lets no batch be
    gathered meanwhile, passes itself; None: nothing to hide or drop)."""

    def __init__(self, action: Implausible, factor: float,
                 reward_range: tuple[float, float] | None, hold_rows: int, rows: Any) -> None:
        if action not in ("warn", "quarantine", "refuse"):
            raise ValueError(f'implausible must be "warn", "quarantine" or "refuse" '
                             f'(got {action!r})')
        self.action, self.factor, self.reward_range = action, float(factor), reward_range
        self.hold_rows, self.rows = hold_rows, rows
        self.workers: dict[str, _Worker] = {}
        self.requests: list[tuple[str, str]] = []  # (worker, why): revocations to ask the server
        self.counts = collections.Counter[str]()
        # packets a lift released, by id (kept, so no other takes the id): taken unjudged, once
        self._vouched: dict[int, Buffer] = {}
        self._ring: np.ndarray | None = None
        self._names: list[str] = []
        self._layout: tuple[Any, ...] | None = None
        self._used: list[tuple[int, int]] = []  # (leaf, its numbers a row) of the judged leaves
        self._width = 0
        self._picks: dict[int, np.ndarray] = {}  # packet rows -> the rows it gives the ring
        self._filled = self._pos = self._since = 0
        self._median: np.ndarray | None = None
        self._limit: np.ndarray | None = None
        self._scale: np.ndarray | None = None
        self._lo: np.ndarray | None = None  # median -+ limit: what passes, per feature
        self._hi: np.ndarray | None = None
        self._bounds: dict[tuple[int, Any], tuple[np.ndarray, np.ndarray]] = {}  # (at, dtype) ->

    # -- one packet --------------------------------------------------------------------------------
    def admit(self, buf: Buffer, new: bool = True) -> bool:
        """True: ``buf`` goes into the memory; False: it is held (quarantine) or refused."""
        name = worker_name(buf.worker)
        worker = self.workers.get(name)
        if self._vouched and self._vouched.get(id(buf)) is buf:  # the operator lifted its quarantine
            del self._vouched[id(buf)]
            return True
        if worker is not None and worker.revoked:
            self.counts["revoked_packets"] += 1
            return False
        if worker is not None and worker.quarantined:
            self._hold(name, worker, buf)
            return False
        values = self._values(buf)
        why = self._judge(buf, values)
        if why is None:
            self._learn(values)
            return True
        worker = self.workers.setdefault(name, _Worker())
        worker.implausible += 1
        self.counts["implausible_packets"] += new
        if worth_logging(worker.implausible, first=5, every=100):
            log.warning("packet %d of worker %s holds implausible values for this run: %s "
                        "(%d of its packets so far; trainer.implausible is %s)", buf.seq,
                        buf.worker, why, worker.implausible, self.action)
        if self.action == "warn":
            return True
        if self.action == "quarantine":
            self.quarantine(name, why)
            self._hold(name, worker, buf)
            return False
        self.requests.append((name, f"the trainer found implausible values: {why}"[:300]))
        self.revoked(name)
        return False

    def _values(self, buf: Buffer) -> list[np.ndarray] | None:
        """The packet's judged numbers as (rows, width) views, no copies: the reward, then each
        small numeric observation leaf (None when the layout gives more than MAX_FEATURES)."""
        obs, n = buf.obs, len(buf)
        leaves = [("obs", obs)] if isinstance(obs, np.ndarray) else flatten(obs, "obs")[1]
        arrays = [np.asarray(leaf) for _, leaf in leaves]
        layout = tuple((name, a.shape[1:], a.dtype.kind)
                       for (name, _), a in zip(leaves, arrays, strict=True))
        if layout != self._layout:  # the first packet, or another layout: start again
            self._plan(layout)
        if self._width > MAX_FEATURES:
            return None
        return [buf.rew.reshape(n, 1), *(arrays[i].reshape(n, width) for i, width in self._used)]

    def _plan(self, layout: tuple[tuple[str, tuple[int, ...], str], ...]) -> None:
        """Which observation leaves are judged, and their features' names, for a new layout."""
        self._layout, self._used, self._names = layout, [], ["reward"]
        for i, (name, shape, kind) in enumerate(layout):
            width = math.prod(shape)
            if kind in "biuf" and width <= MAX_LEAF_FEATURES:
                self._used.append((i, width))
                self._names += [f"{name}[{j}]" if shape else name for j in range(width)]
        self._width = len(self._names)
        self._ring, self._median, self._lo, self._hi = None, None, None, None
        self._bounds.clear()
        self._filled = self._pos = self._since = 0

    def _judge(self, buf: Buffer, values: list[np.ndarray] | None) -> str | None:
        if self.reward_range is not None and len(buf):
            lo, hi = self.reward_range
            rew = buf.rew
            outside = (rew < lo) | (rew > hi)
            if outside.any():
                row = int(np.argmax(outside))
                return (f"reward {float(rew[row]):g} in row {row} is outside the env's declared "
                        f"reward_range [{lo:g}, {hi:g}]")
        if values is None or self._lo is None or self._hi is None or not len(buf):
            return None
        at = 0
        for block in values:  # compared in its own dtype (numpy's axis-0 min of a narrow block,
            width = block.shape[1]  # and a float64 copy, each cost more than the comparison)
            below, above = self._typed(at, width, block.dtype)
            if (block < below).any() or (block > above).any():
                return self._why(np.concatenate(values, axis=1, dtype=np.float64))
            at += width
        return None

    def _typed(self, at: int, width: int, dtype: np.dtype[Any]) -> tuple[np.ndarray, np.ndarray]:
        """The bounds of features ``at:at + width``, in ``dtype`` when it is a float's."""
        key = (at, dtype)
        bounds = self._bounds.get(key)
        if bounds is None:
            assert self._lo is not None and self._hi is not None
            lo, hi = self._lo[at:at + width], self._hi[at:at + width]
            if dtype.kind == "f":  # finite bounds beyond the dtype's range become inf: still right
                with np.errstate(over="ignore"):
                    lo, hi = lo.astype(dtype), hi.astype(dtype)
            bounds = self._bounds[key] = (lo, hi)
        return bounds

    def _why(self, values: np.ndarray) -> str:
        """What is implausible in a packet found so (the slow path, for those alone)."""
        assert self._median is not None and self._limit is not None and self._scale is not None
        over = np.abs(values - self._median) > self._limit
        row, col = (int(i) for i in np.unravel_index(int(np.argmax(over)), over.shape))
        value, median = float(values[row, col]), float(self._median[col])
        scales = abs(value - median) / self._scale[col]
        return (f"{self._names[col]} {value:g} in row {row} is {scales:.0f} robust scales "
                f"from the median {median:g} of recent rows (beyond "
                f"trainer.implausible_factor, {self.factor:g})")

    def _learn(self, values: list[np.ndarray] | None) -> None:
        """A few rows of a plausible packet into the ring; the medians and scales renewed every
        REFRESH_EVERY packets once it holds MIN_ROWS."""
        n = len(values[0]) if values else 0
        if values is None or not n:
            return
        if self._ring is None:
            self._ring = np.empty((RING_ROWS, self._width), np.float64)
        picks = self._picks.get(n)
        if picks is None:
            if len(self._picks) > 1024:
                self._picks.clear()
            picks = np.linspace(0, n - 1, min(SAMPLED_PER_PACKET, n)).astype(np.intp)
            self._picks[n] = picks
        k = len(picks)
        rows = np.concatenate([block[picks] for block in values], axis=1, dtype=np.float64)
        if self._pos + k <= RING_ROWS:
            self._ring[self._pos:self._pos + k] = rows
        else:
            self._ring[(self._pos + np.arange(k)) % RING_ROWS] = rows
        self._pos = (self._pos + k) % RING_ROWS
        self._filled = min(RING_ROWS, self._filled + k)
        self._since += 1
        if self._filled >= MIN_ROWS and (self._median is None or self._since >= REFRESH_EVERY):
            ring = self._ring[:self._filled]
            median = np.median(ring, axis=0)
            mad = np.median(np.abs(ring - median), axis=0)
            self._scale = np.maximum(np.maximum(1.4826 * mad, 0.1 * np.abs(median)), 1.0)
            self._median, self._limit, self._since = median, self.factor * self._scale, 0
            self._lo, self._hi = median - self._limit, median + self._limit
            self._bounds.clear()

    def exchange(self, source: Any) -> None:
        """The training loop's ingest, first: revocations the source (the trainer's link) heard of
        are applied, and the revocations this check wants are asked for."""
        heard = getattr(source, "revocations", None)
        for name in heard() if callable(heard) else []:
            self.revoked(name)
        requests, self.requests = self.requests, []
        ask = getattr(source, "revoke", None)
        for name, why in requests:
            if callable(ask):
                ask(name, why)
            else:  # e.g. single-process mode: no server, no key to revoke
                log.warning("cannot ask a server to revoke worker %s (%s has no revoke()): its "
                            "packets are refused by this trainer alone", name,
                            type(source).__name__)

    # -- a worker's standing -----------------------------------------------------------------------
    def quarantine(self, name: str, why: str) -> None:
        worker = self.workers.setdefault(name, _Worker())
        if worker.quarantined:
            return
        worker.quarantined, worker.reason = True, why
        hidden = self._in_memory("set_quarantined", name, True)
        log.warning("worker %s is quarantined: its rows are kept aside, never sampled, until the "
                    "run ends or it is lifted (%s); %s", name, why,
                    f"{hidden} rows it wrote before are hidden" if hidden is not None else
                    f"the rows it wrote before stay ({_memory_name(self.rows)} cannot hide them)")

    def lift(self, name: str) -> list[Buffer]:
        """End ``name``'s quarantine; its held packets, to be ingested (the caller's)."""
        released = self.release(name)
        return released[0] if released is not None else []

    def release(self, name: str) -> tuple[list[Buffer], int | None, int] | None:
        """End ``name``'s quarantine (``--lift``): its held packets, to be ingested (the
        caller's), its rows in the memory sampled again (None: the memory cannot tell), and the
        rows it sent while quarantined that were dropped beyond ``hold_rows`` (gone); None when it
        is not quarantined."""
        worker = self.workers.get(name)
        if worker is None or not worker.quarantined:
            return None
        worker.quarantined, worker.reason = False, ""
        hidden = self._in_memory("set_quarantined", name, False)
        held, worker.held, worker.held_rows = list(worker.held), collections.deque(), 0
        gone, worker.gone = worker.gone, 0
        self._vouched = {id(buf): buf for buf in held}  # not judged again: the operator let them in
        log.info("quarantine of worker %s lifted: %d packets it held go into the memory, %s of "
                 "its rows there are sampled again, %d rows it sent were dropped beyond the "
                 "hold", name, len(held), "?" if hidden is None else hidden, gone)
        return held, hidden, gone

    def unrevoked(self, name: str) -> None:
        """The server lifted ``name``'s revocation (``--unrevoke``): its packets are taken again
        (its rows dropped before stay dropped)."""
        worker = self.workers.get(name)
        if worker is not None and worker.revoked:
            worker.revoked = False
            log.warning("worker %s is no longer revoked: its packets are taken again", name)

    def revoked(self, name: str) -> int:
        """The server revoked ``name`` (or this trainer asked it to): its rows in the memory are
        dropped and its packets refused from now on. Returns the rows dropped."""
        worker = self.workers.setdefault(name, _Worker())
        first = not worker.revoked
        worker.revoked = True
        held, worker.held, worker.held_rows = worker.held_rows, collections.deque(), 0
        dropped = self._in_memory("drop_worker", name)
        self.counts["revoked_rows_dropped"] += (dropped or 0) + held
        if first:
            self.counts["revoked_workers"] += 1
            log.warning("worker %s is revoked: %s, %d held in quarantine dropped; its packets "
                        "still on their way are refused", name,
                        f"{dropped} of its rows dropped from the memory" if dropped is not None
                        else f"its rows stay in the memory ({_memory_name(self.rows)} cannot "
                             f"drop a worker's rows)", held)
        return dropped or 0

    def _in_memory(self, method: str, name: str, *args: Any) -> int | None:
        """``rows.<method>(name, *args)``: the rows it reports, or None where the memory does not
        keep each row's worker (a ported tmrl memory)."""
        call = getattr(self.rows, method, None)
        if not callable(call):
            return None
        try:
            held = getattr(getattr(self.rows, "memory", self.rows), "rows_of", None)
            if callable(held) and not held(name):  # none of its rows: nothing to hide or drop
                return 0
            return int(call(name, *args))
        except NotImplementedError:
            return None

    def _hold(self, name: str, worker: _Worker, buf: Buffer) -> None:
        worker.held.append(buf)
        worker.held_rows += len(buf)
        self.counts["quarantined_packets"] += 1
        while worker.held_rows > self.hold_rows and len(worker.held) > 1:
            gone = worker.held.popleft()
            worker.held_rows -= len(gone)
            worker.gone += len(gone)
            self.counts["quarantine_dropped_rows"] += len(gone)
            if worth_logging(self.counts["quarantine_dropped_rows"], first=1, every=100):
                log.warning("worker %s is quarantined beyond %d rows: its oldest held rows are "
                            "dropped (%d so far)", name, self.hold_rows,
                            self.counts["quarantine_dropped_rows"])

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the workers quarantined and revoked (a restarted trainer holds
        or refuses their packets again as it replays the sample log), and the counts."""
        return {"plausibility": {
            "quarantined": sorted(n for n, w in self.workers.items() if w.quarantined),
            "revoked": sorted(n for n, w in self.workers.items() if w.revoked),
            "counts": dict(self.counts)}}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's :meth:`state` (before the sample log is replayed: the
        memory is empty, so nothing is hidden or dropped there)."""
        kept = state.get("plausibility") or {}
        for key in ("quarantined", "revoked"):
            for name in kept.get(key, []):
                setattr(self.workers.setdefault(str(name), _Worker()), key, True)
        self.counts.update({str(k): int(v) for k, v in (kept.get("counts") or {}).items()})

    def metrics(self) -> dict[str, int]:
        """The counters for the round's metrics and the status line (read from the trainer's
        network thread too: a copy of the workers, made in one step)."""
        workers = list(self.workers.values())
        return {"implausible_packets": self.counts["implausible_packets"],
                "quarantined_workers": sum(w.quarantined for w in workers),
                "quarantined_rows": sum(w.held_rows for w in workers),
                "quarantine_dropped_rows": self.counts["quarantine_dropped_rows"],
                "revoked_workers": self.counts["revoked_workers"],
                "revoked_rows_dropped": self.counts["revoked_rows_dropped"]}
