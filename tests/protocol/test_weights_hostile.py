"""Hostile weight versions: what a buggy or malicious trainer or server may send on the weight path. The server's
cache refuses them, and a worker rejects them (counted and logged once per version) and keeps its actor: neither
raises, and neither holds much more memory than a version's declared size."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pytest
import torch
import zmq

from netrl.agents.sac import MLPActor
from netrl.errors import MalformedMessage
from netrl.protocol.checks import MAX_LAYOUT_ENTRIES, check_layout
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.weights import flat_layout, snapshot_into
from netrl.protocol.wire import decode, encode, frames_nbytes, weight_parts
from netrl.server.server import Server
from netrl.server.weight_cache import OVERHEAD_ROOM_BYTES, WeightCache
from netrl.worker.weight_receiver import WeightReceiver
from tests.fakes import ACT, OBS, PATIENT_NET, Peer, weights_message

pytestmark = pytest.mark.server(network=PATIENT_NET)  # fake peers that pause up to 2 s stay connected


def part(version: int, i: int, parts: int, offset: int, nbytes: int, layout: list[Any], chunk: np.ndarray,
         session: str = "t") -> Message:
    """One WEIGHTS part, through encode and decode: anything built here passes the wire's own checks."""
    return decode(encode(Message(MsgType.WEIGHTS, "server", policy_version=version, arrays={"chunk": chunk},
                                 body={"trained_steps": 0, "session": session, "part": i, "parts": parts,
                                       "offset": offset, "nbytes": nbytes, "layout": layout})))


def actor() -> torch.nn.Module:
    torch.manual_seed(0)
    return MLPActor(OBS, ACT, hidden_sizes=(8,))


def receiver() -> WeightReceiver:
    return WeightReceiver(actor(), actor(), -1, lambda *_: None)


def good_version(version: int, part_bytes: int = 1 << 20) -> list[Message]:
    layout, nbytes = flat_layout(actor())
    flat = np.zeros(nbytes, np.uint8)
    snapshot_into(actor(), layout, flat)
    return [decode(encode(m)) for m in weight_parts("trainer", "t", version, 0, flat, layout, part_bytes)]


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# -- malformed layouts: the checker, the worker, the server --------------------------------------------------------
BAD_LAYOUTS = {  # layout -> what the rejection says; 64 bytes of buffer
    "a list as dtype": ([["w", ["<f4"], [1], 0]], "has the dtype ['<f4']"),
    "a map as dtype": ([["w", {"f": 4}, [1], 0]], "has the dtype {'f': 4}"),
    "an object dtype": ([["w", "|O", [1], 0]], "has the dtype '|O'"),
    "a number as name": ([[7, "<f4", [1], 0]], "has the name 7"),
    "an empty name": ([["", "<f4", [1], 0]], "has the name ''"),
    "not an entry": ([["w"]], "is not [name, dtype, shape, offset]"),
    "a string as entry": (["w"], "is not [name, dtype, shape, offset]"),
    "a number as shape": ([["w", "<f4", 3, 0]], "has the shape 3"),
    "a negative dimension": ([["w", "<f4", [-1], 0]], "has the shape [-1]"),
    "a bool dimension": ([["w", "<f4", [True], 0]], "has the shape [True]"),
    "a float dimension": ([["w", "<f4", [1.5], 0]], "has the shape [1.5]"),
    "a nested dimension": ([["w", "<f4", [[1]], 0]], "has the shape [[1]]"),
    "too many dimensions": ([["w", "<f4", [1] * 33, 0]], "not a list of at most 32"),
    "a negative offset": ([["w", "<f4", [1], -64]], "has the offset -64"),
    "a float offset": ([["w", "<f4", [1], 0.5]], "has the offset 0.5"),
    "a bool offset": ([["w", "<f4", [1], True]], "has the offset True"),
    "a huge offset": ([["w", "<f4", [1], 2**62]], "lies outside the 64-byte buffer"),
    "a huge shape": ([["w", "<f4", [2**40, 2**40], 0]], "lies outside the 64-byte buffer"),
    "overlapping tensors": ([["a", "<f4", [4], 0], ["b", "<f4", [4], 8]], "tensors 'a' and 'b' overlap"),
    "a name twice": ([["a", "<f4", [1], 0], ["a", "<f4", [1], 32]], "names a tensor listed before it"),
}


