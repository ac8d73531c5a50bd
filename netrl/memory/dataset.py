"""Datasets of samples on disk: one ``.npz`` file of sample columns, written by :func:`save_dataset`
and read back through a memory's ``dataset_path``. Arrays only: netrl never unpickles, so tmrl's
pickled ``data.pkl`` is refused with a message that says how to convert one.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from netrl.samples.columns import Buffer, flatten, unflatten

__all__ = ["read_dataset", "save_dataset"]

# plus act*, obs*
_DATASET_COLUMNS = ("rew", "terminated", "truncated", "reset", "context", "policy_version")


def _dataset_error(path: str | os.PathLike[str], problem: str) -> str:
    return (f"dataset_path {str(path)!r} {problem}. netrl reads one .npz file of "
            f"sample columns, as written by netrl.memory.save_dataset; it does "
            f"not read tmrl's pickled data.pkl datasets, because netrl never "
            f"unpickles (to reuse one you trust, unpickle it yourself, put "
            f"its rows in a netrl.Buffer and write that with save_dataset)")


def _read_columns(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The columns of a :func:`save_dataset` file, with an error that says
    what to do for anything else."""
    p = Path(path)
    if p.is_dir():
        held = " holding tmrl's data.pkl" if (p / "data.pkl").exists() else ""
        raise ValueError(_dataset_error(path, f"is a folder{held}, not a file"))
    if not p.exists():
        # np.savez (so save_dataset) adds .npz to a path without it
        npz = p.with_name(p.name + ".npz")
        hint = f"did you mean {str(npz)!r}? " if npz.is_file() else ""
        raise FileNotFoundError(_dataset_error(path, f"does not exist ({hint}pass "
                                                     f'dataset_path="" to start with an '
                                                     f"empty memory, as tmrl does when "
                                                     f"its dataset folder is missing)"))
    try:
        loaded = np.load(p, allow_pickle=False)
    # numpy's answer to a pickle (tmrl's data.pkl) and to any file it does not recognise
    except ValueError:
        raise ValueError(_dataset_error(path, "is not an .npz archive of arrays "
                                              "(it is a pickle, such as tmrl's "
                                              "data.pkl, or another format)")) from None
    except (EOFError, zipfile.BadZipFile) as e:
        raise ValueError(_dataset_error(path, f"is not a readable .npz archive ({e})")) from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(_dataset_error(path, "holds a single .npy array, "
                                              "not an .npz archive of columns"))
    with loaded:
        try:
            cols = {k: loaded[k] for k in loaded.files}
        except ValueError:
            raise ValueError(_dataset_error(path, "has a column of Python objects "
                                                  "(pickled data)")) from None
    missing = [c for c in _DATASET_COLUMNS if c not in cols]
    missing += [f"{c} (or {c}/0, {c}/1...)" for c in ("act", "obs")
                if not any(k == c or k.startswith(c + "/") for k in cols)]
    if missing:
        raise ValueError(_dataset_error(path, f"lacks the columns {', '.join(missing)}"))
    return cols


def save_dataset(path: str | os.PathLike[str], buffer: Buffer) -> None:
    """Write ``buffer``'s rows to an ``.npz`` file that a memory's ``dataset_path``
    reads back (arrays only).

    Columns: ``act`` and ``obs`` (or ``act/0``, ``act/1``... for a tuple), ``rew``,
    ``terminated``, ``truncated``, ``reset``, ``context`` and ``policy_version``, as in
    :class:`~netrl.samples.Buffer`, ``extra/<name>`` for each of its extra outputs and
    ``info/<name>`` for each of its info entries. numpy adds ``.npz`` to a path without it.
    """
    act_spec, act_leaves = flatten(buffer.act, "act")
    obs_spec, obs_leaves = flatten(buffer.obs, "obs")
    for prefix, spec in (("act", act_spec), ("obs", obs_spec)):
        if not (isinstance(spec, str) or (isinstance(spec, list) and all(isinstance(s, str) for s in spec))):
            raise ValueError(f"save_dataset stores {prefix} as one array or a flat "
                             f"tuple of arrays, and this buffer's {prefix} is "
                             f"nested as {spec!r}: flatten it into a tuple first")
    columns: dict[str, Any] = {**dict(act_leaves + obs_leaves), **{c: getattr(buffer, c) for c in _DATASET_COLUMNS}}
    columns.update((f"extra/{name}", col) for name, col in (buffer.extra or {}).items())
    columns.update((f"info/{name}", col) for name, col in (buffer.info or {}).items())
    np.savez(path, **columns)


def _spec_from_names(names: list[str], prefix: str) -> Any:
    """Rebuild a flat spec from saved leaf names (``obs`` or ``obs/0``,
    ``obs/1``... one level deep)."""
    if names == [prefix]:
        return prefix
    return sorted(names, key=lambda n: int(n.rsplit("/", 1)[1]) if n.rsplit("/", 1)[1].isdigit() else n)

def read_dataset(path: str | os.PathLike[str]) -> Buffer:
    """The rows of a :func:`save_dataset` file as one :class:`~netrl.samples.Buffer` (see
    :meth:`~netrl.memory.MemoryDataloading.load_dataset` for the errors and dtypes)."""
    cols = _read_columns(path)
    leaves = {k: v.astype(np.float32) if np.issubdtype(v.dtype, np.floating) else v
              for k, v in cols.items() if k.startswith(("act", "obs"))}
    act = unflatten(_spec_from_names([k for k in leaves if k.startswith("act")], "act"), leaves)
    obs = unflatten(_spec_from_names([k for k in leaves if k.startswith("obs")], "obs"), leaves)
    return Buffer(act=act, obs=obs, rew=cols["rew"], terminated=cols["terminated"], truncated=cols["truncated"],
                  reset=cols["reset"], context=cols["context"], policy_version=cols["policy_version"],
                  worker="dataset", extra={k[6:]: v for k, v in cols.items() if k.startswith("extra/")} or None,
                  info={k[5:]: v for k, v in cols.items()
                        if k.startswith("info/")} or None)
