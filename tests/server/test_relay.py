"""The server's sample relay on its own: what goes into a bundle, and who is acknowledged when."""

from __future__ import annotations

import errno
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from netrl.protocol.messages import MsgType
from netrl.protocol.wire import BUNDLE_HEADER_ROOM, decode
from netrl.server.counters import ServerCounters
from netrl.server.peers import QueuedPacket
from netrl.server.relay import FRAME_OVERHEAD, MAX_BUNDLE_PARTS, SampleRelay
from netrl.server.spool import Spool


class Relay:
    """A SampleRelay whose trainer and workers are lists."""

    def __init__(self, tmp_path: Path, min_samples: int, max_bundle_bytes: int, max_message_bytes: int = 1 << 30,
                 spool_bytes: int = 1 << 20) -> None:
        self.bundles: list[list[Any]] = []
        self.told: list[tuple[str, MsgType, dict[str, Any]]] = []
        self.workers: list[str] = []  # the connected workers' names
        self.relay = SampleRelay(Spool(tmp_path / "spool", spool_bytes).open(), min_samples, max_bundle_bytes,
                                 max_message_bytes, max_delay_s=10.0, max_queue_bytes=1 << 30, spool_after_s=60.0,
                                 stats=ServerCounters(), send_to_trainer=self._send,
                                 tell_worker=lambda *told: self.told.append(told), workers=lambda: self.workers)

    def _send(self, frames: list[Any]) -> bool:
        self.bundles.append(frames)
        return True

    def packet(self, session: str, seq: int, steps: int = 4, nbytes: int = 100) -> None:
        frames = [b"p%s%d" % (session.encode(), seq)]
        got = self.relay.accept(QueuedPacket(f"w/{session}", session, seq, steps, frames, nbytes, 0.0), True)
        assert got == "held"

    def bundle_contents(self, i: int) -> list[bytes]:
        """The packets (their single frames) in the i-th bundle sent."""
        return [bytes(part[0]) for part in decode(self.bundles[i]).parts]


def test_a_bundle_takes_what_waits_beyond_min_samples_up_to_max_bundle_bytes(tmp_path: Path) -> None:
    r = Relay(tmp_path, min_samples=5, max_bundle_bytes=250)
    for seq in range(1, 6):
        r.packet("a", seq)
    r.relay.add_credit(3)
    r.relay.flush(now=0.0, trainer_connected=True)
    # 4 samples per packet: two make min_samples (200 bytes), a third would pass 250 bytes
    assert [r.bundle_contents(i) for i in range(len(r.bundles))] == [[b"pa1", b"pa2"], [b"pa3", b"pa4"]]
    assert r.relay.credit == 1 and len(r.relay.queue) == 1  # pa5 (4 samples) waits for more, or for max_delay_s


def test_under_load_one_bundle_and_one_ack_per_worker_cover_many_packets(tmp_path: Path) -> None:
    r = Relay(tmp_path, min_samples=5, max_bundle_bytes=1 << 20)
    for seq in range(1, 5):
        r.packet("a", seq)
        r.packet("b", seq)
    r.relay.add_credit(8)
    r.relay.flush(now=0.0, trainer_connected=True)
    assert len(r.bundles) == 1 and len(r.bundle_contents(0)) == 8 and r.relay.credit == 7
    assert not r.told  # nobody is acknowledged before the trainer has the bundle
    r.relay.trainer_acked([1])
    assert sorted((s, k, b["seqs"]) for s, k, b in r.told) == [("a", MsgType.ACK, [1, 2, 3, 4]),
                                                                 ("b", MsgType.ACK, [1, 2, 3, 4])]
    assert r.relay.mem_bytes == 0 and not r.relay.held and not r.relay.held_cost


def test_the_memory_queue_counts_what_holding_a_packet_costs(tmp_path: Path) -> None:
    # counting bytes only, 560-byte packets of 9 frames would take 450 MiB of memory for the 64 MiB the queue counts
    r = Relay(tmp_path, min_samples=1000, max_bundle_bytes=1 << 20)
    cost = 100 + 9 * FRAME_OVERHEAD
    r.relay.max_queue_bytes = 10 * cost
    got = [r.relay.accept(QueuedPacket("w/a", "a", seq, 4, [b"x"] * 9, 100, 0.0), True) for seq in range(1, 21)]
    assert got == ["held"] * 10 + ["spooled"] * 10  # the rest waits on disk
    assert r.relay.mem_bytes == 10 * cost and r.relay.held_cost == {"a": 10 * cost}  # per worker, for its share
    r.relay.spool_stale(now=120.0, trainer_connected=True)  # the trainer took nothing for a while
    assert r.relay.mem_bytes == 0 and not r.relay.held_cost


