"""The collector's frames: packets in, batches of exactly ``frames_per_batch`` transitions out, and
the position in the stream that a restarted collector resumes from.

A *frame* is one transition (TorchRL's frame: one env step), a row of a packet that ends one
(see :mod:`netrl.samples.columns`). Packets are taken in arrival order; within a packet, rows keep
its order (env-major segments, time order within each). A batch takes the frames at the front::

    queue:   [packet a: 40 frames][packet b: 40][packet c: 40]
    take(64) -> a's 40 + b's first 24: a is settled (ACK), b is at offset 24

The position (:meth:`FrameQueue.state_dict`) is: the packets settled (ranges of sequence numbers
per worker stream), the offset into each packet taken in part, the frames yielded, and the
trajectory numbering. A collector started from it drops a packet settled before and skips the
frames of a packet it had taken in part: packets it had not settled come again, since their
bundles were never acknowledged. Nothing is lost and nothing comes twice.

Sync collection takes only the frames of the batch's version; the other frames at the front are
*late* (another version's: counted, logged, settled, never yielded), as netrl's own sync
collection leaves them out (:mod:`netrl.training.sync`).

``traj_ids`` (TorchRL's ``("collector", "traj_ids")``): a new number at each episode start, kept
by an env's frames until its next one, across packets and batches.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from netrl.samples.columns import Buffer, Spec, flatten
from netrl.trainer.delivery import Deliveries
from netrl.util import worth_logging

__all__ = ["FrameQueue", "Frames"]

log = logging.getLogger(__name__)

PacketKey = tuple[str, int]


@dataclass
class Frames:
    """Transitions as columns: ``obs/...`` (the observation leaves), ``next:obs/...``,
    ``act/...``, ``rew``, ``terminated``, ``truncated``, ``policy_version``, ``traj_ids``,
    ``extra/<name>`` and ``info/<name>``; one row per frame."""

    cols: dict[str, np.ndarray]
    obs_spec: Spec
    act_spec: Spec
    worker: str = ""  # the packet's stream (one packet's frames)

    def __len__(self) -> int:
        return int(self.cols["rew"].shape[0])


def packet_frames(buf: Buffer, traj: Trajectories) -> Frames:
    """The frames of one packet, numbered into trajectories by ``traj``."""
    obs_spec, obs_leaves = flatten(buf.obs, "obs")
    act_spec, act_leaves = flatten(buf.act, "act")
    idx = np.flatnonzero(~(np.asarray(buf.reset) | np.asarray(buf.context)))
    if len(idx) and idx[0] == 0:
        raise ValueError(
            f"packet {buf.seq} of worker {buf.worker}: its first row ends a "
            f"transition, but the row before it is in another packet"
        )
    cols: dict[str, np.ndarray] = {}
    for name, leaf in obs_leaves:
        arr = np.asarray(leaf)
        cols[name], cols["next:" + name] = arr[idx - 1], arr[idx]
    for name, leaf in act_leaves:
        cols[name] = np.asarray(leaf)[idx]
    for prefix, named in (("extra/", buf.extra), ("info/", buf.info)):
        for name, values in (named or {}).items():
            cols[prefix + name] = np.asarray(values)[idx]
    cols["rew"] = np.asarray(buf.rew, np.float32)[idx]
    cols["terminated"] = np.asarray(buf.terminated, np.bool_)[idx]
    cols["truncated"] = np.asarray(buf.truncated, np.bool_)[idx]
    cols["policy_version"] = np.asarray(buf.policy_version, np.int64)[idx]
    cols["traj_ids"] = traj.number(buf)[idx]
    return Frames(cols, obs_spec, act_spec, buf.worker)


class Trajectories:
    """Trajectory numbers per row: a new one at each reset row, kept by an env's rows until its
    next; an env whose rows start without a reset (a stream resumed mid-episode) gets a new one."""

    def __init__(self, next_id: int = 0, open_ids: dict[str, int] | None = None) -> None:
        self.next_id = next_id
        self.open: dict[str, int] = dict(open_ids or {})  # "stream|env" -> its trajectory

    def number(self, buf: Buffer) -> np.ndarray:
        n = len(buf)
        env = np.zeros(n, np.int64) if buf.env is None else np.asarray(buf.env, np.int64)
        reset = np.asarray(buf.reset, np.bool_)
        ids = np.empty(n, np.int64)
        starts = np.flatnonzero(np.r_[True, env[1:] != env[:-1]])  # env segments
        for lo, hi in zip(starts.tolist(), [*starts[1:].tolist(), n], strict=True):
            key = f"{buf.worker}|{int(env[lo])}"
            count = np.cumsum(reset[lo:hi])
            held = self.open.get(key)
            if held is None and not reset[lo]:  # no trajectory to continue
                held, self.next_id = self.next_id, self.next_id + 1
            ids[lo:hi] = np.where(
                count == 0, -1 if held is None else held, self.next_id + count - 1
            )
            self.next_id += int(count[-1])
            self.open[key] = int(ids[hi - 1])
        return ids


@dataclass
class _Piece:
    key: PacketKey
    frames: Frames
    start: int  # frames of it taken (or left out) so far


class FrameQueue:
    """Packets' frames in arrival order; :meth:`take` cuts batches (see the module docstring)."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.settled = Deliveries(state.get("settled"))
        self.partial: dict[PacketKey, int] = {
            (s, int(q)): int(k) for s, q, k in state.get("partial", [])
        }
        self.frames_out = int(state.get("frames", 0))  # yielded
        self.late = int(state.get("late", 0))  # left out as late (sync)
        self.traj = Trajectories(int(state.get("next_traj", 0)), state.get("open_traj"))
        self._queue: collections.deque[_Piece] = collections.deque()
        self.queued = 0  # frames in the queue

    def add(self, buf: Buffer) -> bool:
        """Queue a packet's frames; False for a packet settled before (a resend after a restart)."""
        key = (buf.worker, buf.seq)
        if self.settled.seen(*key):
            return False
        frames = packet_frames(buf, self.traj)
        start = min(self.partial.get(key, 0), len(frames))
        self._queue.append(_Piece(key, frames, start))
        self.queued += len(frames) - start
        return True

    def available(self, version: int | None = None) -> int:
        """Frames queued (of ``version`` only, when given)."""
        if version is None:
            return self.queued
        return sum(
            int((p.frames.cols["policy_version"][p.start :] == version).sum()) for p in self._queue
        )

    def take(self, n: int, version: int | None = None) -> tuple[list[Frames], list[PacketKey]]:
        """Up to ``n`` frames from the front (of ``version`` only: the others before the last one
        taken are late), and the packets this settles."""
        out: list[Frames] = []
        settled: list[PacketKey] = []
        want = n
        while self._queue and want > 0:
            piece = self._queue[0]
            cols, total = piece.frames.cols, len(piece.frames)
            rest = np.arange(piece.start, total)
            if version is not None:
                rest = rest[cols["policy_version"][piece.start :] == version]
            chosen = rest[:want]
            stop = int(chosen[-1]) + 1 if len(chosen) and len(chosen) == want else total
            late = stop - piece.start - len(chosen)
            if late:
                self._late(piece, late, version)
            if len(chosen):
                out.append(
                    Frames(
                        {k: v[chosen] for k, v in cols.items()},
                        piece.frames.obs_spec,
                        piece.frames.act_spec,
                        piece.frames.worker,
                    )
                )
            want -= len(chosen)
            self.queued -= stop - piece.start
            piece.start = stop
            if stop == total:
                self._queue.popleft()
                self.partial.pop(piece.key, None)
                self.settled.add(*piece.key)
                settled.append(piece.key)
            else:
                self.partial[piece.key] = stop
        self.frames_out += n - want
        return out, settled

    def drop_late(self, version: int) -> list[PacketKey]:
        """Sync: settle the queued frames of versions before ``version`` (late)."""
        _, settled = self.take(0, version)  # takes nothing, passes the late ones at the front
        return settled

    def _late(self, piece: _Piece, count: int, version: int | None) -> None:
        self.late += count
        if worth_logging(self.late, first=5, every=100):
            log.info(
                "%d late frames of worker %s left out of the batch of v%s, which takes v%s "
                "only (%d late in all)",
                count,
                piece.frames.worker,
                version,
                version,
                self.late,
            )

    def state_dict(self) -> dict[str, Any]:
        """The position in the stream (see the module docstring); JSON-serialisable."""
        return {
            "settled": self.settled.to_json(),
            "partial": [[s, q, k] for (s, q), k in sorted(self.partial.items())],
            "frames": self.frames_out,
            "late": self.late,
            "next_traj": self.traj.next_id,
            "open_traj": dict(self.traj.open),
        }
