"""The worker's sample packets: env-step rows gathered into packets, then numbered and
encoded for the network thread.

The control path adds one row per env step, plus one per reset, with :meth:`PacketMaker.add`. A
packet is due once it holds ``min_samples_per_worker_packet`` rows, when its columns are full,
or, if ``max_packet_delay_s`` is set, that long after its first row. :meth:`PacketMaker.cut` takes
it, with the episodes finished since the previous packet, and :meth:`PacketMaker.to_frames` numbers
and encodes it. A packet the server could never relay (over ``network.max_message_bytes``, less the
bundle header's room, uncompressed: a message's arrays may not inflate past that limit either) stops
the worker at its first row with a :class:`~netrl.errors.ConfigError` that says what to change.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from netrl.errors import ConfigError
from netrl.net.thread import Command, command_head
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import (
    BUNDLE_HEADER_ROOM,
    Codec,
    encode,
    frames_nbytes,
    max_packet_bytes,
    sample_row_bytes,
    samples_message,
)
from netrl.samples.columns import Buffer, BufferBuilder, EpisodeStats, ExtraSpec
from netrl.samples.info import InfoKey, info_spec, info_values

__all__ = ["PacketMaker"]

class PacketMaker:
    """Rows in, numbered sample packets out, for one worker session (it owns the row
    columns and the packet count).

    Args:
        worker_id, session: the worker's name and session, which every packet carries.
        min_samples, overlap, max_delay_s, compression: the worker's packet settings (see
            :class:`~netrl.worker.worker.RolloutWorker`).
        max_message_bytes: ``network.max_message_bytes``, which bounds a packet.
        sample_compressor: applied to each row before it is stored (None: rows
            are stored as they are).
        envs: the worker's envs, whose segments share each packet (see :mod:`netrl.worker.sink`):
            the size check counts them all.
        info_keys: the env info entries each row records, from the env's info as it came
            (before the sample compressor; :mod:`netrl.samples.info`).
    """

    def __init__(self, worker_id: str, session: str, min_samples: int, overlap: int, max_delay_s: float | None,
                 compression: Codec, max_message_bytes: int, sample_compressor: Callable[..., Any] | None,
                 envs: int = 1, info_keys: tuple[InfoKey, ...] = ()) -> None:
        self.worker_id, self.session = worker_id, session
        self.min_samples, self.overlap = min_samples, overlap
        # None: wait for min_samples rows
        self.max_delay = math.inf if max_delay_s is None else max_delay_s
        self.compression: Codec = compression
        self.max_message_bytes = max_message_bytes
        self.sample_compressor = sample_compressor
        self.envs = envs
        self.seq = 0  # packets numbered so far
        self.pending_episodes: list[EpisodeStats] = []  # finished since the previous packet:
                                                        # they go with the next
        self._builder = BufferBuilder(min_samples + overlap + 2, overlap)
        self.info_keys = info_keys
        self._builder.info = info_spec(info_keys)
        # adds the models' versions
        self.stamp: Callable[[dict[str, Any] | None], dict[str, Any]] | None = None
        self._first_unsent = 0.0
        self._size_checked = False  # the packet size was checked against the server's limit
        self._row_bytes = 0  # the most one row takes, from the spaces (0: not known, see follow)

    def widen(self, overlap: int) -> None:
        """Carry ``overlap`` context rows per packet (the actor's views read that far back), if
        more than now: before the first row."""
        if overlap <= self.overlap:
            return
        assert len(self._builder) == 0, "widen() after rows were recorded"
        info = self._builder.info
        self.overlap = overlap
        self._builder = BufferBuilder(self.min_samples + overlap + 2, overlap)
        self._builder.info = info

    def bounds(self) -> dict[str, int]:
        """The largest packet this worker makes, as its HELLO declares it: the rows of one block of
        columns (a packet is cut before they overflow, context rows included) and, once the
        spaces are known, their bytes inflated. The server and the trainer refuse a packet beyond
        them before inflating it."""
        rows = self._builder.capacity
        return {"max_rows": rows, "max_bytes": rows * self._row_bytes} if self._row_bytes else {"max_rows": rows}

    def follow(self, schema: SampleSchema) -> None:
        """Store leaves in the dtypes ``schema`` (the env's spaces, after the sample compressor)
        gives them, which the trainer expects: an env whose float32 space returns float64
        observations still sends float32."""
        self._builder.dtypes = {name: np.dtype(dtype) for name, (dtype, _shape) in schema.leaves.items()}
        self._row_bytes = sample_row_bytes(schema.leaves)

    def declare_extras(self, spec: ExtraSpec) -> None:
        """The actor's extra outputs, which every row carries (zeros where it has none):
        before the first row."""
        self._builder.extra = dict(spec)

    def add(self, act: Any, obs: Any, rew: float, terminated: bool, truncated: bool, info: dict[str, Any],
            reset: bool, version: int, networked: bool, extra: dict[str, Any] | None = None) -> None:
        """Store one row (``version``: the weights that chose its action; ``extra``: the actor's
        extra outputs with it, None for zeros). The first row of a ``networked`` worker shows a
        sample's size, which is checked against what the server relays. The sample compressor
        never sees the extras."""
        # the env's info as it came: a compressor may rebuild or drop it
        values = (info_values(self.info_keys, info, "reset" if reset else "step")
                  if self.info_keys else None)
        if self.sample_compressor is not None:
            act, obs, rew, terminated, truncated, info = self.sample_compressor(act, obs, rew, terminated,
                                                                                truncated, info)
        if len(self._builder) == 0:
            self._first_unsent = time.monotonic()
        if self.stamp is not None:
            extra = self.stamp(extra)
        self._builder.add(act, obs, rew, terminated, truncated, reset, version, extra, values)
        if not self._size_checked:
            self._size_checked = True
            if networked:
                self._check_packet_size()

    def __len__(self) -> int:
        """Rows not sent yet."""
        return len(self._builder)

    @property
    def unsent_transitions(self) -> int:
        return self._builder.transitions

    def due(self) -> bool:
        """Whether the rows gathered so far should leave now."""
        return (len(self._builder) >= self.min_samples or self._builder.full
                or time.monotonic() - self._first_unsent > self.max_delay)

    def cut(self) -> Buffer | None:
        """The rows gathered so far as a packet carrying the episodes finished since
        the previous one, or None."""
        if not self._builder.transitions and not self.pending_episodes:
            # only an episode's first observation: it travels with the transition that follows it
            return None
        buf = self._builder.cut()
        if buf is None:
            return None
        buf.episodes, self.pending_episodes = self.pending_episodes, []
        return buf

    def to_frames(self, buf: Buffer, produced: int) -> list[Any]:
        """Number ``buf`` and encode it for the network thread: a PACKET command (its head carries
        the seq and the transitions), then the message."""
        self.seq += 1
        msg = samples_message(buf, self.worker_id, self.session, self.seq, produced)
        frames = encode(msg, self.compression)
        nbytes = frames_nbytes(frames)
        # the server would refuse it, and every packet like it: stop and say what to change
        if nbytes > max_packet_bytes(self.max_message_bytes):
            raise ConfigError([self._too_big(len(buf), nbytes)])
        return [command_head(Command.PACKET, self.seq, int(np.count_nonzero(buf.transition_end))), *frames]

    def _check_packet_size(self) -> None:
        """Once the first row shows a sample's size: say now, not when the first packet closes, that
        packets of ``min_samples_per_worker_packet`` rows cannot reach the trainer. Compression does
        not help: a receiver refuses a message whose arrays inflate past its limit (a small message
        must not claim gigabytes)."""
        rows = (self.min_samples + self.overlap) * self.envs
        nbytes = rows * self._builder.row_nbytes
        if nbytes > max_packet_bytes(self.max_message_bytes):
            raise ConfigError([self._too_big(rows, nbytes, " uncompressed" if self.compression != "none" else "")])

    def _too_big(self, rows: int, nbytes: int, how: str = "") -> str:
        """Why packets of ``rows`` samples taking ``nbytes`` cannot be sent (the server
        would refuse every one)."""
        return (f"worker {self.worker_id}: a packet of {rows} samples takes {nbytes} "
                f"bytes{how}, more than the server relays (network.max_message_bytes = "
                f"{self.max_message_bytes}, less {BUNDLE_HEADER_ROOM} for the bundle "
                f"header): lower worker.min_samples_per_worker_packet ({self.min_samples})"
                f"{f' or worker.num_envs ({self.envs})' if self.envs > 1 else ''} or "
                f"raise network.max_message_bytes on every machine")
