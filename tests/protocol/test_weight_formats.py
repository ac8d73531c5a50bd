"""Weight formats: each round-trips within its promise on real actor layouts, deltas chain bit-exactly, hostile
deltas and encodings raise FormatError, and a format of one's own registers and round-trips."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from netrl.agents.sac import MLPActorCritic
from netrl.errors import ProtocolError
from netrl.protocol import weight_formats as wf
from netrl.protocol.weight_formats import EXACT_BELOW, FormatError, WeightFormat
from netrl.protocol.weights import flat_layout, snapshot_into

LOSSY = ["float16", "bfloat16", "int8"]
FORMATS = ["float32", *LOSSY]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "weights.md"


class Mixed(torch.nn.Module):
    """Every kind of tensor a flat buffer holds: float32 of 2, 3, 1 and 0 dims (one empty, some under 64 elements),
    float64 and integers."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(40, 6)
        self.conv = torch.nn.Parameter(torch.randn(4, 3, 8) * 0.1)  # 96 elements: encoded (64 or more)
        self.temp = torch.nn.Parameter(torch.tensor(0.5))
        self.empty = torch.nn.Parameter(torch.zeros(0, 3))
        self.wide = torch.nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
        self.register_buffer("steps", torch.tensor([2**40 + 3, -7], dtype=torch.int64))
        self.register_buffer("mask", torch.tensor([True, False, True]))


def actor() -> torch.nn.Module:
    obs = gymnasium.spaces.Box(-1, 1, (11,), np.float32)
    act = gymnasium.spaces.Box(-1, 1, (3,), np.float32)
    return MLPActorCritic(obs, act, (64, 64)).actor


def flat_of(module: torch.nn.Module) -> tuple[list[list[Any]], np.ndarray]:
    layout, nbytes = flat_layout(module)
    flat = np.zeros(nbytes, np.uint8)
    snapshot_into(module, layout, flat)
    return layout, flat


def model(kind: str) -> tuple[list[list[Any]], np.ndarray]:
    torch.manual_seed(0)
    module = actor() if kind == "actor" else Mixed()
    with torch.no_grad():  # weights over many magnitudes, signs and float16's subnormal range
        first = next(p for p in module.parameters() if p.dtype == torch.float32 and p.numel() >= 200)
        magnitudes = 10 ** torch.linspace(-10, 4, 200) * torch.where(torch.arange(200) % 3 == 0, -1, 1)
        first.view(-1)[:200] = magnitudes
    return flat_of(module)


def tensors(flat: np.ndarray, layout: list[list[Any]]) -> dict[str, np.ndarray]:
    return {n: np.frombuffer(flat, np.dtype(d), math.prod(s), o).reshape(s) for n, d, s, o in layout}