def test_a_packet_bigger_than_max_bundle_bytes_still_goes_alone(tmp_path: Path) -> None:
    r = Relay(tmp_path, min_samples=1, max_bundle_bytes=50)
    r.packet("a", 1, nbytes=400)
    r.packet("a", 2, nbytes=400)
    r.relay.add_credit(5)
    r.relay.flush(now=0.0, trainer_connected=True)
    assert [r.bundle_contents(i) for i in range(len(r.bundles))] == [[b"pa1"], [b"pa2"]]


def test_min_samples_never_makes_a_bundle_the_trainer_would_refuse(tmp_path: Path) -> None:
    # 10 samples per packet and 100 wanted per bundle, but the trainer takes 3 packets' worth of bytes
    r = Relay(tmp_path, min_samples=100, max_bundle_bytes=1, max_message_bytes=BUNDLE_HEADER_ROOM + 3 * 1000)
    for seq in range(1, 11):
        r.packet("a", seq, steps=10, nbytes=1000)
    r.relay.add_credit(10)
    r.relay.flush(now=0.0, trainer_connected=True)
    assert [r.bundle_contents(i) for i in range(len(r.bundles))] == [[b"pa1", b"pa2", b"pa3"]]
    r.relay.flush(now=20.0, trainer_connected=True)  # the rest wait for min_samples, at most max_delay_s
    assert [len(r.bundle_contents(i)) for i in range(len(r.bundles))] == [3, 3, 3, 1]


def test_a_bundle_never_takes_more_at_the_trainer_than_it_accepts_once_decoded(tmp_path: Path) -> None:
    # blank camera frames: 1.6 MB a packet decoded, a few hundred bytes compressed. Counting wire bytes only, one
    # bundle of waiting packets (a spool draining after a trainer outage) could take gigabytes at the trainer.
    r = Relay(tmp_path, min_samples=10**9, max_bundle_bytes=1 << 30, max_message_bytes=BUNDLE_HEADER_ROOM + 4_000_000)
    for seq in range(1, 11):
        got = r.relay.accept(QueuedPacket("w/a", "a", seq, 100, [b"pa%d" % seq], 300, 0.0, inflated=1_600_000), True)
        assert got == "held"
    r.relay.add_credit(10)
    r.relay.flush(now=20.0, trainer_connected=True)
    assert [len(r.bundle_contents(i)) for i in range(len(r.bundles))] == [2, 2, 2, 2, 2]  # 3.2 MB of 4 each
    spooled = Relay(tmp_path / "again", min_samples=10**9, max_bundle_bytes=1 << 30,
                    max_message_bytes=BUNDLE_HEADER_ROOM + 4_000_000)
    for seq in range(1, 6):  # the same from the spool, which keeps each packet's decoded size
        got = spooled.relay.accept(QueuedPacket("w/a", "a", seq, 100, [b"pa%d" % seq], 300, 0.0,
                                                inflated=1_600_000), False)
        assert got == "spooled"
    spooled.relay.add_credit(10)
    spooled.relay.flush(now=20.0, trainer_connected=True)
    assert [len(spooled.bundle_contents(i)) for i in range(len(spooled.bundles))] == [2, 2, 1]


def test_a_bundle_lists_at_most_max_bundle_parts_packets(tmp_path: Path) -> None:
    r = Relay(tmp_path, min_samples=10**9, max_bundle_bytes=1 << 30)
    for seq in range(1, MAX_BUNDLE_PARTS + 11):
        r.packet("a", seq, steps=1, nbytes=10)
    r.relay.add_credit(1)
    r.relay.flush(now=20.0, trainer_connected=True)  # past max_delay_s: what is there leaves
    assert len(r.bundle_contents(0)) == MAX_BUNDLE_PARTS and len(r.relay.queue) == 10


