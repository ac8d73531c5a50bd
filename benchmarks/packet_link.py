"""An emulated wide-area path that real TCP runs over: two network namespaces joined by TUN
devices, and a userspace forwarder between them that drops, delays and rate-limits IP packets.

::

    namespace "near" (the server)          this process            namespace "far" (the worker)
    198.18.0.1 on tun ──IP packets──> forwarder: drop, queue at ──> tun, 198.18.0.2
                       <────────────  the rate, delay one way  <──

Each IP packet the kernel routes into one TUN device is read by the forwarder and written into
the other one after

    its turn at the rate (``bandwidth_mbit`` each way; a drop-tail queue of ``queue_ms`` at that
    rate: beyond it a packet is dropped, as a router's buffer does) + ``one_way_ms``,

unless it is lost, each packet independently with probability ``loss`` (each way). Nothing is
retransmitted by the path: the kernel's TCP in each namespace sees the losses and the delay and
reacts as it does on a real path (retransmissions, a congestion window that shrinks after a
loss). Each namespace has its own TCP congestion control (``congestion``; by default the one it
inherits, this machine's default; a namespace may choose only those the machine allows, see
net.ipv4.tcp_allowed_congestion_control) and its own loopback, so the roles' ports there are free
whatever else runs on the machine. 198.18.0.0/15 is the range
RFC 2544 sets aside for such benchmarks; each namespace has its own routing table, so these
addresses clash with nothing outside.

Needs root (or CAP_NET_ADMIN) and /dev/net/tun. ``with PacketPath(...) as path:`` creates the
namespaces and devices and ``close()`` (also on Ctrl+C or an error) removes them: the TUN devices
vanish with this process's file descriptors (even when it is killed), and namespaces that a killed
run left behind are removed by the next run. ``path.command(side, argv)`` runs a program in a
namespace, ``path.socket(side, ...)`` opens a socket in one (for tests).
"""

from __future__ import annotations

import collections
import ctypes
import fcntl
import os
import random
import re
import select
import shutil
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["FAR_IP", "NEAR_IP", "PacketPath", "PathStats", "Side", "unavailable"]

Side = Literal["near", "far"]
NEAR_IP, FAR_IP = "198.18.0.1", "198.18.0.2"
_TUNSETIFF, _IFF_TUN, _IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
_CLONE_NEWNET = 0x40000000
_PREFIX = "netrl-path-"  # namespaces are netrl-path-<pid>-<n>-<side>
_STALE = re.compile(rf"^{_PREFIX}(\d+)-\d+-(near|far)\b")
_count = iter(range(1_000_000))


def unavailable() -> str | None:
    """Why this process cannot build a path (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (it creates network namespaces and TUN devices)"
    if not os.path.exists("/dev/net/tun"):
        return "needs /dev/net/tun (the tun kernel module)"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    return None


@dataclass
class Direction:
    """One way of the path: its queue and what became of its packets."""

    name: str
    packets: int = 0  # read from the sending side
    delivered: int = 0
    lost: int = 0  # dropped at random (the path's loss)
    queue_drops: int = 0  # dropped because the queue was full
    bytes_delivered: int = 0
    connections: int = 0  # TCP connections opened this way (SYNs from distinct source ports)
    free_at: float = 0.0  # when the rate limit has sent everything queued so far
    queue: collections.deque[tuple[float, bytes]] = field(default_factory=collections.deque)
    _syn_ports: set[int] = field(default_factory=set)

    def count_syn(self, packet: bytes) -> None:
        """Count a new TCP connection: a SYN without ACK from a source port not seen before."""
        if len(packet) >= 40 and packet[9] == 6:  # IPv4, TCP
            tcp = (packet[0] & 0x0F) * 4
            if len(packet) >= tcp + 14 and packet[tcp + 13] & 0x12 == 0x02:
                port = int.from_bytes(packet[tcp:tcp + 2], "big")
                if port not in self._syn_ports:
                    self._syn_ports.add(port)
                    self.connections += 1


@dataclass
class PathStats:
    down: Direction = field(default_factory=lambda: Direction("down"))  # near -> far
    up: Direction = field(default_factory=lambda: Direction("up"))  # far -> near


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        raise OSError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")


def _tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


def _sysctl(key: str) -> str:
    with open("/proc/sys/" + key.replace(".", "/")) as f:
        return f.read().strip()


def _congestion(ns: str) -> str:
    """The TCP congestion control new connections get in the namespace ``ns``."""
    done = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n",
                           "net.ipv4.tcp_congestion_control"],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def remove_stale() -> list[str]:
    """Remove the namespaces of runs whose process is gone (killed before it could clean up)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    removed = []
    for line in listed.stdout.splitlines():
        m = _STALE.match(line)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            name = line.split()[0]
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
            removed.append(name)
    return removed


