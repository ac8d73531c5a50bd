"""Errors raised by netrl, one small tree so callers know what to catch.

::

    NetrlError                  anything netrl raises on purpose
    ├── ConfigError             config.json or a CLI flag is invalid (exit code 2)
    ├── ProtocolError           a message broke the wire contract; the receiver logs, counts and
    │                           drops it
    │   ├── MalformedMessage    bad frame count, header, dtype, shape, size or body field
    │   ├── VersionMismatch     the peer speaks another protocol version
    │   └── RoleViolation       the peer sent a message its role may not send
    ├── SampleRejected          a well-formed sample packet does not match the expected spaces
    ├── PeerLost                a peer stayed silent past its liveness window
    ├── TransportError          a socket could not be bound or connected (says which config key
    │                           to change)
    ├── SecurityError           keys are missing or a setting would expose an unencrypted port
    ├── FolderInUse             another live process holds this run folder or spool folder
    ├── EnvFailure              an env call hung, or a thread of the env died (the worker stops,
    │                           exit code 1)
    ├── CheckpointError         a checkpoint or weights file is missing, torn or does not fit the
    │                           model
    └── TrainingDiverged        training steps kept going non-finite
                                (trainer.max_nonfinite_steps in a row)

Every message says what went wrong and, where there is one, what to do about it.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "ConfigError",
    "EnvFailure",
    "FolderInUse",
    "MalformedMessage",
    "NetrlError",
    "PeerLost",
    "ProtocolError",
    "RoleViolation",
    "SampleRejected",
    "SecurityError",
    "TrainingDiverged",
    "TransportError",
    "VersionMismatch",
]


class NetrlError(Exception):
    """Base class of every error netrl raises on purpose."""


class ConfigError(NetrlError):
    """The configuration is invalid. ``problems`` lists every problem found, one line each."""

    def __init__(self, problems: list[str], source: str = "config") -> None:
        self.problems = list(problems)
        self.source = source
        count = len(self.problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"invalid {source} ({count} problem{'s' if count != 1 else ''})\n{lines}")


class ProtocolError(NetrlError):
    """A received message does not follow the wire protocol."""


class MalformedMessage(ProtocolError):
    """Frames, header, dtypes, shapes, sizes or body fields are invalid."""


class VersionMismatch(ProtocolError):
    """The peer speaks a different protocol version."""

    def __init__(self, theirs: object, ours: int, detail: str = "") -> None:
        self.theirs = theirs
        self.ours = ours
        msg = f"peer speaks netrl protocol {theirs!r}, this process speaks protocol {ours}"
        super().__init__(msg + (f"; {detail}" if detail else ""))


class RoleViolation(ProtocolError):
    """The peer sent a message type that its role is not allowed to send."""


class SampleRejected(NetrlError):
    """A sample packet is well formed but does not fit the observation or action space."""


class PeerLost(NetrlError):
    """A peer stayed silent for longer than its liveness window."""


class TransportError(NetrlError):
    """A socket could not be bound or connected."""


class SecurityError(NetrlError):
    """Keys are missing or invalid, or a setting would expose an unencrypted port."""


class CheckpointError(NetrlError):
    """A checkpoint or weights file is missing, torn or does not match the model."""


class FolderInUse(NetrlError):
    """Another live process holds the run folder or spool folder this process was given (see
    netrl.storage.folderlock)."""


class EnvFailure(NetrlError):
    """An env call did not return within its time limit, or a thread of the process
    (one the env runs) died."""


class TrainingDiverged(NetrlError):
    """Training steps kept making the losses or the agent's state non-finite: each was undone, and
    after ``trainer.max_nonfinite_steps`` of them in a row the trainer stops (exit code 1)."""
