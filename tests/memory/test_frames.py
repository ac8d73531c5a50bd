"""Frame stacks sent one frame at a time: FrameStackCompressor, the frame codecs, and the stacks FrameStackMemory
rebuilds."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Literal

import cv2
import gymnasium
import numpy as np
import pytest
import torch

from netrl.agents.cnn import CNNActor
from netrl.config.sections import Config
from netrl.envs.image import ImageReachEnv
from netrl.memory import frames as frames_module
from netrl.memory.frames import FrameStackCompressor, FrameStackMemory, decode_frame, encode_frame, encoded_capacity
from netrl.pipelines.image import image_pipeline
from netrl.protocol.schema import SampleSchema
from netrl.samples import Buffer, BufferBuilder
from netrl.worker.worker import RolloutWorker
from tests.recording import local_packets, over_the_wire, recorded, same

SMALL = Config(agent=dataclasses.replace(Config().agent, hidden_sizes=[32]))


@pytest.mark.parametrize("codec", ["raw", "png", "jpeg"])
def test_memory_rebuilds_the_stacks_the_env_produced(codec: str) -> None:
    """Episodes end inside packets and across them; the ring wraps; test episodes are skipped."""
    torch.manual_seed(0)
    pipe = image_pipeline(SMALL, codec=codec, quality=90, env_kwargs={"max_steps": 7})  # type: ignore[arg-type]
    env_cls, recorders = recorded(pipe.env_cls)
    worker = RolloutWorker(env_cls, pipe.actor_module_cls, pipe.sample_compressor, min_samples_per_worker_packet=6,
                           overlap=pipe.overlap, seed=2)
    memory = pipe.memory_cls(memory_size=50, batch_size=64, seed=0)
    episodes = [False, False, True, False, False, False, True, False] * 3
    truth = recorders  # filled as the worker runs
    checked: set[bytes] = set()
    errors: list[float] = []
    for buf in local_packets(worker, episodes):
        memory.append_buffer(over_the_wire(buf))
        items: list[tuple[Any, ...]] = [memory.get_transition(i)[:4] for i in range(len(memory))]
        batch = memory.sample()
        items += [(batch.obs[b].numpy(), batch.act[b].numpy(), None, batch.next_obs[b].numpy())
                  for b in range(batch.act.shape[0])]
        for o, a, _r, o2 in items:
            prev, now = truth[0].truth[np.asarray(a).tobytes()]
            checked.add(np.asarray(a).tobytes())
            if codec == "jpeg":
                errors.append(max(np.abs(o.astype(int) - prev).max(), np.abs(o2.astype(int) - now).max()))
            else:
                assert same(o, prev) and same(o2, now)
    steps = sum(not t for t in episodes) * 7
    assert memory.total_appended > 3 * memory.memory_size
    assert len(checked) > 0.9 * steps
    if codec == "jpeg":  # lossy, but the stacks are the right frames in the right order
        assert 0 < np.median(errors) <= 24, np.median(errors)


def test_stacks_never_mix_episodes_even_when_a_packet_starts_mid_episode() -> None:
    """Hand-made rows: frame value = row number, so each stack says which rows it came from."""
    n = 12
    reset = np.zeros(n, bool)
    reset[[0, 5]] = True
    context = np.zeros(n, bool)
    context[:4] = True  # a packet that starts with 4 context rows from an earlier episode
    reset[0] = False  # ... whose first row is not the episode's first: rows 0-4 continue an older episode
    frames = np.arange(n, dtype=np.uint8)[:, None, None] * np.ones((1, 2, 2), np.uint8)
    buf = Buffer(act=np.arange(n, dtype=np.float32)[:, None], obs=frames, rew=np.zeros(n, np.float32),
                 terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), reset=reset, context=context,
                 policy_version=np.zeros(n, np.int64))
    memory = FrameStackMemory(memory_size=100, stack=3)
    memory.append_buffer(buf)
    got = {int(a[0]): ([int(f[0, 0]) for f in o], [int(f[0, 0]) for f in o2])
           for o, a, _r, o2, *_ in (memory.get_transition(i) for i in range(len(memory)))}
    assert got == {
        4: ([1, 2, 3], [2, 3, 4]),  # a packet's first transition reads its context rows
        6: ([5, 5, 5], [5, 5, 6]),  # row 5 starts an episode: no frame of row 4 leaks in
        7: ([5, 5, 6], [5, 6, 7]),
        8: ([5, 6, 7], [6, 7, 8]), 9: ([6, 7, 8], [7, 8, 9]), 10: ([7, 8, 9], [8, 9, 10]),
        11: ([8, 9, 10], [9, 10, 11]),
    }


def test_loss_weights_drop_or_down_weight_stale_transitions() -> None:
    n = 10
    reset = np.zeros(n, bool)
    reset[0] = True
    flags = np.zeros(n, bool)
    weight = np.ones(n, np.float32)
    weight[4], weight[6] = 0.0, 0.5  # the trainer drops row 4's transition and halves row 6's
    buf = Buffer(act=np.arange(n, dtype=np.float32)[:, None], obs=np.zeros((n, 2, 2), np.uint8),
                 rew=np.zeros(n, np.float32), terminated=flags, truncated=flags, reset=reset, context=flags,
                 policy_version=np.zeros(n, np.int64), weight=weight)
    memory = FrameStackMemory(memory_size=100, batch_size=200, stack=2, seed=0)
    memory.append_buffer(buf)
    assert len(memory) == n - 2  # rows 1..9 end transitions, minus the dropped one
    batch = memory.sample()
    acts = batch.act[:, 0].numpy().astype(int)
    assert 4 not in set(acts) and batch.weight is not None
    np.testing.assert_array_equal(batch.weight.numpy(), np.where(acts == 6, 0.5, 1.0))


def test_frame_codecs_round_trip_and_reject_bad_input() -> None:
    frame = (np.arange(64 * 64) % 251).astype(np.uint8).reshape(64, 64)
    data = np.frombuffer(encode_frame(frame, "png"), np.uint8)
    np.testing.assert_array_equal(decode_frame(data, len(data)), frame)
    jpeg = np.frombuffer(encode_frame(frame, "jpeg", quality=50), np.uint8)
    assert decode_frame(jpeg, len(jpeg)).shape == (64, 64)
    with pytest.raises(ValueError, match="neither valid PNG nor JPEG"):
        decode_frame(np.zeros(100, np.uint8), 50)
    with pytest.raises(ValueError, match="codec must be one of"):
        FrameStackCompressor("webp")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="quality"):
        FrameStackCompressor("jpeg", quality=0)
    with pytest.raises(ValueError, match="png_strategy"):
        FrameStackCompressor("png", png_strategy="lzma")  # type: ignore[arg-type]
    clean = ImageReachEnv(noise=0.0).reset(seed=0)[0][-1]  # LZ77 beats RLE on noise-free frames
    assert len(encode_frame(clean, "png", png_strategy="default")) < len(encode_frame(clean, "png"))
    with pytest.raises(ValueError, match="uint8 observation"):
        FrameStackCompressor()(np.zeros(2), np.zeros((4, 8, 8), np.float32), 0.0, False, False, {})
    assert cv2.imdecode(data, cv2.IMREAD_GRAYSCALE) is not None


@pytest.mark.parametrize("codec", ["png", "jpeg"])
def test_every_encoded_frame_fits_its_capacity_whatever_its_shape_and_pixels(codec: Literal["png", "jpeg"]) -> None:
    """The worst cases: noise (uniform, and black-or-white) at JPEG quality 100 or PNG level 0 to 9, and thin or odd
    shapes, whose JPEG blocks are mostly padding (2x640 at quality 100 takes twice 2 * H * W + 1024, a bound that
    leaves the padding out)."""
    rng = np.random.default_rng(0)
    shapes = [(2, 640), (1, 640), (3, 640), (5, 640), (640, 2), (480, 5), (1, 1), (7, 9), (17, 33), (64, 64), (9, 999)]
    options = [{"quality": 100}, {"quality": 90}] if codec == "jpeg" else [
        {"png_level": level, "png_strategy": strategy} for level in (0, 1, 9) for strategy in ("rle", "default")]
    for h, w in shapes:
        for frame in (rng.integers(0, 256, (h, w), dtype=np.uint8), rng.integers(0, 2, (h, w), dtype=np.uint8) * 255):
            for kwargs in options:
                compressor = FrameStackCompressor(codec, **kwargs)
                payload, nbytes = compressor(None, np.stack([frame] * 2), 0.0, False, False, {})[1]
                assert payload.shape == (encoded_capacity(h, w, codec),) and 0 < nbytes <= payload.shape[0]
                assert decode_frame(payload, int(nbytes)).shape == (h, w)
    assert encoded_capacity(64, 64, "png") < encoded_capacity(64, 64, "jpeg") == encoded_capacity(64, 64)


def test_a_jpeg_frame_beyond_its_reserved_bytes_is_sent_at_a_lower_quality_not_refused(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # JPEG's reserve is measured, not a bound (a bound would triple every row): a frame beyond it must not stop
    # the worker mid-run.
    frame = np.random.default_rng(1).integers(0, 256, (64, 64), dtype=np.uint8)
    full = len(encode_frame(frame, "jpeg", 95))
    monkeypatch.setattr(frames_module, "encoded_capacity", lambda h, w, codec="jpeg": full // 2)
    compressor = FrameStackCompressor("jpeg", quality=95)
    with caplog.at_level(logging.WARNING, logger="netrl.memory.frames"):
        for _ in range(3):
            payload, nbytes = compressor(None, np.stack([frame] * 4), 0.0, False, False, {})[1]
            assert payload.shape == (full // 2,) and 0 < nbytes <= full // 2
    decoded = decode_frame(payload, int(nbytes))
    assert decoded.shape == (64, 64) and np.abs(decoded.astype(int) - frame).mean() < 60  # the same frame, coarser
    assert compressor.reencoded == 3
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "took more than the" in warnings[0] and "at JPEG quality 95: sent at quality" in \
        warnings[0]


def test_a_memory_that_knows_its_frame_shape_refuses_another_from_the_first_packet() -> None:
    # Without it, the first packet's frames set the size: a hostile first packet could fix a wrong one, and every
    # honest packet after it would be refused.
    width = encoded_capacity(64, 64)
    small = [encode_frame(np.full((32, 32), 10 * i, np.uint8), "png") for i in range(6)]
    memory = FrameStackMemory(memory_size=100, stack=4, frame_shape=(64, 64))
    with pytest.raises(ValueError, match=r"row 0: an encoded frame declares 32x32 pixels, but the memory takes "
                                         r"\(frame_shape\) 64x64 frames"):
        memory.append_buffer(encoded_packet(small, width))
    memory.append_buffer(encoded_packet([encode_frame(np.full((64, 64), i, np.uint8), "png") for i in range(6)],
                                        width))
    assert len(memory) > 0
    pipeline = image_pipeline(SMALL, size=48)
    assert pipeline.memory_cls(memory_size=100).frame_shape == (48, 48)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"frame_shape must be \(height, width\) in pixels"):
        FrameStackMemory(memory_size=100, stack=4, frame_shape=(64, 0))


def encoded_packet(frames: list[bytes], width: int) -> Buffer:
    """A packet of encoded frames laid out as FrameStackCompressor sends them, in rows of ``width`` bytes."""
    n = len(frames)
    payload, nbytes = np.zeros((n, width), np.uint8), np.array([len(f) for f in frames], np.int32)
    for i, data in enumerate(frames):
        payload[i, :len(data)] = np.frombuffer(data, np.uint8)
    flags = np.zeros(n, bool)
    return Buffer(act=np.arange(n, dtype=np.float32)[:, None], obs=(payload, nbytes), rew=np.zeros(n, np.float32),
                  terminated=flags, truncated=flags, reset=np.arange(n) == 0, context=flags,
                  policy_version=np.zeros(n, np.int64))


def test_frame_headers_are_read_as_libpng_and_libjpeg_read_them() -> None:
    frame = np.random.default_rng(0).integers(0, 256, (37, 70), dtype=np.uint8)
    for codec in ("png", "jpeg"):
        assert frames_module.frame_header(encode_frame(frame, codec)) == (codec, 37, 70)
    jpeg = encode_frame(frame, "jpeg")
    padded = jpeg[:2] + b"\xff\xfe\x00\x07hello" + b"\xff\xff" + jpeg[2:]  # a comment, then a fill byte
    assert frames_module.frame_header(padded) == ("jpeg", 37, 70)
    assert decode_frame(np.frombuffer(padded, np.uint8), len(padded)).shape == (37, 70)
    sof = jpeg.index(b"\xff\xc0")
    unreadable = [b"", b"\x89PNG\r\n\x1a\n" + bytes(40), encode_frame(frame, "png")[:30], jpeg[:sof + 6],
                  jpeg[:sof] + b"\x00" + jpeg[sof:],  # a byte libjpeg would skip as garbage
                  jpeg[:2] + b"\xff\xda\x00\x02" + jpeg[2:],  # a scan before the frame header
                  jpeg[:sof + 5] + b"\x00\x00" + jpeg[sof + 7:]]  # height 0: set after the scan (DNL)
    assert all(frames_module.frame_header(data) is None for data in unreadable)
    huge = jpeg[:sof + 5] + (3000).to_bytes(2, "big") * 2 + jpeg[sof + 9:]
    assert frames_module.frame_header(huge) == ("jpeg", 3000, 3000)


def test_frames_whose_headers_declare_another_size_are_refused_before_any_pixel_is_decoded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A PNG of 3000x3000 zeros takes 8.8 KB: decoded, a 2 KB packet of 60 such rows would make the trainer allocate
    1 GB."""
    decoded: list[int] = []
    real_decode = frames_module.decode_frame

    def counted_decode(payload: np.ndarray, nbytes: int) -> np.ndarray:
        decoded.append(nbytes)
        return real_decode(payload, nbytes)

    monkeypatch.setattr(frames_module, "decode_frame", counted_decode)
    width = encoded_capacity(64, 64)
    good = [encode_frame(np.full((64, 64), 10 * i, np.uint8), "jpeg") for i in range(6)]
    bomb = encode_frame(np.zeros((3000, 3000), np.uint8), "png", png_level=9)
    jpeg = good[0]
    sof = jpeg.index(b"\xff\xc0")
    jpeg_bomb = jpeg[:sof + 5] + (3000).to_bytes(2, "big") * 2 + jpeg[sof + 9:]
    assert len(bomb) < width

    fresh = FrameStackMemory(memory_size=100, stack=4)
    with pytest.raises(ValueError, match=f"row 0: a 3000x3000 png frame does not fit this packet's {width}-byte rows"):
        fresh.append_buffer(encoded_packet([bomb] * 3, width))
    assert decoded == [] and len(fresh) == 0

    memory = FrameStackMemory(memory_size=100, stack=4)
    memory.append_buffer(encoded_packet(good, width))
    stored, decoded[:] = len(memory), []
    for bad in (bomb, jpeg_bomb):
        with pytest.raises(ValueError, match="row 2: an encoded frame declares 3000x3000 pixels, but the memory "
                                             "stores 64x64 frames"):
            memory.append_buffer(encoded_packet([*good[:2], bad, *good[3:]], width))
        assert decoded == [] and len(memory) == stored
    for data, n in [(b"\x89PNG" + bytes(100), 104), (jpeg[:sof], sof), (jpeg, 0), (jpeg, width + 1)]:
        packet = encoded_packet([*good[:3], data, *good[4:]], width)
        packet.obs[1][3] = n
        with pytest.raises(ValueError, match=f"row 3: {n} bytes of an encoded frame are neither valid PNG nor JPEG"):
            memory.append_buffer(packet)
        assert decoded == [] and len(memory) == stored
    with pytest.raises(ValueError, match="row 3: 200 bytes of an encoded frame are neither"):  # its header is fine
        memory.append_buffer(encoded_packet([*good[:3], jpeg[:200], *good[4:]], width))
    decoded[:] = []
    memory.append_buffer(encoded_packet(good, width))  # good frames still decode
    assert len(decoded) == 6 and len(memory) == 2 * stored


