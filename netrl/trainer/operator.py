"""The trainer link's share of what an operator does and sees: revocations and their undoing heard
from the server, ``--lift`` requests, the revocations and lift answers to send, and the report of
each worker's standing that rides on the next PROGRESS.

The network thread hands messages in (:meth:`OperatorBox.on_message`) and sends what
:attr:`OperatorBox.outgoing` holds; the training thread takes the requests and answers them
(:mod:`netrl.training.standing`)::

    server --REVOKE (undo)--> on_message --> revocations() / unrevocations() --> training loop
    server --LIFT (ask)-----> on_message --> lift_requests() --> answer_lift(body) --> outgoing
    training loop --report(workers, quarantined)--> the next PROGRESS's body (take_report)
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

from netrl.protocol.messages import Message, MsgType, printable

__all__ = ["OperatorBox"]

log = logging.getLogger(__name__)


class OperatorBox:
    """Queues between the trainer's network thread and its training thread (module docstring).
    ``wake()`` wakes the network thread to send :attr:`outgoing`; ``new_data()`` the loop."""

    def __init__(self, name: str, wake: Callable[[], None], new_data: Callable[[], None]) -> None:
        self.name, self.wake, self.new_data = name, wake, new_data
        self.revoked: collections.deque[str] = collections.deque()
        self.unrevoked: collections.deque[str] = collections.deque()
        self.lifts: collections.deque[dict[str, Any]] = collections.deque()
        self.outgoing: collections.deque[Message] = collections.deque()
        self._report: dict[str, Any] | None = None

    # -- network thread ----------------------------------------------------------------------------
    def on_message(self, msg: Message) -> bool:
        """Take a REVOKE or LIFT from the server; False for any other message."""
        if msg.type is MsgType.REVOKE and not msg.body.get("refused"):
            name, undo = msg.body["worker"], msg.body.get("undo", False)
            if undo and msg.body.get("was", True) is False:
                return True  # the answer to an unrevoke of a key that was not revoked
            log.warning("the server %s worker %s%s", "lifted the revocation of" if undo
                        else "revoked", name, "" if undo else
                        f": {printable(msg.body.get('reason', ''), 300)}")
            (self.unrevoked if undo else self.revoked).append(name)
        elif msg.type is MsgType.LIFT and "ask" in msg.body:
            self.lifts.append(dict(msg.body))
        elif msg.type is MsgType.REVOKE:  # one of this trainer's revocations, refused
            log.warning("the server refused a revocation: %s",
                        printable(msg.body.get("reason", ""), 300))
            return True
        else:
            return False
        self.new_data()
        return True

    # -- training thread ---------------------------------------------------------------------------
    def revocations(self) -> list[str]:
        """The workers the server revoked since the last call (drop their rows)."""
        return [self.revoked.popleft() for _ in range(len(self.revoked))]

    def unrevocations(self) -> list[str]:
        """The workers whose revocation the server lifted since the last call."""
        return [self.unrevoked.popleft() for _ in range(len(self.unrevoked))]

    def lift_requests(self) -> list[dict[str, Any]]:
        """The ``--lift`` requests since the last call: LIFT bodies (``worker``, ``ask``)."""
        return [self.lifts.popleft() for _ in range(len(self.lifts))]

    def answer_lift(self, body: dict[str, Any]) -> None:
        """Send the answer to a lift (``body`` keeps the request's ``ask``)."""
        self.outgoing.append(Message(MsgType.LIFT, self.name, body=body))
        self.wake()

    def revoke(self, worker: str, reason: str) -> None:
        """Ask the server to revoke ``worker`` (trainer.implausible: refuse)."""
        body = {"worker": worker, "reason": reason}
        self.outgoing.append(Message(MsgType.REVOKE, self.name, body=body))
        self.wake()

    def report(self, workers: dict[str, list[int]], quarantined: dict[str, list[Any]]) -> None:
        """Each worker's standing (see :mod:`netrl.training.standing`), for the next PROGRESS."""
        self._report = {"workers": workers, "quarantined": quarantined}

    def take_report(self) -> dict[str, Any]:
        """The report to add to a PROGRESS body, once ({} when none is new)."""
        report, self._report = self._report, None
        return report or {}
