"""RemoteCollector: netrl's workers as a TorchRL collector, with the server in between.

TorchRL's collector loop runs unchanged::

    collector = RemoteCollector(cfg, policy, frames_per_batch=1024, total_frames=100_000)
    for data in collector:              # a TensorDict of batch size [frames_per_batch]
        replay_buffer.extend(data)      # or: loss on data
        ...                             # train the policy
        collector.update_policy_weights_()   # the workers act with the new weights
    collector.shutdown()

The workers are ``python -m netrl --worker`` processes anywhere the server reaches (NAT, CURVE
keys); the collector connects to the server as its trainer (``network.trainer_port``), through a
:class:`~netrl.interop.collector_link.CollectorLink`. Per batch:

- **sync** (``sync=True``): the batch has a weight version of its own, published before it; it
  takes only frames of that version (TorchRL's sync collectors: every frame of the current
  policy). The workers collect ``rollout_fragment_length`` steps per env under each version and
  wait for the next, as in netrl's sync collection (:mod:`netrl.training.sync`); frames of older
  versions are late: counted, logged, never yielded. A batch whose weights were not updated is
  published again under a new number, so that the workers go on.
- **async**: frames in arrival order, whatever version made them.

Frames are acknowledged to the server once yielded (:mod:`netrl.interop.frames`), so a killed
collector, server or worker loses none; :meth:`RemoteCollector.state_dict` is the position in the
stream that a new collector resumes from (:meth:`load_state_dict` before iterating).

``init_random_frames``: the workers act at random until the collector holds that many frames
(each worker's ``worker.init_random_frames``, set to the same value: workers count with what the
server tells them the collector holds, which the collector reports as it goes); in sync
collection the batches before it take frames of any version.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from netrl.actor import ActorModule, declared_extras
from netrl.config.sections import Config
from netrl.errors import NetrlError
from netrl.interop.collector_link import CollectorLink
from netrl.interop.frames import FrameQueue, Frames
from netrl.net.keys import client_keys
from netrl.net.transport import new_session
from netrl.protocol.schema import SampleSchema, probe_copy
from netrl.protocol.wire import PacketLimits, sample_row_bytes
from netrl.samples.batch import Batch
from netrl.samples.columns import unflatten
from netrl.samples.info import info_spec
from netrl.trainer.delivery import Deliveries

__all__ = ["RemoteCollector", "check_collector_args"]

log = logging.getLogger(__name__)

MAX_FRAMES_PER_BATCH = 1 << 24  # 16 M frames in one TensorDict: beyond it, a mistake
STATE_VERSION = 1


def check_collector_args(
    frames_per_batch: Any,
    total_frames: Any,
    init_random_frames: Any,
    rollout_fragment_length: Any,
    wait_warning_s: Any,
) -> None:
    """ValueError naming every argument out of range, with its value."""

    def whole(v: Any) -> bool:
        return not isinstance(v, bool) and isinstance(v, (int, np.integer))

    problems = []
    if not (whole(frames_per_batch) and 1 <= frames_per_batch <= MAX_FRAMES_PER_BATCH):
        problems.append(
            f"frames_per_batch must be an integer between 1 and {MAX_FRAMES_PER_BATCH} "
            f"(got {frames_per_batch!r})"
        )
    if not (whole(total_frames) and (total_frames == -1 or total_frames >= 1)):
        problems.append(
            f"total_frames must be an integer >= 1, or -1 to collect until stopped "
            f"(got {total_frames!r})"
        )
    elif whole(frames_per_batch) and total_frames > 0 and 1 <= frames_per_batch > total_frames:
        problems.append(
            f"frames_per_batch ({frames_per_batch}) is more than total_frames "
            f"({total_frames}): not one batch would be yielded"
        )
    if not (whole(init_random_frames) and init_random_frames >= 0):
        problems.append(f"init_random_frames must be an integer >= 0 (got {init_random_frames!r})")
    if not (whole(rollout_fragment_length) and 1 <= rollout_fragment_length <= 1 << 30):
        problems.append(
            f"rollout_fragment_length must be an integer between 1 and 2**30 "
            f"(got {rollout_fragment_length!r})"
        )
    if not (
        isinstance(wait_warning_s, (int, float))
        and math.isfinite(wait_warning_s)
        and wait_warning_s > 0
    ):
        problems.append(f"wait_warning_s must be a number of seconds > 0 (got {wait_warning_s!r})")
    if problems:
        raise ValueError("RemoteCollector: " + "; ".join(problems))


class RemoteCollector:
    """Batches of frames collected by netrl's workers, TorchRL's collector style (module docstring).

    Args:
        config: the netrl config (a :class:`~netrl.config.Config`) the server and the workers run
            with: the server's address and trainer port, the keys (``security: curve``), and the
            pipeline (spaces, sample compressor, info keys) the workers run.
        policy: what the workers act with: a TorchRL policy (a ``TensorDictModule``; the workers
            run it as a :class:`~netrl.interop.policies.TensorDictActor`), or an
            :class:`~netrl.actor.ActorModule` of the workers' pipeline; its weights are published.
            None (async only): the workers act with what they hold.
        frames_per_batch: frames (env steps, all workers together) in each batch yielded.
        total_frames: frames after which iteration ends; -1: until :meth:`shutdown`.
        init_random_frames: see the module docstring.
        sync: every batch of one weight version (see the module docstring), or frames as they come.
        rollout_fragment_length: sync: env steps each env collects per version; None: the
            config's ``trainer.rollout_fragment_length``.
        wait_warning_s: a warning each time a batch has waited this long (no workers?).
        split_trajs: TorchRL's; only False (frames stay flat, ``("collector", "traj_ids")`` says
            which trajectory each is of).
    """

    def __init__(
        self,
        config: Config,
        policy: torch.nn.Module | None = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        init_random_frames: int = 0,
        sync: bool = True,
        rollout_fragment_length: int | None = None,
        wait_warning_s: float = 30.0,
        split_trajs: bool = False,
        name: str = "collector",
    ) -> None:
        fragment = (
            config.trainer.rollout_fragment_length
            if rollout_fragment_length is None
            else rollout_fragment_length
        )
        check_collector_args(
            frames_per_batch, total_frames, init_random_frames, fragment, wait_warning_s
        )
        if sync and policy is None:
            raise ValueError(
                "RemoteCollector: sync=True needs a policy: each batch is collected "
                "with weights of its own, which the collector publishes; pass "
                "policy=..., or sync=False"
            )
        if split_trajs:
            raise ValueError(
                "RemoteCollector: split_trajs=True is not supported: frames come flat, with "
                "('collector', 'traj_ids') naming each one's trajectory"
            )
        from netrl.pipelines.make import make_pipeline  # builds the env's spaces: not at import

        self.config, self.name = config, name
        self.frames_per_batch, self.total_frames = int(frames_per_batch), int(total_frames)
        self.init_random_frames, self.sync = int(init_random_frames), bool(sync)
        self.fragment, self.wait_warning_s = int(fragment), float(wait_warning_s)
        self.pipeline = make_pipeline(config)
        env = self.pipeline.env_cls()
        self.observation_space, self.action_space = env.observation_space, env.action_space
        if hasattr(env, "close"):
            env.close()
        self.policy = self._actor(policy)
        self.queue = FrameQueue()
        self.version = -1  # the newest weight version this collector published
        self.batch_version = -1  # sync: the version the batch under collection takes
        self.batches = 0  # yielded
        self.frames_by_worker: Counter[str] = Counter()  # yielded, per worker stream
        self.link: CollectorLink | None = None
        self._reported = (-1, -1, 0.0)  # the last PROGRESS: frames yielded, wanted, when
        self._closed = False

    # -- TorchRL's collector API -------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        from netrl.interop.tensordicts import to_tensordict  # tensordict: only when iterating

        for batch in self.iter_batches():
            yield to_tensordict(batch, self.observation_space, self.action_space)

    def iter_batches(self) -> Iterator[Batch]:
        """As iterating, as netrl :class:`~netrl.samples.Batch` es (``extra``: ``traj_ids``,
        ``policy_version``, the actor's extra outputs and the info entries)."""
        self._start()
        while not self._closed and (
            self.total_frames < 0 or self.queue.frames_out < self.total_frames
        ):
            yield self._next_batch()

    def update_policy_weights_(self, policy: torch.nn.Module | None = None) -> None:
        """Publish ``policy``'s weights (None: the collector's policy, trained in place) as a new
        version: the workers act with them from their next step (sync: from the next batch)."""
        if policy is not None:
            self.policy = self._actor(policy)
        if self.policy is None:
            raise ValueError(
                "update_policy_weights_(): this collector has no policy; pass "
                "policy=... here or to RemoteCollector(...)"
            )
        if self.link is not None and not self.sync:  # sync: with the next batch
            self._publish()

    def shutdown(self) -> None:
        """Disconnect; idempotent. Frames not yet yielded stay with the server and the workers."""
        if self._closed:
            return
        self._closed = True
        if self.link is not None:
            self.link.halt()

    def state_dict(self) -> dict[str, Any]:
        """The position in the stream (JSON-serialisable): a new collector given it by
        :meth:`load_state_dict` yields every frame after the last one yielded, once."""
        return {
            "v": STATE_VERSION,
            "queue": self.queue.state_dict(),
            "version": self.version,
            "batches": self.batches,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`'s position; before iterating."""
        if self.link is not None:
            raise NetrlError("load_state_dict(): call it before iterating, on a new collector")
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION:
            raise ValueError(
                f"load_state_dict(): not a RemoteCollector state of version "
                f"{STATE_VERSION} (got {str(state)[:80]!r})"
            )
        self.queue = FrameQueue(state["queue"])
        self.version, self.batches = int(state["version"]), int(state["batches"])

    def __enter__(self) -> RemoteCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _actor(self, policy: torch.nn.Module | None) -> torch.nn.Module | None:
        """A TorchRL policy (a TensorDictModule) as the workers' TensorDictActor holds it, whose
        weights are the ones the workers load; an ActorModule as it is."""
        if policy is None or isinstance(policy, ActorModule):
            return policy
        from netrl.interop.policies import TensorDictActor  # tensordict: only for such a policy

        return TensorDictActor(self.observation_space, self.action_space, policy)

    # -- the link ----------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._closed:
            raise NetrlError(
                "this RemoteCollector was shut down: create a new one (load_state_dict "
                "resumes from where it stopped)"
            )
        if self.link is not None:
            return
        cfg = self.config
        probe = probe_copy(self.pipeline.sample_compressor)
        schema = SampleSchema.from_spaces(
            self.observation_space,
            self.action_space,
            self.pipeline.sample_compressor if probe is None else probe,
            None,
            declared_extras(self.policy),
            info_spec(self.pipeline.info_keys),
        )
        keys = client_keys(cfg.keys_dir, "trainer", "trainer") if cfg.security == "curve" else None
        self.link = link = CollectorLink(
            cfg.network,
            self.name,
            new_session(),
            cfg.network.trainer_port,
            cfg.trainer.credit_window,
            Deliveries(self.queue.settled.streams()),
            None,
            schema,
            keys,
        )
        rows = cfg.server.max_rows_per_packet
        link.packet_limits = PacketLimits(
            rows,
            min(cfg.network.max_message_bytes, rows * sample_row_bytes(schema.leaves)),
            f"server.max_rows_per_packet is {rows}",
        )
        link.announce(
            {"mode": "sync", "fragment": self.fragment, "batch_mode": "truncate_episodes"}
            if self.sync
            else {"mode": "async"}
        )
        link.version = max(self.version, 0)
        link.start()
        if self.policy is not None and not self.sync:
            self._publish()

    def _publish(self) -> int:
        """The policy's weights under a new version number (after any the server has seen)."""
        assert self.link is not None
        self.version = max(self.version, self.link.taken_version()) + 1
        if self.policy is not None:
            self.link.publish(self.policy, self.version, self.batches)
        return self.version

    def _fetch(self) -> None:
        assert self.link is not None
        repeated = [(b.worker, b.seq) for b in self.link.fetch() if not self.queue.add(b)]
        self.link.done(repeated)  # settled before this collector started: acknowledged again

    def _progress(self) -> None:
        """Tell the server how far the workers may run ahead: three batches past the frames
        yielded (the pacing counts rows, a few more than frames: reset and context rows). The
        server counts frames as on the way until their bundle is acknowledged: those yielded
        already (:attr:`CollectorLink.yielded_unacked`) and those in the queue are added back."""
        assert self.link is not None
        out = self.queue.frames_out
        held = self.link.yielded_unacked + self.queue.queued  # on the way, for the server
        wanted = max(out + held + 3 * self.frames_per_batch, self.init_random_frames)
        now = time.monotonic()
        # as the training loop reports: on a change, and once a second (a wait polls at 20 Hz)
        if (out, wanted) != self._reported[:2] or now - self._reported[2] >= 1.0:
            self._reported = (out, wanted, now)
            self.link.progress(self.batches, out, wanted)

    def _next_batch(self) -> Batch:
        link = self.link
        assert link is not None
        random_phase = self.queue.frames_out < self.init_random_frames
        if self.sync:  # each batch its own version, published before it (the workers wait for it)
            self.batch_version = self._publish()
        started = warned = time.monotonic()
        while True:
            self._fetch()
            if self.sync and link.taken_version() >= self.batch_version:
                self.batch_version = self._publish()  # a number the server had seen: a new one
            version = self.batch_version if self.sync and not random_phase else None
            if self.queue.available(version) >= self.frames_per_batch:
                break
            self._progress()
            link.wait(0.05)
            if time.monotonic() - warned >= self.wait_warning_s:
                warned = time.monotonic()
                log.warning(
                    "%s: %d of frames_per_batch %d frames%s after %.0f s: are workers "
                    "connected to the server at %s?%s",
                    self.name,
                    self.queue.available(version),
                    self.frames_per_batch,
                    f" of v{version}" if version is not None else "",
                    warned - started,
                    self.config.network.server_ip,
                    " (sync: a batch takes one version's frames, and the workers "
                    "collect workers x envs x rollout_fragment_length of each)"
                    if self.sync
                    else "",
                )
        frames, settled = self.queue.take(self.frames_per_batch, version)
        link.done(settled)
        self.batches += 1
        self._progress()
        return self._batch(frames)

    def _batch(self, frames: list[Frames]) -> Batch:
        for f in frames:
            self.frames_by_worker[f.worker] += len(f)
        cols = {k: np.concatenate([f.cols[k] for f in frames]) for k in frames[0].cols}
        t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in cols.items()}
        obs_names = [k for k in cols if k.startswith("obs")]
        obs = unflatten(frames[0].obs_spec, {k: t[k] for k in obs_names})
        next_obs = unflatten(frames[0].obs_spec, {k: t["next:" + k] for k in obs_names})
        act = unflatten(frames[0].act_spec, {k: t[k] for k in cols if k.startswith("act")})
        extra = {
            k.split("/", 1)[1] if k.startswith("extra/") else k: v
            for k, v in t.items()
            if k.startswith(("extra/", "info/")) or k in ("traj_ids", "policy_version")
        }
        return Batch(
            obs,
            act,
            t["rew"],
            next_obs,
            t["terminated"].float(),
            t["truncated"].float(),
            extra=extra,
        )


def load(path: str | Path) -> Config:
    """The config at ``path`` (a convenience for scripts)."""
    from netrl.config.load import load_config

    return load_config(path)
