"""Workers joining shrink every worker's share of the server's memory; a worker is told its new
window once it shrank by more than 1/WINDOW_SLACK, not at every join: with one ACK per worker per
join, N workers joining cost N^2 messages (a million for a thousand workers reconnecting)."""

from __future__ import annotations

from pathlib import Path

from netrl.config.sections import NetworkConfig
from netrl.protocol.messages import MsgType
from netrl.server.intake import WINDOW_SLACK
from tests.fakes import Peer, running_server

NET = NetworkConfig(heartbeat_interval_s=2.0, heartbeat_liveness=10)  # the fake peers stay silent


def test_a_growing_fleet_tells_each_worker_its_window_a_few_times_not_at_every_join(
        tmp_path: Path) -> None:
    with running_server(network=NET, spool_dir=tmp_path / "spool") as (srv, ctx):
        first = Peer(ctx, srv.worker_port, "worker", "first")
        welcome = first.hello()
        fleet = [Peer(ctx, srv.worker_port, "worker", f"w{i}") for i in range(79)]
        for peer in fleet[:39]:
            assert peer.hello().type is MsgType.WELCOME
        while first.recv(0.3) is not None:  # the windows told while 40 workers joined
            pass
        told: list[int] = []
        for peer in fleet[39:]:  # the fleet doubles, one join at a time
            assert peer.hello().type is MsgType.WELCOME
        while (msg := first.recv(0.5)) is not None:
            if msg.type is MsgType.ACK and msg.body["seqs"] == []:
                told.append(msg.body["window"])
        share = welcome.body["window"] // 80  # its share among 80 workers
        # halving its share takes log(2) / log(1 + 1/8) = 5.9 steps of 1/8 (before: an ACK per
        # pass of the loop with a join, 17 in a run here)
        assert 1 <= len(told) <= 7, told
        assert told == sorted(told, reverse=True)
        assert told[-1] <= share * (WINDOW_SLACK + 1) // WINDOW_SLACK
