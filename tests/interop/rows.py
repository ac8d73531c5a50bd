"""Memories fed as a worker feeds them: rows through the real BufferBuilder, cut into packets.

Row ``k`` (counted from 0 over the whole stream) says which row it is: its observation and action
are functions of ``k``, its reward ``k / 8``; episodes are ``episode`` rows long, a reset row first,
the last one terminated (or truncated, every third episode)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from netrl.samples import BufferBuilder, ExtraSpec


def vector_obs(k: int) -> np.ndarray:
    return np.array([k, -k, k % 5], np.float32)


def box_act(k: int) -> np.ndarray:
    return np.array([k / 100.0], np.float32)


def feed(
    memory: Any,
    rows: int = 100,
    obs: Callable[[int], Any] = vector_obs,
    act: Callable[[int], Any] = box_act,
    extra: ExtraSpec | None = None,
    extras: Callable[[int], dict[str, Any]] | None = None,
    info: ExtraSpec | None = None,
    infos: Callable[[int], dict[str, Any]] | None = None,
    episode: int = 7,
    packet: int = 10,
    overlap: int = 1,
) -> Any:
    builder = BufferBuilder(packet + overlap + 2, overlap=overlap, extra=extra)
    builder.info = dict(info or {})
    for k in range(rows):
        step = k % episode
        end = step == episode - 1
        truncated = end and (k // episode) % 3 == 2
        builder.add(
            act(k),
            obs(k),
            k / 8,
            end and not truncated,
            truncated,
            step == 0,
            0,
            None if extras is None else extras(k),
            None if infos is None else infos(k),
        )
        if len(builder) >= packet:
            buffer = builder.cut()
            assert buffer is not None
            memory.append_buffer(buffer)
    buffer = builder.cut()
    if buffer is not None:
        memory.append_buffer(buffer)
    return memory
