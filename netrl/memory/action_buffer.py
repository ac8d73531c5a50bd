"""rtgym's action buffer, dropped by the worker and rebuilt by the memory
(tmrl's tutorial, made exact).

An rtgym env with ``act_in_obs`` appends its last ``L = act_buf_len`` actions to every observation
(oldest first), because actions act with a delay. Those actions are already in the rows (each row's
``act``), so :class:`ActionBufferCompressor` drops them and :class:`ActionBufferMemory` rebuilds
them from the rows' actions, following rtgym's rules (``rtgym/envs/real_time_env.py``)::

    step(a):   buffer.append(a)                      (every row that is not a reset row)
    reset():   reset_act_buf=True:            buffer = [default] * L
               else, last_act_on_reset=False: buffer[-1] = default
                                                     (the last action was never applied)
               else:                          buffer unchanged

With ``reset_act_buf=False`` the buffer carries actions across episodes, so it also holds actions
the memory never sees: those of test episodes (not recorded) or of an env used before this worker
started. The compressor checks every row's buffer against what the memory will rebuild and
flags a *seam* (one byte) where they differ; the memory then never samples a transition whose buffer
reaches back past the seam. The rebuild is thus exact or absent, never wrong.

The memory resolves each buffer entry to the row whose action it is, once per packet, and
stores the distances (``L`` bytes per row); sampling is one gather of the actions. A buffer
can reach ``2L - 1`` rows back (a reset row replaces the action before it), so pipelines
set ``overlap = 2 * act_buf_len - 1``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from netrl.memory.history import MAX_NEED, HistoryMemory
from netrl.memory.views import View
from netrl.samples.columns import Buffer, Spec

__all__ = ["ActionBufferCompressor", "ActionBufferMemory", "act_buf_settings"]

log = logging.getLogger(__name__)


def act_buf_settings(rtgym_config: dict[str, Any]) -> dict[str, Any]:
    """``act_buf_len``, ``reset_act_buf`` and ``last_act_on_reset`` of an rtgym config,
    with rtgym's defaults."""
    if not rtgym_config.get("act_in_obs", True):
        raise ValueError("this rtgym config has act_in_obs=False: "
                         "observations hold no action buffer to compress")
    return {"act_buf_len": int(rtgym_config.get("act_buf_len", 1)),
            "reset_act_buf": bool(rtgym_config.get("reset_act_buf", True)),
            "last_act_on_reset": bool(rtgym_config.get("last_act_on_reset", False))}


def _check_len(act_buf_len: int) -> None:
    if not 1 <= act_buf_len <= MAX_NEED // 2:
        raise ValueError(f"act_buf_len must be between 1 and {MAX_NEED // 2} (got {act_buf_len})")


