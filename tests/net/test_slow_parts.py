"""A float32 version in parts small enough for a slow lossy link: a 1M-parameter actor's 4 MB
version in 1 MiB parts never arrived behind reno at 1% loss (each part took longer than the
worker's liveness window: 10 reconnects in 10 s). Over the emulated path of the WAN benchmark
(benchmarks/packet_link.py), which drops real IP packets: it needs root and /dev/net/tun, and is
skipped elsewhere, saying why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.packet_link import unavailable
from benchmarks.weights import Settings, run_netrl
from netrl.net.keys import keygen

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"the emulated path {unavailable()}")


def test_a_1m_parameter_float32_actor_behind_reno_at_1_percent_loss_keeps_its_connection(
        tmp_path: Path) -> None:
    # the weights family's path: 10 Mbit/s, 50 ms each way, 1% loss; a version every 0.5 s
    s = Settings(formats=("float32",), seconds=12.0, congestion="reno", raw=False)
    keygen(tmp_path / "keys")
    out = run_netrl("float32", s, tmp_path)
    assert out["tcp_connections"] == 1, out  # the worker never reconnected
    assert out["published"] >= 10, out
