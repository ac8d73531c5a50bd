"""A long lossy link keeps its one connection: the liveness window follows the measured round trip.

The worker's link goes through the benchmarks' emulated link (benchmarks/wan_link.py), a TCP
forwarder in this process: TCP cannot lose bytes, so a lost segment arrives a retransmission timeout
late and holds back what follows, as it does on a real path. A link whose window ignores the round
trip takes each such stall for a dead peer and reconnects; and one that counts the handshake against
the window (four round trips without CURVE, seven with it) never gets connected where those take
longer than the window.
"""

from __future__ import annotations

import time

from benchmarks.wan_link import WanLink
from netrl.config.sections import NetworkConfig
from netrl.net.transport import ClientLink
from tests.fakes import MakeServer, wait_until

# heartbeats every 0.1 s and a 0.5 s window: a retransmission timeout on a 400 ms round trip (0.8 s) outlasts it
NET = NetworkConfig(heartbeat_interval_s=0.1, heartbeat_liveness=5, reconnect_initial_s=0.1, reconnect_max_s=0.5)
RTT_MS, LOSS, LOSSY_S = 400.0, 0.1, 6.0


def test_a_worker_over_a_long_lossy_link_keeps_its_one_connection(make_server: MakeServer) -> None:
    srv, ctx = make_server(network=NET)
    # lossless for its first 2 s (the round trip is measured meanwhile), then 10% of segments lost
    with WanLink(srv.worker_port, RTT_MS, LOSS, 10.0, seed=3, loss_from_s=2.0) as wan:
        link = ClientLink(ctx, NET, "worker", "far", "session1", wan.port)
        link.open()
        try:
            end = time.monotonic() + 2.0 + LOSSY_S
            while time.monotonic() < end:
                if link.sock is not None and link.sock.poll(10):
                    link.receive()
                link.maintain()
            assert wan.stats.connections == 1, f"the worker connected {wan.stats.connections} times: {wan.stats}"
            assert wan.stats.lost >= 5, f"the link lost too few segments to test anything: {wan.stats}"
            assert srv.stats["peers_lost"] == 0
            assert link.ready
            assert link.liveness.window > NET.heartbeat_interval_s * NET.heartbeat_liveness  # it followed the RTT
        finally:
            link.close()
    wait_until(lambda: not srv.peers.workers(), 5, "the worker's goodbye")


def test_on_a_lan_the_window_stays_as_configured(make_server: MakeServer) -> None:
    srv, ctx = make_server(network=NET)
    link = ClientLink(ctx, NET, "worker", "near", "session2", srv.worker_port)
    link.open()
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            if link.sock is not None and link.sock.poll(10):
                link.receive()
            link.maintain()
        assert link.liveness.srtt is not None and link.liveness.srtt < 0.05  # measured: heartbeats were echoed
        assert link.liveness.window == NET.heartbeat_interval_s * NET.heartbeat_liveness
        peer = next(iter(srv.peers.values()))
        assert peer.liveness.srtt is not None and peer.liveness.window == link.liveness.window
    finally:
        link.close()


def test_the_window_follows_the_handshake_before_any_round_trip_is_measured(make_server: MakeServer) -> None:
    # The first message after WELCOME may be a weight version that a loss-based TCP takes seconds to
    # deliver, the server's heartbeats behind it: before a heartbeat measured the round trip, the
    # configured window (0.5 s here) expired at 100 ms each way and 5% loss, and a healthy
    # connection was dropped. The handshake's time now gives the first estimate.
    srv, ctx = make_server(network=NET)
    with WanLink(srv.worker_port, RTT_MS, 0.0, 10.0, seed=3) as wan:
        link = ClientLink(ctx, NET, "worker", "far", "session3", wan.port)
        at_welcome: list[tuple[float | None, float]] = []  # (srtt, window) as WELCOME is taken
        link.on_ready = lambda: at_welcome.append((link.liveness.srtt, link.liveness.window))
        link.open()
        try:
            deadline = time.monotonic() + 10
            while not link.ready and time.monotonic() < deadline:
                if link.sock is not None and link.sock.poll(10):
                    link.receive()
                link.maintain()
            assert link.ready and at_welcome
            srtt, window = at_welcome[0]
            # a CURVE-less handshake and HELLO/WELCOME: a few round trips of 0.4 s
            assert srtt is not None and RTT_MS / 1000 / 2 <= srtt <= 3 * RTT_MS / 1000, srtt
            assert window > NET.heartbeat_interval_s * NET.heartbeat_liveness
        finally:
            link.close()
