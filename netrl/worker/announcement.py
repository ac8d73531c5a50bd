"""The trainer's collection announcement, which every WEIGHTS body carries (``collect``): the
collection mode and, in sync mode, the fragment length and batch mode
(:mod:`netrl.worker.runners.sync`)."""

from __future__ import annotations

from typing import Any

__all__ = ["check_announcement"]


def check_announcement(collect: Any) -> str | None:
    """What is wrong with a WEIGHTS body's ``collect`` field, or None."""
    if not isinstance(collect, dict) or collect.get("mode") not in ("sync", "async"):
        return f"collect must be a map with mode sync or async (got {collect!r:.80})"
    if collect["mode"] == "sync":
        fragment = collect.get("fragment")
        if type(fragment) is not int or not 1 <= fragment <= 1 << 30:
            return f"collect.fragment must be an integer between 1 and 2**30 (got {fragment!r:.40})"
        if collect.get("batch_mode") not in ("truncate_episodes", "complete_episodes"):
            mode = collect.get("batch_mode")
            return ("collect.batch_mode must be truncate_episodes or complete_episodes "
                    f"(got {mode!r:.40})")
    return None
