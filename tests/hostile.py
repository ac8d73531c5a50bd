"""Hypothesis strategies for hostile messages. Every message drawn here must be rejected by the receiver (exactly
one rejection each), so a fuzz test can compare what it sent with the receiver's counters."""

from __future__ import annotations

import functools
import math
from typing import Any

import lz4.block
import msgpack
import numpy as np
import zstandard
from hypothesis import strategies as st

from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import PROTOCOL_VERSION, encode, samples_message
from netrl.samples import BufferBuilder
from tests.fakes import weights_message

OBS_DIM, ACT_DIM = 3, 1  # the Pendulum layout the test trainer expects


def valid_packet(session: str, seq: int, rows: int = 6, sender: str = "fuzz") -> list[bytes]:
    """A well-formed SAMPLES message with the Pendulum layout, its values within Pendulum's spaces. The values are
    drawn once per session, rows and sender; each seq rewrites only the header's seq and produced: building and
    encoding a packet for each of thousands of examples took a fifth of the fuzz tests' generation."""
    frames = list(_valid_frames(session, rows, sender))
    header = msgpack.unpackb(frames[0])
    header["seq"], header["body"]["produced"] = seq, seq * rows
    return [msgpack.packb(header), *frames[1:]]


@functools.lru_cache(maxsize=64)
def _valid_frames(session: str, rows: int, sender: str) -> tuple[bytes, ...]:
    b = BufferBuilder(rows + 2, 1)
    rng = np.random.default_rng(rows)
    b.add(np.zeros(ACT_DIM, np.float32), rng.uniform(-1, 1, OBS_DIM).astype(np.float32), 0.0, False, False, True, 1)
    for _ in range(rows - 1):
        b.add(rng.uniform(-1, 1, ACT_DIM).astype(np.float32), rng.uniform(-1, 1, OBS_DIM).astype(np.float32),
              float(rng.normal()), False, False, False, 1)
    buf = b.cut()
    assert buf is not None
    return tuple(bytes(f) for f in encode(samples_message(buf, sender, session, 1, rows)))


def _header(frames: list[bytes]) -> dict[str, Any]:
    return msgpack.unpackb(frames[0])


def _with(frames: list[bytes], header: dict[str, Any], data: list[bytes] | None = None) -> list[bytes]:
    return [msgpack.packb(header), *(frames[1:] if data is None else data)]


def _array_index(header: dict[str, Any], name: str) -> int:
    return [a["name"] for a in header["arrays"]].index(name)


