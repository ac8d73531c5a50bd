"""Actor weights as files: ``torch.save`` of a state_dict plus a JSON sidecar with its version.

Files are read with ``torch.load(weights_only=True)``, so nothing is unpickled. Writers use a
temporary file per process and thread, then ``os.replace``; see :func:`write_weights_file` for
how the two files stay consistent.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import crc32c
import torch

from netrl.errors import CheckpointError

__all__ = ["policy_run_dir", "read_weights_file", "remove_stale_temps", "torch_load", "torch_save",
           "write_weights_file"]

log = logging.getLogger(__name__)


def torch_save(obj: Any, path: Path) -> None:
    """``torch.save(obj, path)``, raising OSError when the write fails: torch's zip writer
    reports a full disk or a file-size limit as a RuntimeError ("unexpected pos ...") that names
    neither the file nor the cause."""
    try:
        torch.save(obj, path)
    except RuntimeError as exc:
        full = shutil.disk_usage(path.parent).free < (64 << 20)
        raise OSError(errno.ENOSPC if full else errno.EIO,
                      f"{'no space left on the disk' if full else 'the write failed'}: "
                      f"torch.save said {exc}",
                      str(path)) from exc


def torch_load(path: Path, data: bytes | None = None) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU (from ``data``, the file's bytes, when
    the caller has read them). Raises CheckpointError naming the file, with torch's reason cut to
    one line: its own message runs to a dozen lines and advises ``weights_only=False``, which would
    unpickle whatever the file holds."""
    try:
        return torch.load(path if data is None else io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        text = str(exc).strip()
        # a file torch cannot read without unpickling: damaged, or not ours
        if "WeightsUnpickler error:" in text:
            detail = text.split("WeightsUnpickler error:", 1)[1].strip()
            reason = f"not a tensor file netrl wrote ({(detail.splitlines() or ['?'])[0]})"
        elif isinstance(exc, EOFError):
            reason = "the file ends early (empty, or cut short)"
        else:
            reason = (text.splitlines() or [type(exc).__name__])[0].split(". This is an internal", 1)[0]
        raise CheckpointError(f"cannot read {path}: {reason}") from None


def write_weights_file(path: str | Path, module: torch.nn.Module | Mapping[str, torch.Tensor],
                       meta: dict[str, Any]) -> None:
    """Write ``path`` (the state_dict of ``module``, or ``module`` if it is one) and its sidecar
    ``path.json`` (meta: version, session...) so that a reader always labels the weights it finds
    correctly. Raises OSError when a write fails, leaving the previous files as they were.

    Two files cannot be replaced at once, so the sidecar goes first and describes both the new
    file and the one it replaces (that one's whole label, with its ``crc32c``, as ``previous``);
    :func:`read_weights_file` matches the weights file's checksum to one of them. A writer killed
    between the two replaces leaves the old weights, still labelled as the old version, with the old
    version's counts (trained steps, samples...).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # unique per writer
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    side = path.with_name(path.name + ".json")
    tmp_side = side.with_name(f"{side.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        old = _read_sidecar(side)
    # damaged: this write replaces it, and a reader then finds no match
    except (OSError, ValueError):
        old = {}
    previous = {k: v for k, v in old.items() if k != "previous"} if "crc32c" in old else None
    try:
        torch_save(module.state_dict() if isinstance(module, torch.nn.Module) else dict(module), tmp)
        tmp_side.write_text(json.dumps({**meta, "crc32c": crc32c.crc32c(tmp.read_bytes()), "previous": previous},
                                       indent=1))
        os.replace(tmp_side, side)
    except OSError:
        tmp.unlink(missing_ok=True)
        tmp_side.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def _read_sidecar(side: Path) -> dict[str, Any]:
    """The sidecar's map ({} if there is none). Raises ValueError (JSONDecodeError) or OSError."""
    if not side.exists():
        return {}
    meta = json.loads(side.read_text())
    if not isinstance(meta, dict):
        raise ValueError(f"{side} holds a JSON {type(meta).__name__}, not a map")
    return meta


def policy_run_dir(path: str | Path) -> str | None:
    """The run folder a trainer saved the policy at ``path`` from (its sidecar's ``run_dir``);
    None when the sidecar names none (a worker, an older netrl or another program
    wrote it) or cannot be read."""
    try:
        owner = _read_sidecar(Path(path).with_name(Path(path).name + ".json")).get("run_dir")
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, str) else None


_TEMP_NAME = re.compile(r".+\.tmp-\d+-\d+")  # write_weights_file's temporary files


def remove_stale_temps(folder: str | Path, older_than_s: float = 60.0) -> None:
    """Delete the temporary files :func:`write_weights_file` left in ``folder`` when its process
    died mid-write (``*.tmp-<pid>-<thread>``; a live writer's is a second old at most). Never raises
    (glob skips a folder it cannot read)."""
    now = time.time()
    for tmp in Path(folder).glob("*.tmp-*-*"):
        try:
            if _TEMP_NAME.fullmatch(tmp.name) and now - tmp.stat().st_mtime > older_than_s:
                tmp.unlink()
        except OSError:  # gone meanwhile, or not ours to remove: it only takes room
            continue


def read_weights_file(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a weights file and its sidecar. Raises CheckpointError naming the path
    when either is unreadable."""
    path = Path(path)
    try:
        # once: loaded and checksummed from the same bytes, whoever writes the file meanwhile
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    state = torch_load(path, data)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} does not hold a state_dict")
    side = path.with_name(path.name + ".json")
    try:
        meta = _read_sidecar(side)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{side} is unreadable: {exc}") from None
    if "crc32c" in meta:  # else an older netrl wrote it, or the user: taken as it is
        crc = crc32c.crc32c(data)
        previous = meta.get("previous") or {}
        # first: the same weights saved again under a new version have both checksums
        if crc == meta["crc32c"]:
            pass
        elif crc == previous.get("crc32c"):  # the writer stopped between the sidecar
                                             # and the weights
            # (older sidecars kept no more)
            meta = {**previous, "version": previous.get("version", -1)}
        else:
            log.warning("%s does not describe %s (another program changed one of "
                        "them, or a writer stopped twice while saving): its weights "
                        "are taken as of unknown version, with no counts", side, path)
            meta = {}
    return state, meta
