"""Workers waiting for a server that is down reconnect at different moments once it is back, not
all within ZeroMQ's default retry interval of 100 ms: a CURVE handshake storm after a restart."""

from __future__ import annotations

import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from netrl.config.sections import NetworkConfig
from netrl.launch import free_port
from netrl.net.liveness import Backoff
from netrl.net.transport import ClientLink, new_session

NET = NetworkConfig(heartbeat_interval_s=1.0, heartbeat_liveness=6, reconnect_initial_s=0.25)


def test_each_socket_retries_at_an_interval_of_its_own() -> None:
    backoff = Backoff(0.25, 8.0)
    intervals = [backoff.socket_interval() for _ in range(200)]
    assert all(0.25 <= i <= 0.25 * Backoff.STAGGER for i in intervals)
    assert max(intervals) - min(intervals) > 0.5


def test_links_waiting_for_a_server_arrive_spread_out_when_it_binds() -> None:
    port = free_port()
    ctx = zmq.Context()
    net = NetworkConfig(**{**NET.__dict__, "worker_port": port})
    links = [ClientLink(ctx, net, "worker", f"w{i}", new_session(), port) for i in range(40)]
    try:
        for link in links:
            link.open()  # nothing listens yet: ZeroMQ retries on its own
        time.sleep(1.2)
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        monitor = router.get_monitor_socket(zmq.EVENT_ACCEPTED)
        router.bind(f"tcp://127.0.0.1:{port}")
        bound = time.monotonic()
        accepted: list[float] = []
        while time.monotonic() - bound < 2.0 and len(accepted) < len(links):
            if monitor.poll(50):
                recv_monitor_message(monitor)
                accepted.append(time.monotonic() - bound)
        assert len(accepted) == len(links)
        # ZeroMQ's own 100 ms for every socket brought them all within about 0.1 s
        assert max(accepted) - min(accepted) > 0.3, accepted
        router.disable_monitor()
        monitor.close()
        router.close()
    finally:
        for link in links:
            link.close()
        ctx.destroy(0)
