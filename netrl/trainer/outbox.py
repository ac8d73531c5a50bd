"""The trainer's network thread's newest version of each model, handed to the
socket as the link allows.

A version starts only once ZeroMQ has written every part of the same model's version before: on a
link slower than the trainer publishes, a newer version replaces the one waiting, unsent, instead of
versions queueing without limit, in memory and in age. Each model has its own outbox, so a big
policy waiting for a slow link never holds back a small model. A version's parts are those of
each of its encodings (netrl.trainer.encoding), each from its part 0.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import zmq

from netrl.protocol.models import POLICY
from netrl.util import worth_logging

__all__ = ["Outbox", "Outboxes"]

log = logging.getLogger("netrl.trainer.link")  # the link's own lines, under its logger as before


@dataclasses.dataclass
class Outbox:
    """One model's newest version: every part (for a reconnect), those not yet given to the socket,
    and the sends of the version given to it last."""

    parts: list[list[Any]] = dataclasses.field(default_factory=list)
    version: int = -1
    unsent: list[list[Any]] = dataclasses.field(default_factory=list)
    writing: list[zmq.MessageTracker] = dataclasses.field(default_factory=list)
    writing_version: int = -1


class Outboxes(dict[str, Outbox]):
    """Model name -> its :class:`Outbox` ("policy" always there)."""

    def __init__(self, stats: collections.Counter[str]) -> None:
        super().__init__({POLICY: Outbox()})
        self.stats = stats  # the link's: weights_superseded

    def take(self, model: str, version: int, payload: list[Any], ready: bool) -> None:
        """One part of ``model``'s version ``version`` (a newer version replaces
        the one waiting)."""
        box = self.setdefault(model, Outbox())
        if version != box.version:  # a new version: its encodings replace the last's
            if box.unsent and box.version != box.writing_version:
                self._superseded(model, version, box.version, ready)
            box.parts, box.unsent, box.version = [], [], version
        box.parts.append(payload)
        box.unsent.append(payload)

    def restart(self, outnumbered: Callable[[int, str], bool]) -> None:
        """A new connection: every newest version goes again (unless its number is
        taken), from its first part."""
        for model, box in self.items():
            box.unsent = [] if outnumbered(box.version, model) else list(box.parts)
            # (a new socket: the old one dropped what it held)
            box.writing, box.writing_version = [], -1

    def send(self, send_tracked: Callable[[list[Any]], zmq.MessageTracker | None]) -> None:
        """Give the socket each model's newest version's unsent parts, as far as
        the rule above allows."""
        for box in self.values():
            if not box.unsent:
                continue
            if box.version != box.writing_version:
                if not all(t.done for t in box.writing):
                    continue  # the next tick looks again
                box.writing, box.writing_version = [], box.version
            while box.unsent:
                tracker = send_tracked(box.unsent[0])
                if tracker is None:
                    return  # the socket's queue is full: the next tick goes on
                box.writing.append(tracker)
                del box.unsent[0]

    def _superseded(self, model: str, version: int, waiting: int, ready: bool) -> None:
        self.stats["weights_superseded"] += 1
        what = "weights" if model == POLICY else f"model {model!r}"
        if not ready:  # waiting for a reconnect, which sends the newest version
            log.debug("%s v%d replace v%d, which waited for the server", what, version, waiting)
        elif worth_logging(self.stats["weights_superseded"]):
            log.info("%s v%d replace v%d, which waited for the link to the server to "
                     "take the version before it: the link is slower than the trainer "
                     "publishes (%d versions skipped so far; trainer.update_model_interval "
                     "sets how often it publishes)", what, version, waiting,
                     self.stats["weights_superseded"])
