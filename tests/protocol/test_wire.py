"""The wire format: every message type round-trips, and hostile input only ever raises ProtocolError."""

from __future__ import annotations

import os

import msgpack
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netrl.errors import MalformedMessage, ProtocolError, RoleViolation, VersionMismatch
from netrl.protocol.messages import Message, MsgType, check_role
from netrl.protocol.wire import (
    PROTOCOL_VERSION,
    STORED_VERSIONS,
    buffer_from_message,
    decode,
    encode,
    encode_bundle,
    restamp,
    samples_message,
)
from netrl.samples import Buffer, BufferBuilder
from tests.fakes import sample_buffer, weights_message


def samples_frames(n: int = 5, compression: str = "none", image: bool = False) -> list[bytes]:
    msg = samples_message(sample_buffer(n, image), "w1", "abcd", seq=7, produced=42)
    return [bytes(f) for f in encode(msg, compression)]  # type: ignore[arg-type]


def header(frames: list[bytes]) -> dict:
    return msgpack.unpackb(frames[0])


def with_header(frames: list[bytes], **changes: object) -> list[bytes]:
    h = header(frames)
    h.update(changes)
    return [msgpack.packb(h), *frames[1:]]


ALL_MESSAGES = [
    Message(MsgType.HELLO, "w1", body={"role": "worker", "netrl_version": "0.1.0", "worker_id": "w1", "session": "s"}),
    Message(MsgType.WELCOME, "server", body={"server_session": "x", "heartbeat_interval_s": 0.5}),
    Message(MsgType.REJECT, "server", body={"reason": "no"}),
    Message(MsgType.HEARTBEAT, "w1"),
    Message(MsgType.BYE, "w1", body={"reason": "bye"}),
    Message(MsgType.ACK, "trainer", body={"seqs": [1, 2, 3]}),
    Message(MsgType.NACK, "server", body={"seqs": [4], "reason": "spool full", "retry_s": 1.0}),
    Message(MsgType.NACK, "server", body={"seqs": [5], "reason": "another layout", "retry_s": 0, "layout": 7}),
    Message(MsgType.NOTICE, "server", body={"cause": "field 'obs' has dtype <f8", "reason": "packet from w: ..."}),
    Message(MsgType.REVOKE, "server", body={"worker": "w1", "reason": "revoked", "links": 1}),
    Message(MsgType.REVOKE, "operator", body={"worker": "w1", "undo": True}),
    Message(MsgType.LIFT, "trainer", body={"worker": "w1", "ask": 3, "was": True, "packets": 2, "rows": 40,
                                           "hidden": 100, "gone": 0, "reason": "lifted"}),
    Message(MsgType.CREDIT, "trainer", body={"bundles": 4}),
    weights_message(9),
    Message(MsgType.PROGRESS, "trainer", body={"trained_steps": 1, "samples": 2, "wanted": 3}),
    Message(MsgType.PROGRESS, "trainer", body={"trained_steps": 1, "samples": 2, "wanted": 3,
                                               "workers": {"w1": [10, 100, 1, 20]}, "quarantined": {"w2": [5, "why"]}}),
    Message(MsgType.PACE, "server", body={"allowance": 77}),
    Message(MsgType.STATUS, "server", body={"snapshot": {"workers": [{"name": "w", "samples": 3}], "rates": {}}}),
    Message(MsgType.SCHEMA, "trainer", body={"act": "act", "obs": ["obs/0"], "leaves": [["act", "<f4", [2]],
                                                                                         ["obs/0", "|u1", [4, 4]]]}),
]


@pytest.mark.parametrize("msg", ALL_MESSAGES, ids=lambda m: m.type.value)
def test_every_message_type_round_trips(msg: Message) -> None:
    out = decode(encode(msg))
    assert (out.type, out.sender, out.seq, out.policy_version, out.body) == (
        msg.type, msg.sender, msg.seq, msg.policy_version, msg.body)
    assert list(out.arrays) == list(msg.arrays)
    for name, arr in msg.arrays.items():
        np.testing.assert_array_equal(out.arrays[name], arr)
        assert out.arrays[name].dtype == arr.dtype