def test_a_memory_too_small_for_one_transition_is_refused_by_name() -> None:
    for size in (1, 3, 4):  # a transition of 4-frame stacks reads 5 rows
        with pytest.raises(ValueError, match=rf"memory_size \({size}\) must be larger than stack \(4\)"):
            FrameStackMemory(memory_size=size, stack=4)
    n = 20
    flags = np.zeros(n, bool)
    memory = FrameStackMemory(memory_size=5, stack=4)
    memory.append_buffer(Buffer(act=np.arange(n, dtype=np.float32)[:, None], obs=np.zeros((n, 2, 2), np.uint8),
                                rew=np.zeros(n, np.float32), terminated=flags, truncated=flags,
                                reset=np.arange(n) == 0, context=flags, policy_version=np.zeros(n, np.int64)))
    assert len(memory) == 1  # the smallest memory allowed holds one


class Ticks(gymnasium.Env[np.ndarray, np.ndarray]):
    """16x16 frames whose value says the episode and step (episode 1, step 2: 12); truncated after 3 steps."""

    observation_space = gymnasium.spaces.Box(0, 255, (16, 16), np.uint8)
    action_space = gymnasium.spaces.Box(-1, 1, (2,), np.float32)

    def __init__(self) -> None:
        self.episode = self.t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return np.full((16, 16), 10 * self.episode, np.uint8), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return np.full((16, 16), 10 * self.episode + self.t, np.uint8), 0.0, False, self.t >= 3, {}


