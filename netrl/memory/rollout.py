"""RolloutMemory: the transitions of one synchronous batch, handed to the
agent all at once, in order.

With ``trainer.collection: sync`` (see :mod:`netrl.training.sync`) the training loop stores
every transition of the batch under collection here, calls ``agent.train(memory.sample())``
once, then :meth:`RolloutMemory.clear`. The agent (PPO) computes advantages from whole pieces of
trajectories, so the order matters:

- rows keep their arrival order: packet after packet, env-major within a packet (its env segments),
  time order within an env segment;
- except that a piece continued by the next packet of the same worker (a worker cuts a fragment into
  packets of at most its ``min_samples_per_worker_packet`` rows per env) is joined to the piece it
  continues, so each trajectory piece is contiguous;
- ``traj_ids`` (int64, TorchRL's collectors' ``("collector", "traj_ids")``) numbers the pieces: rows
  with equal ids are one contiguous piece of one env's trajectory, and a new id starts wherever a
  row does not continue the row before it (another worker or env, an episode start, a row left
  out as late, a gap in a worker's packets).

The batch carries the extra outputs each row's action came with (``Buffer.extra``, e.g.
``action_log_prob``, ``state_value``) and ``traj_ids`` in ``batch.extra``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netrl.memory.base import (
    MemoryDataloading,
    Transition,
    WorkerIds,
    batch_key,
    env_column,
    run_sample_preprocessor,
    to_tensor,
)
from netrl.memory.device import row_entries
from netrl.memory.owners import worker_key
from netrl.samples.batch import Batch
from netrl.samples.columns import Buffer, flatten, row, unflatten

__all__ = ["RolloutMemory"]

class RolloutMemory(MemoryDataloading):
    """Every transition of one batch, in arrival order (see the module docstring);
    ``sample()`` returns them all.

    Rows a packet marks with ``weight`` 0 (the loop's late samples) are left out. ``memory_size``
    and ``batch_size`` are accepted for the loop's sake and not used: the batch is whatever arrived.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # per packet: transition columns, one row per transition
        self._chunks: list[dict[str, np.ndarray]] = []
        self._act_spec: Any = None
        self._obs_spec: Any = None
        self._n = 0
        self._next_traj = 0
        # (worker, env) -> (seq, traj id) of a piece that ended its packet mid-episode: the
        # next packet may continue it
        self._open: dict[tuple[str, int], tuple[int, int]] = {}
        self._workers = WorkerIds()
        self._held: set[str] = set()  # quarantined worker names: their transitions stay out of batches
        super().__init__(*args, **kwargs)

    def __len__(self) -> int:
        if not self._held:
            return self._n
        return sum(int(np.count_nonzero(~self._of(c, self._held))) for c in self._chunks)

    # -- each transition's worker (the API of netrl.memory.owners, for one batch) -----------------
    def _of(self, chunk: dict[str, np.ndarray], names: set[str]) -> np.ndarray:
        """Which of ``chunk``'s transitions come from the workers ``names`` (any session)."""
        ids = [i for i, n in enumerate(self._workers.names) if worker_key(n) in names]
        return np.isin(chunk["worker"], ids)

    def rows_of(self, worker: str) -> int:
        """The transitions of ``worker`` (a name, or ``name/session``) in the batch under
        collection, quarantined or not."""
        return sum(int(np.count_nonzero(self._of(c, {worker_key(worker)}))) for c in self._chunks)

    def drop_worker(self, worker: str) -> int:
        """Remove ``worker``'s transitions from the batch under collection; returns how many."""
        dropped = self.rows_of(worker)
        if dropped:
            keep = [~self._of(c, {worker_key(worker)}) for c in self._chunks]
            chunks = [{k: v[m] for k, v in c.items()} for c, m in zip(self._chunks, keep, strict=True)]
            self._chunks = [c for c in chunks if len(c["worker"])]
            self._n -= dropped
        return dropped

    def set_quarantined(self, worker: str, flag: bool) -> int:
        """Keep ``worker``'s transitions (and those it sends while ``flag`` is on) out of
        :meth:`sample`, or let them in again; returns how many it holds."""
        (self._held.add if flag else self._held.discard)(worker_key(worker))
        return self.rows_of(worker)

    def clear(self) -> None:
        """Empty the memory for the next batch."""
        self._chunks.clear()
        self._open.clear()
        self._n = self._next_traj = 0

    def append_buffer(self, buffer: Buffer) -> None:
        """Store a packet's transitions. One whose structure or leaves differ from the first
        packet's raises ValueError before anything is stored."""
        n = len(buffer)
        if n == 0:
            return
        obs = buffer.obs
        if self.obs_preprocessor is not None:
            obs = _stack([self.obs_preprocessor(row(obs, i)) for i in range(n)])
        act_spec, act_leaves = flatten(buffer.act, "act")
        obs_spec, obs_leaves = flatten(obs, "obs")
        if self._act_spec is not None and (act_spec, obs_spec) != (self._act_spec, self._obs_spec):
            raise ValueError(f"packet {buffer.seq} of worker {buffer.worker}: "
                             f"its observation/action structure differs from the "
                             f"batch's; every worker must run the same pipeline")
        ends = buffer.transition_end  # (weight 0: late rows the loop left out)
        idx = np.flatnonzero(ends)
        if not len(idx):
            return
        env = env_column(buffer, n)
        prev = idx - 1
        if (prev < 0).any():
            raise ValueError(f"packet {buffer.seq} of worker {buffer.worker}: its first "
                             f"row ends a transition, but the row before it is in another "
                             f"packet (a packet starts with a reset or context row)")
        cols: dict[str, np.ndarray] = {}
        for name, leaf in obs_leaves:
            arr = np.asarray(leaf)
            cols["prev:" + name], cols[name] = arr[prev], arr[idx]
        for name, leaf in act_leaves:
            cols[name] = np.asarray(leaf)[idx]
        # the actor's extra outputs, per row
        for name, values in (getattr(buffer, "extra", None) or {}).items():
            cols["extra/" + name] = np.asarray(values)[idx]
        for name, values in (getattr(buffer, "info", None) or {}).items():  # the env's, per row
            cols["info/" + name] = np.asarray(values)[idx]
        cols.update(rew=np.asarray(buffer.rew, np.float32)[idx], terminated=np.asarray(buffer.terminated)[idx],
                    truncated=np.asarray(buffer.truncated)[idx], policy_version=np.asarray(buffer.policy_version)[idx],
                    worker=self._workers.column(buffer.worker, len(idx)), env=env[idx])
        if self._chunks:
            first = {k: v for k, v in self._chunks[0].items() if k != "traj_ids"}
            wrong = [k for k in set(first) | set(cols) if k not in first or k not in cols
                     or first[k].shape[1:] != cols[k].shape[1:] or first[k].dtype.kind != cols[k].dtype.kind]
            if wrong:
                raise ValueError(f"packet {buffer.seq} of worker {buffer.worker}: its columns "
                                 f"{sorted(wrong)} differ from the batch's first packet's "
                                 f"(missing, extra, or another shape or kind of dtype)")
        cols["traj_ids"] = self._traj_ids(buffer, idx, env)
        self._act_spec, self._obs_spec = act_spec, obs_spec
        self._chunks.append(cols)
        self._n += len(idx)

    def _traj_ids(self, buffer: Buffer, idx: np.ndarray, env: np.ndarray) -> np.ndarray:
        """One id per stored transition: a new one where a row does not continue
        the row before it."""
        starts = np.ones(len(idx), np.bool_)
        starts[1:] = (np.diff(idx) != 1) | (env[idx[1:]] != env[idx[:-1]])
        ids = np.empty(len(idx), np.int64)
        context = np.asarray(buffer.context)
        ended = np.asarray(buffer.terminated) | np.asarray(buffer.truncated)
        for k in np.flatnonzero(starts).tolist():
            i, e = int(idx[k]), int(env[idx[k]])
            # a piece continues the same env's open piece of the worker's previous packet when only
            # that env's context rows come before it in this packet
            before = np.flatnonzero(env[:i] == e)
            continues = len(before) > 0 and bool(context[before].all()) and context[i - 1]
            held = self._open.get((buffer.worker, e))
            if continues and held is not None and held[0] == buffer.seq - 1:
                ids[k] = held[1]
            else:
                ids[k] = self._next_traj
                self._next_traj += 1
            stop = int(np.flatnonzero(starts[k + 1:])[0]) + k + 1 if starts[k + 1:].any() else len(idx)
            ids[k:stop] = ids[k]
        self._open = {key: v for key, v in self._open.items() if key[0] != buffer.worker}
        for e in np.unique(env[idx]).tolist():
            last = int(np.flatnonzero(env == e)[-1])
            k = int(np.flatnonzero(idx == last)[0]) if last in idx else -1
            # the env's segment ends mid-episode on a stored transition
            if k >= 0 and not ended[last]:
                self._open[(buffer.worker, e)] = (buffer.seq, int(ids[k]))
        return ids

    def _columns(self) -> dict[str, np.ndarray]:
        """All stored columns, each trajectory piece contiguous (pieces in
        order of their first row)."""
        cols = {k: np.concatenate([c[k] for c in self._chunks]) for k in self._chunks[0]}
        if self._held:
            keep = ~self._of(cols, self._held)
            cols = {k: v[keep] for k, v in cols.items()}
        order = np.argsort(cols["traj_ids"], kind="stable")
        if (np.diff(order) != 1).any():
            cols = {k: v[order] for k, v in cols.items()}
        return cols

    def sample(self) -> Batch:
        """Every stored transition as one Batch on ``self.device`` (see the module docstring for the
        order), with the recorded extras and ``traj_ids`` . Raises ValueError when empty."""
        if not len(self):
            raise ValueError("RolloutMemory.sample(): the memory holds no transition"
                             + (" outside quarantine" if self._n else ""))
        cols = self._columns()
        obs_names = [k for k in cols if k.startswith("obs")]
        o = unflatten(self._obs_spec, {k: cols["prev:" + k] for k in obs_names})
        o2 = unflatten(self._obs_spec, {k: cols[k] for k in obs_names})
        a = unflatten(self._act_spec, {k: cols[k] for k in cols if k.startswith("act")})
        r = cols["rew"]
        term, trunc = cols["terminated"].astype(np.float32), cols["truncated"].astype(np.float32)
        if self.sample_preprocessor is not None:
            o, a, r, o2, term, trunc = run_sample_preprocessor(self.sample_preprocessor, (o, a, r, o2, term, trunc))
        d = self.device
        extra = {key: to_tensor(v, d) for k, v in cols.items() if (key := batch_key(k))}
        extra["traj_ids"] = to_tensor(cols["traj_ids"], d)
        o, o2 = to_tensor(o, d), to_tensor(o2, d)
        if self.obs_transform is not None:  # new tensors: the stored rows stay raw
            o, o2 = self.obs_transform(o), self.obs_transform(o2)
        return Batch(o, to_tensor(a, d), to_tensor(r, d), o2, to_tensor(term, d), to_tensor(trunc, d), extra=extra)

    def policy_versions(self) -> np.ndarray:
        """The weight version of every stored transition, in :meth:`sample`'s order."""
        return self._columns()["policy_version"] if len(self) else np.zeros(0, np.int64)

    def workers(self) -> list[str]:
        """The workers whose transitions the memory holds."""
        if not len(self):
            return []
        return sorted(set(self._workers.named(np.unique(self._columns()["worker"]))))

    def batch_workers(self) -> list[str] | None:
        return self.workers() or None

    def get_transition(self, item: int) -> Transition:
        """The ``item``-th transition in :meth:`sample`'s order (for tests and tmrl-style code);
        ``info`` holds its policy version, trajectory, and the ``extra`` outputs and env ``info``
        entries recorded with it, if any."""
        if not 0 <= item < len(self):
            raise IndexError(f"transition {item} of {len(self)}")
        cols = self._columns()
        obs_names = [k for k in cols if k.startswith("obs")]
        last = unflatten(self._obs_spec, {k: cols["prev:" + k][item].copy() for k in obs_names})
        new = unflatten(self._obs_spec, {k: cols[k][item].copy() for k in obs_names})
        act = unflatten(self._act_spec, {k: cols[k][item].copy() for k in cols if k.startswith("act")})
        info: dict[str, Any] = {"policy_version": int(cols["policy_version"][item]),
                                "traj_id": int(cols["traj_ids"][item])}
        for prefix in ("extra", "info"):
            if entries := row_entries(cols, item, prefix):
                info[prefix] = entries
        return (last, act, float(cols["rew"][item]), new, bool(cols["terminated"][item]),
                bool(cols["truncated"][item]), info)


def _stack(rows: list[Any]) -> Any:
    first = rows[0]
    if isinstance(first, (tuple, list)):
        return tuple(_stack([r[i] for r in rows]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _stack([r[k] for r in rows]) for k in first}
    return np.stack([np.asarray(r) for r in rows])