@pytest.mark.parametrize("case", sorted(BAD_LAYOUTS))
def test_a_malformed_layout_is_refused_with_a_message_naming_the_problem(case: str) -> None:
    layout, why = BAD_LAYOUTS[case]
    with pytest.raises(MalformedMessage) as info:
        check_layout(layout, 64)
    assert why in str(info.value)


def test_the_layout_check_accepts_what_a_trainer_sends_and_bounds_what_it_reads() -> None:
    layout, nbytes = flat_layout(actor())
    check_layout(layout, nbytes)
    check_layout([["a", "<f4", [4], 0], ["b", "<f4", [4], 16], ["empty", "<f8", [0, 3], 16]], 32)  # touching only
    with pytest.raises(MalformedMessage, match="over the limit"):
        check_layout([[f"t{i}", "|u1", [0], 0] for i in range(MAX_LAYOUT_ENTRIES + 1)], 64)
    with pytest.raises(MalformedMessage, match="non-empty list"):
        check_layout({"w": 1}, 64)
    with pytest.raises(MalformedMessage) as info:
        check_layout([["x" * 10_000, "<f4", [100], 0]], 64)
    assert len(str(info.value)) < 200  # a hostile name is quoted, not copied into the log at length


@pytest.mark.parametrize("case", sorted(BAD_LAYOUTS))
def test_a_worker_rejects_a_version_with_a_malformed_layout_and_keeps_its_actor(
        case: str, caplog: pytest.LogCaptureFixture) -> None:
    rx = receiver()
    for m in good_version(1):
        rx(m)
    assert rx.version == 1
    nbytes = rx.known.nbytes
    layout, why = BAD_LAYOUTS[case]
    stats = rx(part(2, 0, 1, 0, nbytes, layout, np.zeros(nbytes, np.uint8)))  # a list dtype: rejected, not a TypeError
    assert stats["version"] == rx.version == 1 and rx.counts["weights_rejected"] == 1
    assert len(errors(caplog)) == 1 and "rejected weights v2" in errors(caplog)[0]
    assert why.replace("64-byte", f"{nbytes}-byte") in errors(caplog)[0]
    for m in good_version(3):  # the thread goes on: the next good version loads
        rx(m)
    assert rx.version == 3


def cache_add(cache: WeightCache, msg: Message) -> str | None:
    """What the server does with a WEIGHTS part from the trainer."""
    b = msg.body
    return cache.add(msg.policy_version, b["part"], b["parts"], b["offset"], b["nbytes"], msg.arrays["chunk"].nbytes,
                     encode(msg), b["layout"])


def test_the_server_refuses_a_version_with_a_malformed_layout_and_keeps_the_last_good_one() -> None:
    cache = WeightCache(max_bytes=1 << 20)
    assert cache_add(cache, part(1, 0, 1, 0, 64, [["w", "<f4", [16], 0]], np.zeros(64, np.uint8))) is None
    for case, (layout, why) in BAD_LAYOUTS.items():
        problem = cache_add(cache, part(2, 0, 1, 0, 64, layout, np.zeros(64, np.uint8)))
        assert problem is not None and "weights v2 have a bad layout" in problem, case
        assert why in problem, case
        assert cache.version == cache.complete_version == 1 and cache.nparts == 1, case  # not cached, not relayed


def weight_versions(peer: Peer, timeout: float) -> list[int]:
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = peer.recv(0.05)
        if msg is not None and msg.type is MsgType.WEIGHTS:
            out.append(msg.policy_version)
    return out