def test_a_trainer_that_leaves_gets_the_whole_bundle_again_and_its_samples_count_once(tmp_path: Path) -> None:
    r = Relay(tmp_path, min_samples=1, max_bundle_bytes=1 << 20)
    for seq in range(1, 4):
        r.packet("a", seq)
    r.relay.add_credit(1)
    r.relay.flush(now=0.0, trainer_connected=True)
    assert r.relay.stats["samples_out"] == 0  # sent, not yet delivered
    r.relay.trainer_left()  # never acknowledged it
    r.relay.trainer_joined()
    r.relay.add_credit(1)
    r.relay.flush(now=0.0, trainer_connected=True)
    assert r.bundle_contents(1) == [b"pa1", b"pa2", b"pa3"] and not r.told
    r.relay.trainer_acked([2])
    assert r.relay.stats["samples_out"] == 12 and r.relay.stats["bundles_out"] == 2  # relayed once, sent twice


def test_a_disk_that_refuses_the_spool_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = Relay(tmp_path, min_samples=1, max_bundle_bytes=1 << 20)
    spool, relay = r.relay.spool, r.relay

    def full(*args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool, "push", full)
    # no trainer: the packet would be spooled; the disk refuses, so its worker keeps it (NACK, retry later)
    got = relay.accept(QueuedPacket("w/a", "a", 1, 4, [b"pa1"], 100, 0.0), trainer_connected=False)
    assert got == "refused" and r.told == [("a", MsgType.NACK, {"seqs": [1], "retry_s": 1.0,
                                                                "reason": "the server cannot write its spool"})]
    assert relay.stats["spool_errors"] == 1 and relay.stats["samples_refused"] == 4
    # a packet waiting in memory too long stays there, unacknowledged, while the disk refuses it
    r.told.clear()
    r.packet("a", 2)
    relay.gate.retry_at = 0.0  # past the rest a refusal buys the spool
    relay.spool_stale(now=120.0, trainer_connected=False)
    assert [p.seq for p in relay.queue] == [2] and not r.told and relay.stats["spool_errors"] == 2
    relay.spool_stale(now=120.5, trainer_connected=False)  # within the rest: not tried again
    assert relay.stats["spool_errors"] == 2
    monkeypatch.undo()  # the disk has room again: the packet is spooled and acknowledged
    relay.gate.retry_at = 0.0
    relay.spool_stale(now=121.0, trainer_connected=False)
    assert not relay.queue and spool.packets == 1 and r.told == [("a", MsgType.ACK, {"seqs": [2], "spooled": True})]


def test_a_spool_that_cannot_be_read_sends_no_empty_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = Relay(tmp_path, min_samples=100, max_bundle_bytes=1 << 20)
    relay = r.relay
    assert relay.accept(QueuedPacket("w/a", "a", 1, 4, [b"pa1"], 100, 0.0), trainer_connected=False) == "spooled"
    start = time.monotonic()  # the relay's clock: a failed spool rests a second of it
    got = relay.accept(QueuedPacket("w/a", "a", 2, 4, [b"pa2"], 100, start), trainer_connected=True)
    assert got == "held"  # 4 samples in memory, far from min_samples, and just received

    def no_files(*args: Any) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(relay.spool, "take", no_files)
    relay.add_credit(3)
    relay.flush(now=start, trainer_connected=True)
    # neither an empty bundle nor the small queued one jumps ahead: both wait for the spool or for max_delay_s
    assert not r.bundles and relay.credit == 3 and relay.stats["spool_errors"] == 1
    monkeypatch.undo()
    relay.flush(now=start + 1.5, trainer_connected=True)  # rested: the spooled packet goes first
    assert r.bundle_contents(0)[0] == b"pa1"


def test_spooled_samples_on_their_way_to_the_trainer_are_counted_once_for_pacing(tmp_path: Path) -> None:
    r = Relay(tmp_path, min_samples=1, max_bundle_bytes=1 << 20)
    packet = QueuedPacket("w/a", "a", 1, 4, [b"pa1"], 100, 0.0)
    assert r.relay.accept(packet, trainer_connected=False) == "spooled"
    r.packet("a", 2)  # and one held in memory
    assert r.relay.on_the_way() == 8
    r.relay.add_credit(1)
    r.relay.flush(now=0.0, trainer_connected=True)
    assert len(r.bundles) == 1 and r.relay.on_the_way() == 8  # in flight, and still on disk until acknowledged
    r.relay.trainer_acked([1])
    assert r.relay.on_the_way() == 0 and r.relay.stats["samples_out"] == 8


