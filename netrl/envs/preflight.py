"""The pre-flight check (``python -m netrl --check-env``): the pipeline's env, run for a short
while with random actions through the sample compressor, the packet layout and the replay
memory, as a worker and a trainer would.

Every mismatch is reported at once, each with the step or packet where it first showed, rather
than one per run of a worker: spaces netrl cannot carry, observations that do not fit their space,
action masks that allow nothing, what the sample compressor returns, rows the packet builder
refuses, values outside the spaces, packets the memory refuses, and the batch it hands the agent (as
Gymnasium's ``check_env`` and TorchRL's ``check_env_specs`` do for their own contracts). The worker
keeps running the same checks on its first steps.

The RL half: the packet encoding is the network's, so :mod:`netrl.__main__`
passes it in as ``through_wire``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np

from netrl.envs.checks import (
    ACTION_MASK,
    check_sample_compressor,
    fit_problems,
    mask_problem,
    space_problems,
    value_limits,
)
from netrl.samples.columns import Buffer, BufferBuilder, flatten
from netrl.samples.info import InfoKey, info_spec, info_values
from netrl.samples.spaces import carried_sample, default_value

__all__ = ["PreflightReport", "WireCheck", "preflight", "random_action"]

# (packet, observation space, action space, sample compressor) -> the packet as the trainer
# receives it; raises ValueError (or a NetrlError) naming the field when the server or
# the trainer would refuse it
WireCheck = Callable[[Buffer, gymnasium.Space, gymnasium.Space, Any], Buffer]
PACKET_ROWS = 32
_PLACE = re.compile(r"\b(env step|episode|packet|row) \d+")


@dataclass
class PreflightReport:
    """What :func:`preflight` found: ``problems`` (each once, where it first showed) and
    ``checked`` (what passed)."""

    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)  # a problem without its place -> how
                                                        # often it showed
    _keys: list[str] = field(default_factory=list, repr=False)  # each problem's key in seen

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, problem: str, where: str = "") -> None:
        """Keep ``problem`` (found at ``where``) unless the same one, wherever it was,
        showed before: count it then."""
        key = _PLACE.sub("#", problem)
        if key not in self.seen:
            self.problems.append(f"{where}: {problem}" if where else problem)
            self._keys.append(key)
        self.seen[key] = self.seen.get(key, 0) + 1

    def format(self) -> str:
        head = ("env check passed" if self.ok else
                f"env check found {len(self.problems)} "
                f"problem{'' if len(self.problems) == 1 else 's'}")
        lines = [head, *(f"  checked: {c}" for c in self.checked)]
        for p, key in zip(self.problems, self._keys, strict=True):
            times = self.seen[key]
            lines.append(f"  problem: {p}" + (f" (and {times - 1} more "
                                              f"time{'' if times == 2 else 's'})"
                                                 if times > 1 else ""))
        return "\n".join(lines)


def random_action(action_space: gymnasium.Space, obs: Any) -> Any:
    """A uniformly random action, within the observation's action mask if it has one."""
    mask = obs.get(ACTION_MASK) if isinstance(obs, dict) else None
    if mask is not None and isinstance(action_space, gymnasium.spaces.Discrete):
        return action_space.sample(mask=np.asarray(mask).astype(np.int8))
    if mask is not None and isinstance(action_space, gymnasium.spaces.MultiDiscrete):
        parts = np.split(np.asarray(mask).astype(np.int8), np.cumsum(action_space.nvec)[:-1])
        return action_space.sample(mask=tuple(parts))
    return action_space.sample()


def preflight(env_cls: Callable[[], Any], sample_compressor: Callable[..., Any] | None = None,
              memory_cls: Callable[..., Any] | None = None, overlap: int = 1, steps: int = 200,
              seed: int | None = 0, through_wire: WireCheck | None = None,
              info_keys: tuple[InfoKey, ...] = ()) -> PreflightReport:
    """Build ``env_cls()``, run ``steps`` env steps with random actions, and
    report every mismatch at once.

    ``memory_cls`` is built with ``device="cpu"`` (and a small ``memory_size`` and ``batch_size``
    where it takes them); ``through_wire`` (see :data:`WireCheck`) checks each packet as
    the server and trainer would; ``info_keys``, the pipeline's, are recorded from each info as a
    worker does (:mod:`netrl.samples.info`)."""
    report = PreflightReport()
    try:
        env = env_cls()
    except Exception as exc:
        report.add(f"building the env failed: {type(exc).__name__}: {exc}")
        return report
    try:
        _run(env, report, sample_compressor, memory_cls, overlap, steps, seed, through_wire,
             info_keys)
    finally:
        try:
            env.close()
        except Exception as exc:  # reported, not raised: the rest of the report is worth more
            report.add(f"env.close() failed: {type(exc).__name__}: {exc}")
    return report