def test_a_malformed_layout_from_the_trainer_never_reaches_a_worker(
        server: tuple[Server, zmq.Context], caplog: pytest.LogCaptureFixture) -> None:
    srv, ctx = server
    caplog.set_level(logging.WARNING)
    trainer, worker = Peer(ctx, srv.trainer_port, "trainer", "trainer"), Peer(ctx, srv.worker_port, "worker", "w")
    trainer.hello()
    worker.hello()
    trainer.send(weights_message(1, trainer.session))
    assert weight_versions(worker, 0.5) == [1]
    worker.send(Message(MsgType.ACK, "w", body={"seqs": [1]}))
    bad = weights_message(2, trainer.session)
    bad.body["layout"] = [["w", ["<f4"], [1], 0]]  # the audit's case: every worker would die on it
    trainer.send(bad)
    assert weight_versions(worker, 0.5) == []
    assert srv.stats["rejected"] == 1 and srv.snapshot()["weights_version"] == 1
    assert "rejected a message from trainer" in caplog.text and "has the dtype ['<f4']" in caplog.text
    assert "is not checked" not in caplog.text  # the server's frames: the cache read each layout
    late = Peer(ctx, srv.worker_port, "worker", "late")
    late.hello()
    assert weight_versions(late, 0.5) == [1]  # a worker joining later gets the last good version


# -- parts: as many as the version's size and part size make, and memory bounded -----------------------------------
def test_the_server_refuses_parts_that_do_not_match_the_part_size() -> None:
    cache = WeightCache(max_bytes=1 << 30)
    layout = [["w", "<f4", [16], 0]]
    empty = np.zeros(0, np.uint8)
    problem = cache_add(cache, part(1, 0, 1 << 20, 0, 64, layout, empty))  # the audit: 600k empty parts of 64 bytes
    assert problem is not None and "declare 64 bytes, but part 0 is empty" in problem
    for i in range(1, 1000):
        assert "out of order" in str(cache_add(cache, part(1, i, 1 << 20, 0, 64, [], empty)))
    assert cache.parts == [] and cache.held == 0  # nothing of it kept
    problem = cache_add(cache, part(1, 0, 3, 0, 64, layout, np.zeros(32, np.uint8)))
    assert problem is not None and "in 3 parts, but part 0 has 32 bytes: parts of that size make 2" in problem
    assert cache_add(cache, part(2, 0, 4, 0, 128, [["w", "<f4", [32], 0]], np.zeros(32, np.uint8))) is None
    problem = cache_add(cache, part(2, 1, 4, 32, 128, [], np.zeros(16, np.uint8)))  # short, but not the last part
    assert problem is not None and "has 16 bytes; every part but the last has the 32 bytes of part 0" in problem


def test_the_server_counts_bookkeeping_per_part_against_max_weights_bytes() -> None:
    cache = WeightCache(max_bytes=1 << 20)
    nbytes = 1 << 16
    layout = [["w", "|u1", [nbytes], 0]]
    problem = cache_add(cache, part(1, 0, nbytes, 0, nbytes, layout, np.zeros(1, np.uint8)))  # 1-byte parts
    assert problem is not None and "would take over server.max_weights_bytes" in problem and "send larger" in problem
    assert cache.version == -1
    assert cache_add(cache, part(1, 0, 64, 0, nbytes, layout, np.zeros(1024, np.uint8))) is None  # 1 KiB parts: fine


def test_the_server_abandons_a_version_whose_headers_take_too_much_memory() -> None:
    cache = WeightCache(max_bytes=1 << 20)
    assert cache_add(cache, weights_message(1)) is None
    layout, parts = [["w", "|u1", [64 * 40], 0]], 40
    # frames far larger than their parts (the wire bounds every header field of a part but part 0's layout, so
    # this stands for whatever a future field could carry): each part's frames take ~1 MB
    fat = [bytes(1_000_000), bytes(64)]
    problems = [cache.add(2, i, parts, 64 * i, 64 * parts, 64, fat, layout if i == 0 else [])
                for i in range(parts)]
    first = next(i for i, p in enumerate(problems) if p)
    assert "of memory" in str(problems[first]) and 10 < first < 20
    assert cache.version == cache.complete_version == 1  # abandoned: workers get the last complete version
    assert sum(frames_nbytes(f) for f in cache.parts) < (1 << 20) + OVERHEAD_ROOM_BYTES