@st.composite
def hostile_samples(draw: st.DrawFn, session: str = "hostile") -> list[bytes]:
    """A message a worker might send that the server (or, inside a bundle, the trainer) must reject."""
    frames = valid_packet(session, draw(st.integers(1, 10**6)))
    header = _header(frames)
    kind = draw(st.sampled_from(["random", "truncated", "extra_frame", "version", "dtype", "shape", "huge",
                                 "header_types", "nan", "obs_shape", "body", "unknown_type", "zstd_bomb", "empty"]))
    if kind == "random":
        return draw(st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=4))
    if kind == "empty":
        return [b""]
    if kind == "truncated":
        return frames[:draw(st.integers(1, len(frames) - 1))]
    if kind == "extra_frame":
        return [*frames, draw(st.binary(max_size=64))]
    if kind == "version":
        header["v"] = draw(st.integers(-5, 1000).filter(lambda v: v != PROTOCOL_VERSION))
        return _with(frames, header)
    if kind == "dtype":
        i = draw(st.integers(0, len(header["arrays"]) - 1))
        header["arrays"][i]["dtype"] = draw(st.sampled_from(["|O", "<c8", "|V8", "<M8", "|S5", "object", "", "<f16"]))
        return _with(frames, header)
    if kind == "shape":
        i = draw(st.integers(0, len(header["arrays"]) - 1))
        spec = header["arrays"][i]
        spec["shape"] = [*spec["shape"][:-1], spec["shape"][-1] + draw(st.integers(1, 5))] if spec["shape"] else [2]
        spec["nbytes"] = math.prod(spec["shape"]) * np.dtype(spec["dtype"]).itemsize  # consistent, but the frame lies
        return _with(frames, header)
    if kind == "huge":
        i = draw(st.integers(0, len(header["arrays"]) - 1))
        header["arrays"][i]["shape"] = [draw(st.integers(2**30, 2**39)), draw(st.integers(2**10, 2**20))]
        return _with(frames, header)
    if kind == "header_types":
        bad = {"seq": [-1, "7", 1.5, None, [], 2**63], "sender": [7, None, [], "s" * 300, b"x"],
               "body": [[], "x", None, 3], "arrays": [{}, "x", None, [1]], "policy_version": [-2, "x", None, True],
               "type": [7, None, [], "Samples"], "v": ["1", None, [], 1.5]}
        field = draw(st.sampled_from(sorted(bad)))
        header[field] = draw(st.sampled_from(bad[field]))
        return _with(frames, header)
    if kind == "nan":  # wire-valid, but not finite: the schema check rejects it
        name = draw(st.sampled_from(["obs", "act", "rew"]))
        i = _array_index(header, name)
        arr = np.frombuffer(frames[1 + i], np.float32).copy()
        arr[draw(st.integers(0, arr.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        return _with(frames, header, [*frames[1:1 + i], arr.tobytes(), *frames[2 + i:]])
    if kind == "obs_shape":  # wire-valid, but not the trainer's observation shape
        i = _array_index(header, "obs")
        n = header["body"]["n"]
        extra = draw(st.integers(1, 3))
        header["arrays"][i]["shape"] = [n, OBS_DIM + extra]
        header["arrays"][i]["nbytes"] = n * (OBS_DIM + extra) * 4
        return _with(frames, header, [*frames[1:1 + i], bytes(n * (OBS_DIM + extra) * 4), *frames[2 + i:]])
    if kind == "body":
        change = draw(st.sampled_from([{"n": 999}, {"n": -1}, {"episodes": [[1.0, 2]]}, {"extra": 1},
                                       {"episodes": [[float("nan"), 2, False, 1]]}, {"obs": 5}, {"act": ["act", "act"]},
                                       {"session": 5}, {"produced": "x"}]))
        header["body"].update(change)
        return _with(frames, header)
    if kind == "unknown_type":
        header["type"] = draw(st.text(min_size=1, max_size=12).filter(lambda t: t not in {m.value for m in MsgType}))
        return _with(frames, header)
    # zstd_bomb: a compressed payload that inflates to far more than the array's declared size
    i = _array_index(header, "terminated")
    codec = draw(st.sampled_from(["zstd", "lz4"]))
    header["arrays"][i]["codec"] = codec
    inflated = bytes(draw(st.integers(1 << 10, 1 << 24)))
    bomb = zstandard.ZstdCompressor().compress(inflated) if codec == "zstd" else lz4.block.compress(
        inflated, store_size=False)
    return _with(frames, header, [*frames[1:1 + i], bomb, *frames[2 + i:]])


def role_violations() -> st.SearchStrategy[list[bytes]]:
    """Well-formed messages a worker may not send."""
    return st.sampled_from([
        [bytes(f) for f in encode(weights_message(10**6, session="evil", sender="evil", value=0.0))],
        [bytes(f) for f in encode(Message(MsgType.CREDIT, "evil", body={"bundles": 5}))],
        [bytes(f) for f in encode(Message(MsgType.PROGRESS, "evil", body={"trained_steps": 0, "samples": 0,
                                                                           "wanted": 10**9}))],
        [bytes(f) for f in encode(Message(MsgType.SCHEMA, "evil", body={"act": "act", "obs": "obs",
                                                                         "leaves": [["act", "<f4", [1]],
                                                                                    ["obs", "<f4", [99]]]}))],
    ])


def hostile_worker_messages() -> st.SearchStrategy[list[bytes]]:
    return st.one_of(hostile_samples(), role_violations())


@st.composite
def hostile_server_messages(draw: st.DrawFn) -> list[bytes]:
    """A whole message a compromised server might send the trainer, which it must drop."""
    kind = draw(st.sampled_from(["random", "bad_bundle", "version", "unknown_type", "body"]))
    if kind == "random":
        return draw(st.lists(st.binary(max_size=300), min_size=1, max_size=3))
    frames = [bytes(f) for f in encode(Message(MsgType.PACE, "server", body={"allowance": 1}))]
    header = _header(frames)
    if kind == "bad_bundle":
        header.update(type="bundle", body={"parts": draw(st.lists(st.integers(-3, 50), min_size=1, max_size=4))})
        extra = draw(st.lists(st.binary(max_size=40), max_size=3))
        if 1 + sum(p for p in header["body"]["parts"] if p > 0) == 1 + len(extra) and all(
                p >= 1 for p in header["body"]["parts"]):
            extra.append(b"x")  # make sure the part counts never add up
        return [msgpack.packb(header), *extra]
    if kind == "version":
        header["v"] = draw(st.integers(-5, 1000).filter(lambda v: v != PROTOCOL_VERSION))
    elif kind == "unknown_type":
        header["type"] = draw(st.text(min_size=1, max_size=8).filter(lambda t: t not in {m.value for m in MsgType}))
    else:
        header["body"] = {"allowance": draw(st.sampled_from(["x", 1.5, None, [1]]))}
    return [msgpack.packb(header)]
