"""Trainer: samples from the server -> replay memory -> TrainingAgent.train -> versioned weights to the server.

The training loop (:class:`~netrl.training.TrainingOffline`) runs on the calling thread. A network thread
(:class:`TrainerLink`) keeps the connection alive while training runs. For every bundle it receives it:

1. decodes and checks each sample packet, and drops packets it has already seen (:class:`~netrl.delivery.Deliveries`);
2. appends each new packet to the sample log on disk (:class:`~netrl.delivery.SampleLog`);
3. queues the packets for the training loop and acknowledges the bundle; the server then acknowledges the workers.

It grants the server credit as the loop consumes bundles, so a slow trainer never makes the server's memory grow.
The Trainer checkpoints after every epoch and when stopped. A restarted Trainer loads the checkpoint, rebuilds the
replay memory by replaying the sample log, so every sample a worker produced enters the memory exactly once, and
continues the weight version numbering after the newest version the checkpoint or the sample log names.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zmq

from netrl import checkpoint
from netrl.config import Config, NetworkConfig, config_to_dict
from netrl.delivery import Deliveries, SampleLog
from netrl.errors import CheckpointError, NetrlError, ProtocolError, SampleRejected
from netrl.keys import ClientKeys, client_keys
from netrl.metrics import MetricsLogger, WandbMode
from netrl.samples import Buffer
from netrl.schema import SampleSchema
from netrl.segments import Position
from netrl.training import TrainingOffline
from netrl.transport import NetThread, new_session
from netrl.weights import PART_BYTES, flat_layout, snapshot_into, write_weights_file
from netrl.wire import Message, MsgType, buffer_from_message, decode, encode, weight_parts

__all__ = ["Trainer", "TrainerLink"]

log = logging.getLogger(__name__)


class TrainerLink(NetThread):
    """The trainer's network thread; also the training loop's :class:`~netrl.training.SampleSource`."""

    def __init__(self, net: NetworkConfig, name: str, session: str, port: int, credit_window: int,
                 deliveries: Deliveries, sample_log: SampleLog | None, schema: SampleSchema | None = None,
                 keys: ClientKeys | None = None) -> None:
        super().__init__(net, "trainer", name, session, port, keys=keys)
        self.schema = schema
        self.credit_window = credit_window
        self.deliveries = deliveries
        self.sample_log = sample_log
        self.lock = threading.Lock()  # guards deliveries and the sample log against checkpoint snapshots
        self.inbox: collections.deque[tuple[list[Buffer], Position | None]] = collections.deque()
        self.new_data = threading.Event()
        self.version = 0  # the newest published weight version, written by the training thread
        self.ingested: Position | None = sample_log.end() if sample_log else None  # log end of fetched packets
        self.granted = 0  # credits granted on the current connection
        self.received = 0  # bundles received on the current connection
        self.weights: list[list[Any]] = []  # every part of the newest version, for a reconnect
        self.last_progress: list[Any] | None = None
        self._snapshots: list[tuple[np.ndarray, list[zmq.MessageTracker]]] = []  # reusable flat buffers
        self.stats: collections.Counter[str] = collections.Counter()

    # -- SampleSource, called from the training thread --------------------------------------------------
    def fetch(self) -> list[Buffer]:
        out: list[Buffer] = []
        taken = 0
        while self.inbox:
            bufs, end = self.inbox.popleft()
            out += bufs
            self.ingested = end
            taken += 1
        if taken:
            self.command([b"credit"])  # wake the network thread: it can grant the server new credit right away
        return out

    def wait(self, timeout: float) -> None:
        self.new_data.wait(timeout)
        self.new_data.clear()
        if self.error is not None or self.link.fatal:
            raise NetrlError(f"trainer cannot continue: {self.link.fatal or self.error}")

    def publish(self, actor: torch.nn.Module, version: int, trained_steps: int) -> None:
        """Snapshot the actor into a reused flat buffer and send it in parts (training goes on meanwhile)."""
        self.version = version
        state = actor.state_dict()  # once: it costs tens of microseconds, a third of a small actor's publish
        layout, nbytes = flat_layout(state)
        flat = self._free_snapshot(nbytes)
        snapshot_into(state, layout, flat)
        trackers = []
        for msg in weight_parts(self.link.name, self.link.session, version, trained_steps, flat, layout, PART_BYTES):
            tracker = self.command([b"weights", b"%d" % msg.body["part"], *encode(msg)], track=True)
            assert tracker is not None
            trackers.append(tracker)
        self._snapshots.append((flat, trackers))
        log.debug("published weights v%d in %d parts", version, len(trackers))

    def _free_snapshot(self, nbytes: int) -> np.ndarray:
        """A buffer no send still reads: the network thread keeps the newest version until the next one."""
        for i, (flat, trackers) in enumerate(self._snapshots):
            if flat.nbytes == nbytes and all(t.done for t in trackers):
                return self._snapshots.pop(i)[0]
        if len(self._snapshots) > 4:
            self._snapshots.pop(0)  # let an old, still-busy buffer go; a fresh one is allocated below
        return np.empty(nbytes, np.uint8)

    def progress(self, trained_steps: int, samples: int, wanted: int) -> None:
        msg = Message(MsgType.PROGRESS, self.link.name,
                      body={"trained_steps": trained_steps, "samples": samples, "wanted": wanted})
        self.command([b"progress", *encode(msg)])

    def delivery_state(self) -> dict[str, Any]:
        """Packets seen so far, consistent with the sample log (for a checkpoint)."""
        with self.lock:
            return self.deliveries.to_json()

    # -- network thread ---------------------------------------------------------------------------------
    def on_ready(self) -> None:
        self.granted = self.received = 0
        if self.schema is not None:  # first, so that the server checks packets before queueing them
            self.link.send(encode(Message(MsgType.SCHEMA, self.link.name, body=self.schema.to_wire())))
        self._grant()
        for frames in [*self.weights, self.last_progress]:
            if frames is not None:
                self.link.send(frames)

    def _grant(self) -> None:
        """Keep at most ``credit_window`` bundles either granted-but-unsent or waiting in the inbox."""
        if not self.link.ready:
            return
        extra = self.credit_window - (self.granted - self.received) - len(self.inbox)
        if extra > 0 and self.link.send(encode(Message(MsgType.CREDIT, self.link.name, body={"bundles": extra}))):
            self.granted += extra

    def on_tick(self) -> None:
        self._grant()

    def on_command(self, frames: list[Any]) -> None:
        kind, payload = frames[0].bytes, frames[1:]
        if kind == b"credit":
            self._grant()
            return
        if kind == b"weights":
            part, payload = int(payload[0].bytes), payload[1:]
            self.weights = [payload] if part == 0 else [*self.weights, payload]
        else:
            self.last_progress = payload
        self.link.send(payload)

    def on_message(self, msg: Message) -> None:
        if msg.type is not MsgType.BUNDLE:
            log.debug("ignored a %s message from the server", msg.type.value)
            return
        bufs = []
        for part in msg.parts:
            try:
                sample_msg = decode(part, self.link.net.max_message_bytes)
                if sample_msg.type is not MsgType.SAMPLES:
                    raise ProtocolError(f"bundle part is a {sample_msg.type.value} message")
                if self.schema is not None:
                    self.schema.check(sample_msg.body, sample_msg.arrays, f"{sample_msg.sender!r} (via the server)")
                buf = buffer_from_message(sample_msg)
            except (ProtocolError, SampleRejected) as exc:
                self.stats["rejected"] += 1
                if self.stats["rejected"] <= 10 or self.stats["rejected"] % 1000 == 0:
                    log.warning("rejected a sample packet in bundle %d (%d rejected): %s", msg.seq,
                                self.stats["rejected"], exc)
                continue
            buf.recv_version = self.version
            with self.lock:
                if not self.deliveries.add(buf.worker, buf.seq):
                    self.stats["duplicates"] += 1  # resent after a reconnect or a server restart
                    continue
                if self.sample_log is not None:  # on disk before it is acknowledged
                    self.sample_log.append(part, buf.worker, buf.seq, len(buf), buf.recv_version)
            bufs.append(buf)
        self.stats["bundles"] += 1
        self.received += 1
        self.inbox.append((bufs, self.sample_log.end() if self.sample_log else None))
        self.new_data.set()
        self.link.send(encode(Message(MsgType.ACK, self.link.name, body={"seqs": [msg.seq]})))


class Trainer:
    """Runs a :class:`TrainingOffline` against the server (tmrl's ``Trainer``), with checkpoints and resume.

    Args:
        training_cls: a callable returning a :class:`TrainingOffline` (usually a ``partial``).
        server_ip: address of the server.
        model_path: where the trainer saves its current policy (state_dict + JSON) after every epoch.
        server_port, network, name: connection settings.
        run_dir: folder for the checkpoint, the sample log, metrics.csv and wandb files.
        wandb_mode, wandb_project, wandb_entity: wandb settings ("disabled" turns it off).
        credit_window: bundles the server may send ahead of the training loop.
        resume: continue from the checkpoint in ``run_dir`` if there is one.
        persist_samples: keep a sample log so that a restart rebuilds the replay memory.
        fsync: fsync the sample log and checkpoints.
        sample_compressor: the workers' compressor, so the trainer knows the packet layout to expect.
        keys: CURVE keys to connect with (:func:`netrl.keys.client_keys`); None connects unencrypted.
    """

    def __init__(self, training_cls: Any = TrainingOffline, server_ip: str | None = None,
                 model_path: str | None = None, *, server_port: int = 55555, network: NetworkConfig | None = None,
                 name: str = "trainer", run_dir: str | Path = "weights/run", run_name: str = "run",
                 wandb_mode: WandbMode = "offline", wandb_project: str = "netrl", wandb_entity: str | None = None,
                 config: dict[str, Any] | None = None, credit_window: int = 8, resume: bool = True,
                 persist_samples: bool = True, fsync: bool = False, sample_compressor: Any = None,
                 keys: ClientKeys | None = None) -> None:
        self.training_cls = training_cls
        self.network = network or NetworkConfig()
        if server_ip is not None:
            from dataclasses import replace

            self.network = replace(self.network, server_ip=server_ip)
        self.server_port = server_port
        self.run_dir = Path(run_dir)
        self.model_path = Path(model_path) if model_path else self.run_dir / "policy.pt"
        self.name, self.run_name = name, run_name
        self.wandb = (wandb_mode, wandb_project, wandb_entity)
        self.config = config
        self.credit_window = credit_window
        self.resume, self.persist_samples, self.fsync = resume, persist_samples, fsync
        self.sample_compressor, self.keys = sample_compressor, keys
        self.session = new_session()
        self.training: TrainingOffline | None = None
        self.net: TrainerLink | None = None
        self.metrics: MetricsLogger | None = None
        self._closed = False

    @classmethod
    def from_config(cls, cfg: Config, pipeline: Any) -> Trainer:
        t, m = cfg.trainer, cfg.memory
        training_cls = lambda: TrainingOffline(  # noqa: E731
            env_cls=pipeline.env_cls, memory_cls=pipeline.memory_cls, training_agent_cls=pipeline.training_agent_cls,
            epochs=t.epochs, rounds=t.rounds, steps=t.steps, update_model_interval=t.update_model_interval,
            update_buffer_interval=t.update_buffer_interval,
            max_training_steps_per_env_step=t.max_training_steps_per_env_step, start_training=t.start_training,
            device=t.device, worker_lead=t.worker_lead, max_policy_lag=t.max_policy_lag,
            stale_sample_weight=t.stale_sample_weight, memory_size=m.memory_size, batch_size=m.batch_size,
            seed=cfg.seed)
        return cls(training_cls, cfg.network.server_ip, str(cfg.run_dir / "policy.pt"),
                   server_port=cfg.network.trainer_port, network=cfg.network, run_dir=cfg.run_dir,
                   run_name=cfg.run_name, wandb_mode=cfg.wandb.mode, wandb_project=cfg.wandb.project,
                   wandb_entity=cfg.wandb.entity, config=config_to_dict(cfg), credit_window=t.credit_window,
                   resume=t.resume, persist_samples=t.persist_samples, fsync=t.fsync,
                   sample_compressor=pipeline.sample_compressor,
                   keys=client_keys(cfg.keys_dir, "trainer", "trainer") if cfg.security == "curve" else None)

    def run(self, stop: threading.Event | None = None) -> None:
        """Train for ``epochs`` epochs or until ``stop`` is set, checkpointing each epoch, then close."""
        stop = stop or threading.Event()
        try:
            self.training = training = self.training_cls()
            training.build()
            self.run_dir.mkdir(parents=True, exist_ok=True)
            deliveries, sample_log = self._restore(training)
            if training.epoch >= training.epochs:
                log.warning("%s holds a finished run (%d of %d epochs): nothing to train. Raise trainer.epochs to "
                            "train it further, or set run_name for a new run", self.run_dir, training.epoch,
                            training.epochs)
                if sample_log is not None:
                    sample_log.close()
                return
            self.metrics = MetricsLogger(self.run_dir, self.run_name, *self.wandb, config=self.config)
            schema = SampleSchema.from_spaces(training.observation_space, training.action_space,
                                              self.sample_compressor)
            self.net = net = TrainerLink(self.network, self.name, self.session, self.server_port, self.credit_window,
                                         deliveries, sample_log, schema, self.keys)
            net.version = training.version
            net.start()
            training.start(net)
            log.info("trainer %s started: %d epochs x %d rounds x %d steps on %s", self.name, training.epochs,
                     training.rounds, training.steps, training.device)
            while training.epoch < training.epochs and not stop.is_set():
                for stats in training.run_epoch(net, stop):
                    self.metrics.log_round({**stats, "duplicates": net.stats["duplicates"]})
                if not stop.is_set():
                    self.checkpoint()
                    self.save_policy()
        finally:
            self.close()

    def _restore(self, training: TrainingOffline) -> tuple[Deliveries, SampleLog | None]:
        """Load the checkpoint (if resuming) and rebuild the replay memory from the sample log."""
        saved = checkpoint.load_checkpoint(self.run_dir) if self.resume else None
        if not self.resume and (checkpoint.exists(self.run_dir) or (self.run_dir / "samples").exists()):
            raise CheckpointError(f"{self.run_dir} already holds a checkpoint or sample log and trainer.resume is "
                                  "false: set trainer.resume to true to continue that run, or choose another run_name")
        state: dict[str, Any] = {}
        if saved is not None:
            agent_state, state = saved
            assert training.agent is not None
            training.agent.load_state_dict(agent_state)
            training.load_state(state)
        deliveries = Deliveries(state.get("deliveries"))
        if not self.persist_samples:
            return deliveries, None
        memory_size = training.memory_size
        sample_log = SampleLog(self.run_dir / "samples", keep_rows=int(memory_size * 1.1) + 10_000, fsync=self.fsync)
        at_checkpoint = Position(*state["log_position"]) if state.get("log_position") else None
        restored = after = newest = 0
        for rec in sample_log.read():
            buf = buffer_from_message(decode(rec.frames))
            buf.recv_version = int(rec.meta["recv_version"])
            newest = max(newest, buf.recv_version, int(buf.policy_version.max(initial=0)))
            new = at_checkpoint is None or rec.position >= at_checkpoint
            steps = training.add(buf, new=new)
            deliveries.add(buf.worker, buf.seq)
            restored += 0 if new else steps
            after += steps if new else 0
            if not new and rec.next == at_checkpoint:
                assert training.memory is not None
                log.info("replay memory restored to its checkpoint state: %d transitions (checkpoint: %s)",
                         len(training.memory), state.get("memory_len"))
        if restored or after:
            log.info("rebuilt the replay memory from the sample log: %d samples from before the checkpoint, %d "
                     "received after it; memory holds %d transitions", restored, after,
                     len(training.memory) if training.memory is not None else 0)
        if newest > training.version:  # published after the checkpoint, before a crash: never number weights twice
            log.info("weight versions continue after v%d, the newest in the sample log (the checkpoint has v%d)",
                     newest, training.version)
            training.version = newest
        return deliveries, sample_log

    def checkpoint(self) -> None:
        """Save agent, counters, weight version, sample-log position and delivery state (atomically)."""
        training, net = self.training, self.net
        if training is None or training.agent is None or net is None:
            return
        state = {**training.state(), "memory_len": len(training.memory) if training.memory is not None else 0,
                 "log_position": list(net.ingested) if net.ingested is not None else None,
                 "deliveries": net.delivery_state(), "trainer_session": self.session, "saved_at": time.time(),
                 "config": self.config}
        path = checkpoint.save_checkpoint(self.run_dir, training.agent.state_dict(), state, self.fsync)
        log.info("checkpoint saved to %s (epoch %d, %d training steps, weights v%d, memory %d)", path,
                 training.epoch, training.total_updates, training.version, state["memory_len"])

    def save_policy(self) -> None:
        """Write the current actor to ``model_path`` (state_dict plus a JSON sidecar with its version)."""
        training = self.training
        if training is None or training.agent is None:
            return
        meta = {"version": training.version, "trained_steps": training.total_updates,
                "samples": training.total_samples, "trainer_session": self.session, "saved_at": time.time(),
                "pid": os.getpid()}
        write_weights_file(self.model_path, training.agent.get_actor(), meta)

    def close(self) -> None:
        """Checkpoint, save the policy, disconnect and flush metrics. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.net is not None:
            self.net.halt()  # stop receiving first, so the checkpoint's delivery state is final
            self.checkpoint()
            if self.net.sample_log is not None:
                self.net.sample_log.close()
        self.save_policy()
        if self.metrics is not None:
            self.metrics.close()
        stats = self.net.stats if self.net is not None else collections.Counter()
        malformed = self.net.link.rejected_messages if self.net is not None else 0
        log.info("trainer stopped; policy saved to %s; %d sample packets rejected, %d malformed messages from the "
                 "server, %d duplicate packets dropped", self.model_path, stats["rejected"], malformed,
                 stats["duplicates"])
