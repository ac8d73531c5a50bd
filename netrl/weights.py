"""Actor weights as numpy arrays (for the wire) and as files (``torch.save`` of a state_dict plus a JSON sidecar).

Weights received from the network are checked against the receiving model's parameter names, shapes and dtypes
and for finiteness before anything is loaded. Files are read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import math
import os
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from netrl.errors import CheckpointError

__all__ = ["check_weights", "load_weights", "read_weights_file", "state_arrays", "write_weights_file"]


def state_arrays(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """A snapshot of ``module.state_dict()`` as contiguous numpy arrays (copies: training goes on)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def check_weights(module: torch.nn.Module, arrays: Mapping[str, Any]) -> list[str]:
    """Problems that stop ``arrays`` from loading into ``module``: missing, unexpected, misshapen or non-finite."""
    expected = module.state_dict()
    problems = [f"missing parameter {k!r}" for k in expected if k not in arrays]
    problems += [f"unexpected parameter {k!r}" for k in arrays if k not in expected]
    for name, ref in expected.items():
        got = arrays.get(name)
        if got is None:
            continue
        shape, dtype = tuple(got.shape), str(got.dtype).replace("torch.", "")
        want_dtype = str(ref.dtype).replace("torch.", "")
        if shape != tuple(ref.shape):
            problems.append(f"parameter {name!r} has shape {shape}, the model needs {tuple(ref.shape)}")
        elif dtype != want_dtype:
            problems.append(f"parameter {name!r} has dtype {dtype}, the model needs {want_dtype}")
        elif ref.dtype.is_floating_point and not _finite(np.asarray(got)):
            problems.append(f"parameter {name!r} contains NaN or infinity")
    return problems


def _finite(arr: np.ndarray) -> bool:
    """All elements finite, in one pass with no temporary array: a float64 sum is non-finite iff an element is
    (float32 or float16 values cannot overflow a float64 sum of any realistic length)."""
    return math.isfinite(float(arr.sum(dtype=np.float64)))


def load_weights(module: torch.nn.Module, arrays: Mapping[str, Any], assign: bool = False) -> None:
    """Load checked arrays into ``module`` (call :func:`check_weights` first).

    With ``assign`` (CPU modules only), the module's tensors become views of ``arrays`` instead of copies: the
    worker loads received weights that way, with no copy, since nothing writes to an inference actor.
    """
    with warnings.catch_warnings():  # received frames are read-only buffers; inference never writes to them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        state = {k: torch.as_tensor(np.asarray(v)) for k, v in arrays.items()}
        on_cpu = all(t.device.type == "cpu" for t in module.state_dict().values())
        module.load_state_dict(state, assign=assign and on_cpu)


def write_weights_file(path: str | Path, module: torch.nn.Module, meta: dict[str, Any]) -> None:
    """Atomically write ``path`` (state_dict) and ``path.json`` (meta: version, session...)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")  # unique per writer
    torch.save(module.state_dict(), tmp)
    os.replace(tmp, path)
    side = path.with_name(path.name + ".json")
    tmp_side = side.with_name(f"{side.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp_side.write_text(json.dumps(meta, indent=1))
    os.replace(tmp_side, side)


def read_weights_file(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a weights file and its sidecar. Raises CheckpointError naming the path when either is unreadable."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"could not read weights file {path}: {exc}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} does not hold a state_dict")
    side = path.with_name(path.name + ".json")
    meta: dict[str, Any] = {}
    if side.exists():
        try:
            meta = json.loads(side.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{side} is not valid JSON: {exc}") from None
    return state, meta
