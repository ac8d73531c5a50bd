"""An emulated wide-area link: a userspace TCP forwarder that delays, loses (as TCP experiences
loss) and limits bandwidth, for machines whose kernel has no netem and for users without root.

Each direction of each connection is cut into segments of ``MSS`` bytes as the forwarder reads
them, and each segment is delivered at

    max(the segment before it,  when the link finishes sending it + RTT/2  [+ RTO if it is lost])

* **bandwidth**: a token bucket of ``bandwidth_mbit``, shared by the segments of one direction;
* **delay**: half the round trip each way;
* **loss**: TCP cannot lose bytes; a segment lost with probability ``loss`` arrives after an extra
  retransmission timeout, ``RTO = max(200 ms, 2 * RTT)``, and everything behind it waits for it
  (head-of-line blocking), as a receiver's TCP holds in-order data behind a hole. Losses close
  together overlap, as TCP retransmits them within the same timeout; the model does not shrink a
  congestion window, so on a real lossy path throughput is lower (roughly
  ``MSS / RTT * 1.22 / sqrt(loss)`` for one TCP stream: 0.32 Mbit/s at 200 ms and 5%);
* **buffer**: at most ``buffer_bytes`` wait in the forwarder per direction (a socket buffer on the
  path); beyond it the forwarder stops reading, so the sender's own buffers fill as they would
  over a slow link.

:class:`WanLink` runs the forwarder in a thread of its own (an asyncio loop); ``with WanLink(...)
as link:`` listens on ``link.port`` and forwards to ``target``. The wan and weights families use it,
and so does tests/net/test_lossy_link.py.
"""

from __future__ import annotations

import asyncio
import collections
import random
import socket
import threading
import time
from dataclasses import dataclass, field

__all__ = ["WanLink", "WanStats"]

MSS = 1448


@dataclass
class WanStats:
    connections: int = 0
    segments: int = 0
    lost: int = 0
    bytes: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})


class WanLink:
    def __init__(self, target_port: int, rtt_ms: float = 200.0, loss: float = 0.05,
                 bandwidth_mbit: float = 10.0, buffer_bytes: int = 4 << 20,
                 target_host: str = "127.0.0.1", seed: int = 1,
                 loss_from_s: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.one_way = rtt_ms / 2000.0
        self.rto = max(0.2, 2 * rtt_ms / 1000.0)
        self.loss = loss
        # segments are lost only this long after the link opened (a link turning bad)
        self.loss_from_s = loss_from_s
        self._opened_at = 0.0
        self.bytes_per_s = bandwidth_mbit * 1e6 / 8
        self.buffer_bytes = buffer_bytes
        self.stats = WanStats()
        self._rng = random.Random(seed)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="wan-link", daemon=True)
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    def __enter__(self) -> WanLink:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cpu_s(self) -> float:
        """CPU seconds the forwarder's thread has used so far (to show it was not the
        bottleneck)."""
        ident = self._thread.ident
        return 0.0 if ident is None else time.clock_gettime(time.pthread_getcpuclockid(ident))

    def close(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._accept, sock=self._listener)
        self._opened_at = asyncio.get_running_loop().time()
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
        pipes = asyncio.all_tasks() - {asyncio.current_task()}
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        # the TCP handshake over the emulated path (SYN, SYN-ACK, ACK)
        await asyncio.sleep(2 * self.one_way)
        try:
            await asyncio.gather(self._pipe(client_r, server_w, "up"),
                                 self._pipe(server_r, client_w, "down"),
                                 return_exceptions=True)
        except asyncio.CancelledError:  # the link closes, so do its connections (a clean end)
            client_w.close()
            server_w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    direction: str) -> None:
        loop = asyncio.get_running_loop()
        queue: collections.deque[tuple[float, bytes]] = collections.deque()
        state = {"queued": 0, "free_at": 0.0, "last": 0.0, "eof": False}
        wake, room = asyncio.Event(), asyncio.Event()

        async def read() -> None:
            while True:
                while state["queued"] >= self.buffer_bytes:
                    room.clear()
                    await room.wait()
                data = await reader.read(64 * 1024)
                if not data:
                    break
                now = loop.time()
                for i in range(0, len(data), MSS):
                    seg = data[i:i + MSS]
                    start = max(now, state["free_at"])
                    state["free_at"] = start + len(seg) / self.bytes_per_s
                    at = state["free_at"] + self.one_way
                    self.stats.segments += 1
                    if now - self._opened_at >= self.loss_from_s and self._rng.random() < self.loss:
                        self.stats.lost += 1
                        at += self.rto
                    # in order: nothing overtakes a lost segment
                    at = state["last"] = max(at, state["last"])
                    queue.append((at, seg))
                    state["queued"] += len(seg)
                wake.set()
            state["eof"] = True
            wake.set()

        async def write() -> None:
            while True:
                if not queue:
                    if state["eof"]:
                        break
                    wake.clear()
                    await wake.wait()
                    continue
                delay = queue[0][0] - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                now, out = loop.time(), []
                while queue and queue[0][0] <= now:
                    out.append(queue.popleft()[1])
                data = b"".join(out)
                state["queued"] -= len(data)
                self.stats.bytes[direction] += len(data)
                room.set()
                writer.write(data)
                await writer.drain()
            writer.close()

        try:
            await asyncio.gather(read(), write())
        except (ConnectionError, OSError):
            writer.close()
