"""Where a worker's rows go: into packets (:mod:`netrl.worker.packets`), cut when due and handed to
the network thread, or to a list in single-process mode; and, as the worker closes, the account of
what became of them.

A worker with several envs keeps a packet maker per env (its own columns, context rows and copy of
the sample compressor: frame stacks and action buffers never mix envs); a packet then holds every
env's rows as env-major segments with the ``env`` column
(:func:`~netrl.samples.columns.concat_segments`). The one-env maker numbers and encodes every
packet.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

from netrl.errors import NetrlError
from netrl.protocol.codecs import Codec
from netrl.protocol.schema import SampleSchema, probe_copy
from netrl.samples.columns import Buffer, EpisodeStats, ExtraSpec, concat_segments
from netrl.samples.info import InfoKey, info_spec
from netrl.worker.link import WorkerLink
from netrl.worker.packets import PacketMaker

__all__ = ["PacketSink"]

log = logging.getLogger("netrl.worker.worker")  # the worker's own lines, under its logger


class PacketSink:
    """A worker session's rows in, packets out (see the module docstring).

    Args:
        worker_id, session: the worker's name and session, which every packet carries.
        min_samples, overlap, max_delay_s, compression, max_message_bytes: see
            :class:`~netrl.worker.packets.PacketMaker`.
        sample_compressor: applied to each row before it is stored (each env has its own copy).
        num_envs: the worker's envs.
        info_keys: the env info entries every row records (:mod:`netrl.samples.info`).
    """

    def __init__(self, worker_id: str, session: str, min_samples: int, overlap: int,
                 max_delay_s: float | None, compression: Codec, max_message_bytes: int,
                 sample_compressor: Callable[..., Any] | None, num_envs: int,
                 info_keys: tuple[InfoKey, ...] = ()) -> None:
        self.worker_id, self.session = worker_id, session
        self.sample_compressor = sample_compressor
        self.info_keys = info_keys
        self.packets = PacketMaker(worker_id, session, min_samples, overlap, max_delay_s,
                                   compression, max_message_bytes, sample_compressor,
                                   info_keys=info_keys)
        # several envs: their rows go to per-env makers; self.packets only numbers and encodes
        self.env_makers = [PacketMaker(worker_id, session, min_samples, overlap, max_delay_s,
                                       compression, max_message_bytes,
                                       _own_copy(sample_compressor, i), num_envs, info_keys)
                           for i in range(num_envs)] if num_envs > 1 else None
        self.makers = self.env_makers or [self.packets]  # the makers rows go to
        self.produced = 0  # env steps recorded for training
        self.link: WorkerLink | None = None  # the network thread packets go to (connect)
        # set by the single-process mode instead of a network
        self.local: list[Buffer] | None = None
        # at close: samples the server neither spooled nor delivered (at risk)
        self.samples_unacknowledged = 0

    @property
    def seq(self) -> int:
        """Sample packets handed to the network thread so far (the newest one's number)."""
        return self.packets.seq

    def count(self) -> int:
        return self.produced

    def follow(self, observation_space: Any, action_space: Any, extras: ExtraSpec,
               stamp: Callable[[dict[str, Any] | None], dict[str, Any]] | None) -> None:
        """Send leaves in the dtypes the trainer expects from the spaces, and ``extras`` in every
        row (``stamp``: adds the models' versions). The compressor is probed on a copy: one such as
        ActionBufferCompressor keeps state, and a random probe row would make the first real one a
        seam."""
        for maker in self.makers:
            maker.declare_extras(extras)
            maker.stamp = stamp
        compressor = probe_copy(self.sample_compressor)
        # it cannot be copied: the env's dtypes
        if compressor is None and self.sample_compressor is not None:
            return
        schema = SampleSchema.from_spaces(observation_space, action_space, compressor, extra=extras,
                                          info=info_spec(self.info_keys))
        self.packets.follow(schema)
        for maker in self.env_makers or ():
            maker.follow(schema)

    def widen(self, overlap: int) -> None:
        """At least ``overlap`` context rows in every packet: before the first row."""
        for maker in {id(m): m for m in (self.packets, *self.makers)}.values():
            maker.widen(overlap)

    def bounds(self) -> dict[str, int]:
        """HELLO's packet bounds: one env's, times the envs (a packet holds a segment of each)."""
        if self.env_makers is None:
            return self.packets.bounds()
        n = len(self.env_makers)
        return {**{k: v * n for k, v in self.env_makers[0].bounds().items()}, "num_envs": n}

    # -- the control path
    # -------------------------------------------------------------------------------------
    def record(self, act: Any, obs: Any, rew: float, terminated: bool, truncated: bool,
               info: dict[str, Any], reset: bool, version: int,
               extra: dict[str, Any] | None = None) -> None:
        """One env's row (a reset row starts an episode; ``version``: the weights that chose
        ``act``); the packet leaves once it is due."""
        self.packets.add(act, obs, rew, terminated, truncated, info, reset, version,
                         networked=self.local is None and self.link is not None, extra=extra)
        if not reset:
            self.produced += 1
        if self.packets.due():
            self.send()

    def record_env(self, i: int, act: Any, obs: Any, rew: float, terminated: bool, truncated: bool,
                   info: dict[str, Any], version: int, reset: bool = False,
                   extra: dict[str, Any] | None = None) -> None:
        """Env ``i``'s row of a vector step; the caller sends once the step's rows are in
        (:meth:`due`)."""
        networked = i == 0 and self.local is None and self.link is not None  # env 0 checks for all
        self.makers[i].add(act, obs, rew, terminated, truncated, info, reset, version,
                           networked=networked, extra=extra)
        if not reset:
            self.produced += 1

    def episode_ended(self, stats: EpisodeStats, i: int = 0) -> None:
        """Env ``i``'s episode ended: its stats leave with the packet of its last row."""
        self.makers[i].pending_episodes.append(stats)

    def due(self) -> bool:
        if self.env_makers is None:
            return self.packets.due()
        return any(len(m) and m.due() for m in self.env_makers)

    def cut(self) -> Buffer | None:
        """The unsent rows as one packet (every env's as env-major segments), or None."""
        if self.env_makers is None:
            return self.packets.cut()
        segments = [(i, buf) for i, m in enumerate(self.env_makers) if (buf := m.cut()) is not None]
        return concat_segments(segments) if segments else None

    def send(self) -> None:
        """Cut a packet of what is unsent and hand it over: to the single-process list, or the
        network."""
        buf = self.cut()
        if buf is None:
            return
        if self.local is not None:  # single-process mode: no network
            self.local.append(buf)
            return
        if self.link is None:
            return
        self.link.hand_over(self.packets.to_frames(buf, self.produced))

    @property
    def unsent_transitions(self) -> int:
        return sum(m.unsent_transitions for m in self.makers)

    @property
    def pending_episodes(self) -> list[EpisodeStats]:
        return [e for m in self.makers for e in m.pending_episodes]

    # -- closing
    # ----------------------------------------------------------------------------------------------
    def close(self, net: WorkerLink, flush_timeout_s: float) -> None:
        """Hand over the last rows, wait up to ``flush_timeout_s`` for their acknowledgement, stop
        the network thread, and log what became of this session's samples."""
        unsent, lost = self.unsent_transitions, 0
        if self.pending_episodes and not unsent:  # e.g. after a final test episode
            log.info("worker %s: the stats of its last %d episodes stay in its episode log: no "
                     "samples are left to carry them to the trainer", self.worker_id,
                     len(self.pending_episodes))
        try:
            self.send()
        except NetrlError as exc:  # its network thread had stopped (the server refused the worker?)
            lost = unsent
            log.warning("worker %s could not hand over its last %d samples: %s", self.worker_id,
                        unsent, exc)
        # not one dropped at the pipe: it never arrives
        flushed = net.flush(net.handed_seq, flush_timeout_s)
        net.halt()
        c = net.dropped()
        unacked_packets, unacked = net.unacknowledged()
        unacked += lost
        self.samples_unacknowledged = unacked
        troubled = unacked or c["dropped_samples"] or c["rejected_samples"]
        spooled = (f"; {c['spooled_samples']} of the acknowledged samples are spooled at the "
                   "server (safe on its disk until a trainer of their sample layout takes them: "
                   "the server's --status and last line say where they are)"
                   ) if c["spooled_samples"] else ""
        log.log(logging.WARNING if troubled else logging.INFO,
                "worker %s session %s: %d samples produced in %d packets; %d acknowledged, "
                "%d dropped, %d rejected, %d unacknowledged%s", self.worker_id, self.session,
                self.produced, self.seq, c["acked_samples"], c["dropped_samples"],
                c["rejected_samples"], unacked, spooled)
        held, held_samples = len(net.held), sum(net.backlog[seq].steps for seq in net.held)
        # the server refused them for the trainer's layout, and no trainer with theirs came in time
        if held:
            log.warning("worker %s stopped with %d packets (%d samples) it kept for a trainer with "
                        "their sample layout, which the server refused for the trainer's (%s): "
                        "they "
                        "are lost with this session", self.worker_id, held, held_samples,
                        net.last_held_reason)
        if not flushed and unacked_packets > held:
            log.warning("worker %s stopped with %d packets (%d samples) unacknowledged: the server "
                        "had neither spooled them nor delivered them to the trainer, so they are "
                        "lost if they did not reach it or if it stops before the trainer takes "
                        "them",
                        self.worker_id,
                        unacked_packets - held, unacked - lost - held_samples)


def _own_copy(compressor: Callable[..., Any] | None, i: int) -> Callable[..., Any] | None:
    """Env ``i``'s own copy of the sample compressor: one such as FrameStackCompressor keeps state
    per env."""
    if compressor is None or i == 0:
        return compressor
    try:
        return copy.deepcopy(compressor)
    except Exception as exc:  # e.g. it holds a lock or a file
        raise ValueError(f"the sample compressor {compressor!r} cannot be copied ({exc}), and each "
                         "of the worker.num_envs envs needs its own: make it copyable, or set "
                         "worker.num_envs = 1") from None