def int8_parts(encoding: np.ndarray, layout: list[list[Any]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The scales and codes of each float32 tensor in an int8 encoding, viewed as the module docstring lays them
    out (8-byte aligned parts)."""
    parts, at = {}, 0
    for name, dtype, shape, _ in layout:
        size = math.prod(shape)
        if dtype == "<f4" and size >= EXACT_BELOW:
            rows = shape[0] if len(shape) >= 2 else 1
            codes_at = at + -(-4 * rows // 8) * 8
            codes = encoding[codes_at:codes_at + size].view(np.int8)
            parts[name] = (np.frombuffer(encoding, np.float32, rows, at), codes)
            nbytes = codes_at - at + size
        else:
            nbytes = size * np.dtype(dtype).itemsize
        at += -(-nbytes // 8) * 8
    assert at == encoding.nbytes
    return parts


def int8_scales(encoding: np.ndarray, layout: list[list[Any]]) -> dict[str, np.ndarray]:
    return {name: scales for name, (scales, _) in int8_parts(encoding, layout).items()}


def check_promise(fmt: str, original: np.ndarray, decoded: np.ndarray, layout: list[list[Any]],
                  encoding: np.ndarray) -> None:
    """Every element within the format's promise; every other tensor and all padding bit-exact."""
    before, after = tensors(original, layout), tensors(decoded, layout)
    scales = int8_scales(encoding, layout) if fmt == "int8" else {}
    for name, dtype, shape, _ in layout:
        w, d = before[name], after[name]
        if dtype != "<f4" or fmt == "float32" or math.prod(shape) < EXACT_BELOW:  # small tensors travel exact
            assert w.tobytes() == d.tobytes(), name
            continue
        w64, err = w.astype(np.float64), np.abs(d.astype(np.float64) - w)
        if fmt == "float16":
            bound = np.where(np.abs(w64) >= 2**-14, np.abs(w64) * 2**-11, 2**-25)
        elif fmt == "bfloat16":
            bound = np.maximum(np.abs(w64) * 2**-8, 2**-134)
        else:
            s = scales[name].astype(np.float64)
            peak = np.abs(w64.reshape(s.size, -1 if w.size else 0)).max(axis=1, initial=0)
            assert (peak / 127 <= s * (1 + 1e-6)).all() and (s <= 2 * peak / 127 * (1 + 1e-6)).all(), name
            s = s.reshape(-1, *([1] * (w.ndim - 1))) if w.ndim >= 2 else s[0]
            bound = np.broadcast_to(s / 2 + s * 2**-16, w.shape)
        assert (err <= bound).all(), (fmt, name, float((err - bound).max()))
    mask = np.ones(original.nbytes, bool)  # padding: the bytes no tensor covers
    for _, dtype, shape, offset in layout:
        mask[offset:offset + math.prod(shape) * np.dtype(dtype).itemsize] = False
    assert not decoded[mask].any()


@pytest.mark.parametrize("kind", ["actor", "mixed"])
@pytest.mark.parametrize("name", FORMATS)
def test_round_trip_within_the_promise(name: str, kind: str) -> None:
    layout, flat = model(kind)
    fmt = wf.get_format(name)
    encoding = fmt.encoder(layout).encode(flat)
    assert encoding.dtype == np.uint8 and encoding.nbytes == fmt.encoded_nbytes(layout)
    out = np.zeros_like(flat)
    fmt.decode(encoding, layout, out)
    check_promise(name, flat, out, layout, encoding)
    assert fmt.exact == (name == "float32") and fmt.promise
    worst = max(float(np.abs(w.astype(np.float64) - d).max(initial=0))
                for (_, dtype, *_), w, d in zip(layout, tensors(flat, layout).values(), tensors(out, layout).values(),
                                                strict=True) if dtype == "<f4")
    assert fmt.max_error(flat, out, layout) == pytest.approx(worst) and (worst == 0) == fmt.exact


def test_float32_is_the_flat_buffer_itself_and_sizes_follow_the_layout() -> None:
    layout, flat = model("actor")
    assert np.shares_memory(wf.get_format("float32").encoder(layout).encode(flat), flat)
    n = sum(math.prod(s) for _, d, s, _ in layout)
    assert wf.get_format("float16").encoded_nbytes(layout) < n * 2 + 8 * len(layout)
    assert wf.get_format("int8").encoded_nbytes(layout) < flat.nbytes / 3.5


def test_16_bit_rounding_matches_torch_and_keeps_nan() -> None:
    bits = np.random.default_rng(1).integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32)
    w = bits.view(np.float32)
    w = w[np.isfinite(w) & (np.abs(w) < 3e38)]
    w = np.concatenate([w, np.float32([1 + 2**-8, 1 + 3 * 2**-8, -0.0, 2**-140, 65504, 65519.99])])
    layout = [["w", "<f4", [w.size], 0]]
    flat = np.zeros(wf.flat_nbytes(layout), np.uint8)
    flat[:w.nbytes] = w.view(np.uint8)
    ours = wf.get_format("bfloat16").encoder(layout).encode(flat)[:w.size * 2].view(np.uint16)
    assert np.array_equal(ours, torch.from_numpy(w).bfloat16().view(torch.int16).numpy().view(np.uint16))
    small = w[np.abs(w) < 65520]  # what rounds into float16's range
    flat[:] = 0
    flat[:small.nbytes] = small.view(np.uint8)
    half = wf.get_format("float16").encoder(layout).encode(flat)[:small.size * 2].view(np.float16)
    assert np.array_equal(half.view(np.uint16), torch.from_numpy(small).half().numpy().view(np.uint16))
    nan = np.uint32([0x7F800001, 0xFFC00000, 0x7FFFFFFF]).view(np.float32)  # a payload rounding would carry to inf
    flat[:] = 0
    flat[:nan.nbytes] = nan.view(np.uint8)
    for name in ("float16", "bfloat16"):
        fmt = wf.get_format(name)
        out = np.zeros_like(flat)
        fmt.decode(fmt.encoder(layout).encode(flat), layout, out)
        assert np.isnan(out[:nan.nbytes].view(np.float32)).all(), name


@pytest.mark.parametrize(("name", "value"), [("float16", 70000.0), ("float16", -65520.0), ("bfloat16", 3.4e38)])
def test_beyond_the_16_bit_range_raises_naming_tensor_and_value(name: str, value: float) -> None:
    layout, flat = model("mixed")
    tensors(flat, layout)["conv"][2, 1, 0] = value  # a writable view of the flat buffer
    with pytest.raises(FormatError, match=rf"tensor 'conv' holds {re.escape(repr(float(np.float32(value))))}"):
        wf.get_format(name).encoder(layout).encode(flat)


def test_int8_refuses_non_finite_weights() -> None:
    layout, flat = model("mixed")
    tensors(flat, layout)["lin.weight"][3, 2] = np.nan
    with pytest.raises(FormatError, match=r"tensor 'lin.weight' row 3 holds NaN"):
        wf.get_format("int8").encoder(layout).encode(flat)


def test_int8_scales_are_kept_while_rows_stay_in_range() -> None:
    layout, flat = model("actor")
    encoder = wf.get_format("int8").encoder(layout)
    first = encoder.encode(flat.copy())
    scales = int8_scales(first, layout)
    big = next(n for n, d, s, _ in layout if d == "<f4" and len(s) == 2 and s[0] >= 64)
    w = tensors(flat, layout)[big]
    rng = np.random.default_rng(0)
    w += (rng.choice([-1, 1], w.shape) * 0.002 * scales[big][:, None]).astype(np.float32)  # an Adam-like step
    second = encoder.encode(flat.copy())
    assert all(np.array_equal(scales[n], s) for n, s in int8_scales(second, layout).items())
    codes = [np.frombuffer(e, np.int8) for e in (first, second)]
    assert np.mean(codes[0] == codes[1]) >= 0.99
    w[5] *= 3  # grows past 127 * scale: row 5 alone takes a new scale
    w[6] /= 3  # shrinks under half its range: so does row 6
    w[7] = 0
    w[8] *= np.float32(126.9 * scales[big][8] / np.abs(w[8]).max())  # grows within range: keeps its scale, and
    # its peak takes code +-127
    encoding = encoder.encode(flat.copy())
    third, codes = int8_parts(encoding, layout)[big]
    changed = np.flatnonzero(third != scales[big])
    assert list(changed) == [5, 6, 7]
    assert np.abs(codes.reshape(w.shape)[8]).max() == 127
    assert third[5] == pytest.approx(np.abs(w[5]).max() * 1.125 / 127, rel=1e-6) and third[7] == 0
    out = np.zeros_like(flat)
    wf.get_format("int8").decode(encoder.encode(flat.copy()), layout, out)
    assert not tensors(out, layout)[big][7].any()


def versions(layout: list[list[Any]], flat: np.ndarray, n: int, lr: float) -> list[np.ndarray]:
    """n flat buffers, each an Adam-like step after the one before: every float32 weight moves by +-lr."""
    rng, out = np.random.default_rng(2), [flat.copy()]
    for _ in range(n - 1):
        nxt = out[-1].copy()
        for (_, dtype, _, _), t in zip(layout, tensors(nxt, layout).values(), strict=True):
            if dtype == "<f4":
                t += (rng.choice([-1, 1], t.shape) * lr).astype(np.float32)
        out.append(nxt)
    return out


@pytest.mark.parametrize("name", FORMATS)
def test_a_delta_chain_rebuilds_each_encoding_bit_exactly(name: str) -> None:
    layout, flat = model("mixed")
    fmt, flats = wf.get_format(name), versions(layout, flat, 3, 1e-3)
    encoder = fmt.encoder(layout)
    e1, e2, e3 = (encoder.encode(f).copy() for f in flats)
    held = e1.copy()
    for new in (e2, e3):
        payload = wf.delta_encode(held, new)
        held = wf.delta_apply(held, payload, new.nbytes, out=held)  # in place, as a worker keeps one per model
        assert held.tobytes() == new.tobytes() and wf.crc(held) == wf.crc(new)
    out = np.zeros_like(flat)
    fmt.decode(held, layout, out)
    check_promise(name, flats[2], out, layout, held)
    if name == "float32":
        assert out.tobytes() == flats[2].tobytes()


def test_deltas_of_small_changes_compress() -> None:
    torch.manual_seed(0)
    layout, flat = flat_of(actor())  # int8 scales of about 1e-3 for its 64 x 64 layer
    ratios = {}
    for name in ("float32", "int8"):
        encoder = wf.get_format(name).encoder(layout)
        e1, e2 = (encoder.encode(f).copy() for f in versions(layout, flat, 2, 1e-5))
        ratios[name] = e2.nbytes / wf.delta_encode(e1, e2).nbytes
    assert ratios["int8"] > 15 and ratios["float32"] > 1.8, ratios  # measured: 28.8 and 2.4


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=300), st.binary(min_size=1, max_size=300))
def test_delta_round_trips_any_bytes(a: bytes, b: bytes) -> None:
    base = np.frombuffer(a, np.uint8)
    new = np.frombuffer((b * (len(a) // len(b) + 1))[:len(a)], np.uint8)  # any size, 4- and 8-byte tails included
    assert wf.delta_apply(base, wf.delta_encode(base, new), len(a)).tobytes() == new.tobytes()


def zstd(data: bytes, content_size: bool = True) -> bytes:
    return zstandard.ZstdCompressor(level=3, write_content_size=content_size).compress(data)


def test_hostile_deltas_raise_format_error() -> None:
    base = np.arange(1000, dtype=np.uint8)
    good = wf.delta_encode(base, base[::-1].copy()).tobytes()
    cases = {
        "truncated": (good[:len(good) // 2], "does not decompress"),
        "not zstd": (b"\x00" * 40, "not a zstd frame"),
        "a bomb": (zstd(bytes(100_000_000)), "declares 100000000 bytes, but the encoding it makes has 1000"),
        "no size": (zstd(bytes(1000), content_size=False), "declares no size"),
        "trailing data": (good + b"xx", "does not decompress"),
        "another size": (zstd(bytes(2000)), "declares 2000 bytes"),
    }
    lying = bytearray(zstd(bytes(2000)))  # a frame that declares 1000 bytes and inflates to 2000
    assert lying[4] == 0x60
    lying[5:7] = (1000 - 256).to_bytes(2, "little")
    cases["lying header"] = (bytes(lying), "does not decompress to 1000 bytes")
    for case, (payload, message) in cases.items():
        with pytest.raises(FormatError, match=message):
            wf.delta_apply(base, payload, 1000)
        assert issubclass(FormatError, ProtocolError), case
    with pytest.raises(FormatError, match="against a 1000-byte encoding, but the base held has 999 bytes"):
        wf.delta_apply(base[:999].copy(), good, 1000)
    with pytest.raises(FormatError, match="the base has 1000 bytes, the new version 999"):
        wf.delta_encode(base, base[:999].copy())
    corrupt = bytearray(good)
    corrupt[len(corrupt) // 2] ^= 0xFF
    try:  # zstd may not notice a flipped literal: the crc the worker checks does
        assert wf.crc(wf.delta_apply(base, bytes(corrupt), 1000)) != wf.crc(base[::-1].copy())
    except FormatError:
        pass


def test_hostile_encodings_and_layouts_raise_format_error() -> None:
    layout, flat = model("mixed")
    int8 = wf.get_format("int8")
    encoding = int8.encoder(layout).encode(flat)
    out = np.zeros_like(flat)
    with pytest.raises(FormatError, match=f"has {encoding.nbytes} bytes, not {encoding.nbytes - 8}"):
        int8.decode(encoding[:-8].copy(), layout, out)
    with pytest.raises(FormatError, match="cannot decode into a 64-byte buffer"):
        int8.decode(encoding, layout, np.zeros(64, np.uint8))
    bad = encoding.copy()
    int8_scales(bad, layout)["lin.weight"][1] = -1.0  # a view into bad
    with pytest.raises(FormatError, match=r"tensor 'lin.weight': an int8 scale is negative"):
        int8.decode(bad, layout, out)
    bad = encoding.copy()
    int8_parts(bad, layout)["conv"][1][5] = -128
    with pytest.raises(FormatError, match=r"tensor 'conv': an int8 code is -128, outside \[-127, 127\]"):
        int8.decode(bad, layout, out)
    with pytest.raises(FormatError, match=r"layout entry 1 .* has the dtype 'complex'"):
        int8.decode(encoding, [layout[0], ["x", "complex", [2], 64]], out)
    with pytest.raises(FormatError, match="layout must be"):
        wf.get_format("float16").encoder("not a layout")  # type: ignore[arg-type]
    with pytest.raises(FormatError, match=f"has {flat.nbytes - 64} bytes; its layout needs {flat.nbytes}"):
        int8.encoder(layout).encode(flat[:-64].copy())


def test_registry_names_settings_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wf, "_formats", dict(wf._formats))
    assert wf.format_names() == ["float32", "float16", "bfloat16", "int8"]
    assert [f.rank for f in map(wf.get_format, wf.format_names())] == [0, 1, 2, 3]
    assert wf.formats_for("float32") == wf.formats_for("delta") == ["float32"]
    assert wf.formats_for("auto") == ["float32", "float16", "int8"] and wf.formats_for("int8") == ["int8"]
    assert [wf.sends_deltas(s) for s in ("delta", "auto", "float32", "float16", "int8")] == [True, True] + [False] * 3
    with pytest.raises(FormatError, match="unknown weight format 'int4'; known formats: float32, float16, bfloat"):
        wf.get_format("int4")
    with pytest.raises(FormatError,
                       match=r"network.weight_format is 'int4'; choose one of delta, auto, adaptive, float32"):
        wf.formats_for("int4")

    def named(name: Any, **attrs: Any) -> WeightFormat:
        fmt = WeightFormat()
        fmt.name = name
        vars(fmt).update(attrs)
        return fmt

    for name, message in [("Int4", "not a lower-case letter"), ("4bit", "not a lower-case"), ("a" * 33, "not a"),
                          ("auto", "is a network.weight_format setting"), ("delta", "setting"),
                          ("float16", "built-in format, which cannot be replaced")]:
        with pytest.raises(FormatError, match=message):
            wf.register_format(named(name), replace=True)
    with pytest.raises(FormatError, match="rank must be an int >= 0"):
        wf.register_format(named("lossy", rank=-1))
    with pytest.raises(FormatError, match="takes a WeightFormat instance, not str"):
        wf.register_format("int4")  # type: ignore[arg-type]
    wf.register_format(named("int4"))
    with pytest.raises(FormatError, match="'int4' is registered already"):
        wf.register_format(named("int4"))
    wf.register_format(named("int4", rank=5), replace=True)
    assert wf.get_format("int4").rank == 5 and wf.format_names()[-1] == "int4"


def docs_example() -> str:
    text = DOCS.read_text()
    section = text[text.index("## A format of your own"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_the_documented_custom_format_round_trips_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wf, "_formats", dict(wf._formats))
    exec(compile(docs_example(), str(DOCS), "exec"), {})  # registers "float64", a float64 copy of the float32s
    fmt = wf.get_format("float64")
    assert wf.formats_for("float64") == ["float64"] and wf.sends_deltas("float64") and fmt.exact
    layout, flat = model("mixed")
    flats = versions(layout, flat, 2, 1e-3)
    encoder = fmt.encoder(layout)
    e1, e2 = (encoder.encode(f) for f in flats)
    assert e2.nbytes == fmt.encoded_nbytes(layout)
    out = np.zeros_like(flat)
    fmt.decode(wf.delta_apply(e1, wf.delta_encode(e1, e2), e2.nbytes), layout, out)
    assert out.tobytes() == flats[1].tobytes() and fmt.max_error(flats[1], out, layout) == 0.0


@pytest.mark.parametrize("name", LOSSY)
def test_an_actors_action_scale_and_offset_travel_exact_so_its_actions_stay_in_bounds(name: str) -> None:
    # int8 made an action scale of 2.0 into 2.0020, and the server refused the actions beyond [-2, 2] as out of bounds
    from netrl.agents.sac import MLPActor

    actor = MLPActor(gymnasium.spaces.Box(-1, 1, (3,), np.float32), gymnasium.spaces.Box(-2, 1.7, (2,), np.float32))
    layout, nbytes = flat_layout(actor)
    flat = np.zeros(nbytes, np.uint8)
    snapshot_into(actor, layout, flat)
    fmt = wf.get_format(name)
    out = np.zeros(nbytes, np.uint8)
    fmt.decode(fmt.encoder(layout).encode(flat), layout, out)
    before, after = tensors(flat, layout), tensors(out, layout)
    for small in ("act_scale", "act_bias", "mu.bias", "log_std.bias"):
        assert before[small].tobytes() == after[small].tobytes(), small
    assert before["net.2.weight"].tobytes() != after["net.2.weight"].tobytes()  # the weights themselves are encoded
