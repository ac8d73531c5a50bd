"""The one results format of every benchmark family: rows, the table printed at the end, the JSON.

A :class:`Row` is one figure of one configuration, beside the baseline it is judged against, and
the settings it ran with. ``python -m benchmarks <family> --json FILE`` writes a JSON list of them::

    [{"family": "relay", "row": "vector, 1 worker, curve", "figure": "samples/s delivered",
      "value": 2402412.0, "unit": "samples/s", "baseline": 4623603.0,
      "baseline_name": "raw ZeroMQ, same path", "ratio": 0.527, "ratio_label": "x",
      "target": ">= 1,000,000 samples/s", "met": true,
      "params": {"kind": "vector", "workers": 1, "repeat": 3, ...},
      "detail": {"raw_samples_s": 9688374.0, "runs": [...], ...}}, ...]

``ratio`` reads the way the row's target does, and ``ratio_label`` says how: ``"x"`` is value over
baseline (a prioritized batch takes 4.03x a uniform one's time), ``"%"`` the same as a percentage
(the relay keeps 52.7% of raw ZeroMQ's rate), ``"x faster"`` and ``"x fewer bytes"`` the baseline
over the value. ``met`` is None where the row has no target. ``detail``
keeps every number the family measured (each repeat, each seed), for the docs' fuller tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Row:
    """One figure of one configuration (see the module docstring for each field)."""

    family: str
    row: str
    figure: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    ratio: float | None = None
    ratio_label: str = "x"
    target: str = ""
    met: bool | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)


def ratio(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline``, or None where either is missing (a run that never got there)."""
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline


def number(value: float | None, unit: str = "") -> str:
    """A value as the table shows it: a share as a percentage, counts with thousands separators."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "share":
        return f"{100 * value:.1f}%"
    size = abs(value)
    whole = size >= 100 and float(value).is_integer()
    text = (f"{value:,.0f}" if size >= 1000 or whole else f"{value:.1f}" if size >= 100
            else f"{value:.2f}" if size >= 1 or size == 0 else f"{value:.3g}")
    return f"{text} {unit}" if unit else text


def table(rows: Sequence[Row]) -> list[str]:
    """The markdown table printed at the end of a run: a line per row."""
    lines = ["| row | figure | value | baseline | ratio | target |", "|---|---|---|---|---|---|"]
    for r in rows:
        base = f"{number(r.baseline, r.unit)} ({r.baseline_name})" if r.baseline is not None else ""
        share = f"{r.ratio:.1%}" if r.ratio is not None and r.ratio_label == "%" else ""
        rat = share or (f"{r.ratio:.2f}{r.ratio_label}" if r.ratio is not None else "")
        verdict = "" if r.met is None else " (met)" if r.met else " (NOT met)"
        lines.append(f"| {r.row} | {r.figure} | {number(r.value, r.unit)} | {base} | {rat} | "
                     f"{r.target}{verdict} |")
    return lines


def write(rows: Sequence[Row], path: Path) -> None:
    """The rows as a JSON list (numpy numbers and tuples turned into JSON's own)."""
    data = [dataclasses.asdict(r) for r in rows]
    path.write_text(json.dumps(data, indent=1, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # a numpy scalar
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"a benchmark row holds a {type(value).__name__}, which JSON cannot: {value!r}")


def machine() -> str:
    """The machine a run measures on, as its figures need saying: CPU, cores, load, Python."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{cpu}, {os.cpu_count()} cores, load average {load:.1f}; "
            f"Python {platform.python_version()}")
