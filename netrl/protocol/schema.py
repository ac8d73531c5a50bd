"""What a sample packet must look like: the layout the trainer expects, checked at
the server and the trainer.

The trainer derives a :class:`SampleSchema` from its observation and action spaces, passed
through the pipeline's sample compressor, from the extra outputs its actor declares (leaves
``extra/<name>``) and from the env info entries its pipeline declares (leaves ``info/<name>``), and
sends it to the server (SCHEMA message). Both check every packet against it: the act/obs trees, the
extra outputs and info entries (none missing, none undeclared), each leaf's dtype and
per-row shape, and the values (:class:`~netrl.samples.value_limits.ValueLimits`): floating-point
data (observations, actions, rewards, extra outputs) finite, float leaves within the bounds of the
spaces, rewards within ``trainer.max_abs_reward``. A packet that fails names the worker, the field,
the row and the value, and is rejected and counted; the rest of the traffic is unaffected.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from netrl.errors import MalformedMessage, ProtocolError, SampleRejected
from netrl.protocol.codecs import Codec
from netrl.protocol.wire import buffer_from_message, decode, encode, samples_message
from netrl.samples.columns import (
    EXTRA_NAME,
    MAX_EXTRAS,
    Buffer,
    ExtraSpec,
    Spec,
    check_extra_spec,
    flatten,
    spec_leaves,
)
from netrl.samples.info import MAX_INFO_KEYS, InfoSpec
from netrl.samples.spaces import carried_sample
from netrl.samples.value_limits import ValueLimits

# spaces come from the trainer's env: the server, which only checks packets, never loads gymnasium
if TYPE_CHECKING:
    import gymnasium

__all__ = ["LayoutMismatch", "SampleSchema", "WireRoute", "load_schema", "probe_copy", "save_schema"]

log = logging.getLogger(__name__)

# The usual cause of a packet that does not fit: the trainer derives its layout from
# the workers' sample compressor
_SAME_ACTOR = (" (ActorModule.extra_outputs() declares them: do the "
               "worker and the trainer run the same actor class?)")
_SAME_INFO = (" (the pipeline's info_keys declare them: do the worker and the trainer run "
              "the same pipeline, with the same env.info_keys?)")
_SAME_COMPRESSOR = (" (do the worker and the trainer use the same pipeline "
                    "and sample compressor? In Python, give the Trainer the "
                    "workers' compressor: Trainer(..., sample_compressor=...))")
# the columns a packet carries because the trainer's side declares them: (prefix, what one is, who
# declares them, the hint when they differ)
_DECLARED = (("extra/", "extra output", "actor", _SAME_ACTOR), ("info/", "info key", "pipeline", _SAME_INFO))


class LayoutMismatch(SampleRejected):
    """A packet whose layout (act/obs structure, a field's dtype or row shape) is not the trainer's:
    the packet is fine, the trainer's sample compressor or pipeline usually is not, so its worker
    keeps it for a trainer whose layout matches. ``cause`` says what differs without naming the
    worker: one cause, one log line."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


def probe_copy(sample_compressor: Any) -> Any | None:
    """A copy of ``sample_compressor`` to probe for the schema (None for None, or if it cannot be
    copied): one that keeps state (ActionBufferCompressor, FrameStackCompressor) may be the
    very instance a worker uses."""
    try:
        return copy.deepcopy(sample_compressor)
    except Exception as exc:
        log.debug("sample_compressor cannot be copied (%s)", exc)
        return None


@dataclass(frozen=True)
class SampleSchema:
    act_spec: Spec
    obs_spec: Spec
    leaves: dict[str, tuple[str, tuple[int, ...]]]  # leaf name -> (dtype string, shape of one row)
    # finiteness only, unless the trainer sent bounds
    limits: ValueLimits = field(default_factory=ValueLimits)

    @classmethod
    def from_spaces(cls, observation_space: gymnasium.Space, action_space: gymnasium.Space,
                    sample_compressor: Callable[..., Any] | None = None,
                    limits: ValueLimits | None = None, extra: ExtraSpec | None = None,
                    info: InfoSpec | None = None) -> SampleSchema:
        """The layout of rows a worker produces for these spaces, in the dtypes leaves travel in
        (:func:`netrl.samples.spaces.storage_dtype`: a Discrete action is a scalar of the smallest
        integer dtype that holds its values), after ``sample_compressor``, if any, called once
        with a random row and ``info={"probe": True}`` (a compressor that checks rows against
        the ones before should neither check nor count it). ``limits`` (the spaces' bounds)
        are kept for the leaves the compressor returns as it got them: one that rescales or
        re-encodes a leaf makes its bounds meaningless. ``extra``: the actor's extra outputs
        (:func:`netrl.actor.declared_extras`), leaves ``extra/<name>``; ``info``: the pipeline's
        info keys (:func:`netrl.samples.info.info_spec`), leaves ``info/<name>``."""
        act, obs = carried_sample(action_space), carried_sample(observation_space)
        raw = dict(flatten(act, "act")[1] + flatten(obs, "obs")[1])
        if sample_compressor is not None:
            act, obs, *_ = sample_compressor(act, obs, 0.0, False, False, {"probe": True})
        act_spec, act_leaves = flatten(act, "act")
        obs_spec, obs_leaves = flatten(obs, "obs")
        leaves = {name: (np.asarray(v).dtype.str, tuple(np.asarray(v).shape)) for name, v in act_leaves + obs_leaves}
        leaves.update((f"extra/{name}", (dtype.str, shape))
                      for name, (shape, dtype) in check_extra_spec(extra or {}, "the actor").items())
        leaves.update((f"info/{name}", (dtype.str, shape)) for name, (shape, dtype)
                      in check_extra_spec(info or {}, "the pipeline's info_keys").items())
        kept = {name for name, v in act_leaves + obs_leaves
                if name in raw and np.shape(raw[name]) == np.shape(v) and np.array_equal(raw[name], v)}
        return cls(act_spec, obs_spec, leaves, limits.only(kept) if limits is not None else ValueLimits())

    @classmethod
    def of_packet(cls, body: dict[str, Any], arrays: dict[str, np.ndarray]) -> SampleSchema:
        """The layout a decoded SAMPLES packet has (no value bounds): its :attr:`tag` is that of
        the trainers whose :meth:`check` takes it. Raises :class:`MalformedMessage` for a packet
        whose act/obs trees do not name its arrays."""
        try:
            names = spec_leaves(body["act"]) + spec_leaves(body["obs"])
            names += sorted(name for name in arrays if name.startswith(("extra/", "info/")))
            leaves = {name: (arrays[name].dtype.str, tuple(arrays[name].shape[1:]))
                      for name in names}
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedMessage(f"the packet's act/obs trees do not name its arrays "
                                   f"({exc})") from None
        return cls(body["act"], body["obs"], leaves)

    @functools.cached_property
    def tag(self) -> int:
        """A number for this layout (structure, dtypes and row shapes; not the value bounds),
        never 0: a worker keeps the packets a layout refused until the server names another one."""
        layout = json.dumps([self.act_spec, self.obs_spec, sorted(self.to_wire()["leaves"])], sort_keys=True)
        return int.from_bytes(hashlib.sha256(layout.encode()).digest()[:6], "big") or 1

    def to_wire(self) -> dict[str, Any]:
        return {"act": self.act_spec, "obs": self.obs_spec,
                "leaves": [[name, dtype, list(shape)] for name, (dtype, shape) in self.leaves.items()],
                "limits": self.limits.to_wire()}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> SampleSchema:
        """Parse a SCHEMA message body (untrusted: every field is checked)."""
        try:
            act, obs, leaves = body["act"], body["obs"], body["leaves"]
            names = spec_leaves(act) + spec_leaves(obs)
            parsed = {str(n): (str(d), tuple(int(x) for x in s)) for n, d, s in leaves}
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedMessage(f"schema is malformed ({exc})") from None
        extras = [n for n in parsed if n.startswith("extra/") and EXTRA_NAME.fullmatch(n[6:])]
        infos = [n for n in parsed if n.startswith("info/") and EXTRA_NAME.fullmatch(n[5:])]
        if (sorted(names + extras + infos) != sorted(parsed) or len(extras) > MAX_EXTRAS
                or len(infos) > MAX_INFO_KEYS
                or any(len(s) > 8 or min(s, default=0) < 0 for _, s in parsed.values())):
            raise MalformedMessage("schema leaves do not match its act/obs specs")
        floats = {n: v for n, v in parsed.items() if n in set(names) and v[0].lstrip("<>|=")[:1] == "f"}
        try:  # an older trainer's schema has none: finiteness is checked all the same
            limits = ValueLimits.from_wire(body["limits"], floats) if "limits" in body else ValueLimits()
        except (ValueError, TypeError) as exc:
            raise MalformedMessage(f"schema limits are malformed ({exc})") from None
        return cls(act, obs, parsed, limits)

    def check(self, body: dict[str, Any], arrays: dict[str, np.ndarray], worker: str,
              inflated: bool = False) -> None:
        """Raise :class:`SampleRejected` naming ``worker`` and the field unless the packet fits this
        schema (:class:`LayoutMismatch` when its layout is not this one's). ``inflated``: every
        array was decoded in full (the trainer's), so integer leaves' values are checked too, and
        the check is the one the training loop would make (it skips such packets)."""
        for key, spec in (("act", self.act_spec), ("obs", self.obs_spec)):
            if body[key] != spec:
                self._mismatch(worker, f"the {key} structure {body[key]!r} differs "
                                       f"from the trainer's {spec!r}")
        for prefix, what, owner, hint in _DECLARED:
            sent = {name for name in arrays if name.startswith(prefix)}
            declared = {name for name in self.leaves if name.startswith(prefix)}
            if sent != declared:
                missing, undeclared = sorted(declared - sent), sorted(sent - declared)
                name = (missing or undeclared)[0][len(prefix):]
                self._mismatch(worker, f"it lacks the {what} {name!r}, which the trainer's {owner} declares"
                               if missing else
                               f"it carries the {what} {name!r}, which the trainer's {owner} does not declare",
                               hint)
        for name, (dtype, shape) in self.leaves.items():
            arr = arrays[name]
            if arr.dtype.str != dtype or tuple(arr.shape[1:]) != shape:
                self._mismatch(worker, f"field {name!r} has dtype {arr.dtype.str} and "
                                       f"row shape {tuple(arr.shape[1:])}; the "
                                       f"trainer expects {dtype} and {shape}",
                               next((h for p, _, _, h in _DECLARED if name.startswith(p)), _SAME_COMPRESSOR))
        # float leaves only: the server's relay-only decode leaves compressed
        # integer arrays compressed
        floats = {name: arrays[name] for name in self.leaves
                  if inflated or arrays[name].dtype.kind == "f"}
        problem = self.limits.problem(floats, arrays["rew"], arrays.get("reset"))
        if problem:
            raise SampleRejected(f"packet from {worker}: {problem}")

    @staticmethod
    def _mismatch(worker: str, cause: str, hint: str = _SAME_COMPRESSOR) -> NoReturn:
        raise LayoutMismatch(f"packet from {worker}: {cause}{hint}", cause)


def load_schema(path: Path) -> SampleSchema | None:
    """The schema a server saved at ``path`` (the trainer's last), or None (also
    when it cannot be read)."""
    if not path.exists():
        return None
    try:
        return SampleSchema.from_wire(json.loads(path.read_text()))
    # the trainer sends it again when it connects
    except (OSError, ValueError, ProtocolError) as exc:
        log.warning("ignoring the saved sample layout %s (%s): packets are checked "
                    "against the layout the trainer sends when it connects", path, exc)
        return None


def save_schema(path: Path, body: dict[str, Any]) -> None:
    """Save the trainer's schema, so a restarted server checks packets before
    the trainer reconnects."""
    try:
        path.write_text(json.dumps(body))
    except OSError as exc:
        log.warning("could not save the sample layout to %s (%s): after a restart, this server "
                    "checks packets against it only once the trainer reconnects", path, exc)


class WireRoute:
    """A packet's way from a worker to the trainer's memory, without a network, for ``--check-env``:
    encoded with the worker's ``compression``, checked as the server checks it (integer arrays left
    compressed) and as the trainer does (layout and values, with the bounds of the spaces), and
    decoded. Raises :class:`SampleRejected` naming the field, as they would refuse it."""

    def __init__(self, compression: Codec, limits: Callable[[Any, Any], ValueLimits],
                 info: InfoSpec | None = None) -> None:
        self.compression, self.limits, self.info = compression, limits, info  # info: the pipeline's
        self._schema: SampleSchema | None = None

    def __call__(self, buf: Buffer, observation_space: Any, action_space: Any, sample_compressor: Any) -> Buffer:
        if self._schema is None:
            self._schema = SampleSchema.from_spaces(observation_space, action_space, probe_copy(sample_compressor),
                                                    self.limits(observation_space, action_space),
                                                    info=self.info)
        frames = encode(samples_message(buf, "check-env", "check", 1, len(buf)), self.compression)
        at_server = decode(frames, inflate=False)
        self._schema.check(at_server.body, at_server.arrays, "check-env (at the server)")
        msg = decode(frames)
        self._schema.check(msg.body, msg.arrays, "check-env (at the trainer)")
        leaves = {name: msg.arrays[name] for name in self._schema.leaves}
        problem = self._schema.limits.problem(leaves, msg.arrays["rew"], msg.arrays["reset"])
        if problem:
            raise SampleRejected(f"packet from check-env (at the trainer): {problem}")
        return buffer_from_message(msg)