def _run(env: Any, report: PreflightReport, compressor: Callable[..., Any] | None, memory_cls: Callable[..., Any]
         | None, overlap: int, steps: int, seed: int | None, through_wire: WireCheck | None,
         info_keys: tuple[InfoKey, ...]) -> None:
    obs_space, act_space = env.observation_space, env.action_space
    problems = space_problems(obs_space, act_space)
    for p in problems:
        report.add(p)
    if problems:  # nothing of these spaces could travel: the rest would only repeat it
        return
    report.checked.append(f"spaces: observation {obs_space}, action {act_space}")
    if compressor is not None:
        try:
            check_sample_compressor(compressor)
        except TypeError as exc:
            report.add(str(exc))
            return
    expected = _expected_leaves(obs_space, act_space, compressor, report)
    if expected is None:
        return
    report.checked.append("leaves (dtype, shape per row): " + ", ".join(
        f"{name} {np.dtype(d).name} {s}" for name, (d, s) in expected.items()))
    _rollout(env, report, compressor, memory_cls, overlap, steps, seed, through_wire, expected,
             info_keys)


def _rollout(env: Any, report: PreflightReport, compressor: Callable[..., Any] | None,
             memory_cls: Callable[..., Any] | None, overlap: int, steps: int, seed: int | None,
             through_wire: WireCheck | None, expected: dict[str, tuple[str, tuple[int, ...]]],
             info_keys: tuple[InfoKey, ...] = ()) -> None:
    """Random actions for ``steps`` env steps, rows cut into packets as a worker
    does, each packet checked."""
    obs_space, act_space = env.observation_space, env.action_space
    # one row more than a packet: a step may add two rows (an episode's first observation and
    # the step after it), which one-step episodes (Blackjack) do on every step
    builder = BufferBuilder(PACKET_ROWS + overlap + 1, overlap)
    builder.dtypes = {name: np.dtype(d) for name, (d, _) in expected.items()}
    builder.info = info_spec(info_keys)
    memory = _memory(memory_cls, report)
    # the values' checks, where no wire route brings the trainer's (with a compressor, its schema
    # knows which leaves keep the spaces' bounds)
    limits = value_limits(obs_space, act_space) if compressor is None and through_wire is None else None
    act_space.seed(seed)
    packets, rows, episodes = 0, 0, 0

    def send(buf: Buffer | None) -> None:
        nonlocal packets
        if buf is None:
            return
        packets += 1
        _packet(buf, packets, expected, report, limits, through_wire, obs_space, act_space, compressor, memory)

    obs, info = _reset(env, seed, report)
    if obs is None:
        return
    step, first = 0, True
    while step < steps:
        where = f"the first observation of episode {episodes + 1} (env step {step})" if first else f"env step {step}"
        _observation(obs, obs_space, act_space, where, report, terminal=False)
        if first and not _add(builder, compressor, _placeholder(env, act_space), obs, 0.0, False, False, info,
                              True, where, report, info_keys):
            return
        act = random_action(act_space, obs)
        try:
            obs, rew, terminated, truncated, info = env.step(act)
        except Exception as exc:
            report.add(f"env.step() failed at env step {step}: {type(exc).__name__}: {exc}")
            return
        step, rows, first = step + 1, rows + 1, False
        if not _add(builder, compressor, act, obs, rew, bool(terminated), bool(truncated), info, False,
                    f"env step {step}", report, info_keys):
            return
        if terminated or truncated:
            _observation(obs, obs_space, act_space, f"env step {step}", report, terminal=bool(terminated))
            episodes += 1
            obs, info = _reset(env, None, report)
            if obs is None:
                return
            first = True
        if builder.full or len(builder) >= PACKET_ROWS:
            send(builder.cut())
    send(builder.cut())
    report.checked.append(f"{step} env steps ({episodes} episode{'' if episodes == 1 else 's'} "
                          f"finished) in {packets} packet{'' if packets == 1 else 's'}")
    if memory is not None:
        _batch(memory, expected, report)


def _expected_leaves(obs_space: gymnasium.Space, act_space: gymnasium.Space, compressor: Callable[..., Any] | None,
                     report: PreflightReport) -> dict[str, tuple[str, tuple[int, ...]]] | None:
    """The leaves a worker sends for these spaces (as the trainer's schema derives
    them), or None on a problem."""
    act, obs = carried_sample(act_space), carried_sample(obs_space)
    if compressor is not None:
        try:
            act, obs, *_ = copy.deepcopy(compressor)(act, obs, 0.0, False, False, {"probe": True})
        except Exception as exc:
            report.add(f"the sample compressor failed on a random "
                       f"row of the spaces: {type(exc).__name__}: {exc}")
            return None
    try:
        leaves = flatten(act, "act")[1] + flatten(obs, "obs")[1]
    except ValueError as exc:
        report.add(f"the sample compressor's output cannot travel: {exc}")
        return None
    return {name: (np.asarray(v).dtype.str, tuple(np.asarray(v).shape)) for name, v in leaves}


