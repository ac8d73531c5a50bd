"""The server's heartbeat scan over every peer runs a few times per heartbeat interval, not on
every pass of its loop: with a thousand workers a scan per message made the relay's cost per
message grow with the number of peers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from netrl.config.sections import NetworkConfig
from netrl.protocol.messages import Message, MsgType
from netrl.server.membership import SCAN_FRACTION
from tests.fakes import Peer, running_server

NET = NetworkConfig(heartbeat_interval_s=0.5, heartbeat_liveness=6)


def test_the_peers_are_scanned_a_few_times_per_interval_however_many_messages_come(
        tmp_path: Path) -> None:
    with running_server(network=NET, spool_dir=tmp_path / "spool") as (srv, ctx):
        workers = [Peer(ctx, srv.worker_port, "worker", f"w{i}") for i in range(20)]
        for w in workers:
            assert w.hello().type is MsgType.WELCOME
        counts = {"passes": 0, "scans": 0}
        heartbeats, values = srv.members.heartbeats, srv.peers.values

        def counted_heartbeats(now: float) -> None:
            counts["passes"] += 1
            heartbeats(now)

        def counted_values() -> Any:
            counts["scans"] += 1
            return values()

        # the loop calls them through its own bound lambdas: patched on the instances
        srv.members.heartbeats = counted_heartbeats  # type: ignore[method-assign]
        srv.peers.values = counted_values  # type: ignore[method-assign]
        t0 = time.monotonic()
        for i in range(600):  # a busy server: a pass of the loop per few messages
            workers[i % len(workers)].send(Message(MsgType.HEARTBEAT, f"w{i % len(workers)}",
                                                   body={}))
            if i % 20 == 0:
                time.sleep(0.002)
        time.sleep(0.3)
        elapsed = time.monotonic() - t0
        passes, scans = counts["passes"], counts["scans"]
        assert passes > 3 * scans, (passes, scans)
        assert scans <= elapsed / (SCAN_FRACTION * NET.heartbeat_interval_s) + 3, (scans, elapsed)
        # and the peers are still heartbeated: each heard from the server within the interval
        for w in workers:
            assert w.expect(MsgType.HEARTBEAT, timeout=2 * NET.heartbeat_interval_s)
        assert srv.stats["peers_lost"] == 0