class ActionBufferCompressor:
    """``sample_compressor`` that replaces the last ``act_buf_len`` observation
    leaves by a one-byte seam flag.

    Stateful: it tracks the buffers of the rows it has seen, so use one instance per worker (a
    trainer that probes it to learn the packet layout, in the same process, costs the first
    episode's first transitions). The arguments must match the env's rtgym config (see
    :func:`act_buf_settings`); if they do not, every row is a seam and a warning says so.
    """

    def __init__(self, act_buf_len: int, reset_act_buf: bool = True, last_act_on_reset: bool = False) -> None:
        _check_len(act_buf_len)
        self.act_buf_len, self.reset_act_buf, self.last_act_on_reset = act_buf_len, reset_act_buf, last_act_on_reset
        self._prev: list[np.ndarray] | None = None  # buffer of the previous recorded row
        self._next_is_reset = True
        self.seams = 0
        self._warned = -math.inf

    def _expected(self, act: np.ndarray, is_reset: bool) -> list[np.ndarray]:
        prev, n = self._prev, self.act_buf_len
        if prev is None or (is_reset and self.reset_act_buf):
            return [act] * n  # a fresh env, or a reset that refills the buffer: all default actions
        if not is_reset:
            return [*prev[1:], act]
        if self.last_act_on_reset:
            return prev
        return [*prev[:-1], act]

    def __call__(self, act: Any, obs: Any, rew: float, terminated: bool, truncated: bool,
                 info: dict[str, Any]) -> tuple[Any, Any, float, bool, bool, dict[str, Any]]:
        n = self.act_buf_len
        if not isinstance(obs, (tuple, list)) or len(obs) <= n:
            raise ValueError(f"ActionBufferCompressor expects a tuple observation "
                             f"ending with {n} actions (got {type(obs).__name__} of "
                             f"length {len(obs) if hasattr(obs, '__len__') else '-'})")
        core, buf = tuple(obs[:-n]), [np.asarray(b) for b in obs[-n:]]
        act_arr = np.asarray(act)
        # the worker records a reset row first and after every episode's end
        is_reset = self._next_is_reset
        expected = self._expected(act_arr, is_reset)
        seam = not all(b.shape == e.shape and np.array_equal(b, e) for b, e in zip(buf, expected, strict=True))
        self.seams += seam
        if seam and not is_reset and time.monotonic() - self._warned > 60:
            self._warned = time.monotonic()
            log.warning("an observation's action buffer does not follow from the "
                        "recorded actions (%d seams so far): its transitions will "
                        "not be sampled; if this repeats, act_buf_len, reset_act_buf or "
                        "last_act_on_reset differ from the env's rtgym config", self.seams)
        self._prev = [b.copy() for b in buf]
        self._next_is_reset = bool(terminated or truncated)
        return act, (*core, np.uint8(seam)), rew, terminated, truncated, info