def _memory(memory_cls: Callable[..., Any] | None, report: PreflightReport) -> Any:
    if memory_cls is None:
        return None
    preset = getattr(memory_cls, "keywords", None) or {}
    sizes = {k: v for k, v in (("memory_size", 10_000), ("batch_size", 16)) if k not in preset}
    for kwargs in ({"device": "cpu", **sizes}, {"device": "cpu"}):
        try:
            return memory_cls(**kwargs)
        except TypeError:
            continue
        except Exception as exc:
            report.add(f"building the memory failed: {type(exc).__name__}: {exc}")
            return None
    report.add("the memory class takes neither device= nor memory_size= and batch_size=")
    return None


def _reset(env: Any, seed: int | None, report: PreflightReport) -> tuple[Any, Any]:
    try:
        return env.reset(seed=seed)
    except Exception as exc:
        report.add(f"env.reset() failed: {type(exc).__name__}: {exc}")
        return None, None


def _placeholder(env: Any, act_space: gymnasium.Space) -> Any:
    default = getattr(env, "default_action", None)
    return default_value(act_space) if default is None else default


def _observation(obs: Any, obs_space: gymnasium.Space, act_space: gymnasium.Space, where: str,
                 report: PreflightReport, terminal: bool) -> None:
    problems = fit_problems(obs, obs_space, "observation_space")
    # a mask may be checked whatever else is wrong: mask_problem passes over one it cannot read
    if not terminal:
        problems += [p for p in [mask_problem(obs, act_space)] if p]
    for problem in problems:
        report.add(problem, where)


def _add(builder: BufferBuilder, compressor: Callable[..., Any] | None, act: Any, obs: Any, rew: float,
         terminated: bool, truncated: bool, info: Any, reset: bool, where: str,
         report: PreflightReport, info_keys: tuple[InfoKey, ...] = ()) -> bool:
    """One row through the compressor into the builder (as the worker's PacketMaker
    does); False on a problem."""
    try:
        call = "reset" if reset else "step"
        values = info_values(info_keys, info, call) if info_keys else None
    except ValueError as exc:
        report.add(str(exc), where)
        return False
    if compressor is not None:
        try:
            act, obs, rew, terminated, truncated, info = compressor(act, obs, rew, terminated, truncated, info)
        except Exception as exc:
            report.add(f"the sample compressor failed: {type(exc).__name__}: {exc}", where)
            return False
    try:
        builder.add(act, obs, float(rew), terminated, truncated, reset, 0, info=values)
    except (ValueError, TypeError) as exc:
        report.add(f"the packet builder refused its row: {exc}", where)
        return False
    return True


def _packet(buf: Buffer, number: int, expected: dict[str, tuple[str, tuple[int, ...]]], report: PreflightReport,
            limits: Any, through_wire: WireCheck | None, obs_space: gymnasium.Space, act_space: gymnasium.Space,
            compressor: Any, memory: Any) -> None:
    leaves = dict(flatten(buf.act, "act")[1] + flatten(buf.obs, "obs")[1])
    # else the route's schema checks
    for name, (dtype, shape) in expected.items() if through_wire is None else ():
        got = leaves.get(name)
        if got is not None and (got.dtype.str != dtype or got.shape[1:] != shape):
            report.add(f"{name} is {got.dtype.name} of row shape {got.shape[1:]}, but the "
                       f"spaces (after the sample compressor) give {np.dtype(dtype).name} "
                       f"{shape}: the trainer would refuse every packet; make the env (or "
                       f"the compressor) return what its spaces say", f"packet {number}")
    if limits is not None:
        problem = limits.buffer_problem(buf)
        if problem:
            report.add(problem, f"packet {number}")
    if through_wire is not None:
        try:
            buf = through_wire(buf, obs_space, act_space, compressor)
        except Exception as exc:  # the server's or trainer's refusal, whatever its class
            report.add(f"it would be refused: {exc}", f"packet {number}")
            return
    if memory is not None:
        try:
            memory.append_buffer(buf)
        except Exception as exc:
            report.add(f"the memory refused it: {type(exc).__name__}: {exc}", f"packet {number}")


def _batch(memory: Any, expected: dict[str, tuple[str, tuple[int, ...]]], report: PreflightReport) -> None:
    try:
        size = len(memory)
    except TypeError:
        return
    if size < getattr(memory, "batch_size", 1):
        report.checked.append(f"the memory holds {size} transitions, too few for a batch")
        return
    try:
        batch = memory.sample()
    except Exception as exc:
        report.add(f"the memory's sample() failed: {type(exc).__name__}: {exc}")
        return
    act = getattr(batch, "act", None)
    want = expected.get("act")
    if act is not None and want is not None and tuple(act.shape[1:]) != want[1]:
        report.add(f"the memory's batch has actions of row shape "
                   f"{tuple(act.shape[1:])}; the action space gives {want[1]}")
    report.checked.append(f"the memory holds {size} transitions; a batch of "
                          f"{len(act) if act is not None else '?'} was sampled")
