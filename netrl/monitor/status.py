"""Seeing what a running system does: rates, the server's status snapshot,
and ``python -m netrl --status``.

The server answers STATUS requests on ``server.status_port``, bound to 127.0.0.1 only: run
``--status`` on the server machine (or tunnel the port). The snapshot lists connected workers
(address, key, weight version, samples, last seen, and the counters they report), the trainer's
progress, sample rates in and out, the spool, and the rejected and dropped counts.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from typing import Any

import zmq

from netrl.errors import NetrlError, TransportError
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import decode, encode
from netrl.util import count_of, version_label

__all__ = ["Rates", "StatusClock", "dump_json", "format_status", "query_status"]

log = logging.getLogger(__name__)


class StatusClock:
    """When a role's periodic status line is due, and its counters' per-second
    rates since the previous line.

    Started with ``counters``, the first line is due ``interval_s`` later; without, the
    first :meth:`rates` call only starts the clock (for counters that may not start at zero,
    such as a resumed trainer's)."""

    def __init__(self, interval_s: float, counters: dict[str, float] | None = None) -> None:
        self.interval = interval_s
        self._at = time.monotonic() if counters is not None else None
        self._counters = dict(counters or {})

    def due(self) -> bool:
        return bool(self.interval) and (self._at is None or time.monotonic() - self._at >= self.interval)

    def rates(self, counters: dict[str, float]) -> dict[str, float] | None:
        """Per-second rates of ``counters`` since the previous call (None for the call
        that starts the clock)."""
        now = time.monotonic()
        at, before = self._at, self._counters
        self._at, self._counters = now, dict(counters)
        if at is None:
            return None
        span = max(now - at, 1e-9)
        return {k: (v - before.get(k, 0.0)) / span for k, v in counters.items()}


class Rates:
    """Per-second rates of growing counters, over a sliding window."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._history: collections.deque[tuple[float, dict[str, float]]] = collections.deque()

    def record(self, counters: dict[str, float], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._history.append((now, dict(counters)))
        while len(self._history) > 2 and now - self._history[1][0] >= self.window_s:
            self._history.popleft()

    def rates(self) -> dict[str, float]:
        if len(self._history) < 2:
            return {}
        (t0, first), (t1, last) = self._history[0], self._history[-1]
        span = max(t1 - t0, 1e-9)
        return {k: (last[k] - first.get(k, 0.0)) / span for k in last}


def query_status(port: int, timeout_s: float = 3.0, host: str = "127.0.0.1",
                 stop: threading.Event | None = None) -> dict[str, Any]:
    """Ask the server on this machine for its snapshot. Raises TransportError if it does not answer,
    and NetrlError if ``stop`` is set while it waits (Ctrl+C)."""
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 64 << 20)
        sock.connect(f"tcp://{host}:{port}")
        sock.send_multipart(encode(Message(MsgType.STATUS, "status")))
        deadline = time.monotonic() + timeout_s
        while not sock.poll(50):
            if stop is not None and stop.is_set():
                raise NetrlError("interrupted while waiting for the server's status")
            if time.monotonic() >= deadline:
                raise TransportError(f"no netrl server answered on {host}:{port} within "
                                     f"{timeout_s:.0f} s: is it running on this machine? "
                                     f"(--status talks to the loopback-only `server.status_port`)")
        reply = decode(sock.recv_multipart())
        snapshot = dict(reply.body.get("snapshot", {}))
        if "error" in snapshot:
            raise NetrlError(f"the server on {host}:{port} could not report its "
                             f"status ({str(snapshot['error'])[:300]}); its "
                             f"log has the details: please report it as a bug")
        return snapshot
    finally:
        ctx.destroy(0)


def _server_drops(s: dict[str, Any]) -> str:
    """The samples the server dropped, when there are any (spooled packets over a
    lowered message limit)."""
    dropped = s.get("stats", {}).get("samples_dropped", 0)
    return f", by the server (spooled under a larger network.max_message_bytes) {dropped:,}" if dropped else ""


def _held(held: dict[str, Any]) -> str:
    """The packets the trainer refused for their layout, kept for a trainer of theirs, by layout."""
    layouts = held.get("layouts") or {}
    if not layouts:
        return ""
    each = ", ".join(f"{tag}: {h['samples']:,} samples from {', '.join(h['workers'][:5]) or '-'}"
                     for tag, h in list(layouts.items())[:5])
    return (f"; held for another sample layout {held.get('samples', 0):,} samples in "
            f"{held.get('packets', 0)} packets ({each}{', ...' if len(layouts) > 5 else ''})")


def _ago(t: float | None, now: float) -> str:
    return "-" if not t else f"{now - t:.1f}s ago"


def _per_port(counts: dict[str, int]) -> str:
    return ", ".join(f"{n:,} on the {role} port" for role, n in counts.items())


def format_status(s: dict[str, Any]) -> str:
    """The snapshot as a few readable lines and a table of workers."""
    now = time.time()
    rates = s.get("rates", {})
    spool = s.get("spool", {})
    trainer = s.get("trainer")
    progress = s.get("progress") or {}
    unknown_keys = _per_port(s.get("unknown_keys", {})) or "none checked (security none)"
    failed = _per_port(s.get("failed_handshakes", {})) or "-"
    ports = s.get("ports") or {}
    where = f" (trainer port {ports.get('trainer')}, worker port {ports.get('worker')})" if ports else ""
    lines = [
        f"server session {s.get('session', '?')[:8]}{where}, up {s.get('uptime_s', 0):.0f} s, "
        f"weights {version_label(s.get('weights_version'))}",
        f"samples in {rates.get('samples_in', 0):,.0f}/s, out "
        f"{rates.get('samples_out', 0):,.0f}/s; queued {s.get('queued_samples', 0):,} "
        f"({s.get('queued_bytes', 0) / 2**20:.1f} MiB), in flight {s.get('inflight_samples', 0):,}",
        f"spool {spool.get('samples', 0):,} samples in {spool.get('packets', 0)} packets "
        f"({spool.get('bytes', 0) / 2**20:.1f} of {spool.get('max_bytes', 0) / 2**20:.0f} MiB)"
        f"{_held(s.get('held') or {})}",
        f"rejected messages {s.get('rejected', 0):,}; samples dropped by workers (backlog "
        f"full) {s.get('dropped', 0):,}{_server_drops(s)}; samples refused by the spool "
        f"(full, or past the worker's share) {s.get('refused', 0):,}; packets refused beyond "
        f"their worker's window {s.get('stats', {}).get('window_refusals', 0):,}, beyond "
        f"its PACE allowance {s.get('stats', {}).get('pace_refusals', 0):,}, beyond its "
        f"share of the spool {s.get('stats', {}).get('spool_share_refusals', 0):,} (workers "
        f"keep and resend them, so one can be refused more than once); packets larger "
        f"than their worker declared {s.get('stats', {}).get('oversized_packets', 0):,}",
        f"connections refused for unknown keys: {unknown_keys}; other failed handshakes: "
        f"{failed}; messages before HELLO {s.get('stats', {}).get('unknown_peer', 0):,}",
        (f"trainer {trainer['name']!r} at {trainer['address']}, "
         f"{progress.get('trained_steps', 0):,} training steps, {progress.get('samples', 0):,} "
         f"samples, last seen {_ago(trainer.get('last_seen'), now)}"
         if trainer else "trainer: not connected"),
        f"{count_of(len(s.get('workers', [])) + s.get('workers_omitted', 0), 'worker')}:",
    ]
    # sync collection: the batch under way, and each worker's waits for weights
    if "batch_version" in progress:
        waits = [f"{w['name']} {w['reported']['worker_wait_s']:.1f} s" for w in s.get("workers", [])
                 if "worker_wait_s" in w.get("reported", {})]
        lines.insert(-1, f"sync batch {version_label(progress['batch_version'])}: "
                         f"{progress['batch_steps']:,} env steps so far; "
                         f"workers' waits for weights: {', '.join(waits) or '-'}")
    if s.get("workers_omitted"):
        lines.append(f"  ({s['workers_omitted']:,} not listed: the "
                     f"snapshot of so many would exceed a message header)")
    workers = sorted(s.get("workers", []), key=lambda w: w["name"])
    # as wide as the longest name and key (names are at most 64 characters): a cut
    # name loses its -2 or -3 suffix
    name_w = max([20, *(len(w["name"]) for w in workers)])
    key_w = max([10, *(len(w.get("key", "")) for w in workers)])
    # a worker with several envs (worker.num_envs): its samples are the sum over its envs
    envs = any(w.get("envs", 1) > 1 for w in workers)
    lines.append(f"  {'worker':<{name_w}} {'address':<16} {'key':<{key_w}} "
                 f"{'weights':>7} {'envs ' if envs else ''}{'samples':>10} "
                 f"{'backlog':>8} {'dropped':>8} {'last seen':>10}")
    for w in workers:
        reported = w.get("reported", {})
        env_cell = f"{w.get('envs', 1):>4} " if envs else ""
        lines.append(f"  {w['name']:<{name_w}} {w['address'][:16]:<16} "
                     f"{w.get('key', ''):<{key_w}} {version_label(w['version']):>7} "
                     f"{env_cell}{w['samples']:>10,} {reported.get('backlog_packets', 0):>8} "
                     f"{reported.get('dropped_samples', 0):>8} {_ago(w.get('last_seen'), now):>10}")
    lines += _weight_lines(s.get("models") or {}, workers, name_w)
    lines += _trust_lines(s, now)
    return "\n".join(lines)


def _trust_lines(s: dict[str, Any], now: float) -> list[str]:
    """The revocations in force, the workers the trainer quarantined, and each worker's rows in
    the replay memory against its share, with what was refused over it and held back for PACE."""
    lines = []
    revoked = s.get("revoked") or []
    stats = s.get("stats", {})
    lines.append(f"revoked worker keys: {len(revoked)}" + ("" if revoked else " (none)")
                 + (f", {stats['unrevocations']} revocations lifted" if stats.get("unrevocations")
                    else ""))
    for r in revoked:
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r.get("at", 0)))
        lines.append(f"  {r['worker']} since {at} ({_ago(r.get('at'), now)}), by the "
                     f"{r.get('by', '?')}: {r.get('reason') or 'no reason given'}")
    held = s.get("quarantined") or {}
    reported = s.get("reported_at")
    lines.append(f"quarantined by the trainer: {len(held)}"
                 + ("" if reported else " (no report from a trainer yet)"))
    for name, q in sorted(held.items()):
        lines.append(f"  {name}: {q.get('rows', 0):,} rows kept aside; {q.get('reason') or '-'}")
    replay = s.get("replay") or {}
    if not replay:
        return lines
    over_pace = {w["name"]: w.get("over_pace", 0) for w in s.get("workers", [])}
    name_w = max([20, *(len(n) for n in replay)])
    lines.append(f"replay memory per worker (the trainer's report, {_ago(reported, now)}):")
    lines.append(f"  {'worker':<{name_w}} {'rows':>10} {'share':>10} {'refused over share':>22} "
                 f"{'held for PACE':>13}")
    for name, r in sorted(replay.items(), key=lambda kv: -kv[1]["rows"]):
        refused = f"{r['refused_packets']:,} ({r['refused_rows']:,} rows)"
        lines.append(f"  {name:<{name_w}} {r['rows']:>10,} {r['cap']:>10,} {refused:>22} "
                     f"{over_pace.get(name, '-'):>13}")
    return lines


def _weight_lines(models: dict[str, Any], workers: list[dict[str, Any]], name_w: int) -> list[str]:
    """Several models or formats (issue 34): each model's cached encodings, and each
    worker's models and link rate."""
    plain = set(models) <= {"policy"} and all(set(m["formats"]) <= {"float32"} for m in models.values())
    if plain:
        return []  # the weights column says it all
    cached = []
    for name, m in models.items():
        formats = [f"{f} {e['bytes']:,} B" + (f", {len(e['deltas'])} deltas "
                                              f"{sum(e['deltas'].values()):,} B"
                                               if e["deltas"] else "") for f, e in m["formats"].items()]
        cached.append(f"{name} {version_label(m['version'])} ({'; '.join(formats)})")
    lines = [f"weights cached: {', '.join(cached)}"]
    for w in workers:
        held = ", ".join(f"{name} {version_label(m['version'])} {m['format'] or '-'}"
                         + (f" (in flight: "
                            f"{', '.join(m['in_flight'])})" if m.get("in_flight") else "")
                         for name, m in sorted(w.get("models", {}).items()))
        rate = w.get("link_rate")
        link = f"; link {rate / 2**20:.2f} MiB/s" if rate else "; link rate not measured yet"
        lines.append(f"  {w['name']:<{name_w}} {held or '-'}{link}")
    return lines


def dump_json(snapshot: dict[str, Any]) -> str:
    return json.dumps(snapshot, indent=1, sort_keys=True)
