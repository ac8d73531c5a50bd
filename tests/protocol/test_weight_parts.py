"""Weights in parts: flat snapshots, assembly on the worker, and the server's cut-through streaming."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch
import zmq

from netrl.agents.sac import MLPActor
from netrl.errors import MalformedMessage
from netrl.net.thread import Command, command_head
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.weights import (
    MIN_PART_BYTES,
    PART_BYTES,
    PARTS_PER_VERSION,
    WeightAssembler,
    check_weights,
    flat_arrays,
    flat_layout,
    load_weights,
    part_bytes,
    snapshot_into,
)
from netrl.protocol.wire import decode, encode, weight_parts
from netrl.server.server import Server
from tests.fakes import ACT, OBS, PATIENT_NET, Peer, wait_until

pytestmark = pytest.mark.server(network=PATIENT_NET)  # fake peers that pause up to 2 s stay connected


def parts_of(actor: torch.nn.Module, version: int, part_bytes: int, session: str = "t") -> list[Message]:
    layout, nbytes = flat_layout(actor)
    flat = np.empty(nbytes, np.uint8)
    snapshot_into(actor, layout, flat)
    return [decode(encode(m)) for m in weight_parts("trainer", session, version, 0, flat, layout, part_bytes)]


def assemble(assembler: WeightAssembler, msgs: list[Message]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    for m in msgs:
        b = m.body
        assembler.add(b["session"], m.policy_version, b["part"], b["parts"], b["offset"], b["nbytes"], b["layout"],
                      m.arrays["chunk"])
    assert assembler.done
    flat, layout = assembler.take()
    return flat, flat_arrays(flat, layout)


def test_a_snapshot_in_parts_reassembles_into_the_same_actor() -> None:
    actor, other = MLPActor(OBS, ACT, hidden_sizes=(64,)), MLPActor(OBS, ACT, hidden_sizes=(64,))
    msgs = parts_of(actor, 1, part_bytes=200)
    assert len(msgs) > 5 and msgs[0].body["layout"] and not msgs[1].body["layout"]
    _, nbytes = flat_layout(actor)
    flat, arrays = assemble(WeightAssembler(nbytes), msgs)
    assert check_weights(other, arrays) == []
    load_weights(other, arrays, assign=True)
    for name, t in actor.state_dict().items():
        assert torch.equal(other.state_dict()[name], t)
    assert other.mu.weight.data_ptr() >= flat.ctypes.data  # loaded without a copy: a view of the buffer


def test_parts_out_of_order_or_outside_the_buffer_are_refused() -> None:
    actor = MLPActor(OBS, ACT, hidden_sizes=(32,))
    _, nbytes = flat_layout(actor)
    msgs = parts_of(actor, 3, part_bytes=200)
    n = len(msgs)
    assert n > 3 and n == -(-nbytes // 200)
    a = WeightAssembler(nbytes)
    b0, b2 = msgs[0].body, msgs[2].body
    chunk0 = msgs[0].arrays["chunk"]
    a.add("t", 3, 0, b0["parts"], 0, b0["nbytes"], b0["layout"], chunk0)
    with pytest.raises(ValueError, match="out of order"):
        a.add("t", 3, 2, b2["parts"], b2["offset"], b2["nbytes"], [], msgs[2].arrays["chunk"])
    with pytest.raises(ValueError, match="declare"):
        a.add("t", 4, 0, 1, 0, nbytes * 10, b0["layout"], chunk0)  # bigger than this actor
    with pytest.raises(ValueError, match=f"in {n + 1} parts, but part 0 has 200 bytes"):
        a.add("t", 4, 0, n + 1, 0, nbytes, b0["layout"], chunk0)  # more parts than 200-byte parts make
    with pytest.raises(ValueError, match="part 0 has 0 bytes"):
        a.add("t", 4, 0, nbytes, 0, nbytes, b0["layout"], np.zeros(0, np.uint8))  # empty parts
    a.add("t", 5, 0, n, 0, nbytes, b0["layout"], chunk0)
    with pytest.raises(ValueError, match="does not continue the 200 bytes"):
        a.add("t", 5, 1, n, nbytes - 10, nbytes, [], np.zeros(100, np.uint8))  # past the end
    a.add("t", 6, 0, n, 0, nbytes, b0["layout"], chunk0)
    with pytest.raises(ValueError, match="does not continue the 200 bytes"):
        a.add("t", 6, 1, n, 300, nbytes, [], np.zeros(100, np.uint8))  # a gap: bytes 200-299 never written
    a.add("t", 7, 0, n, 0, nbytes, b0["layout"], chunk0)
    with pytest.raises(ValueError, match="has 100 bytes; every part but the last has the 200 bytes of part 0"):
        a.add("t", 7, 1, n, 200, nbytes, [], np.zeros(100, np.uint8))
    a.add("t", 8, 0, n, 0, nbytes, b0["layout"], chunk0)
    for m in msgs[1:-1]:
        a.add("t", 8, m.body["part"], n, m.body["offset"], nbytes, [], m.arrays["chunk"])
    last = msgs[-1].arrays["chunk"]
    with pytest.raises(ValueError, match=f"end at byte {nbytes - 1} of {nbytes}"):
        a.add("t", 8, n - 1, n, msgs[-1].body["offset"], nbytes, [], last[:-1])  # the last byte never written
    assert not a.done
    with pytest.raises(MalformedMessage, match="lies outside"):
        flat_arrays(np.zeros(64, np.uint8), [["w", "<f4", [100], 0]])
    with pytest.raises(MalformedMessage, match=r"has the dtype '\|O', not one of"):
        flat_arrays(np.zeros(64, np.uint8), [["w", "|O", [1], 0]])


def test_buffers_are_reused_once_no_actor_views_them() -> None:
    actor = MLPActor(OBS, ACT, hidden_sizes=(16,))
    _, nbytes = flat_layout(actor)
    a = WeightAssembler(nbytes)
    first, _ = assemble(a, parts_of(actor, 1, 200))
    a.release(first)
    second, _ = assemble(a, parts_of(actor, 2, 200))
    assert second is first  # the freed buffer came back instead of fresh pages


def test_a_version_in_one_part_is_viewed_in_place_and_never_reused() -> None:
    actor, other = MLPActor(OBS, ACT, hidden_sizes=(16,)), MLPActor(OBS, ACT, hidden_sizes=(16,))
    _, nbytes = flat_layout(actor)
    a = WeightAssembler(nbytes)
    msgs = parts_of(actor, 1, 10_000)
    chunk = msgs[0].arrays["chunk"]
    flat, arrays = assemble(a, msgs)
    assert flat.ctypes.data == chunk.ctypes.data and not flat.flags.writeable  # the received frame, no copy
    load_weights(other, arrays, assign=True)
    for name, t in actor.state_dict().items():
        assert torch.equal(other.state_dict()[name], t)
    a.release(flat)  # the frame is not the assembler's to write: the next version gets a buffer of its own
    later, _ = assemble(a, parts_of(actor, 2, 200))
    assert later.flags.writeable and later.ctypes.data != chunk.ctypes.data
    assert torch.equal(other.mu.weight, actor.mu.weight)  # the loaded actor still reads the untouched frame


def received(peer: Peer, timeout: float = 1.0) -> list[tuple[int, int]]:
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = peer.recv(0.05)
        if msg is not None and msg.type is MsgType.WEIGHTS:
            out.append((msg.policy_version, msg.body["part"]))
    return out


def test_the_server_forwards_parts_as_they_arrive_and_a_newer_version_preempts(
        server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer, worker = Peer(ctx, srv.trainer_port, "trainer", "trainer"), Peer(ctx, srv.worker_port, "worker", "w")
    trainer.hello()
    worker.hello()
    actor = MLPActor(OBS, ACT, hidden_sizes=(32,))
    v1, v2 = parts_of(actor, 1, 400, trainer.session), parts_of(actor, 2, 400, trainer.session)
    for m in v1[:3]:
        trainer.send(m)
    assert received(worker) == [(1, 0), (1, 1), (1, 2)]  # forwarded before the version is complete
    trainer.send(v2[0])  # a newer version starts: the worker switches to it from its first part
    for m in v2[1:]:
        trainer.send(m)
    assert received(worker) == [(2, i) for i in range(len(v2))]
    late = Peer(ctx, srv.worker_port, "worker", "late")
    late.hello()
    assert received(late) == [(2, i) for i in range(len(v2))]  # the cache serves a late joiner the newest version
    for m in v1:  # out of order: v1 part 0 would start v1 again, but later parts of v1 after v2 are refused
        trainer.send(m)
    assert srv.stats["rejected"] == 0  # part 0 restarts the cache, and the rest follow in order


def test_a_worker_gets_the_next_version_only_after_acknowledging(server: tuple[Server, zmq.Context]) -> None:
    srv, ctx = server
    trainer, worker = Peer(ctx, srv.trainer_port, "trainer", "trainer"), Peer(ctx, srv.worker_port, "worker", "w")
    trainer.hello()
    worker.hello()
    actor = MLPActor(OBS, ACT, hidden_sizes=(8,))
    for version in (1, 2, 3):
        for m in parts_of(actor, version, 1 << 20, trainer.session):
            trainer.send(m)
        wait_until(lambda v=version: srv.weights.complete_version == v, 5, f"v{version} cached", poll=0.02)
    assert received(worker) == [(1, 0)]  # v2 and v3 wait: v1 is not acknowledged yet
    worker.send(Message(MsgType.ACK, "w", body={"seqs": [1]}))
    assert received(worker) == [(3, 0)]  # then the newest, not every version


def weight_msgs(flat: np.ndarray, layout: list, version: int, part_bytes: int = 1 << 20) -> list[Message]:
    return [decode(encode(m)) for m in weight_parts("trainer", "t", version, 0, flat, layout, part_bytes)]


def test_a_worker_proves_its_own_layout_finite_with_one_sum_and_checks_anything_else_exactly(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import netrl.worker.weight_receiver as wr

    checked: list[int] = []
    exact = wr.check_weights
    monkeypatch.setattr(wr, "check_weights", lambda specs, arrays: checked.append(1) or exact(specs, arrays))
    actor = MLPActor(OBS, ACT, hidden_sizes=(5,))  # 5 floats: padding after several tensors
    receiver = wr.WeightReceiver(actor, MLPActor(OBS, ACT, hidden_sizes=(5,)), -1, lambda *_: None)
    layout, nbytes = flat_layout(actor)
    ends = [offset + 4 * int(np.prod(shape)) for _, _, shape, offset in layout]
    assert any(end < nbytes and end not in [e[3] for e in layout] for end in ends)  # the layout has padding
    flat = np.zeros(nbytes, np.uint8)  # as the trainer allocates it
    snapshot_into(actor, layout, flat)

    def receive(buf: np.ndarray, version: int, entries: list = layout, part_bytes: int = 1 << 20) -> int:
        for m in weight_msgs(buf, entries, version, part_bytes):
            receiver(m)
        return receiver.version

    assert receive(flat, 1) == 1 and not checked  # the usual version: one sum, no per-tensor checks
    loaded = receiver.slot.swap(actor)
    assert loaded is not None and all(torch.equal(loaded[2].state_dict()[k], t) for k, t in actor.state_dict().items())

    bad = flat.copy()
    name, _, _, offset = layout[2]
    bad.view(np.float32)[offset // 4 + 1] = np.nan
    assert receive(bad, 2, part_bytes=96) == 1 and checked  # rejected by the exact check, which names the tensor
    assert receiver.counts["weights_rejected"] == 1 and f"{name!r} contains NaN" in caplog.text

    padded = flat.copy()
    padded[ends[0]:ends[0] + 4] = np.frombuffer(np.float32(np.nan).tobytes(), np.uint8)  # NaN in padding only
    assert ends[0] < layout[1][3]
    checked.clear()
    assert receive(padded, 3) == 3 and checked  # not a weight: the exact check accepts it

    huge = flat.copy()
    huge.view(np.float32)[layout[0][3] // 4:layout[0][3] // 4 + 2] = 3e38  # finite, though the sum overflows
    checked.clear()
    assert receive(huge, 4) == 4 and checked

    reordered = [[n, d, s, o] for n, d, s, o in reversed(layout)]  # another sender's order: the general path
    other = np.zeros(nbytes, np.uint8)
    offset = 0
    for entry in reordered:
        entry[3] = offset
        offset += -(-4 * int(np.prod(entry[2])) // 64) * 64
    snapshot_into({n: actor.state_dict()[n] for n, *_ in reordered}, reordered, other)
    checked.clear()
    assert receive(other, 5, reordered) == 5 and checked
    loaded = receiver.slot.swap(actor)
    assert loaded is not None and all(torch.equal(loaded[2].state_dict()[k], t) for k, t in actor.state_dict().items())

    outside = [[n, d, s, o + nbytes] for n, d, s, o in layout]
    assert receive(flat, 6, outside) == 5 and "lies outside" in caplog.text
    assert receiver.counts["weights_rejected"] == 2


def test_weights_that_cannot_be_saved_are_still_used_and_the_failure_is_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    from netrl.worker.weight_receiver import WeightReceiver

    caplog.set_level("INFO", logger="netrl.worker.weight_receiver")
    actor = MLPActor(OBS, ACT, hidden_sizes=(8,))
    failing = {1, 2}
    saved: list[int] = []

    def save(module: torch.nn.Module, version: int, session: str) -> None:
        if version in failing:
            raise OSError(28, "No space left on device", "/run/worker_policy.pt")
        saved.append(version)

    receiver = WeightReceiver(actor, MLPActor(OBS, ACT, hidden_sizes=(8,)), -1, save)
    layout, nbytes = flat_layout(actor)
    flat = np.zeros(nbytes, np.uint8)
    snapshot_into(actor, layout, flat)
    for version in (1, 2, 3):
        for m in weight_msgs(flat, layout, version):
            receiver(m)
        assert receiver.version == version  # loaded and used whether or not it could be saved
        assert receiver.saved()  # (written on a thread of its own)
    receiver.close()
    assert saved == [3] and receiver.counts["weights_save_failed"] == 2
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "could not save weights v1" in errors[0].getMessage()
    assert "No space left on device" in errors[0].getMessage()
    assert "saving received weights works again (v3 saved)" in caplog.text


def test_versions_in_the_workers_layout_land_in_spare_actors_own_buffers_and_a_failed_one_keeps_the_pending(
        caplog: pytest.LogCaptureFixture) -> None:
    from netrl.worker.weight_receiver import WeightReceiver

    sender = MLPActor(OBS, ACT, hidden_sizes=(16,))
    current = MLPActor(OBS, ACT, hidden_sizes=(16,))
    receiver = WeightReceiver(MLPActor(OBS, ACT, hidden_sizes=(16,)), MLPActor(OBS, ACT, hidden_sizes=(16,)), -1,
                              lambda *_: None)
    places: dict[int, int] = {}  # id(actor) -> where its first weight lives
    for version in range(1, 13):
        with torch.no_grad():
            sender.mu.weight.add_(1.0)
        for m in parts_of(sender, version, part_bytes=128 if version % 2 else 1 << 20):  # in parts, or in one
            receiver(m)
        if version % 3 != 1:  # the control path swaps now and then, not after every version
            swapped = receiver.slot.swap(current)
            assert swapped is not None and swapped[0] == version
            current = swapped[2]
            assert all(torch.equal(current.state_dict()[k], t) for k, t in sender.state_dict().items())
            assert places.setdefault(id(current), current.mu.weight.data_ptr()) == current.mu.weight.data_ptr()
    assert receiver.version == 12 and len(set(places.values())) == len(places) == 3  # each actor kept its buffer
    # A newer version that fails its check midway leaves the pending one to the control path.
    for m in parts_of(sender, 13, part_bytes=128):  # pending: the control path has not swapped it in yet
        receiver(m)
    bad = parts_of(sender, 14, part_bytes=128)
    chunk = bad[1].arrays["chunk"].copy()
    chunk.view(np.float32)[0] = np.nan
    bad[1].arrays["chunk"] = chunk
    for m in bad:
        receiver(m)
    assert receiver.counts["weights_rejected"] == 1 and "contains NaN" in caplog.text
    swapped = receiver.slot.swap(current)
    assert swapped is not None and swapped[0] == 13
    assert all(torch.equal(swapped[2].state_dict()[k], t) for k, t in sender.state_dict().items())


class TwoTensors(torch.nn.Module):
    """16 and ``n`` floats, in the order given: two such modules take the same bytes in different layouts."""

    def __init__(self, first: str, n: int) -> None:
        super().__init__()
        for name in (first, "b" if first == "a" else "a"):
            setattr(self, name, torch.nn.Parameter(torch.randn(16 if name == "a" else n)))


def test_a_small_version_leaves_the_trainer_in_small_parts_and_a_large_one_in_1_mib_parts() -> None:
    """Each part that arrives is the server talking: a Pendulum actor's 270 KB float32 version, once
    one message, took longer than the worker's liveness window over a lossy 200 ms link behind reno
    (6 reconnects in 1.5 minutes, no version through: docs/benchmarks/links.md). It now leaves in
    4 parts of at most 68 KiB, and a large version still in 1 MiB parts (few messages on a LAN)."""
    from netrl.trainer.delivery import Deliveries
    from netrl.trainer.link import TrainerLink

    link = TrainerLink(PATIENT_NET, "trainer", "s", 1, 8, Deliveries(), None)  # never started: the test reads its pipe
    try:
        actor = TwoTensors("a", 67_500)  # 270 KB, as the default Pendulum actor
        layout, nbytes = flat_layout(actor)
        link.publish(actor, 1, 0)
        flat, sizes = np.zeros(nbytes, np.uint8), []
        for _ in range(-(-nbytes // part_bytes(nbytes))):
            assert link._pipe_in.poll(5000), f"{len(sizes)} parts came"
            msg = decode(link._pipe_in.recv_multipart()[1:])  # after the command head
            chunk = msg.arrays["chunk"]
            flat[msg.body["offset"]:msg.body["offset"] + chunk.nbytes] = chunk
            sizes.append(chunk.nbytes)
        assert msg.body["parts"] == len(sizes) == 4 and max(sizes) <= 68 << 10 and sum(sizes) == nbytes
        assert not link._pipe_in.poll(100)  # nothing more
        got = flat_arrays(flat, layout)
        assert all(np.array_equal(got[k], t.numpy()) for k, t in actor.state_dict().items())
    finally:
        link.halt()
    assert part_bytes(1) == MIN_PART_BYTES and part_bytes(40_000_000) == PART_BYTES == 1 << 20
    for n in (MIN_PART_BYTES * PARTS_PER_VERSION + 1, 4_000_000, PART_BYTES * PARTS_PER_VERSION):
        assert part_bytes(n) % 64 == 0 and -(-n // part_bytes(n)) <= PARTS_PER_VERSION


@pytest.mark.parametrize("n", [20, 300_001])  # a version in one part, and one in several; both with padding
def test_a_trainer_snapshot_reuses_its_buffer_and_views_and_views_another_layout_anew(n: int) -> None:
    from netrl.trainer.delivery import Deliveries
    from netrl.trainer.link import TrainerLink

    link = TrainerLink(PATIENT_NET, "trainer", "s", 1, 8, Deliveries(), None)  # never started: the test reads its pipe

    def published(actor: torch.nn.Module, version: int) -> None:
        link.publish(actor, version, 0)
        layout, nbytes = flat_layout(actor)
        flat = np.zeros(nbytes, np.uint8)
        for _ in range(-(-nbytes // part_bytes(nbytes))):
            frames = link._pipe_in.recv_multipart()  # a copy, as the network thread's send leaves the buffer
            msg = decode(frames[1:])  # after the command head
            flat[msg.body["offset"]:msg.body["offset"] + msg.arrays["chunk"].nbytes] = msg.arrays["chunk"]
            assert msg.body["layout"] in ([], layout)
        got = flat_arrays(flat, layout)
        assert msg.policy_version == version and set(got) == set(actor.state_dict())
        assert all(np.array_equal(got[k], t.numpy()) for k, t in actor.state_dict().items())
        deadline = time.monotonic() + 5
        held = link.sender.snapshots.held
        while not all(t.done for t in held[-1].trackers):  # ZeroMQ lets go of the buffer
            assert time.monotonic() < deadline
            time.sleep(0.01)

    try:
        ab, ba = TwoTensors("a", n), TwoTensors("b", n)
        published(ab, 1)
        first = link.sender.snapshots.held[-1]
        with torch.no_grad():
            ab.a.mul_(-2)
        published(ab, 2)
        assert link.sender.snapshots.held == [first]
        assert len(first.trackers) == -(-first.flat.nbytes // part_bytes(first.flat.nbytes))
        published(ba, 3)  # as many bytes in another layout: the buffer is viewed anew, not written by ab's views
        snap = link.sender.snapshots.held[-1]
        assert snap.flat is first.flat and snap.layout != flat_layout(ab)[0]
        used = np.zeros(snap.flat.nbytes, bool)
        for _, dtype, shape, offset in snap.layout:
            used[offset:offset + np.dtype(dtype).itemsize * int(np.prod(shape))] = True
        assert not used.all() and not snap.flat[~used].any()  # ab's bytes in ba's padding were zeroed
    finally:
        link.halt()


def test_an_actor_off_the_cpu_gets_each_version_checked_apart_and_copied_in(caplog: pytest.LogCaptureFixture) -> None:
    from netrl.worker.weight_receiver import WeightReceiver

    sender = MLPActor(OBS, ACT, hidden_sizes=(16,))
    receiver = WeightReceiver(MLPActor(OBS, ACT, hidden_sizes=(16,)), MLPActor(OBS, ACT, hidden_sizes=(16,)), -1,
                              lambda *_: None)
    receiver._on_cpu = False  # what a CUDA actor makes it: no buffer of its own to assemble in
    current = MLPActor(OBS, ACT, hidden_sizes=(16,))
    for version in (1, 2):
        with torch.no_grad():
            sender.mu.weight.add_(1.0)
        for m in parts_of(sender, version, part_bytes=128):
            receiver(m)
        swapped = receiver.slot.swap(current)
        assert swapped is not None and swapped[0] == version
        current = swapped[2]
        assert all(torch.equal(current.state_dict()[k], t) for k, t in sender.state_dict().items())
    assert not receiver._bound  # nothing was re-pointed: each version was copied into the actor's own tensors
    bad = parts_of(sender, 3, part_bytes=1 << 20)
    chunk = bad[0].arrays["chunk"].copy()
    chunk.view(np.float32)[0] = np.inf
    bad[0].arrays["chunk"] = chunk
    receiver(bad[0])
    assert receiver.version == 2 and "contains NaN or infinity" in caplog.text


class _Tracker:
    done = False


def test_on_a_slow_link_the_trainer_sends_the_newest_version_not_every_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # A trainer publishing faster than its link to the server carries the weights must not queue every version:
    # its memory would grow by megabytes a second, and the workers' weights fall further behind without limit.
    from netrl.trainer.delivery import Deliveries
    from netrl.trainer.link import TrainerLink

    # never started: its commands are called here
    link = TrainerLink(PATIENT_NET, "trainer", "s", 1, 8, Deliveries(), None)
    sent: list[tuple[int, int]] = []  # (version, part) given to the socket
    trackers: list[_Tracker] = []
    full = [False]

    def send_tracked(frames: list[Any]) -> _Tracker | None:
        if full[0]:
            return None
        msg = decode(frames)
        sent.append((msg.policy_version, msg.body["part"]))
        trackers.append(_Tracker())
        return trackers[-1]

    def publish(version: int, parts: int = 1) -> None:
        flat = np.zeros(parts * 64, np.uint8)
        for msg in weight_parts("trainer", "s", version, 0, flat, [["w", "uint8", [parts * 64], 0]], 64):
            link.on_command([zmq.Frame(b) for b in (command_head(Command.WEIGHTS, msg.body["part"], version),
                                                    *encode(msg))])

    monkeypatch.setattr(link.link, "ready", True)
    monkeypatch.setattr(link.link, "send_tracked", send_tracked)
    try:
        publish(1, parts=2)
        assert sent == [(1, 0), (1, 1)]  # the parts of one version go at once
        publish(2)
        publish(3)  # v1 is not written yet: v3 replaces v2, which never goes
        link.on_tick()
        assert sent == [(1, 0), (1, 1)] and link.stats["weights_superseded"] == 1
        trackers[0].done = True
        link.on_tick()
        assert len(sent) == 2  # every part of v1 must be written first
        trackers[1].done = True
        link.on_tick()
        assert sent[2:] == [(3, 0)]
        trackers[2].done = True
        full[0] = True  # the socket's queue is full: a version's parts wait, and go on at the next tick
        publish(4, parts=3)
        full[0] = False
        link.on_tick()
        assert sent[3:] == [(4, 0), (4, 1), (4, 2)] and link.weights_version == 4 and len(link.weights) == 3
    finally:
        link.halt()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.complex64])
def test_an_actor_with_tensors_the_wire_cannot_carry_is_refused_by_name(dtype: torch.dtype) -> None:
    # Unchecked, a bfloat16 actor would stop the trainer at its first publication with numpy's "data type
    # 'bfloat16' not understood"; a complex one would make a layout every worker refuses.
    from netrl.errors import NetrlError
    from netrl.trainer.delivery import Deliveries
    from netrl.trainer.link import TrainerLink

    actor = torch.nn.Linear(3, 2)
    actor.bias.data = actor.bias.data.to(dtype)
    link = TrainerLink(PATIENT_NET, "trainer", "s", 1, 8, Deliveries(), None)  # never started
    try:
        with pytest.raises(NetrlError, match=rf"the actor's tensor 'bias' is {dtype}, which netrl's weights do not"):
            link.publish(actor, 1, 0)
    finally:
        link.halt()


def test_a_slow_disk_never_holds_the_network_thread_and_only_the_newest_waiting_version_is_written() -> None:
    # A network thread that writes each version itself sends no heartbeat while a disk takes 4 s per write: the
    # server would declare the worker lost 7 times in 25 s.
    import threading

    from netrl.worker.weight_receiver import WeightReceiver

    actor = MLPActor(OBS, ACT, hidden_sizes=(8,))
    disk_free, saved = threading.Event(), []

    def save(state: dict[str, torch.Tensor], version: int, session: str) -> None:
        assert disk_free.wait(10)
        saved.append((version, float(state["net.0.bias"][0])))

    receiver = WeightReceiver(actor, MLPActor(OBS, ACT, hidden_sizes=(8,)), -1, save)
    layout, nbytes = flat_layout(actor)
    flat = np.zeros(nbytes, np.uint8)
    t0 = time.monotonic()
    for version in (1, 2, 3):
        with torch.no_grad():
            actor.net[0].bias[0] = version
        snapshot_into(actor, layout, flat)
        for m in weight_msgs(flat, layout, version):
            receiver(m)
        assert receiver.version == version
    assert time.monotonic() - t0 < 2 and not saved  # all three loaded while the disk held the first write
    disk_free.set()
    assert receiver.saved()
    receiver.close()
    assert saved == [(1, 1.0), (3, 3.0)]  # v2 was replaced while it waited; each file holds its own version


def test_compact_encodings_leave_in_parts_of_16_kib_for_the_slow_links_they_go_to() -> None:
    """An int8 version of the Pendulum actor (69 KB) went as a 64 KiB part and a small one: at the
    20 KB/s reno leaves at 100 ms each way and 5% loss, the first part took longer than the worker's
    liveness window, and the worker dropped a healthy connection. Compact encodings (all but
    float32's full version) now go in about 4 parts of at least 16 KiB; float32's are unchanged."""
    from netrl.protocol.weights import MIN_COMPACT_PART_BYTES
    from netrl.trainer.delivery import Deliveries
    from netrl.trainer.link import TrainerLink

    link = TrainerLink(PATIENT_NET, "trainer", "s", 1, 8, Deliveries(), None, weight_format="auto")
    sizes: dict[str, list[int]] = {}
    try:
        link.publish(TwoTensors("a", 67_500), 1, 0)  # 270 KB in float32, as the Pendulum actor
        while link._pipe_in.poll(2000):
            msg = decode(link._pipe_in.recv_multipart()[1:])
            sizes.setdefault(msg.body.get("format", "float32"), []).append(msg.arrays["chunk"].nbytes)
    finally:
        link.halt()
    assert len(sizes["float32"]) == 4 and max(sizes["float32"]) <= 68 << 10  # as before
    for fmt in ("float16", "int8"):
        assert len(sizes[fmt]) == 4 and max(sizes[fmt]) <= 36 << 10, (fmt, sizes[fmt])
    assert max(sizes["int8"]) <= 20 << 10  # 69 KB: each part under a second at 20 KB/s
    assert part_bytes(1, MIN_COMPACT_PART_BYTES) == MIN_COMPACT_PART_BYTES == 16 << 10


def test_every_format_leaves_in_small_parts_while_the_server_counts_a_slow_worker() -> None:
    """A 1M-parameter actor's float32 version (4 MB, parts of 1 MiB) never arrived behind reno at
    100 ms each way and 1% loss with ``weight_format float32``: a part took longer than the worker's
    liveness window, and it reconnected 10 times in 10 s. While the server's heartbeats count a slow
    worker, or one whose rate is not measured yet (the first 1 MiB part outlived the window before
    the worker was found slow), every encoding now leaves in parts of 16 KiB; with none, as before."""
    from netrl.protocol.weights import MAX_SLOW_PARTS, SLOW_PART_BYTES
    from netrl.trainer.delivery import Deliveries
    from netrl.trainer.link import TrainerLink

    link = TrainerLink(PATIENT_NET, "trainer", "s", 1, 8, Deliveries(), None, weight_format="float32")
    sizes: dict[int, list[int]] = {}
    try:
        for version, slow, unmeasured in ((1, 0, 0), (2, 1, 0), (3, 0, 1)):
            link.link.server_stats = {"slow_workers": slow, "unmeasured_workers": unmeasured}
            link.publish(TwoTensors("a", 1_000_000), version, 0)  # 4 MB in float32
            while link._pipe_in.poll(2000):
                msg = decode(link._pipe_in.recv_multipart()[1:])
                sizes.setdefault(msg.policy_version, []).append(msg.arrays["chunk"].nbytes)
    finally:
        link.halt()
    assert len(sizes[1]) == 4 and max(sizes[1]) > 900 << 10  # no slow worker: as before
    total = sum(sizes[1])
    assert max(sizes[2]) == SLOW_PART_BYTES == 16 << 10 and len(sizes[2]) == -(-total // (16 << 10))
    assert sizes[3] == sizes[2]  # a worker whose rate is not measured yet may be on a slow link
    # a version too large for MAX_SLOW_PARTS of 16 KiB: larger parts, the server's bookkeeping bounded
    assert -(-(1 << 30) // part_bytes(1 << 30, slow=True)) <= MAX_SLOW_PARTS
    assert part_bytes(100_000, slow=True) == SLOW_PART_BYTES and part_bytes(100_000) == 64 << 10
