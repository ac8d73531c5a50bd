"""The trainer's weight encodings (issue 34): each published version of each model in the formats
``network.weight_format`` asks for, and deltas between versions, on a thread of its own.

The training thread only snapshots a model into a flat buffer
(:meth:`~netrl.trainer.link.TrainerLink.publish`); :class:`WeightEncoder` turns that snapshot into
WEIGHTS messages, one set per format (see :mod:`netrl.protocol.weight_formats`):

- a full version: the format's encoding, with ``format``, ``encoded`` (its size), ``crc`` and
  ``rank`` (and ``budget_s`` under ``auto``: ``network.weight_budget_s``, or with 0 the smaller of
  the model's last two intervals between publications, so that the server picks formats with
  which a worker keeps up with the trainer; none before the third version: the first interval
  spans the trainer's warm-up, not its pace);
- for settings that send deltas, also a delta against the version of the same model and format
  encoded just before (``base``): the worker applies it to the encoding it holds and checks the
  crc, so float32's stay bit-exact.

Each lossy version's error against the float32 original is measured and logged (the first per
format at INFO, then DEBUG) and kept in :attr:`WeightEncoder.max_errors`. A version a 16-bit format
cannot hold (a weight beyond float16's range) goes in float32 in that format's place, logged, unless
float32 is sent anyway. A newer version of a model replaces one still waiting to be encoded: on a
slow CPU the encodings never queue without limit.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from netrl.protocol.weight_formats import (
    Encoder,
    FormatError,
    crc,
    delta_encode,
    formats_for,
    get_format,
    sends_deltas,
)

__all__ = ["Encoded", "WeightEncoder"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Encoded:
    """One WEIGHTS message set to send: ``data`` in parts, with these optional ``fields``."""

    data: np.ndarray
    fields: dict[str, Any]
    snapshot: bool  # data is the snapshot itself (float32's full encoding): its sends keep it busy


@dataclasses.dataclass
class _Job:
    model: str
    version: int
    trained_steps: int
    flat: np.ndarray
    layout: list[list[Any]]
    done: Callable[[list[Encoded]], None]  # sends them (on the encoding thread) and releases
                                           # the snapshot
    release: Callable[[], None]  # releases the snapshot of a version replaced before it was encoded
    # the smaller of the model's last two intervals between publications (None: under two known)
    interval_s: float | None = None
    exact: bool = False  # float32 only, whatever the setting


# a budget measured from publications: versions published faster are still allowed this long
MIN_BUDGET_S = 0.05
MAX_BUDGET_S = 3600.0


@dataclasses.dataclass
class _Chain:
    """A model's state in one format: its encoder (int8 keeps scales), and the
    encoding of the version before."""

    layout: list[list[Any]]
    encoder: Encoder
    version: int = -1
    encoding: np.ndarray | None = None


class WeightEncoder:
    """Encodes published versions on a thread of its own; see the module docstring."""

    def __init__(self, setting: str, budget_s: float) -> None:
        self.setting = setting
        self.formats = formats_for(setting)  # FormatError for an unknown setting
        self.deltas = sends_deltas(setting)
        # auto only; 0: each model's time between publications (see the module docstring)
        self.budget_s = budget_s if setting in ("auto", "adaptive") else None
        self._published: dict[str, float] = {}  # model -> time.monotonic() of its last publication
        # model -> the time between its last two publications
        self._intervals: dict[str, float | None] = {}
        self.max_errors: dict[str, float] = {}  # format -> the newest lossy version's
                                                # measured error
        self.counts: collections.Counter[str] = collections.Counter()
        self._chains: dict[tuple[str, str], _Chain] = {}
        self._cond = threading.Condition()
        # model -> its newest version waiting (insertion order: arrival)
        self._jobs: dict[str, _Job] = {}
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    # -- the training thread -----------------------------------------------------------------------
    def published(self, model: str) -> float | None:
        """Note a publication of ``model`` (encoded or not: adaptive sends float32 alone while no
        worker is slow); returns its pace, the smaller of its last two intervals (None: under two
        known). The first interval alone spans the trainer's warm-up: 12 s before its second
        version over a slow link, which let the server send that version in float16, twice
        int8's bytes, for a budget of 12 s."""
        now = time.monotonic()
        last, self._published[model] = self._published.get(model), now
        interval = None if last is None else now - last
        before, self._intervals[model] = self._intervals.get(model), interval
        return None if interval is None or before is None else min(interval, before)

    def put(self, model: str, version: int, trained_steps: int, flat: np.ndarray, layout: list[list[Any]],
            done: Callable[[list[Encoded]], None], release: Callable[[], None], exact: bool = False) -> None:
        """Encode ``flat`` (a snapshot, read-only until ``done`` or ``release`` is called) on the
        encoding thread; ``release`` frees a snapshot whose version a newer one replaced before it
        was encoded. ``exact``: the model travels in float32 whatever the setting (its module's
        ``exact_weights``: the observation statistics)."""
        pace = self.published(model)
        with self._cond:
            old = self._jobs.pop(model, None)
            self._jobs[model] = _Job(model, version, trained_steps, flat, layout, done, release,
                                     pace, exact)
            self._cond.notify_all()
        if old is not None:
            self.counts["encodings_superseded"] += 1
            old.release()
            log.debug("%s v%d was replaced by v%d before it was encoded",
                      _what(model), old.version, version)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="netrl-weight-encoder", daemon=True)
            self._thread.start()

    def wait(self, timeout: float) -> bool:
        """Wait until every version put is encoded and handed on; False after ``timeout`` s."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._busy, timeout)

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the encoding thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                model = next(iter(self._jobs))
                job = self._jobs.pop(model)
                self._busy = True
            try:
                job.done(self.encode(job.model, job.version, job.flat, job.layout, job.interval_s, job.exact))
            # a bug or a custom format's: that version is not sent, later ones still are
            except Exception:
                self.counts["encodings_failed"] += 1
                log.exception("encoding %s v%d failed; it is not sent", _what(job.model), job.version)
                job.done([])
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def encode(self, model: str, version: int, flat: np.ndarray, layout: list[list[Any]],
               interval_s: float | None = None, exact: bool = False) -> list[Encoded]:
        """The messages of one version in every format: deltas first (small, and most workers
        take them), then the full encodings, each kind smallest first: the server streams to an
        idle worker what it has, and one whose link rate it does not know yet gets the fewest
        bytes. ``interval_s``: the model's pace of publication (:meth:`put`), auto's budget
        when ``network.weight_budget_s`` is 0."""
        budget = self.budget_s
        if budget == 0:
            budget = None if interval_s is None else min(max(interval_s, MIN_BUDGET_S), MAX_BUDGET_S)
        deltas: list[Encoded] = []
        fulls: list[Encoded] = []
        sent = set()
        formats = ["float32"] if exact else self.formats
        for name in formats:
            fmt = get_format(name)
            chain = self._chain(model, name, layout)
            try:
                encoding = chain.encoder.encode(flat)
            except FormatError as exc:
                self._chains.pop((model, name), None)  # the next version goes in full
                if "float32" in formats:
                    log.warning("%s v%d is not sent in %s (%s); workers get it in float32",
                                _what(model), version,
                                name, exc)
                    continue
                log.warning("%s v%d goes in float32 in place of %s: %s",
                            _what(model), version, name, exc)
                fmt, encoding = get_format("float32"), flat.view()
                name = "float32"
                chain = self._chain(model, name, layout)
            if name in sent:
                continue
            sent.add(name)
            # float32's: a view of the snapshot, which is reused
            snapshot = np.may_share_memory(encoding, flat)
            if not fmt.exact:
                self._measure(model, version, name, fmt, flat, encoding, layout)
            fields: dict[str, Any] = {"format": name, "encoded": int(encoding.nbytes), "crc": crc(encoding),
                                      "rank": int(fmt.rank)}
            if model != "policy":
                fields["model"] = model
            if budget is not None:
                fields["budget_s"] = round(budget, 3)
            if (self.deltas and chain.encoding is not None and chain.encoding.nbytes == encoding.nbytes
                    and chain.version < version):
                deltas.append(Encoded(delta_encode(chain.encoding, encoding), {**fields, "base": chain.version},
                                      False))
            fulls.append(Encoded(encoding, fields, snapshot))
            # the base of the next delta: float32's encoding is the snapshot, which is reused
            if self.deltas:
                chain.version, chain.encoding = version, encoding.copy() if snapshot else encoding
        return sorted(deltas, key=lambda e: e.data.nbytes) + sorted(fulls, key=lambda e: e.data.nbytes)

    def _chain(self, model: str, name: str, layout: list[list[Any]]) -> _Chain:
        chain = self._chains.get((model, name))
        # another actor: a new encoder, and no delta against the old
        if chain is None or chain.layout != layout:
            chain = self._chains[(model, name)] = _Chain(layout, get_format(name).encoder(layout))
        return chain

    def _measure(self, model: str, version: int, name: str, fmt: Any, flat: np.ndarray, encoding: np.ndarray,
                 layout: list[list[Any]]) -> None:
        decoded = np.zeros(flat.nbytes, np.uint8)
        fmt.decode(encoding, layout, decoded)
        error = fmt.max_error(flat, decoded, layout)
        first = name not in self.max_errors
        self.max_errors[name] = error
        log.log(logging.INFO if first else logging.DEBUG, "%s v%d in %s: max error %.3g (%s)", _what(model),
                version, name, error, fmt.promise)


def _what(model: str) -> str:
    return "weights" if model == "policy" else f"model {model!r}"
