"""The WAN benchmark's emulated path (benchmarks/packet_link.py) drops, delays and rate-limits real IP
packets: a UDP probe loses the configured share and arrives one way later, and a TCP stream over it
retransmits (its kernel saw the losses), measures the round trip, is held to the rate, and slows
down on the losses (its congestion window shrinks: what the benchmark's TCP-level emulator,
benchmarks/wan_link.py, does not model).

It needs root and /dev/net/tun (it creates network namespaces); elsewhere it is skipped, saying why.
"""

from __future__ import annotations

import socket
import statistics
import struct
import subprocess
import threading
import time

import pytest

from benchmarks.packet_link import FAR_IP, NEAR_IP, PacketPath, unavailable

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"the emulated path {unavailable()}")


def _tcp_info(sock: socket.socket) -> tuple[int, float]:
    """(total retransmissions, smoothed round trip in s) from the kernel's struct tcp_info."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    rtt_us = struct.unpack_from("I", raw, 68)[0]  # tcpi_rtt
    total_retrans = struct.unpack_from("I", raw, 100)[0]  # tcpi_total_retrans
    return total_retrans, rtt_us / 1e6


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_a_udp_probe_loses_the_configured_share_and_arrives_a_one_way_delay_later() -> None:
    n, loss, one_way = 1000, 0.2, 0.03
    with PacketPath(one_way * 1000, loss, 10.0, seed=5) as path:
        names = list(path.ns.values())
        assert all(name in _namespaces() for name in names)
        rx, tx = path.socket("near", socket.SOCK_DGRAM), path.socket("far", socket.SOCK_DGRAM)
        with rx, tx:
            rx.bind((NEAR_IP, 0))
            rx.settimeout(2.0)  # the last datagram came long ago: all are in
            delays: list[float] = []

            def receive() -> None:  # as they come: a socket's buffer would overflow meanwhile
                try:
                    while True:
                        data = rx.recv(200)
                        delays.append(time.monotonic() - struct.unpack_from("d", data)[0])
                except TimeoutError:
                    pass

            reader = threading.Thread(target=receive)
            reader.start()
            for i in range(n):  # 100 datagrams a second of 136 bytes on the wire: no queueing
                tx.sendto(struct.pack("d", time.monotonic()) + bytes(100), rx.getsockname())
                if i % 10 == 9:
                    time.sleep(0.01)
            reader.join(30)
        stats = path.stats.up
    got = len(delays)
    # 1000 draws at 20%: 200 lost, sd 12.6; 5 sd either way
    assert 137 <= n - got <= 263, f"{n - got} of {n} lost at a configured {loss:.0%}: {stats}"
    assert stats.lost == n - got and stats.queue_drops == 0 and stats.delivered == got
    assert min(delays) >= one_way, f"a datagram arrived in {min(delays):.4f} s, under the one-way delay"
    assert statistics.median(delays) < one_way + 0.05, f"median {statistics.median(delays):.3f} s"
    assert not any(name in _namespaces() for name in names), "close() left a namespace behind"


def test_a_tcp_stream_over_it_retransmits_sees_the_round_trip_and_keeps_to_the_rate() -> None:
    one_way, mbit = 0.02, 4.0
    # 0.8 s at 4 Mbit/s; a queue of 1 s (500 kB) holds it all, so only the path's losses drop any
    size = 400_000

    def stream(loss: float) -> tuple[int, float, float]:
        with PacketPath(one_way * 1000, loss, mbit, queue_ms=1000, congestion="reno",
                        seed=7) as path:
            listener, client = path.socket("near"), path.socket("far")
            with listener, client:
                listener.bind((NEAR_IP, 0))
                listener.listen(1)
                got = bytearray()

                def receive() -> None:
                    conn, _ = listener.accept()
                    with conn:
                        while len(got) < size and (data := conn.recv(65536)):
                            got.extend(data)

                reader = threading.Thread(target=receive)
                reader.start()
                client.connect(listener.getsockname())
                assert client.getsockname()[0] == FAR_IP
                start = time.monotonic()
                client.sendall(bytes(size))
                reader.join(30)
                took = time.monotonic() - start
                retrans, rtt = _tcp_info(client)
            assert len(got) == size
            assert path.stats.up.queue_drops == path.stats.down.queue_drops == 0
            return retrans, rtt, took

    clean_retrans, clean_rtt, clean_took = stream(0.0)
    assert clean_retrans == 0
    assert clean_took >= size * 8 / (mbit * 1e6) * 0.95, f"{size} bytes in {clean_took:.2f} s: faster than the rate"
    assert clean_rtt >= 2 * one_way, f"TCP measured a round trip of {clean_rtt:.3f} s"
    lossy_retrans, lossy_rtt, lossy_took = stream(0.05)
    assert lossy_retrans >= 5, f"TCP retransmitted {lossy_retrans} segments over a path losing 5%"
    assert lossy_rtt >= 2 * one_way
    # reno halves its window at each loss (the machine's default, bbr for one, may not slow down)
    assert lossy_took > 1.5 * clean_took, f"{lossy_took:.2f} s with 5% loss, {clean_took:.2f} s without"
