"""A worker's encoded weights (issue 34): versions in another format than float32,
and deltas between versions.

:class:`Encodings` assembles such a version's parts, applies a delta to the encoding of the version
the worker holds (kept per model), checks the crc of the result, and hands the encoding to the
:class:`~netrl.worker.weight_receiver.WeightReceiver`, which decodes it into a spare module and
checks the weights as it checks a float32 version. A version it cannot use (a format this process
does not know, a delta against a version it does not hold, a crc that does not match, an encoding
that does not fit its layout) raises :class:`Refused`: the receiver rejects it, and the worker's ACK
asks the server for a full version (``need_full``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from netrl.protocol.weight_formats import FormatError, WeightFormat, crc, delta_apply, format_names, get_format
from netrl.protocol.weights import WeightAssembler

__all__ = ["Encodings", "Held", "Refused"]

FLOAT32 = "float32"


class Refused(ValueError):
    """A version the worker cannot use; the server should send a full one."""


class Held(NamedTuple):
    """The encoding of the version a worker holds of a model, in the format it
    came in: a delta's base."""

    format: str
    version: int
    encoding: np.ndarray


class Encodings:
    """Assembles one model's encoded versions and deltas (see the module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        self.assembler = WeightAssembler(max_bytes=max_bytes)
        self.held: Held | None = None
        self._format: WeightFormat | None = None  # of the version being assembled

    def add(self, session: str, version: int, body: dict[str, Any], chunk: np.ndarray) -> bool:
        """Take one part; True once the version is complete (then :meth:`take`).
        Raises Refused, or ValueError for parts that do not continue each other
        (as :class:`~netrl.protocol.weights.WeightAssembler`)."""
        if body["part"] == 0:
            self._format = self._known(version, body)
            base = body.get("base")
            if base is not None and (self.held is None or self.held[:2] != (body.get("format", FLOAT32), base)):
                held = "nothing to apply it to" if self.held is None else \
                    f"v{self.held.version} in {self.held.format}"
                raise Refused(f"weights v{version} are a delta against v{base} in "
                              f"{body.get('format', FLOAT32)}, but this worker "
                              f"holds {held}: it asks for a full version")
        self.assembler.add(session, version, body["part"], body["parts"], body["offset"], body["nbytes"],
                           body["layout"], chunk)
        return self.assembler.done

    def take(self, version: int, body: dict[str, Any]) -> tuple[WeightFormat, np.ndarray, list[Any]]:
        """The complete version's format, encoding (a delta applied) and layout, its crc checked."""
        payload, layout = self.assembler.take()
        fmt = self._format
        assert fmt is not None
        try:
            if "base" in body:
                assert self.held is not None  # (checked at part 0)
                encoding = delta_apply(self.held.encoding, payload, body["encoded"])
            else:
                encoding = payload
        except FormatError as exc:
            raise Refused(f"weights v{version} ({fmt.name} delta "
                          f"against v{body['base']}): {exc}") from None
        if "crc" in body:
            got = crc(encoding)
            if got != body["crc"]:
                what = f"the delta against v{body['base']} makes" if "base" in body else "the version is"
                raise Refused(f"weights v{version} in {fmt.name}: {what} an encoding whose "
                              f"crc is {got:#010x}, not the trainer's {body['crc']:#010x}")
        return fmt, encoding, layout

    def keep(self, fmt: str, version: int, encoding: np.ndarray) -> None:
        """Hold ``encoding`` (not written again by anyone) as the base of the next delta."""
        self.held = Held(fmt, version, encoding)

    @staticmethod
    def _known(version: int, body: dict[str, Any]) -> WeightFormat:
        name = body.get("format", FLOAT32)
        try:
            return get_format(name)
        except FormatError:
            raise Refused(f"weights v{version} come in the format {name!r}, "
                          f"which this worker does not know (it knows "
                          f"{', '.join(format_names())}; a custom format must be registered "
                          f"with netrl.protocol.weight_formats.register_format on "
                          f"the workers too)") from None