def test_message_types_are_all_covered() -> None:
    covered = {m.type for m in ALL_MESSAGES} | {MsgType.SAMPLES, MsgType.BUNDLE}
    assert covered == set(MsgType)


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
@pytest.mark.parametrize("image", [False, True])
def test_samples_round_trip_exactly(compression: str, image: bool) -> None:
    buf = sample_buffer(6, image)
    out = buffer_from_message(decode(samples_frames(6, compression, image)))
    assert out.worker == "w1/abcd" and out.seq == 7 and len(out) == 6
    assert out.episodes == buf.episodes
    for got, want in [(out.act, buf.act), (out.rew, buf.rew), (out.terminated, buf.terminated),
                      (out.reset, buf.reset), (out.policy_version, buf.policy_version)]:
        np.testing.assert_array_equal(got, want)
    if image:
        np.testing.assert_array_equal(out.obs, buf.obs)
    else:
        assert isinstance(out.obs, tuple) and len(out.obs) == 2
        for got, want in zip(out.obs, buf.obs, strict=True):
            np.testing.assert_array_equal(got, want)


def test_compression_applies_where_it_pays() -> None:
    frames = samples_frames(50, "zstd", image=True)
    specs = {a["name"]: a["codec"] for a in header(frames)["arrays"]}
    assert specs["obs"] == "zstd"  # integer image data compresses
    assert len(frames[[a["name"] for a in header(frames)["arrays"]].index("obs") + 1]) < 50 * 4 * 16 * 16 / 4
    assert specs["rew"] == "none" and specs["act"] == "none"  # float vectors are not worth it
    noise = Buffer(**{**sample_buffer(50).__dict__, "obs": np.random.default_rng(0).integers(
        0, 255, (50, 4, 16, 16), dtype=np.uint8)})
    noisy = encode(samples_message(noise, "w", "s", 1, 1), "zstd")
    assert {a["name"]: a["codec"] for a in header([bytes(noisy[0])])["arrays"]}["obs"] == "none"  # no gain: raw