class ActionBufferMemory(HistoryMemory):
    """Replay memory for rtgym observations compressed by :class:`ActionBufferCompressor`.

    Stores the rows' core observation leaves and actions once, and rebuilds
    ``(*core, *action_buffer)`` per batch. The action must be a single array
    (rtgym's Box action space).

    Args:
        act_buf_len, reset_act_buf, last_act_on_reset: the env's rtgym settings
            (see :func:`act_buf_settings`).
        *args, **kwargs: :class:`~netrl.memory.base.MemoryDataloading`'s arguments.
    """

    def __init__(self, *args: Any, act_buf_len: int = 1, reset_act_buf: bool = True, last_act_on_reset: bool = False,
                 **kwargs: Any) -> None:
        _check_len(act_buf_len)
        self.act_buf_len, self.reset_act_buf, self.last_act_on_reset = act_buf_len, reset_act_buf, last_act_on_reset
        # The buffer is a view of the rows' actions, resolved by rtgym's rules; it
        # reaches 2L - 1 rows back.
        view = View("act_buf", "act", act_buf_len, rule=self._sources, reach=2 * act_buf_len - 1)
        super().__init__(*args, views=[view], **kwargs)

    def _obs_columns(self, buffer: Buffer) -> tuple[Spec, dict[str, np.ndarray]]:
        obs = buffer.obs
        if not isinstance(buffer.act, np.ndarray):
            raise ValueError("ActionBufferMemory needs a single action "
                             "array per row (a Box action space)")
        if not (isinstance(obs, tuple) and len(obs) >= 2 and all(isinstance(o, np.ndarray) for o in obs)
                and obs[-1].dtype == np.uint8 and obs[-1].shape == (len(buffer),)):
            raise ValueError("ActionBufferMemory expects observations "
                             "compressed by ActionBufferCompressor: a flat "
                             "tuple of arrays ending with a uint8 seam flag")
        cols = {f"obs/{i}": leaf for i, leaf in enumerate(obs[:-1])}
        return list(cols), cols

    def _sources(self, buffer: Buffer, length: int) -> np.ndarray:
        """The view's rule, for one env segment: per row and buffer entry (oldest first), how many
        rows back the entry's action is; -1 if unknown."""
        n, seam = len(buffer), np.asarray(buffer.obs[-1]).astype(bool)
        rows = np.arange(n)
        back = np.arange(length - 1, -1, -1)  # entry j is the (L-1-j)-th newest
        reset = np.asarray(buffer.reset, bool)
        # entries before the episode's first row are default actions: that row's action
        if self.reset_act_buf:
            last_reset = np.maximum.accumulate(np.where(reset, rows, -1))
            src_row = rows[:, None] - back[None, :]
            known_reset = last_reset[:, None] >= 0
            src_row = np.where(known_reset, np.maximum(src_row, last_reset[:, None]), src_row)
            # A seam at row s: entries before s (and a reset row's default entries at s)
            # are not what the env had.
            last_seam = np.maximum.accumulate(np.where(seam, rows, -1))[:, None]
            doubtful = (src_row < last_seam) | ((src_row == last_seam) & reset[np.maximum(last_seam, 0)])
            known = (src_row >= 0) & ~((last_seam >= 0) & doubtful)
        else:
            src_row, known = self._carried_sources(buffer, reset, seam)
        offsets = rows[:, None] - src_row
        return np.where(known & (offsets >= 0), offsets, -1)

    def _carried_sources(self, buffer: Buffer, reset: np.ndarray, seam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Buffers carried across episodes (``reset_act_buf=False``), as positions in
        the sequence of pushes.

        Every non-reset row pushes its action at position ``pos`` (1, 2, ...); a reset row
        sits at the position of the row before it and, unless ``last_act_on_reset``, overwrites
        that position with its (default) action. Entry ``j`` of row ``k`` is the last write to
        position ``pos[k] - (L - 1 - j)``.
        """
        n, length = len(buffer), self.act_buf_len
        rows = np.arange(n)
        pos = np.cumsum(~reset)
        writes = np.ones(n, bool) if not self.last_act_on_reset else ~reset
        top = int(pos[-1])
        wpos, wrows = pos[writes], rows[writes]  # positions never decrease along the rows
        # (none in a segment of reset rows alone, e.g. a new env's first packet,
        # when resets write nothing)
        last = np.append(wpos[1:] != wpos[:-1], True)[:len(wpos)]  # the last write to each position
        last_write = np.full(top + 1, -1, np.int64)
        last_write[wpos[last]] = wrows[last]
        # Positions written in this packet start at row 0's (a reset row writes none
        # when last_act_on_reset).
        first_known = int(pos[0]) if not self.last_act_on_reset else 1
        # A seam at row s: positions before it hold actions the memory never saw.
        seam_floor = np.where(seam, pos + (1 if self.last_act_on_reset else 0) * reset, -1)
        floor = np.maximum(np.maximum.accumulate(seam_floor), first_known)
        # a new env: its buffer starts as defaults
        fresh = bool(reset[0] and not buffer.context[0] and not seam[0])
        q = pos[:, None] - np.arange(length - 1, -1, -1)[None, :]
        src_row = np.where(q >= 0, last_write[np.clip(q, 0, top)], -1)
        if not self.last_act_on_reset:
            src_row[:, -1] = rows  # every row writes its own action at its position
        known = (q >= floor[:, None]) & (src_row >= 0)
        before = fresh & (q < first_known) & (floor[:, None] == first_known)
        src_row = np.where(before, 0, src_row)
        return src_row, known | before

    def _observations(self, idx: np.ndarray, windows: dict[str, np.ndarray], tag: str = "") -> tuple[Any, Any]:
        core, next_core = super()._observations(idx, windows, tag)  # the stored leaves, as tuples
        buf = windows["act_buf"]  # (B, L + 1, *act_shape): the row before's buffer, then the row's
        n = self.act_buf_len
        return (*core, *(buf[:, j] for j in range(n))), (*next_core, *(buf[:, j + 1] for j in range(n)))
