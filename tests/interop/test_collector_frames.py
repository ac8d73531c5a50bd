"""The remote collector's parts without processes: exact batches cut from packets, the position in
the stream a restart resumes from, late frames, trajectory numbers, ACKs held until packets are
yielded, and bad arguments."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from netrl.config.sections import Config
from netrl.interop.collector import RemoteCollector, check_collector_args
from netrl.interop.collector_link import CollectorLink
from netrl.interop.frames import FrameQueue, Trajectories
from netrl.protocol.wire import decode
from netrl.samples.columns import Buffer
from netrl.trainer.delivery import Deliveries
from tests.fakes import NET


def packet(
    worker: str,
    seq: int,
    reset: list[int],
    version: int = 0,
    first_obs: int = 0,
    env: list[int] | None = None,
) -> Buffer:
    """Rows whose observation is their number from ``first_obs``; ``reset`` lists the reset rows;
    every other row ends a transition, except row 0 of a packet that does not start with a reset (a
    context row)."""
    n = len(env) if env is not None else 0
    n = n or max([*reset, 0]) + 1
    return packet_rows(worker, seq, n, reset, version, first_obs, env)


def packet_rows(
    worker: str,
    seq: int,
    n: int,
    reset: list[int],
    version: int = 0,
    first_obs: int = 0,
    env: list[int] | None = None,
) -> Buffer:
    flags = np.zeros(n, np.bool_)
    flags[reset] = True
    context = np.zeros(n, np.bool_)
    envs = np.zeros(n, np.uint16) if env is None else np.asarray(env, np.uint16)
    starts = np.r_[True, envs[1:] != envs[:-1]]
    context[starts & ~flags] = True  # each env segment starts with a reset or a context row
    return Buffer(
        act=np.zeros((n, 1), np.float32),
        obs=np.arange(first_obs, first_obs + n, dtype=np.float32)[:, None],
        rew=np.ones(n, np.float32),
        terminated=np.zeros(n, np.bool_),
        truncated=np.zeros(n, np.bool_),
        reset=flags,
        context=context,
        policy_version=np.full(n, version, np.int64),
        worker=worker,
        seq=seq,
        env=envs,
    )


def next_obs(frames: list[Any]) -> list[float]:
    return [float(x) for f in frames for x in f.cols["next:obs"][:, 0]]


def test_exact_batches_across_packets_and_a_restart_resumes_with_nothing_lost_or_repeated() -> None:
    stream = [
        packet_rows("w/s", seq, 41, [0] if seq == 1 else [], first_obs=40 * (seq - 1))
        for seq in (1, 2, 3)
    ]
    q = FrameQueue()
    for buf in stream:
        assert q.add(buf)
    assert q.available() == 120  # 40 frames a packet: the first row is a reset or a context row
    frames, settled = q.take(64)
    assert sum(len(f) for f in frames) == 64 and settled == [("w/s", 1)]
    first = next_obs(frames)
    state = q.state_dict()
    assert state["partial"] == [["w/s", 2, 24]] and state["frames"] == 64
    # a new collector from the state: the server sends every unacknowledged packet again (1 was
    # settled, then lost with the old collector's ACK), and the resends of 2 and 3
    resumed = FrameQueue(state)
    assert [resumed.add(buf) for buf in stream] == [False, True, True]
    assert resumed.available() == 56
    frames, settled = resumed.take(100)
    assert settled == [("w/s", 2), ("w/s", 3)] and resumed.frames_out == 120
    assert first + next_obs(frames) == [
        float(x) for x in range(1, 121)
    ]  # each frame once, in order
    assert resumed.take(10) == ([], []) and resumed.state_dict()["partial"] == []


def test_sync_takes_one_version_and_leaves_the_others_out_as_late() -> None:
    q = FrameQueue()
    q.add(packet_rows("w/s", 1, 11, [0], version=3))
    q.add(packet_rows("w/s", 2, 11, [], version=4, first_obs=10))
    assert q.available(4) == 10 and q.available(3) == 10 and q.available() == 20
    frames, settled = q.take(10, version=4)
    assert next_obs(frames) == [float(x) for x in range(11, 21)] and settled == [
        ("w/s", 1),
        ("w/s", 2),
    ]
    assert q.late == 10 and q.frames_out == 10 and q.queued == 0


def test_trajectory_ids_start_at_resets_and_continue_across_packets_per_env() -> None:
    traj = Trajectories()
    # env 0: reset, 2 steps, reset, 1 step | env 1: reset, 3 steps
    ids = traj.number(packet_rows("w/s", 1, 9, [0, 3, 5], env=[0, 0, 0, 0, 0, 1, 1, 1, 1]))
    assert ids.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    # the next packet: context rows, then env 0 goes on, env 1 resets after a step
    ids = traj.number(packet_rows("w/s", 2, 6, [4], env=[0, 0, 0, 1, 1, 1]))
    assert ids.tolist() == [1, 1, 1, 2, 3, 3]
    # another worker, starting mid-episode (a resumed stream): a new number
    assert traj.number(packet_rows("v/s", 7, 3, [])).tolist() == [4, 4, 4]


class Sent:
    """A CollectorLink that is never started: its sends are recorded, its commands handled at once.
    """

    def __init__(self) -> None:
        self.link = CollectorLink(NET, "collector", "c" * 16, 1, 8, Deliveries(), None)
        self.acks: list[int] = []
        self.link.link.send = self._send  # type: ignore[method-assign]
        self.link.command = self._command  # type: ignore[method-assign]

    def _command(self, frames: Any, track: bool = False) -> None:
        self.link.on_command(list(frames))

    def _send(self, frames: Any, *args: Any) -> bool:
        msg = decode(frames)
        if msg.type.value == "ack":
            self.acks += msg.body["seqs"]
        return True


@pytest.fixture
def sent() -> Iterator[Sent]:
    s = Sent()
    yield s
    s.link.halt()  # frees its sockets (never started), or the context's end hangs the interpreter


def test_a_bundle_is_acknowledged_only_once_every_packet_in_it_was_yielded(sent: Sent) -> None:
    s = sent
    a, b, c = (packet("w/s", seq, [0] if seq == 1 else [], first_obs=seq) for seq in (1, 2, 3))
    s.link._acknowledge(10, {}, [a, b], [])
    s.link.done([("w/s", 1)])
    assert s.acks == [] and s.link.held_bundles == 1 and s.link.yielded_unacked == len(a) - 1
    # a resend of packet 2 (held, not yet yielded) in another bundle waits for it; one of a packet
    # yielded already does not wait
    s.link._acknowledge(11, {}, [c], [("w/s", 2)])
    s.link._acknowledge(12, {}, [], [("w/s", 1)])
    assert s.acks == [12]
    s.link.done([("w/s", 3)])
    assert s.acks == [12]
    s.link.done([("w/s", 2)])
    assert (
        sorted(s.acks) == [10, 11, 12] and s.link.held_bundles == 0 and s.link.yielded_unacked == 0
    )


def test_after_a_reconnect_no_ack_names_a_bundle_of_the_old_connection(sent: Sent) -> None:
    """A restarted server numbers its bundles from 1 again: an ACK for an old number would
    acknowledge one of its bundles that the collector never yielded."""
    s = sent
    s.link._acknowledge(1, {}, [packet("w/s", 1, [0])], [])
    s.link.on_ready()  # a new connection
    s.link.done([("w/s", 1)])
    assert s.acks == []
    # the packet comes again in the new server's bundle 1, and waits for nothing: it was yielded
    s.link._acknowledge(1, {}, [], [("w/s", 1)])
    assert s.acks == [1]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((0, -1, 0, 8, 30.0), "frames_per_batch must be an integer between 1 and"),
        ((-5, -1, 0, 8, 30.0), "frames_per_batch must be an integer between 1 and"),
        ((True, -1, 0, 8, 30.0), "frames_per_batch must be an integer"),
        ((1.5, -1, 0, 8, 30.0), "frames_per_batch must be an integer"),
        ((1 << 40, -1, 0, 8, 30.0), "(got 1099511627776)"),
        ((10, 0, 0, 8, 30.0), "total_frames must be an integer >= 1, or -1"),
        ((10, -7, 0, 8, 30.0), "total_frames must be an integer >= 1, or -1"),
        ((100, 50, 0, 8, 30.0), "frames_per_batch (100) is more than total_frames (50)"),
        ((10, -1, -1, 8, 30.0), "init_random_frames must be an integer >= 0"),
        ((10, -1, 0, 0, 30.0), "rollout_fragment_length must be an integer between 1 and"),
        ((10, -1, 0, 8, math.nan), "wait_warning_s must be a number of seconds > 0"),
    ],
)
def test_bad_arguments_are_refused_with_an_error_that_names_them(
    args: tuple[Any, ...], says: str
) -> None:
    with pytest.raises(ValueError, match="RemoteCollector: ") as err:
        check_collector_args(*args)
    assert says in str(err.value)


def test_every_bad_argument_is_named_at_once_and_the_constructor_checks_them() -> None:
    with pytest.raises(ValueError) as err:
        RemoteCollector(Config(), None, frames_per_batch=0, total_frames=0, sync=False)
    assert "frames_per_batch must" in str(err.value) and "total_frames must" in str(err.value)
    with pytest.raises(ValueError, match="sync=True needs a policy"):
        RemoteCollector(Config(), None, frames_per_batch=10)
    with pytest.raises(ValueError, match="split_trajs=True is not supported"):
        RemoteCollector(Config(), None, frames_per_batch=10, sync=False, split_trajs=True)
    with pytest.raises(ValueError, match="not a RemoteCollector state"):
        RemoteCollector(Config(), None, frames_per_batch=10, sync=False).load_state_dict({"v": 99})
