"""The commands a role's main thread hands its network thread: each kind through the pipe and back, payload frames
zero-copy and tracked, and a head no command has refused."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from netrl.config.sections import NetworkConfig
from netrl.errors import NetrlError
from netrl.launch import free_port
from netrl.net.thread import Command, NetThread, command_head, read_command
from netrl.net.transport import new_session
from netrl.protocol.messages import Message
from netrl.trainer.delivery import Deliveries
from netrl.trainer.link import TrainerLink
from netrl.worker.link import WorkerLink

# every kind, with the largest values its head carries
EXAMPLES = [(Command.PACKET, (2**64 - 1, 2**64 - 1)), (Command.CREDIT, ()),
            (Command.WEIGHTS, (2**32 - 1, 2**63 - 1)), (Command.PROGRESS, ())]


class Reader(NetThread):
    """A network thread that reads every command's head, as a role's does."""

    def on_message(self, msg: Message) -> None:
        pass

    def on_command(self, frames: list[Any]) -> None:
        read_command(frames[0])


@pytest.fixture
def thread() -> Iterator[Reader]:
    reader = Reader(NetworkConfig(), "worker", "w", new_session(), free_port())
    yield reader
    reader.halt()


def test_every_command_kind_is_listed_here() -> None:
    assert {kind for kind, _ in EXAMPLES} == set(Command)


@pytest.mark.parametrize(("kind", "values"), EXAMPLES, ids=[kind.name for kind, _ in EXAMPLES])
def test_a_command_crosses_the_pipe_with_its_kind_and_values_and_its_frames_untouched(
        thread: Reader, kind: Command, values: tuple[int, ...]) -> None:
    payload = np.arange(1 << 17, dtype=np.uint8)  # beyond pyzmq's copy threshold: handed over, not copied
    tracker = thread.command([command_head(kind, *values), b"header", payload], track=True)
    assert tracker is not None
    frames = thread._pipe_in.recv_multipart(copy=False)
    assert read_command(frames[0]) == (kind, values) and read_command(bytes(frames[0])) == (kind, values)
    assert frames[1].bytes == b"header"
    received = np.frombuffer(frames[2].buffer, np.uint8)
    assert np.shares_memory(received, payload)  # the very memory the main thread handed over
    assert not tracker.done  # ZeroMQ still holds it while the network thread does
    del frames, received
    tracker.wait(5)  # released: the trainer reuses a weights buffer only now


@pytest.mark.parametrize("head", [b"", b"\x00", b"\x09", b"weights", command_head(Command.PACKET, 1, 2)[:9],
                                  command_head(Command.CREDIT) + b"\x00", b"\x03" + b"1"],
                         ids=["empty", "kind 0", "unknown kind", "the old ASCII command", "short PACKET",
                              "long CREDIT", "ASCII WEIGHTS"])
def test_a_head_no_command_has_raises(head: bytes) -> None:
    with pytest.raises(ValueError, match="command"):
        read_command(head)
    with pytest.raises(ValueError, match="command"):
        read_command(zmq.Frame(head))


def test_a_command_whose_values_do_not_fit_its_head_is_not_built() -> None:
    for kind, values in [(Command.PACKET, (1,)), (Command.PACKET, (-1, 1)), (Command.WEIGHTS, (2**32, 1)),
                         (Command.CREDIT, (1,))]:
        with pytest.raises(struct.error):
            command_head(kind, *values)


def test_a_role_refuses_a_command_of_the_other_role() -> None:
    worker = WorkerLink(NetworkConfig(), "w", new_session(), free_port(), None, 1 << 20, 1 << 20)
    trainer = TrainerLink(NetworkConfig(), "trainer", new_session(), free_port(), 8, Deliveries(), None)
    try:
        with pytest.raises(ValueError, match="a CREDIT command on a worker's network thread"):
            worker.on_command([zmq.Frame(command_head(Command.CREDIT))])
        with pytest.raises(ValueError, match="a PACKET command on the trainer's network thread"):
            trainer.on_command([zmq.Frame(command_head(Command.PACKET, 1, 4)), zmq.Frame(b"packet")])
        assert not worker.backlog and trainer.last_progress is None
    finally:
        worker.halt()
        trainer.halt()


def test_a_network_thread_that_meets_a_malformed_command_stops_and_the_next_command_says_why(thread: Reader) -> None:
    thread.start()
    thread.command([b"credit"])  # an untyped head, not one command_head() builds
    thread.join(5)
    assert not thread.is_alive() and isinstance(thread.error, ValueError)
    with pytest.raises(NetrlError, match=r"network thread has stopped .*an unknown command"):
        thread.command([command_head(Command.CREDIT)])