def test_without_inflate_compressed_integer_arrays_stay_compressed_and_the_rest_is_checked() -> None:
    """The server's decode: it reads layouts, never image contents; the trainer's full decode checks those."""
    frames = samples_frames(50, "zstd", image=True)
    names = [a["name"] for a in header(frames)["arrays"]]
    full, lazy = decode(frames), decode(frames, inflate=False)
    obs = lazy.arrays["obs"]
    assert obs.shape == full.arrays["obs"].shape and obs.dtype == np.uint8 and not obs.flags.writeable
    assert not obs.any() and full.arrays["obs"].any()  # zeros in place of the (unread) image data
    for name in set(names) - {"obs"}:
        np.testing.assert_array_equal(lazy.arrays[name], full.arrays[name])

    i = names.index("obs") + 1
    corrupt = bytearray(frames[i])
    corrupt[len(corrupt) // 2:] = bytes(len(corrupt) - len(corrupt) // 2)  # a valid zstd header, garbage after it
    damaged = [*frames[:i], bytes(corrupt), *frames[i + 1:]]
    decode(damaged, inflate=False)  # relayed by the server...
    with pytest.raises(MalformedMessage, match="'obs': zstd data does not decompress"):
        decode(damaged)  # ...and rejected by the trainer

    bigger = zstandard.ZstdCompressor().compress(bytes(2 * len(full.arrays["obs"].tobytes())))
    with pytest.raises(MalformedMessage, match="'obs': zstd frame declares"):  # a declared size is checked
        decode([*frames[:i], bigger, *frames[i + 1:]], inflate=False)
    h = header(frames)
    j = names.index("terminated")
    h["arrays"][j]["codec"] = "zstd"  # booleans are always inflated: the server counts steps from them
    with pytest.raises(MalformedMessage, match="'terminated'"):
        decode([msgpack.packb(h), *frames[1:j + 1], zstandard.ZstdCompressor().compress(bytes([2] * 50)),
                *frames[j + 2:]], inflate=False)


def test_bundle_carries_parts_unchanged() -> None:
    parts = [samples_frames(3), samples_frames(4)]
    msg = decode(encode_bundle("server", 5, parts))
    assert msg.type is MsgType.BUNDLE and msg.seq == 5
    assert [len(buffer_from_message(decode(p))) for p in msg.parts] == [3, 4]


def test_builder_packets_are_self_contained() -> None:
    b = BufferBuilder(capacity=10, overlap=1)
    act = np.zeros(1, np.float32)
    b.add(act, np.array([0.0], np.float32), 0.0, False, False, True, 0)
    for i in range(1, 4):
        b.add(act, np.array([float(i)], np.float32), 1.0, False, False, False, 0)
    first = b.cut()
    b.add(act, np.array([4.0], np.float32), 1.0, True, False, False, 0)
    second = b.cut()
    assert first is not None and second is not None
    np.testing.assert_array_equal(first.transition_end, [False, True, True, True])
    # the second packet repeats the last row as context, so its first transition is (3 -> 4)
    np.testing.assert_array_equal(second.obs[:, 0], [3.0, 4.0])
    np.testing.assert_array_equal(second.transition_end, [False, True])


def test_a_leaf_whose_shape_changes_after_the_first_row_is_refused_not_broadcast() -> None:
    # numpy broadcasts a (1,) leaf into a (3,) column: unchecked, an env that returns one bad observation on an
    # episode's last step (which the actor never sees) would store [7, 7, 7] without a word.
    b = BufferBuilder(capacity=10, overlap=1)
    act = np.zeros(2, np.float32)
    b.add(act, (np.zeros(3, np.float32), 1.0), 0.0, False, False, True, 0)
    with pytest.raises(ValueError, match=r"obs/0 has the shape \(1,\) in this step, and \(3,\) in the first"):
        b.add(act, (np.array([7.0], np.float32), 1.0), 1.0, True, False, False, 0)
    with pytest.raises(ValueError, match=r"obs/1 has the shape \(2,\) in this step, and \(\) in the first"):
        b.add(act, (np.zeros(3, np.float32), np.zeros(2)), 1.0, True, False, False, 0)
    with pytest.raises(ValueError, match=r"act has the shape \(\) in this step"):
        b.add(0.5, (np.zeros(3, np.float32), 1.0), 1.0, True, False, False, 0)
    b.add(act, (np.ones(3, np.float32), 2.0), 1.0, True, False, False, 0)  # a good row still goes in
    buf = b.cut()
    assert buf is not None and len(buf) == 2


# -- hostile input -----------------------------------------------------------------------------------------


def test_truncated_frames_are_rejected() -> None:
    frames = samples_frames()
    with pytest.raises(MalformedMessage, match="data frames follow"):
        decode(frames[:-1])
    with pytest.raises(MalformedMessage, match="bytes"):
        decode([*frames[:-1], frames[-1][:-3]])
    with pytest.raises(MalformedMessage):
        decode([frames[0][: len(frames[0]) // 2], *frames[1:]])
    with pytest.raises(MalformedMessage, match="empty"):
        decode([])


@pytest.mark.parametrize("theirs", [1, PROTOCOL_VERSION + 1])  # 1: a netrl from before version 2's optional fields
def test_wrong_version_is_a_version_mismatch_naming_both(theirs: int) -> None:
    assert theirs != PROTOCOL_VERSION
    frames = encode(ALL_MESSAGES[0])
    with pytest.raises(VersionMismatch) as info:
        decode(with_header([bytes(f) for f in frames], v=theirs))
    assert f"protocol {theirs}," in str(info.value) and f"protocol {PROTOCOL_VERSION}" in str(info.value)
    assert "netrl 0.1.0" in str(info.value)


def same_message(got: Message, want: Message) -> None:
    assert (got.type, got.sender, got.seq, got.policy_version, got.body) == (want.type, want.sender, want.seq,
                                                                           want.policy_version, want.body)
    assert got.arrays.keys() == want.arrays.keys()
    for name, arr in want.arrays.items():
        np.testing.assert_array_equal(got.arrays[name], arr)


def test_older_versions_are_read_from_disk_only_and_restamped_for_the_trainer() -> None:
    today = samples_frames()
    v1 = with_header(today, v=1)  # every field version 2 added is optional: the same packet, as netrl 1 wrote it
    with pytest.raises(VersionMismatch):
        decode(v1)  # never from a live peer
    same_message(decode(v1, stored=True), decode(today))
    assert 1 in STORED_VERSIONS and PROTOCOL_VERSION in STORED_VERSIONS
    for unknown in (0, PROTOCOL_VERSION + 1):  # not written by any netrl this one can read
        with pytest.raises(VersionMismatch, match=f"protocol {unknown},"):
            decode(with_header(today, v=unknown), stored=True)
    restamped = restamp(v1)  # the server's spool hands it on like this, for the trainer's live decode
    assert header(restamped)["v"] == PROTOCOL_VERSION and header(restamped) == header(today)
    same_message(decode(restamped), decode(today))
    assert restamped[1:] == v1[1:]
    assert restamp(today) == today and restamp(today)[0] is today[0]  # today's header: not even unpacked
    for unchanged in (with_header(today, v=PROTOCOL_VERSION + 1), with_header(today, v=True), [b"\x00junk"]):
        assert restamp(unchanged) == unchanged  # refused by the trainer as any such message would be


def test_disallowed_dtype_is_rejected() -> None:
    frames = samples_frames()
    h = header(frames)
    h["arrays"][0]["dtype"] = "|O"  # object arrays could smuggle anything
    with pytest.raises(MalformedMessage, match="not allowed"):
        decode([msgpack.packb(h), *frames[1:]])


def test_shape_mismatch_is_rejected() -> None:
    frames = samples_frames()
    h = header(frames)
    h["arrays"][0]["shape"] = [5, 3]
    h["arrays"][0]["nbytes"] = 60
    with pytest.raises(MalformedMessage, match="needs 60 bytes"):
        decode([msgpack.packb(h), *frames[1:]])


def test_oversized_message_is_rejected() -> None:
    frames = samples_frames(100)
    with pytest.raises(MalformedMessage, match="exceeds"):
        decode(frames, max_bytes=1000)


def test_huge_declared_sizes_are_rejected_before_allocating() -> None:
    frames = samples_frames()
    h = header(frames)
    h["arrays"][0]["shape"] = [2**39, 2**30]
    with pytest.raises(MalformedMessage):
        decode([msgpack.packb(h), *frames[1:]])
    # a zstd frame that claims to inflate to 1 GiB while the header declares a few bytes
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (1 << 20))
    h = header(frames)
    h["arrays"][0]["codec"] = "zstd"
    with pytest.raises(MalformedMessage):
        decode([msgpack.packb(h), bomb, *frames[2:]])


def test_the_arrays_of_one_message_cannot_together_inflate_past_the_size_limit() -> None:
    # each array is small on the wire and within the limit alone; together they would take 12x the limit
    limit = 1 << 20
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (limit // 4))
    specs = [{"name": f"a{i}", "dtype": "|u1", "shape": [limit // 4], "codec": "zstd", "nbytes": limit // 4}
             for i in range(12)]
    head = msgpack.packb({"v": PROTOCOL_VERSION, "type": "status", "sender": "s", "seq": 0, "policy_version": 0,
                          "body": {}, "arrays": specs})
    frames = [head, *[bomb] * 12]
    assert sum(len(f) for f in frames) < limit // 50
    with pytest.raises(MalformedMessage, match=r"array 'a4' needs 262144 bytes: with the arrays before it, the "
                                               r"message would take over the 1048576-byte limit"):
        decode(frames, max_bytes=limit)
    four = msgpack.packb({**msgpack.unpackb(head), "arrays": specs[:4]})
    assert len(decode([four, *[bomb] * 4], max_bytes=limit).arrays) == 4  # four fit exactly


def test_header_keys_must_be_strings() -> None:
    h = header(samples_frames())
    h[b""] = 0  # the only bytes key msgpack lets through here (max_bin_len=0): unchecked, it would raise a TypeError
    with pytest.raises(MalformedMessage, match="header keys must be strings"):
        decode([msgpack.packb(h, use_bin_type=True), *samples_frames()[1:]])


def test_policy_versions_are_bounded_so_a_trainer_can_always_number_after_them() -> None:
    from netrl.protocol.messages import MAX_POLICY_VERSION

    buf = sample_buffer()
    buf.policy_version[-1] = MAX_POLICY_VERSION  # the largest any message may name: fine
    decode([bytes(f) for f in encode(samples_message(buf, "w1", "abcd", seq=7, produced=42))])
    buf.policy_version[-1] = 2**63 - 1  # would make the trainer number its weights past int64
    frames = [bytes(f) for f in encode(samples_message(buf, "w1", "abcd", seq=7, produced=42))]
    with pytest.raises(MalformedMessage, match=r"header policy_version 9223372036854775807 is out of range "
                                               r"\(-1 to 2199023255552\)"):
        decode(frames)
    with pytest.raises(MalformedMessage, match=r"column 'policy_version' holds 9223372036854775807, over"):
        decode(with_header(frames, policy_version=0))
    with pytest.raises(MalformedMessage, match=r"policy_version from -1 to 2199023255552"):
        decode(with_header(samples_frames(), body={**header(samples_frames())["body"],
                                                   "episodes": [[-1.0, 5, True, MAX_POLICY_VERSION + 1]]}))
    decode(encode(weights_message(MAX_POLICY_VERSION)))
    with pytest.raises(MalformedMessage, match=r"header policy_version 2199023255553 is out of range"):
        decode(encode(weights_message(MAX_POLICY_VERSION + 1)))


@pytest.mark.parametrize("session", ["", "s" * 65, "a\nforged line", "x" * 1_000_000])
def test_a_session_id_is_a_short_name_in_samples_and_weights(session: str) -> None:
    with pytest.raises(MalformedMessage, match=r"session .* is not a valid id") as err:
        decode(encode(weights_message(1, session=session)))
    assert len(str(err.value)) < 200 and "\n" not in str(err.value)
    body = {**header(samples_frames())["body"], "session": session}
    with pytest.raises(MalformedMessage, match=r"samples session .* is not a valid id"):
        decode(with_header(samples_frames(), body=body))


def test_a_welcome_cannot_announce_a_message_limit_no_config_allows() -> None:
    # a fake server's max_message_bytes of 0 would make a worker drop every packet as too large for the server
    welcome = Message(MsgType.WELCOME, "server", body={"server_session": "x", "heartbeat_interval_s": 0.5,
                                                       "max_message_bytes": 0})
    with pytest.raises(MalformedMessage, match="welcome max_message_bytes 0 is under 65536"):
        decode(encode(welcome))
    welcome.body["max_message_bytes"] = 1 << 16
    assert decode(encode(welcome)).body["max_message_bytes"] == 1 << 16


def test_a_body_number_that_is_not_finite_is_malformed() -> None:
    nack = Message(MsgType.NACK, "server", body={"seqs": [4], "reason": "spool full", "retry_s": float("nan")})
    with pytest.raises(MalformedMessage, match="nack body field 'retry_s' is nan, not a finite number"):
        decode(encode(nack))


def test_random_bytes_are_rejected() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        frames = [os.urandom(int(rng.integers(0, 64))) for _ in range(int(rng.integers(1, 4)))]
        with pytest.raises(ProtocolError):
            decode(frames)


@pytest.mark.parametrize("change", [
    {"type": "launch_missiles"}, {"seq": -1}, {"seq": "7"}, {"sender": "x" * 1000}, {"body": []},
    {"arrays": {}}, {"policy_version": True}, {"extra": 1},
])
def test_bad_header_fields_are_rejected(change: dict) -> None:
    with pytest.raises(MalformedMessage):
        decode(with_header(samples_frames(), **change))


@pytest.mark.parametrize("body_change", [
    {"n": 999}, {"n": "5"}, {"act": 5}, {"obs": ["obs/0", "obs/0"]}, {"episodes": [[1.0, 2]]},
    {"episodes": [[float("nan"), 2, False, 1]]}, {"unexpected": 1}, {"obs": [[[[[[[[[["obs/0"]]]]]]]]]]},
])
def test_bad_sample_bodies_are_rejected(body_change: dict) -> None:
    frames = samples_frames()
    h = header(frames)
    h["body"].update(body_change)
    with pytest.raises(MalformedMessage):
        decode([msgpack.packb(h), *frames[1:]])


@pytest.mark.parametrize("worker_id", ["", "robot 1", "a\n23:59:59.000 W [server 1] forged line", "\x1b[31mred",
                                       "x" * 65, "-starts-with-a-dash", "pc/1"])
def test_a_hello_names_its_worker_with_nothing_that_could_forge_a_log_line(worker_id: str) -> None:
    hello = Message(MsgType.HELLO, "w", body={"role": "worker", "netrl_version": "0.1.0", "worker_id": worker_id,
                                              "session": "s"})
    with pytest.raises(MalformedMessage, match="is not a valid name") as err:
        decode(encode(hello))
    assert "\n" not in str(err.value) and "\x1b" not in str(err.value) and len(str(err.value)) < 200
    hello.body.update(worker_id="w1", role="admin\nforged line")
    with pytest.raises(MalformedMessage, match="neither 'worker' nor 'trainer'"):
        decode(encode(hello))


def test_deeply_nested_header_does_not_crash() -> None:
    h = header(samples_frames())
    h["body"]["obs"] = "PLACEHOLDER"
    nested = b"\x91" * 100_000 + msgpack.packb("obs/0")  # 100k nested one-element arrays (msgpack won't pack it)
    raw = msgpack.packb(h).replace(msgpack.packb("PLACEHOLDER"), nested)
    with pytest.raises(ProtocolError):
        decode([raw, *samples_frames()[1:]])


def test_roles_may_only_send_their_message_types() -> None:
    weights = next(m for m in ALL_MESSAGES if m.type is MsgType.WEIGHTS)
    check_role("trainer", weights)  # a trainer may publish weights
    with pytest.raises(RoleViolation, match="worker may not send weights"):
        check_role("worker", weights)
    with pytest.raises(RoleViolation):
        check_role("trainer", decode(samples_frames()))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_frames_never_raise_anything_but_protocol_errors(data: st.DataObject) -> None:
    frames = samples_frames(4, data.draw(st.sampled_from(["none", "zstd"])), image=data.draw(st.booleans()))
    i = data.draw(st.integers(0, len(frames) - 1))
    raw = bytearray(frames[i])
    for _ in range(data.draw(st.integers(1, 8))):
        if raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    frames[i] = bytes(raw)
    if data.draw(st.booleans()):
        frames = frames[: data.draw(st.integers(0, len(frames)))]
    try:
        msg = decode(frames, inflate=data.draw(st.booleans()))
    except ProtocolError:
        return
    assert msg.type is MsgType.SAMPLES  # a mutation that still decodes must still be a valid packet


def test_threads_compress_and_decompress_with_their_own_zstd_objects() -> None:
    # python-zstandard's (de)compressors must not be shared by threads running at once
    import threading

    from netrl.protocol import codecs

    seen: dict[str, tuple[int, int]] = {}
    failures: list[str] = []

    def work(name: str, seed: int) -> None:
        seen[name] = (id(codecs._compressors.zstd_c), id(codecs._compressors.zstd_d))
        rng = np.random.default_rng(seed)
        for _ in range(50):
            arr = rng.integers(0, 4, 20_000).astype(np.uint8)
            codec, packed = codecs.compress(arr, "zstd")
            out = codecs.decompress("a", codec, memoryview(packed), arr.nbytes) if codec == "zstd" else bytes(packed)
            if out != arr.tobytes():
                failures.append(name)

    threads = [threading.Thread(target=work, args=(f"t{i}", i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert len(set(seen.values())) == 4
