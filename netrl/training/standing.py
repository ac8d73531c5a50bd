"""What the trainer tells an operator of each worker, and what it does on the operator's word.

At most once a second, the training loop's ingest reports, through its source's ``operator`` (the
trainer link's :class:`~netrl.trainer.operator.OperatorBox`, which sends it on the next PROGRESS):

- per worker, its rows in the replay memory, its share's cap, and the packets and rows refused
  over that share (:meth:`~netrl.training.ingest.Ingester.share_cap`): the server shows them in
  ``--status`` and tells the worker when its refusals rise;
- the workers quarantined (:mod:`netrl.training.plausibility`): their rows kept aside, and why.

It applies the revocations the server lifted (``--unrevoke``: the worker's packets are taken
again) and answers ``--lift``: the worker's held packets go into the memory, its rows there are
sampled again, and the answer says how many, and how many rows it sent while quarantined were
dropped beyond the hold (gone for good), or that it was not quarantined.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from netrl.samples.columns import Buffer

__all__ = ["MAX_REPORTED", "REPORT_EVERY_S", "Standing"]

log = logging.getLogger(__name__)

REPORT_EVERY_S = 1.0  # the server's --status needs no more; the report costs a pass over workers
MAX_REPORTED = 1000  # workers in one report (those holding most rows): a PROGRESS stays small


class Standing:
    """The operator's side of an :class:`~netrl.training.ingest.Ingester` (module docstring)."""

    def __init__(self, ingester: Any) -> None:
        self.ingester = ingester  # (Any: ingest.py imports this module)
        self.clock = time.monotonic
        self._next_report = 0.0

    def exchange(self, source: object, add: Callable[[Buffer], int]) -> int:
        """Lifts and unrevocations from ``source``'s operator box, answered; the report once a
        second. Returns the env steps of the packets a lift released (``add`` ingests them)."""
        box = getattr(source, "operator", None)
        if box is None:
            return 0
        plausibility = self.ingester.plausibility
        for name in box.unrevocations():
            plausibility.unrevoked(name)
        steps = 0
        for request in box.lift_requests():
            answer, added = self.lift(str(request.get("worker", "")), add)
            steps += added
            box.answer_lift({**answer, "ask": request.get("ask", 0)})
        now = self.clock()
        if now >= self._next_report:
            self._next_report = now + REPORT_EVERY_S
            box.report(*self.report())
        return steps

    def report(self) -> tuple[dict[str, list[int]], dict[str, list[Any]]]:
        """({worker: [rows in replay, its cap, packets refused over it, their rows]},
        {worker quarantined: [rows kept aside, why]})."""
        ing = self.ingester
        held = {name: w for name, w in ing.plausibility.workers.items() if w.quarantined}
        quarantined = {name: [w.held_rows, w.reason[:300]]
                       for name, w in list(held.items())[:MAX_REPORTED]}
        if ing.owned is None:  # a memory that does not keep each row's worker: no shares
            return {}, quarantined
        rows = ing.owned.worker_rows()
        names = sorted(set(rows) | set(ing.over_share), key=lambda n: -rows.get(n, 0))
        recent = ing.recent_workers()  # once, not once a worker
        workers = {name: [rows.get(name, 0), ing.share_cap(name, recent),
                          ing.over_share.get(name, 0), ing.over_share_rows.get(name, 0)]
                   for name in names[:MAX_REPORTED]}
        return workers, quarantined

    def lift(self, name: str, add: Callable[[Buffer], int]) -> tuple[dict[str, Any], int]:
        """``--lift name``: (the answer's body, the env steps its released packets added)."""
        plausibility = self.ingester.plausibility
        released = plausibility.release(name)
        if released is None:
            worker = plausibility.workers.get(name)
            others = sorted(n for n, w in plausibility.workers.items() if w.quarantined)
            why = (f"worker {name!r} is not quarantined, nothing to lift (quarantined now: "
                   f"{', '.join(others[:10]) or 'none'})")
            if worker is not None and worker.revoked:
                why += "; it is revoked: --unrevoke lets it connect again"
            return {"worker": name, "was": False, "reason": why}, 0
        held, hidden, gone = released
        refused_before = self.ingester.over_share.get(name, 0)
        steps = sum(add(buf) for buf in held)
        refused = self.ingester.over_share.get(name, 0) - refused_before
        rows = sum(len(buf) for buf in held)
        why = (f"quarantine of worker {name!r} lifted: {len(held)} packet(s) ({rows} rows) it "
               f"sent while quarantined went into the replay memory"
               + (f" ({refused} refused over its share of it)" if refused else "")
               + (f"; {hidden} of its rows already there are sampled again" if hidden is not None
                  else "; its rows already there stay as they were (this memory cannot tell "
                       "them apart)")
               + (f"; {gone} rows it sent while quarantined are gone: dropped beyond the hold "
                  f"of {plausibility.hold_rows} rows" if gone else "; none of its rows is gone"))
        log.warning("%s (asked by the operator)", why)
        return {"worker": name, "was": True, "reason": why, "packets": len(held), "rows": rows,
                "hidden": hidden or 0, "gone": gone}, steps
