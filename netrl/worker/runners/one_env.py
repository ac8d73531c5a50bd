"""The control path's one-env episode loop, and the account a worker gives of its samples as it closes.

A worker with several envs steps them in :mod:`netrl.worker.runners.vector` instead. Both take the
:class:`~netrl.worker.worker.RolloutWorker` as ``w`` (typed Any: the worker imports this module).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Generator
from typing import Any

import numpy as np

from netrl.envs.checks import check_action, check_observation
from netrl.errors import NetrlError
from netrl.samples.columns import EpisodeStats

__all__ = ["close_net", "one_env_steps"]

log = logging.getLogger("netrl.worker.worker")  # the worker's own lines, under its logger as before


def one_env_steps(w: Any, test: bool, stop: threading.Event) -> Generator[None, None, EpisodeStats | None]:
    """One episode of a one-env worker, yielding after every env step; its stats, or None when ``stop``
    interrupted it."""
    collect = not test and not w.standalone
    assert w.env_calls is not None
    obs, info = w.env_calls.call("reset", w.env.reset, seed=w.seed if w.episodes_done == 0 else None)
    if not w._checked:
        check_observation(obs, w.env.observation_space, "the first observation from the env's reset()",
                          w.env.action_space)
    if collect:
        w._record(w._default_action(), obs, 0.0, False, False, info, reset=True)
    if w.recurrent is not None:
        w.recurrent.reset(0)
    ret, length = 0.0, 0
    while True:
        if not w.pace(stop, collect):
            return None
        w._swap_weights()  # after any wait for the trainer, which trained and published meanwhile
        version = w.version  # the version that chooses this action
        act = None if test else w.random_actions(obs)  # worker.init_random_frames
        extra = None  # a random action's extra outputs are zeros
        if act is None:
            act, extra = _actor_action(w, obs, test)
        elif w.recurrent is not None:  # the state advances under random actions too, and is recorded
            _, chosen = w.recurrent.act(w.actor, w.policy_obs(w.obs_preprocessor(obs) if w.obs_preprocessor else obs),
                                        test)
            extra = w.recurrent.random_extras(chosen)
        obs, rew, terminated, truncated, info = w.env_calls.call("step", w.env.step, act)
        if not w._checked:
            check_observation(obs, w.env.observation_space, "the observation from the env's first step()",
                              w.env.action_space, bool(terminated))
            w._checked = True
        length += 1
        ret += float(rew)
        if length >= w.max_samples_per_episode and not terminated:
            truncated = True  # a forced reset is a time limit: the trainer still bootstraps
        stats = EpisodeStats(ret, length, test, w.version) if terminated or truncated else None
        if stats is not None and not w.standalone:  # before the last row: they leave in the same packet
            w.packets.pending_episodes.append(stats)
        if collect:
            w._record(act, obs, rew, terminated, truncated, info, reset=False, version=version, extra=extra)
            if w.sync.version is not None:  # sync collection: the fragment may be complete
                w.sync.after_step(np.array([terminated or truncated]))
        elif w.packets.due():  # rows from before a test episode still leave after max_packet_delay_s
            w._send_packet()
        if terminated or truncated:
            break
        yield
    assert stats is not None  # the loop ends only with an episode's end
    w._episode_done(stats)
    yield
    return stats


def _actor_action(w: Any, obs: Any, test: bool) -> tuple[Any, dict[str, Any] | None]:
    """The actor's action for one observation, and the row's extras (None when the actor declares none); the first
    action is checked (also when random actions came first)."""
    o = w.policy_obs(w.obs_preprocessor(obs) if w.obs_preprocessor else obs)
    extra = None
    if w.recurrent is not None:
        act, extra = w.recurrent.act(w.actor, o, test)
    else:
        act = w.actor.act_(o, test=test)
        if w.extra_spec:
            act, extra = act
    if not w.actor_checked:
        check_action(act, w.env.action_space, type(w.actor).__name__)
        w.actor_checked = True
    return act, extra


def close_net(w: Any, net: Any) -> None:
    """Hand over the last rows, wait up to ``flush_timeout_s`` for their acknowledgement, stop the network thread,
    and log what became of this session's samples."""
    rows = w.packets if w.vec is None else w.vec
    unsent, lost = rows.unsent_transitions, 0
    if rows.pending_episodes and not unsent:  # e.g. after a final test episode
        log.info("worker %s: the stats of its last %d episodes stay in its episode log: no samples are left "
                 "to carry them to the trainer", w.worker_id, len(rows.pending_episodes))
    try:
        w._send_packet()
    except NetrlError as exc:  # its network thread had stopped (e.g. the server refused this worker)
        lost = unsent
        log.warning("worker %s could not hand over its last %d samples: %s", w.worker_id, unsent, exc)
    flushed = net.flush(net.handed_seq, w.flush_timeout)  # not one dropped at the pipe: it never arrives
    net.halt()
    c = net.dropped()
    unacked_packets, unacked = net.unacknowledged()
    unacked += lost
    w.samples_unacknowledged = unacked
    level = logging.WARNING if unacked or c["dropped_samples"] or c["rejected_samples"] else logging.INFO
    spooled = (f"; {c['spooled_samples']} of the acknowledged samples are spooled at the server (safe on its "
               "disk: the trainer gets them when it catches up)") if c["spooled_samples"] else ""
    log.log(level, "worker %s session %s: %d samples produced in %d packets; %d acknowledged, %d dropped, "
            "%d rejected, %d unacknowledged%s", w.worker_id, w.session, w.produced, w.seq,
            c["acked_samples"], c["dropped_samples"], c["rejected_samples"], unacked, spooled)
    held, held_samples = len(net.held), sum(net.backlog[seq].steps for seq in net.held)
    if held:  # the server refused them for the trainer's layout, and no trainer with theirs came in time
        log.warning("worker %s stopped with %d packets (%d samples) it kept for a trainer with their sample layout, "
                    "which the server refused for the trainer's (%s): they are lost with this session", w.worker_id,
                    held, held_samples, net.last_held_reason)
    if not flushed and unacked_packets > held:
        log.warning("worker %s stopped with %d packets (%d samples) unacknowledged: the server had neither "
                    "spooled them nor delivered them to the trainer, so they are lost if they did not reach it or "
                    "if it stops before the trainer takes them", w.worker_id, unacked_packets - held,
                    unacked - lost - held_samples)
