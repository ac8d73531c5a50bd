"""Weight formats: how one version of a model's flat buffer is encoded, the formats known in this
process, and deltas between two versions.

Internal; numpy, zstandard and zlib only (no torch), so the server may import it, although it never
decodes. This module is the registry and the one place a format's user imports from; the parts live
apart::

    weight_format_base   the WeightFormat and Encoder classes, the layout every format works on
    builtin_formats      float32, float16, bfloat16 and int8, and their byte layouts
    weight_deltas        deltas between two encodings (delta_encode, delta_apply) and their crc

A custom format subclasses :class:`WeightFormat` and is made known with :func:`register_format` in
the trainer's process and in every worker's (docs/weights.md); ``network.weight_format`` names a
format or a setting beyond one (:func:`formats_for`).

The calling sequence (the trainer encodes and deltas, the server relays bytes, the worker applies
and decodes)::

    fmt = get_format("int8")
    encoder = fmt.encoder(layout)                    # one per model: int8 keeps its scales
    e1 = encoder.encode(flat_v1)                     # uint8 arrays, fmt.encoded_nbytes(layout) each
    e2 = encoder.encode(flat_v2)
    payload = delta_encode(e1, e2); check = crc(e2)  # trainer
    e2 = delta_apply(e1, payload, encoded=e2.nbytes) # worker: then crc(e2) == check, or need_full
    fmt.decode(e2, layout, out)                      # out: a zeroed flat buffer of the layout
"""

from __future__ import annotations

import threading

from netrl.protocol.builtin_formats import BUILTIN_FORMATS
from netrl.protocol.checks import FORMAT_NAME
from netrl.protocol.weight_deltas import crc, delta_apply, delta_encode
from netrl.protocol.weight_format_base import (
    EXACT_BELOW,
    Encoder,
    FormatError,
    WeightFormat,
    flat_nbytes,
)

__all__ = ["EXACT_BELOW", "FORMAT_NAME", "Encoder", "FormatError", "WeightFormat", "crc",
           "delta_apply", "delta_encode", "flat_nbytes", "format_names", "formats_for", "get_format",
           "register_format", "sends_deltas"]

# network.weight_format beyond a name
# (adaptive: auto's formats, while a worker's link is measured slow; float32 alone otherwise)
_SETTINGS = {"delta": ["float32"], "auto": ["float32", "float16", "int8"],
             "adaptive": ["float32", "float16", "int8"]}
_BUILTIN: dict[str, WeightFormat] = {f.name: f for f in BUILTIN_FORMATS}
_formats: dict[str, WeightFormat] = dict(_BUILTIN)
_lock = threading.Lock()


def register_format(fmt: WeightFormat, replace: bool = False) -> None:
    """Make ``fmt`` known under ``fmt.name`` in this process (trainer and workers;
    the server needs nothing)."""
    if not isinstance(fmt, WeightFormat):
        raise FormatError(f"register_format takes a WeightFormat "
                          f"instance, not {type(fmt).__name__}")
    name = fmt.name
    if not (isinstance(name, str) and FORMAT_NAME.fullmatch(name)):
        raise FormatError(f"the format name {name!r} is not a lower-case letter "
                          f"followed by up to 31 lower-case letters, digits or _")
    if name in _SETTINGS:
        raise FormatError(f"{name!r} is a network.weight_format setting, "
                          f"not a format name: choose another name")
    if type(fmt.rank) is not int or fmt.rank < 0 or not isinstance(fmt.exact, bool):
        raise FormatError(f"format {name!r}: rank must be an int >= 0 (got "
                          f"{fmt.rank!r}) and exact a bool (got {fmt.exact!r})")
    with _lock:
        if name in _BUILTIN:
            raise FormatError(f"{name!r} is a built-in format, which "
                              f"cannot be replaced: choose another name")
        if name in _formats and not replace:
            raise FormatError(f"a format named {name!r} is registered "
                              f"already (pass replace=True to replace it)")
        _formats[name] = fmt


def get_format(name: str) -> WeightFormat:
    """The format registered as ``name`` (FormatError listing the known names otherwise)."""
    fmt = _formats.get(name)
    if fmt is None:
        raise FormatError(f"unknown weight format {str(name)[:40]!r}; known formats: "
                          f"{', '.join(format_names())} (a custom one must be "
                          f"registered with register_format in this process)")
    return fmt


def format_names() -> list[str]:
    """Every format known in this process: the built-ins, then the registered ones."""
    return list(_formats)


def formats_for(setting: str) -> list[str]:
    """The formats the trainer encodes each version in for a ``network.weight_format`` setting."""
    if setting in _SETTINGS:
        return list(_SETTINGS[setting])
    if setting in _formats:
        return [setting]
    raise FormatError(f"network.weight_format is {str(setting)[:40]!r}; choose one of "
                      f"{', '.join([*_SETTINGS, *format_names()])}")


def sends_deltas(setting: str) -> bool:
    """Whether the trainer also sends each version as a delta against the one
    before, for this setting."""
    return setting in _SETTINGS or bool(get_format(formats_for(setting)[0]).deltas)