class PacketPath:
    """Two namespaces and the lossy, slow path between them (see the module's docstring)."""

    def __init__(self, one_way_ms: float, loss: float, bandwidth_mbit: float,
                 queue_ms: float = 100.0, congestion: str | None = None, seed: int = 1) -> None:
        if not 0 <= loss < 1:
            raise ValueError(f"loss must be in [0, 1) (got {loss:g})")
        if one_way_ms < 0 or bandwidth_mbit <= 0 or queue_ms <= 0:
            raise ValueError("one_way_ms must be >= 0, bandwidth_mbit and queue_ms > 0 (got "
                             f"{one_way_ms:g}, {bandwidth_mbit:g}, {queue_ms:g})")
        self.one_way = one_way_ms / 1000.0
        self.loss = loss
        self.bytes_per_s = bandwidth_mbit * 1e6 / 8
        self.queue_bytes = max(1500.0, self.bytes_per_s * queue_ms / 1000.0)
        self.congestion = congestion
        self.stats = PathStats()
        self._rng = random.Random(seed)
        n = next(_count)
        self.ns: dict[Side, str] = {s: f"{_PREFIX}{os.getpid()}-{n}-{s}" for s in ("near", "far")}
        self._dev: dict[Side, str] = {s: f"nw{os.getpid()}{n}{s[0]}" for s in ("near", "far")}
        self._fd: dict[Side, int] = {}
        self._made: list[str] = []
        self._stop = threading.Event()
        self._wake_r, self._wake_w = -1, -1
        self._thread = threading.Thread(target=self._forward, name="packet-path", daemon=True)

    def __enter__(self) -> PacketPath:
        why = unavailable()
        if why is not None:
            raise OSError(f"the emulated path {why}")
        remove_stale()
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> None:
        ips: dict[Side, tuple[str, str]] = {"near": (NEAR_IP, FAR_IP), "far": (FAR_IP, NEAR_IP)}
        for side in ("near", "far"):
            self._fd[side] = _tun(self._dev[side])
            _run("ip", "netns", "add", self.ns[side])
            self._made.append(self.ns[side])
            ns, dev = self.ns[side], self._dev[side]
            _run("ip", "link", "set", dev, "netns", ns)
            # IPv4 only: no IPv6 neighbour discovery among the packets counted
            _run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            _run("ip", "-n", ns, "addr", "add", ips[side][0], "peer", ips[side][1], "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            if self.congestion is not None:
                self._set_congestion(ns, self.congestion)
        self.congestion = _congestion(self.ns["near"])
        self._wake_r, self._wake_w = os.pipe()
        self._thread.start()

    @staticmethod
    def _set_congestion(ns: str, name: str) -> None:
        key = "net.ipv4.tcp_congestion_control"
        done = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}={name}"],
                              capture_output=True, text=True, check=False)
        if done.returncode:
            allowed = _sysctl("net.ipv4.tcp_allowed_congestion_control")
            raise OSError(f"the emulated path could not use TCP congestion control {name!r} "
                          f"({done.stderr.strip()}): a namespace may choose only those this "
                          f"machine allows ({allowed}; net.ipv4.tcp_allowed_congestion_control) "
                          "among those it has (net.ipv4.tcp_available_congestion_control: "
                          f"{_sysctl('net.ipv4.tcp_available_congestion_control')})")

    def close(self) -> None:
        """Stop forwarding and remove the devices and namespaces; idempotent."""
        self._stop.set()
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(5)
        for fd in [*self._fd.values(), self._wake_r, self._wake_w]:
            if fd >= 0:
                os.close(fd)
        self._fd.clear()
        self._wake_r = self._wake_w = -1
        while self._made:
            subprocess.run(["ip", "netns", "del", self._made.pop()], capture_output=True,
                           check=False)

    def ip(self, side: Side) -> str:
        return NEAR_IP if side == "near" else FAR_IP

    def command(self, side: Side, argv: list[str]) -> list[str]:
        """``argv`` run in the namespace of ``side`` (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns[side], *argv]

    def socket(self, side: Side, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """An IPv4 socket in the namespace of ``side`` (a socket stays in the namespace it was
        made in; a thread enters it, so this process stays where it is)."""
        made: list[socket.socket | BaseException] = []

        def inside() -> None:
            try:
                fd = os.open(f"/run/netns/{self.ns[side]}", os.O_RDONLY)
                try:
                    if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns failed")
                finally:
                    os.close(fd)
                made.append(socket.socket(socket.AF_INET, kind))
            except BaseException as exc:  # handed to the caller's thread
                made.append(exc)

        t = threading.Thread(target=inside, name="enter-netns")  # dies in the namespace
        t.start()
        t.join()
        if isinstance(made[0], BaseException):
            raise made[0]
        return made[0]

    def tcp_counters(self, side: Side) -> dict[str, int]:
        """The TCP counters of the namespace of ``side`` (/proc/net/snmp: OutSegs, RetransSegs...):
        what its kernel sent, and how much of it again."""
        done = subprocess.run(self.command(side, ["cat", "/proc/net/snmp"]), capture_output=True,
                              text=True, check=True)
        names, values = [line.split()[1:] for line in done.stdout.splitlines()
                         if line.startswith("Tcp:")]
        return {k: int(v) for k, v in zip(names, values, strict=True)}

    def _forward(self) -> None:
        ways = ((self._fd["near"], self.stats.down, self._fd["far"]),
                (self._fd["far"], self.stats.up, self._fd["near"]))
        inputs = [self._fd["near"], self._fd["far"], self._wake_r]
        while not self._stop.is_set():
            now = time.monotonic()
            due = None
            for _, d, to in ways:
                while d.queue and d.queue[0][0] <= now:
                    packet = d.queue.popleft()[1]
                    try:
                        os.write(to, packet)
                    except OSError:  # the namespace's stack refused it: a loss
                        d.lost += 1
                        continue
                    d.delivered += 1
                    d.bytes_delivered += len(packet)
                if d.queue:
                    due = d.queue[0][0] if due is None else min(due, d.queue[0][0])
            timeout = 0.05 if due is None else max(0.0, due - now)
            readable, _, _ = select.select(inputs, [], [], timeout)
            for fd in readable:
                if fd == self._wake_r:
                    continue
                self._take(fd, self.stats.down if fd == self._fd["near"] else self.stats.up)

    def _take(self, fd: int, d: Direction) -> None:
        """Every packet waiting on ``fd``: dropped, or queued for its time of arrival."""
        while True:
            try:
                packet = os.read(fd, 65536)
            except BlockingIOError:
                return
            now = time.monotonic()
            d.packets += 1
            d.count_syn(packet)
            if self._rng.random() < self.loss:
                d.lost += 1
                continue
            start = max(now, d.free_at)
            if (start - now) * self.bytes_per_s + len(packet) > self.queue_bytes:
                d.queue_drops += 1
                continue
            d.free_at = start + len(packet) / self.bytes_per_s
            d.queue.append((d.free_at + self.one_way, packet))
