"""The server's counters: every one declared here, once, with what it counts.

One :class:`ServerCounters` belongs to a server; its parts (admission, intake, relay, outbound,
status) are handed that object and increment its attributes in place (``stats.rejected += 1``). A
name not declared here is an AttributeError at the increment (its ``__slots__`` hold nothing
else), and mypy's error before that, so a typo can never start a counter of its own.
``python -m netrl --status`` shows them all, at 0 until they count.
"""

from __future__ import annotations

import dataclasses

__all__ = ["COUNTERS", "ServerCounters"]


@dataclasses.dataclass(slots=True)
class ServerCounters:
    """The counters of one server session, in the order ``--status --json`` lists them."""

    bundles_out: int = 0  # bundles sent to the trainer (one sent again after the trainer
                          # reconnected counts again)
    failed_handshakes_trainer: int = 0  # connections to the trainer port that failed their
                                        # ZeroMQ handshake
    failed_handshakes_worker: int = 0  # connections to the worker port that failed their
                                       # ZeroMQ handshake
    internal_errors: int = 0  # exceptions in the server's own code that its loop caught
                              # and logged (bugs)
    layout_refusals: int = 0  # packets refused for another sample layout than the trainer's
                              # (their workers keep them)
    lifts: int = 0  # --lift requests relayed to the trainer (its answers go to the operator)
    oversized_packets: int = 0  # packets refused before inflating: more rows or bytes than
                                # their worker declared
    pace_refusals: int = 0  # packets held back (NACK) beyond their worker's PACE allowance
                            # while the trainer paces
    peers_lost: int = 0  # peers forgotten without a BYE: silent past their liveness, or
                         # found gone by a send
    refused_full: int = 0  # worker HELLOs refused because server.max_workers workers were connected
    rejected: int = 0  # messages rejected: malformed, from the wrong role, failing a check,
                       # bad status requests
    replies_withheld: int = 0  # refusals left unanswered: their connection was answered within the
                               # heartbeat interval, or no answer fits in the bytes it sent
    revocations: int = 0  # worker keys or names revoked (--revoke, or the trainer's refuse)
    revoked_links: int = 0  # worker connections dropped because their key or name was revoked
    revoked_refused: int = 0  # worker HELLOs refused because their key or name was revoked
    resends_ignored: int = 0  # packets a worker sent again while the relay still held them
    samples_dropped: int = 0  # samples in spooled packets larger than the trainer takes,
                              # dropped from the spool
    samples_held: int = 0  # samples the trainer refused for their sample layout, kept in the
                           # spool's held folder for a trainer of theirs
    samples_held_lost: int = 0  # samples the trainer refused for their layout that the held folder
                                # could not keep (full, or the disk refusing): lost, and logged
    samples_in: int = 0  # samples accepted from workers (held in memory or spooled)
    samples_out: int = 0  # samples delivered: the trainer acknowledged their bundle and did not
                          # refuse them (once each, however often they were sent)
    samples_refused: int = 0  # samples refused because memory and spool were full or failing
                              # (workers resend them)
    samples_released: int = 0  # held samples moved back to the spool for a trainer of their layout
    samples_spooled: int = 0  # samples written to the spool
    samples_trainer_rejected: int = 0  # samples the trainer refused for good (its checks: its log
                                       # says why), not delivered
    send_full: int = 0  # sends refused because a peer's queue was full
    share_notices: int = 0  # NOTICEs telling a worker the trainer refused its packets over its
                            # share of the replay memory (at most one a trainer report)
    spool_errors: int = 0  # spool reads and writes that the disk refused
    spool_share_refusals: int = 0  # packets refused for the spool beyond their worker's share of it
    unknown_peer: int = 0  # messages from a connection that had not said HELLO (e.g.
                           # after a server restart)
    unpaced_denied: int = 0  # worker HELLOs asking for paced false whose key
                             # server.unpaced_workers does not name (they are paced)
    unrevocations: int = 0  # revocations lifted (--unrevoke)
    weights_in: int = 0  # complete weight versions received from the trainer
    weights_out: int = 0  # complete weight versions sent to a worker
    window_refusals: int = 0  # packets refused beyond their worker's window

    def handshake_failed(self, role: str) -> int:
        """Count a connection to ``role``'s port ("trainer" or "worker") that failed its
        handshake; the count so far."""
        if role == "trainer":
            self.failed_handshakes_trainer += 1
            return self.failed_handshakes_trainer
        self.failed_handshakes_worker += 1
        return self.failed_handshakes_worker

    def __getitem__(self, name: str) -> int:
        """A counter by its name (the snapshot, tests); KeyError for a name not declared."""
        if name not in _NAMES:
            raise KeyError(f"{name!r} is not a server counter "
                           f"(netrl.server.counters declares them)")
        value: int = getattr(self, name)
        return value

    def as_dict(self) -> dict[str, int]:
        """Every counter by name, in declaration order: what ``--status`` shows under "stats"."""
        return {name: getattr(self, name) for name in COUNTERS}


COUNTERS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ServerCounters))
_NAMES = frozenset(COUNTERS)