def test_a_worker_counts_and_logs_a_rejected_version_once_not_per_part(caplog: pytest.LogCaptureFixture) -> None:
    rx = receiver()
    empty = np.zeros(0, np.uint8)
    rx(part(1, 0, 300, 0, 64, [["w", "<f4", [16], 0]], empty))  # the audit: a part 0 it refuses, then 29,999 more
    for i in range(1, 300):
        rx(part(1, i, 300, 0, 64, [], empty))
    assert rx.counts["weights_rejected"] == 1 and rx.counts["weight_parts_dropped"] == 299
    assert len(errors(caplog)) == 1 and "declare 64 bytes in 300 parts, but part 0 has 0 bytes" in errors(caplog)[0]
    msgs = good_version(2, part_bytes=64)
    for m in [msgs[0], *msgs[2:]]:  # part 1 lost: the version is rejected once, its later parts dropped
        rx(m)
    assert rx.counts["weights_rejected"] == 2 and rx.counts["weight_parts_dropped"] == 299 + len(msgs) - 3
    for m in msgs:  # sent again from part 0: a new try
        rx(m)
    assert rx.version == 2 and len(errors(caplog)) == 2


def test_a_worker_logs_a_stream_of_bad_versions_sparingly(caplog: pytest.LogCaptureFixture) -> None:
    rx = receiver()
    nbytes = rx.known.nbytes
    for version in range(1, 151):
        rx(part(version, 0, 1, 0, nbytes, [["w", ["<f4"], [1], 0]], np.zeros(nbytes, np.uint8)))
    assert rx.counts["weights_rejected"] == 150
    assert len(errors(caplog)) == 11 and "(100 rejected so far" in errors(caplog)[-1]  # the first 10, every 100th


def test_a_worker_logs_a_bounded_line_about_tensors_with_very_long_names(caplog: pytest.LogCaptureFixture) -> None:
    rx = receiver()
    nbytes = rx.known.nbytes
    layout = [list(entry) for entry in rx.known.layout]
    layout[0][0] = "x" * 500_000  # well-formed: a name may be long
    rx(part(1, 0, 1, 0, nbytes, layout, np.zeros(nbytes, np.uint8)))
    assert rx.counts["weights_rejected"] == 1 and "unexpected parameter 'xxx" in errors(caplog)[0]
    assert len(errors(caplog)[0]) < 2200


def test_a_worker_remembers_when_recent_versions_loaded_not_all_of_them() -> None:
    rx = receiver()
    rx._KEEP_LOADED_AT = 3
    for version in range(1, 7):
        for m in good_version(version):
            rx(m)
    assert rx.version == 6 and list(rx.loaded_at) == [4, 5, 6]


@pytest.mark.parametrize(("fields", "why"), [
    ({"model": "a b"}, r"weights name the model 'a b', not a valid name"),
    ({"model": "m" * 65}, r"not a valid name"),
    ({"format": "Float32"}, r"weights name the format 'Float32', not a valid format name"),
    ({"format": "f" * 33}, r"not a valid format name"),
    ({"base": 5}, r"weights v5 are a delta against v5, not an earlier version"),
    ({"base": -1}, r"a delta against v-1, not an earlier version"),
    ({"base": 1, "encoded": -1}, r"declare a -1-byte encoding"),
    ({"encoded": 7}, r"a full weights version of 64 bytes declares a 7-byte encoding"),
    ({"crc": 1 << 32}, r"crc 4294967296 is not a 32-bit crc"),
    ({"rank": 256}, r"rank 256 is not between 0 and 255"),
    ({"budget_s": 0.0}, r"budget_s 0.0 is not between 0 and 3600 s"),
])
def test_the_model_and_format_fields_of_weights_are_checked(fields: dict[str, object], why: str) -> None:
    flat = np.zeros(64, np.uint8)
    layout = [["w", "<f4", [16], 0]]
    [good] = weight_parts("trainer", "t", 5, 0, flat, layout, 1 << 20, {"model": "obs_norm", "format": "int8",
                                                                         "base": 4, "encoded": 64, "crc": 7,
                                                                         "rank": 2, "budget_s": 0.5})
    assert decode(encode(good)).body["model"] == "obs_norm"
    [bad] = weight_parts("trainer", "t", 5, 0, flat, layout, 1 << 20, fields)
    with pytest.raises(MalformedMessage, match=why):
        decode(encode(bad))
