"""Transport helpers: reconnect back-off, liveness, and bind errors that name the setting to change."""

from __future__ import annotations

import time

import pytest
import zmq

from netrl.errors import TransportError
from netrl.transport import Backoff, Liveness, bind, new_socket


def test_backoff_doubles_with_jitter_up_to_the_maximum_and_resets() -> None:
    b = Backoff(0.25, 2.0)
    delays = [b.next() for _ in range(6)]
    for got, nominal in zip(delays, [0.25, 0.5, 1.0, 2.0, 2.0, 2.0], strict=True):
        assert 0.8 * nominal <= got <= 1.2 * nominal
    b.reset()
    assert b.next() <= 0.3


def test_liveness_expires_after_the_window_and_any_message_renews_it() -> None:
    live = Liveness(interval=0.05, liveness=3)
    assert not live.expired(time.monotonic())
    assert live.expired(time.monotonic() + 0.2)
    time.sleep(0.1)
    live.heard()
    assert not live.expired(time.monotonic()) and live.heartbeat_due(time.monotonic())
    live.sent()
    assert not live.heartbeat_due(time.monotonic())


def test_bind_failure_names_the_config_key() -> None:
    ctx = zmq.Context()
    try:
        first = new_socket(ctx, zmq.ROUTER, 1 << 20)
        port = first.bind_to_random_port("tcp://127.0.0.1")
        second = new_socket(ctx, zmq.ROUTER, 1 << 20)
        with pytest.raises(TransportError, match=r"could not bind .* is another netrl server running\? change "
                                                 r"`network.worker_port`"):
            bind(second, "127.0.0.1", port, "network.worker_port")
    finally:
        ctx.destroy(0)
