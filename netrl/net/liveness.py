"""When a peer counts as lost, and how long to wait before connecting again.

Both follow the ZeroMQ Guide's Paranoid Pirate pattern: whoever has sent nothing for a heartbeat
interval sends HEARTBEAT, *any* message counts as one, and a peer silent for
``heartbeat_interval_s * heartbeat_liveness`` is lost (or for longer on a link whose measured round
trip needs it). The client's :class:`~netrl.net.transport.ClientLink` and the server's peer table
each keep a :class:`Liveness` per connection; a client reconnects after a :class:`Backoff` delay.
No sockets here: only clocks.
"""

from __future__ import annotations

import random
import time

__all__ = ["Backoff", "Liveness"]


class Liveness:
    """Paranoid Pirate liveness: a peer is lost when nothing arrived from it for :attr:`window`
    seconds.

    The window is ``interval * liveness``, or longer on a link whose round trip needs it: heartbeats
    carry the sender's clock (``t``), and the peer echoes the newest one it got with the time it
    held it (``echo``, ``held``), so each side measures the round trip on its own clock and keeps a
    smoothed one and its variation, as TCP does for its retransmission timeout. Over a long lossy
    link TCP holds everything behind a lost segment for a retransmission timeout or more, so the
    window grows to ``interval + RTT_FACTOR * (srtt + 4 * rttvar)`` when that is longer (at most
    ``MAX_STRETCH`` times the configured window); on a LAN it stays as configured.
    """

    RTT_FACTOR = 6.0
    MAX_STRETCH = 10.0
    # round trips from a client's TCP connection to the server's WELCOME: CURVE's handshake, then
    # HELLO and WELCOME
    HANDSHAKE_ROUND_TRIPS = 6.0

    def __init__(self, interval: float, liveness: int) -> None:
        self.liveness = liveness
        self.interval = interval
        self.window = interval * liveness
        self.last_heard = time.monotonic()
        self.last_sent = time.monotonic()
        # smoothed round trip, seconds (None until a heartbeat came back)
        self.srtt: float | None = None
        self.rttvar = 0.0
        # the peer's newest heartbeat clock, and when it came
        self._peer_t: tuple[float, float] | None = None

    def set_interval(self, interval: float) -> None:
        self.interval = interval
        self._update_window()

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    def sent(self) -> None:
        self.last_sent = time.monotonic()

    def expired(self, now: float) -> bool:
        return now - self.last_heard > self.window

    def heartbeat_due(self, now: float) -> bool:
        return now - self.last_sent >= self.interval

    def stamp(self) -> dict[str, float]:
        """The round-trip fields of a heartbeat about to be sent."""
        now = time.monotonic()
        body = {"t": now}
        if self._peer_t is not None:
            body["echo"], body["held"] = self._peer_t[0], now - self._peer_t[1]
        return body

    def handshake(self, seconds: float) -> None:
        """A client's first round-trip estimate, until a heartbeat measures one: its TCP connection
        took ``seconds`` to bring WELCOME (:data:`HANDSHAKE_ROUND_TRIPS`), as TCP takes its first
        from the SYN. Over a long lossy link the first message after WELCOME (a weight version)
        can take that long, with the server's heartbeats behind it in the same TCP stream; the
        configured window alone expired there and dropped a healthy connection."""
        if self.srtt is None and seconds > 0:
            rtt = seconds / self.HANDSHAKE_ROUND_TRIPS
            self.srtt, self.rttvar = rtt, rtt / 2
            self._update_window()

    def on_heartbeat(self, body: dict[str, object]) -> None:
        """Take a received heartbeat's round-trip fields (a peer without them, or with nonsense,
        changes nothing)."""
        now = time.monotonic()
        t, echo, held = body.get("t"), body.get("echo"), body.get("held")
        if isinstance(t, float):
            self._peer_t = (t, now)
        if not (isinstance(echo, float) and isinstance(held, (float, int))):
            return
        rtt = now - echo - held
        if not 0.0 <= rtt <= self.MAX_STRETCH * self.liveness * self.interval:
            return  # not our clock's: ignored
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:  # RFC 6298's gains
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self._update_window()

    def _update_window(self) -> None:
        base = self.interval * self.liveness
        if self.srtt is None:
            self.window = base
            return
        needed = self.interval + self.RTT_FACTOR * (self.srtt + 4 * self.rttvar)
        self.window = max(base, min(needed, self.MAX_STRETCH * base))


class Backoff:
    """Exponential reconnect delays with jitter: initial, 2x, 4x ... up to ``maximum``."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self.delay = initial
        # its own: never moves the user's global random state (or a seeded run's)
        self._rng = random.Random()

    def next(self) -> float:
        delay = self.delay * self._rng.uniform(0.8, 1.2)
        self.delay = min(self.delay * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self.delay = self.initial

    # ZeroMQ retries a refused TCP connection on its own, every RECONNECT_IVL (100 ms by default,
    # the same for every socket): after a server restart a thousand workers' CURVE handshakes
    # came within 100 ms of its bind. Each socket gets an interval of its own in
    # [initial, STAGGER * initial], so their retries fall at different phases.
    STAGGER = 4.0

    def socket_interval(self) -> float:
        """The seconds between a new socket's own connection retries (ZeroMQ's RECONNECT_IVL)."""
        return self.initial * self._rng.uniform(1.0, self.STAGGER)
