"""Resuming a run: what a Trainer does with its run folder before it trains (internal).

Calling sequence (the Trainer's, on a built :class:`~netrl.training.loop.TrainingOffline`)::

    check_model_path(model_path, run_dir)   # never overwrite another run's policy
    restored = restore(training, run_dir, resume=..., persist_samples=..., fsync=...,
                       max_message_bytes=..., stop=stop)
    restored.deliveries    # the packets already in the memory
    restored.sample_log    # the log, open to append
    ...
    checkpoint.save_checkpoint(run_dir, agent_state(training), ...)   # what load_agent reads

Every sample a worker produced enters the memory exactly once: those before the checkpoint are
replayed uncounted (``new=False``), those after it counted as on arrival. Weight versions
continue after the newest this run noted as sent
(:func:`netrl.storage.checkpoint.record_published`) and the newest in the sample log.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, NamedTuple

import torch

from netrl.errors import CheckpointError, ProtocolError
from netrl.protocol.models import POLICY
from netrl.protocol.wire import buffer_from_message, decode
from netrl.storage import checkpoint
from netrl.storage.segments import Position
from netrl.storage.weight_files import policy_run_dir
from netrl.trainer.delivery import Deliveries, SampleLog
from netrl.training.loop import TrainingOffline

__all__ = ["Restored", "agent_state", "check_model_path", "load_agent", "restore"]

log = logging.getLogger(__name__)


class Restored(NamedTuple):
    deliveries: Deliveries  # the packets in the memory, by worker stream and sequence number
    sample_log: SampleLog | None  # None: trainer.persist_samples is off
    published: dict[str, int]  # model -> the newest version this run noted as sent


def restore(training: TrainingOffline, run_dir: Path, *, resume: bool, persist_samples: bool,
            fsync: bool, max_message_bytes: int, stop: threading.Event) -> Restored:
    """Load the checkpoint (if ``resume``) and rebuild the replay memory from the sample log,
    unless ``stop`` is set meanwhile (a log of a million image rows takes minutes): then it
    returns at once, with the memory and the deliveries part-built, and the caller must neither
    train nor save."""
    publisher = training.publisher
    assert publisher is not None  # (built)
    saved = checkpoint.load_checkpoint(run_dir) if resume else None
    if not resume and (checkpoint.exists(run_dir) or (run_dir / "samples").exists()):
        raise CheckpointError(f"{run_dir} already holds a checkpoint or sample log and "
                              "trainer.resume is false: set trainer.resume to true to continue "
                              "that run, or choose another run_name")
    state: dict[str, Any] = {}
    if saved is not None:
        agent_state, state = saved
        load_agent(training, agent_state, state.get("agent_state", "full"))
        training.load_state(state)
    deliveries = Deliveries(state.get("deliveries"))
    publisher.number_after(checkpoint.published_version(run_dir), "this run sent out")
    for model, newest in checkpoint.published_models(run_dir).items():
        if model in publisher.models and newest > publisher.model_versions.get(model, 0):
            publisher.model_versions[model] = newest  # no number names two of its versions
    published = {POLICY: publisher.version, **publisher.model_versions}
    held = state.get("memory_len") or 0  # transitions the replay memory held at the checkpoint
    if not persist_samples:
        if held:
            log.warning("trainer.persist_samples is off, so the replay memory starts empty: the "
                        "%d transitions it held at the checkpoint are lost (the server and "
                        "workers do not send them again)", held)
        return Restored(deliveries, None, published)
    memory_size = training.settings.memory_size
    assert memory_size is not None  # build() resolved it
    keep_rows = int(memory_size * 1.1) + 10_000
    sample_log = SampleLog(run_dir / "samples", keep_rows=keep_rows, fsync=fsync)
    at = Position(*state["log_position"]) if state.get("log_position") else None
    _replay(training, sample_log, deliveries, at, held, run_dir, max_message_bytes, stop)
    return Restored(deliveries, sample_log, published)


def _replay(training: TrainingOffline, sample_log: SampleLog, deliveries: Deliveries,
            at_checkpoint: Position | None, held: int, run_dir: Path, max_message_bytes: int,
            stop: threading.Event) -> None:
    """Every packet of the log into the memory: uncounted up to ``at_checkpoint``, counted
    after it."""
    restored = after = newest = 0
    matched = at_checkpoint is None

    def reached() -> None:
        assert training.memory is not None
        log.info("replay memory restored to its checkpoint state: %d transitions (checkpoint: %d)",
                 len(training.memory), held)

    for rec in sample_log.read():
        if stop.is_set():
            log.info("stopped while rebuilding the replay memory (%d samples read): nothing was "
                     "trained, and the next start rebuilds it from the start of the sample log",
                     restored + after)
            return
        try:  # as on arrival; a log an older netrl wrote holds older protocol versions
            buf = buffer_from_message(decode(rec.frames, max_message_bytes, stored=True))
        except ProtocolError as exc:  # intact on disk, but refused by today's checks
            log.warning("skipped a packet in the sample log at %s that this netrl refuses: %s",
                        rec.position, exc)
            continue
        buf.recv_version = int(rec.meta["recv_version"])
        newest = max(newest, buf.recv_version, int(buf.policy_version.max(initial=0)))
        new = at_checkpoint is None or rec.position >= at_checkpoint
        if new and not matched:  # the first record after the checkpoint, a damaged one before it
            matched = True
            reached()
        steps = training.add(buf, new=new)
        deliveries.add(buf.worker, buf.seq)
        restored += 0 if new else steps
        after += steps if new else 0
        if not new and rec.next == at_checkpoint:
            matched = True
            reached()
    memory_len = len(training.memory) if training.memory is not None else 0
    if restored or after:
        log.info("rebuilt the replay memory from the sample log: %d samples from before the "
                 "checkpoint, %d received after it; memory holds %d transitions", restored,
                 after, memory_len)
    if not matched and held:  # e.g. samples/ deleted or not copied with checkpoint/, or damaged
        log.warning("the sample log in %s does not reach the checkpoint's position, so the "
                    "replay memory holds %d of the %d transitions it held at the checkpoint: the "
                    "missing ones are lost (they were acknowledged, so nobody sends them again)",
                    run_dir / "samples", memory_len, held)
    assert training.publisher is not None
    training.publisher.number_after(newest, "in the sample log")  # e.g. another run's, still out


def load_agent(training: TrainingOffline, agent_state: dict[str, Any], kind: str) -> None:
    """Restore the agent: all of it (``kind`` "full"), or only its actor when the checkpoint was
    saved from an agent without ``state_dict`` ("actor")."""
    agent = training.agent
    assert agent is not None
    name = type(agent).__name__
    if kind == "full" and training.agent_has_state:
        try:
            agent.load_state_dict(agent_state)
        except (RuntimeError, KeyError, ValueError) as exc:  # e.g. other sizes, or other spaces
            detail = "; ".join(line.strip() for line in str(exc).strip().splitlines()[:2])
            raise CheckpointError(f"the checkpoint does not fit this {name} ({detail}): the model "
                                  "or the env changed since it was saved; revert that change to "
                                  "resume, or start a new run (--run-name, config.json: run_name)"
                                  ) from None
        return
    if kind == "full":
        log.warning("the checkpoint holds a full agent state, but %s has no load_state_dict(): "
                    "the agent starts afresh (the counters still continue)", name)
        return
    actor = agent.get_actor()
    try:
        actor.load_state_dict(agent_state.get("actor", {}))
    except (RuntimeError, AttributeError) as exc:
        log.warning("the checkpoint's actor does not fit %s's actor, which starts afresh: %s",
                    name, exc)
        return
    log.warning("the checkpoint holds only the actor's weights (saved from an agent "
                "without state_dict()): restored them into %s's actor; the rest of %s "
                "(critics, target networks, optimisers) starts afresh", name, name)


def agent_state(training: TrainingOffline) -> dict[str, Any]:
    """What a checkpoint keeps of the agent, for :func:`load_agent`: its whole ``state_dict()``, or,
    from an agent without one (see ``TrainingOffline.build``), its actor's weights."""
    agent = training.agent
    assert agent is not None
    if training.agent_has_state:
        return agent.state_dict()
    actor = agent.get_actor()
    return {"actor": actor.state_dict()} if isinstance(actor, torch.nn.Module) else {}


def check_model_path(model_path: Path, run_dir: Path) -> None:
    """Refuse a ``model_path`` outside the run folder that holds a policy another run saved: each
    save would overwrite that run's trained policy (its checkpoint keeps the agent, but not where a
    user looks for it)."""
    path = model_path.resolve()
    if path.is_relative_to(run_dir.resolve()) or not path.exists():
        return
    owner = policy_run_dir(path)
    if owner == str(run_dir.resolve()):
        return
    saved_by = (f"the run in {owner}" if owner else
                "another run or program (its sidecar names no run folder)")
    raise CheckpointError(f"model_path {model_path} holds a policy saved by {saved_by}, and this "
                          f"trainer (run folder {run_dir}) would overwrite it with its own: leave "
                          f"model_path out to save under the run folder ({run_dir / 'policy.pt'}), "
                          "give another path, or move that file away first")