def test_a_queue_that_cannot_leave_sets_no_deadline_for_the_servers_loop(tmp_path: Path) -> None:
    # The server's loop polls until the next deadline: one already passed, with no trainer or no credit to send
    # to, would make it wake every millisecond until the trainer catches up.
    r = Relay(tmp_path, min_samples=100, max_bundle_bytes=1 << 20)
    assert r.relay.next_deadline(trainer_connected=True) is None  # nothing queued
    r.packet("a", 1)  # received at 0.0, 4 of the 100 samples wanted
    assert r.relay.next_deadline(trainer_connected=True) is None  # no credit yet
    r.relay.add_credit(1)
    assert r.relay.next_deadline(trainer_connected=False) is None
    assert r.relay.next_deadline(trainer_connected=True) == 10.0  # max_delay_s after it arrived
    r.relay.flush(now=10.0, trainer_connected=True)
    assert len(r.bundles) == 1 and r.relay.next_deadline(trainer_connected=True) is None


def test_a_spooled_packet_over_a_lowered_message_limit_is_dropped_loudly_and_the_rest_flows(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Spooled under a larger network.max_message_bytes, such a packet would go first in every bundle; the trainer's
    # socket refuses it by closing the connection, so nothing behind it would ever reach the trainer.
    spooled = Relay(tmp_path, min_samples=1, max_bundle_bytes=1 << 20)
    for seq, size in [(1, 100), (2, 5000), (3, 100)]:
        packet = QueuedPacket("w/a", "a", seq, 4, [b"%d" % seq * size], size, 0.0)
        assert spooled.relay.accept(packet, trainer_connected=False) == "spooled"
    spooled.relay.spool.close()
    r = Relay(tmp_path, min_samples=100, max_bundle_bytes=1 << 20, max_message_bytes=BUNDLE_HEADER_ROOM + 1000)
    relay = r.relay  # restarted with the lower limit, on the same spool
    assert relay.spool.packets == 3
    with caplog.at_level(logging.ERROR, logger="netrl.server.relay"):
        relay.add_credit(4)
        relay.flush(now=0.0, trainer_connected=True)
    assert [r.bundle_contents(i) for i in range(len(r.bundles))] == [[b"1" * 100], [b"3" * 100]]
    assert relay.stats["samples_dropped"] == 4
    assert "spooled packet 2 of worker w/a (4 samples, 5000 bytes, 5000 decoded) is over what the trainer takes" in \
        caplog.text and "network.max_message_bytes is" in caplog.text
    relay.trainer_acked([1, 2])
    assert relay.spool.packets == 0 and relay.stats["samples_out"] == 8  # the dropped one no longer waits either


# -- each worker's share of the spool ----------------------------------------------------------------------------
def _offer(r: Relay, worker: str, seq: int, nbytes: int = 100, trainer: bool = False) -> str:
    """A packet of ``nbytes`` real bytes from ``worker`` (its session is its name)."""
    return r.relay.accept(QueuedPacket(worker, worker, seq, 4, [bytes(nbytes)], nbytes, 0.0), trainer)


def test_a_worker_past_its_share_of_the_spool_cannot_shut_the_others_out(tmp_path: Path) -> None:
    # No trainer: without shares, a fast simulator beside a robot would fill the whole spool, and the robot's packets
    # would be refused until the trainer came back and drained it.
    r = Relay(tmp_path, min_samples=1, max_bundle_bytes=1 << 20, spool_bytes=1000)
    r.workers = ["sim", "robot"]
    assert [_offer(r, "sim", seq) for seq in range(1, 9)] == ["spooled"] * 5 + ["refused"] * 3  # 500 of 1,000 bytes
    nack = r.told[-1]
    assert nack[:2] == ("sim", MsgType.NACK) and nack[2]["retry_s"] > 0  # it keeps the packet and resends it
    assert nack[2]["reason"] == ("worker 'sim' has 500 bytes in the spool, and 100 more would pass its share (1000 "
                                 "bytes between 2 connected workers) into the room kept for the others")
    assert r.relay.stats["spool_share_refusals"] == 3 and r.relay.stats["samples_refused"] == 12
    assert [_offer(r, "robot", seq) for seq in range(1, 3)] == ["spooled"] * 2
    assert r.relay.spool.by_worker == {"sim": 500, "robot": 200}
    r.workers = ["sim"]  # the robot left: what its share kept is anyone's now, and its packets stay
    assert [_offer(r, "sim", seq) for seq in range(9, 13)] == ["spooled"] * 3 + ["refused"]  # the spool is full
    assert r.relay.stats["spool_share_refusals"] == 3  # full, not past a share
    r.relay.add_credit(1)  # the trainer takes the spool, and its acknowledgements free the shares
    r.relay.flush(now=0.0, trainer_connected=True)
    r.relay.trainer_acked([1])
    assert r.relay.spool.by_worker == {} and r.relay.spool.bytes == 0


def test_a_worker_with_nothing_spooled_may_spool_a_packet_bigger_than_its_share(tmp_path: Path) -> None:
    r = Relay(tmp_path, min_samples=1, max_bundle_bytes=1 << 20, spool_bytes=1000)
    r.workers = ["a", "b", "c", "d"]  # shares of 250 bytes
    assert _offer(r, "a", 1, nbytes=400) == "spooled"
    assert _offer(r, "a", 2) == "refused"  # past its share: the room left is the others'
    assert [_offer(r, w, 1, nbytes=200) for w in "bcd"] == ["spooled"] * 3


def test_stale_packets_past_their_workers_share_stay_in_memory_in_order(tmp_path: Path) -> None:
    # A trainer connected but taking nothing: packets waiting in memory are spooled after spool_after_s, and
    # acknowledged, which without shares would open the simulator's window again and again until it filled the spool.
    r = Relay(tmp_path, min_samples=1, max_bundle_bytes=1 << 20, spool_bytes=1000)
    r.workers = ["sim", "robot"]
    assert [_offer(r, "sim", seq) for seq in range(1, 6)] == ["spooled"] * 5  # its share
    r.told.clear()
    for worker, seq in (("sim", 6), ("robot", 1), ("sim", 7), ("robot", 2)):
        assert _offer(r, worker, seq, trainer=True) == "held"
    r.relay.spool_stale(now=120.0, trainer_connected=True)
    assert r.told == [("robot", MsgType.ACK, {"seqs": [1, 2], "spooled": True})]  # the simulator's wait, unacknowledged
    assert [(p.worker, p.seq) for p in r.relay.queue] == [("sim", 6), ("sim", 7)]
    assert r.relay.queued_steps == 8 and r.relay.spool.by_worker == {"sim": 500, "robot": 200}
    r.relay.add_credit(1)
    r.relay.flush(now=120.0, trainer_connected=True)  # the spool first: bundle 1 takes the spool and the queue
    assert not r.relay.queue and r.relay.queued_steps == 0


def test_the_spool_counts_each_workers_bytes_across_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", 1 << 20).open()
    for i, worker in enumerate(["a", "b", "a"]):
        spool.push([bytes(100 + i)], {"worker": worker, "session": worker, "seq": i, "steps": 1})
    assert spool.by_worker == {"a": 202, "b": 101}
    spool.close()
    spool = Spool(tmp_path / "spool", 1 << 20).open()
    assert spool.by_worker == {"a": 202, "b": 101}
    taken = spool.take(lambda *sizes: True)
    spool.ack(taken[1].position)  # out of order: nothing leaves the spool until the head moves
    assert spool.by_worker == {"a": 202, "b": 101}
    spool.ack(taken[0].position)
    assert spool.by_worker == {"a": 102}
    spool.close()


def test_with_the_trainer_gone_packets_waiting_in_memory_are_spooled_at_once(tmp_path: Path) -> None:
    # If they waited spool_after_s (2 s by default) for a trainer, a worker stopped together with the trainer (the
    # demo's Ctrl+C) would give up on its last ACKs first, and report its last packets lost.
    r = Relay(tmp_path, min_samples=1, max_bundle_bytes=1 << 20)
    r.workers = ["w/a"]
    r.packet("a", 1)
    r.packet("a", 2)
    r.relay.add_credit(1)
    r.relay.flush(now=0.0, trainer_connected=True)  # bundle 1 takes both; the trainer leaves before its ACK
    r.packet("a", 3)
    r.relay.trainer_left()
    r.relay.spool_stale(now=0.5, trainer_connected=False)  # well within spool_after_s (60 s here)
    assert not r.relay.queue and r.relay.spool.packets == 3
    assert r.told == [("a", MsgType.ACK, {"seqs": [1, 2, 3], "spooled": True})]