def record(env: gymnasium.Env[Any, Any], compressor: FrameStackCompressor, steps: int = 3,
           rows: list[tuple[Any, ...]] | None = None) -> None:
    """Pass one episode's rows through ``compressor`` as a worker records them: the first observation, then steps.
    With ``rows``, append ``(the env's stack, what the compressor passed, reset, terminated, truncated)`` for each."""
    act = np.zeros(2, np.float32)
    obs = env.reset()[0]
    passed = compressor(act, obs, 0.0, False, False, {})
    if rows is not None:
        rows.append((np.array(obs), passed[1], True, False, False))
    for _ in range(steps):
        obs, rew, terminated, truncated, info = env.step(act)
        passed = compressor(act, obs, float(rew), terminated, truncated, info)
        if rows is not None:
            rows.append((np.array(obs), passed[1], False, terminated, truncated))


def test_the_compressor_passes_stacks_as_the_memory_rebuilds_them_after_a_probe_or_a_stopped_episode() -> None:
    env = gymnasium.wrappers.FrameStackObservation(Ticks(), 4)  # padding_type="reset"
    compressor = FrameStackCompressor()
    SampleSchema.from_spaces(env.observation_space, env.action_space, compressor)  # a random stack, as a trainer's
    rows: list[tuple[Any, ...]] = []
    record(env, compressor, rows=rows)
    record(env, compressor, steps=1, rows=rows)  # stopped before its end: the next episode starts unannounced
    for _ in range(3):
        record(env, compressor, rows=rows)
    builder = BufferBuilder(len(rows))
    for i, (_, frame, reset, terminated, truncated) in enumerate(rows):  # each row's action is its index
        builder.add(np.full(1, i, np.float32), frame, 0.0, terminated, truncated, reset, 0)
    memory = FrameStackMemory(memory_size=100, stack=4)
    memory.append_buffer(builder.cut())
    assert len(memory) == len(rows) - 5  # a transition ends at every row but the first of each of the 5 episodes
    for i in range(len(memory)):
        obs, act, _, next_obs, *_ = memory.get_transition(i)
        row = int(act[0])
        np.testing.assert_array_equal(obs, rows[row - 1][0])  # the stacks the env produced, rebuilt exactly
        np.testing.assert_array_equal(next_obs, rows[row][0])


def test_the_compressor_refuses_stacks_the_memory_would_rebuild_otherwise() -> None:
    """Accepted, gymnasium's padding_type="zero" would make FrameStackMemory rebuild 6 of 12 transitions wrong,
    silently."""
    act = np.zeros(2, np.float32)
    zero = gymnasium.wrappers.FrameStackObservation(Ticks(), 4, padding_type="zero")
    compressor = FrameStackCompressor("png")
    compressor(act, zero.reset()[0], 0.0, False, False, {})  # could be a probe: refused once a step continues it
    with pytest.raises(ValueError, match=r"an episode's first observation is not 4 copies of one frame.*"
                                         r"padding_type='reset'"):
        compressor(act, zero.step(act)[0], 0.0, False, False, {})
    compressor = FrameStackCompressor()
    SampleSchema.from_spaces(zero.observation_space, zero.action_space, compressor)
    with pytest.raises(ValueError, match="an episode's first observation is not 4 copies"):
        record(zero, compressor)
    compressor = FrameStackCompressor()
    record(gymnasium.wrappers.FrameStackObservation(Ticks(), 4), compressor)
    with pytest.raises(ValueError, match="an episode's first observation is not 4 copies"):
        record(zero, compressor)  # after an episode's end, refused at once
    newest_first = gymnasium.wrappers.TransformObservation(gymnasium.wrappers.FrameStackObservation(Ticks(), 4),
                                                           lambda obs: obs[::-1], None)
    with pytest.raises(ValueError, match=r"an observation does not continue the previous one \(its first 3 frames"):
        record(newest_first, FrameStackCompressor())


def test_a_worker_whose_env_pads_stacks_with_zeros_stops_at_its_second_row() -> None:
    torch.manual_seed(0)
    worker = RolloutWorker(lambda: gymnasium.wrappers.FrameStackObservation(Ticks(), 4, padding_type="zero"),
                           lambda o, a: CNNActor(o, a, (16,)), FrameStackCompressor(), min_samples_per_worker_packet=1,
                           overlap=4, seed=0)
    with pytest.raises(ValueError, match="an episode's first observation is not 4 copies"):
        list(local_packets(worker, [False]))
    assert worker.produced == 0  # the row of the first step raised, and nothing was sent
