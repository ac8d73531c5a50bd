"""The trainer's network thread: bundles of sample packets in, weights and progress out.

:class:`TrainerLink` keeps the connection alive while training runs and is the training loop's
:class:`~netrl.training.loop.SampleSource`. For every bundle it receives it:

1. decodes and checks each sample packet, and drops packets it has already seen
   (:class:`~netrl.trainer.delivery.Deliveries`);
2. appends each new packet to the sample log on disk (:class:`~netrl.trainer.delivery.SampleLog`);
3. queues the packets for the training loop and acknowledges the bundle; the server
   then acknowledges the workers.

It grants the server credit as the loop consumes bundles, so a slow trainer never makes the server's
memory grow. It also tells the loop which weight versions an earlier trainer session may have
published (the server's WELCOME, and packets naming versions this session never published), so
that no number ever names two actors.

Besides the policy it publishes further named models (an observation normaliser, a user's
module; see :mod:`netrl.protocol.models`), each with a version counter and an outbox of its
own: a big policy waiting for a slow link never holds back a small model. A WEIGHTS command's
head carries the model's slot (its index in ``TrainerLink.models``, 0 for "policy") in the
top 8 bits of its part number.

:meth:`TrainerLink.publish` numbers each version; the training thread's
side of sending it (a reused snapshot, the encodings, the WEIGHTS commands) is
:class:`~netrl.trainer.weight_sender.WeightSender`, and the status line's
wording is :mod:`netrl.trainer.status_line`'s.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch
import zmq

from netrl.config.sections import NetworkConfig
from netrl.errors import NetrlError, ProtocolError, SampleRejected
from netrl.monitor.status import StatusClock
from netrl.net.keys import ClientKeys
from netrl.net.thread import Command, NetThread, command_head, read_command
from netrl.protocol.messages import MAX_POLICY_VERSION, Message, MsgType, printable
from netrl.protocol.models import POLICY
from netrl.protocol.schema import LayoutMismatch, SampleSchema
from netrl.protocol.wire import PacketLimits, buffer_from_message, decode, encode
from netrl.samples.columns import Buffer
from netrl.storage.segments import Position
from netrl.trainer.delivery import Deliveries, SampleLog, write_failed
from netrl.trainer.encoding import WeightEncoder
from netrl.trainer.operator import OperatorBox
from netrl.trainer.outbox import Outboxes
from netrl.trainer.status_line import status_line
from netrl.trainer.weight_sender import WeightSender
from netrl.util import worth_logging

# A version named by a worker's samples that this session never published is taken (numbered after)
# only up to here: a worker, buggy or hostile, cannot push the numbering near MAX_POLICY_VERSION,
# and real runs never get here.
FOREIGN_VERSION_LIMIT = MAX_POLICY_VERSION // 2
MAX_LAYOUT_CAUSES = 64  # of the server's NOTICEs, logged once each
KEEPALIVE_PARTS = 256  # packets of a bundle between two looks at whether a heartbeat is due
_SLOT_SHIFT = 24  # a WEIGHTS command's part number: the model's slot above, the part below

__all__ = ["TrainerLink"]

log = logging.getLogger(__name__)


class TrainerLink(NetThread):
    """The trainer's network thread; also the training
    loop's :class:`~netrl.training.loop.SampleSource`."""

    def __init__(self, net: NetworkConfig, name: str, session: str, port: int, credit_window: int,
                 deliveries: Deliveries, sample_log: SampleLog | None, schema: SampleSchema | None = None,
                 keys: ClientKeys | None = None, status_interval_s: float = 0.0,
                 live: Callable[[], dict[str, Any]] | None = None,
                 record_version: Callable[[int, str], None] | None = None, weight_format: str = "float32",
                 weight_budget_s: float = 0.0) -> None:
        super().__init__(net, "trainer", name, session, port, keys=keys)
        # network.weight_format: float32 alone is sent as today, from the training thread;
        # any other setting is encoded on a thread of its own (netrl.trainer.encoding).
        # FormatError for an unknown setting.
        self.encoder = None if weight_format == "float32" else WeightEncoder(weight_format, weight_budget_s)
        self._command_lock = threading.Lock()  # training and encoding threads share the pipe
        self.live = live  # TrainingOffline.live
        self.record_version = record_version  # a version noted on disk before it is sent
        self._status = StatusClock(status_interval_s)
        self.schema = schema
        self.value_limits = schema and schema.limits  # checked on arrival, every leaf
        self.packet_limits: PacketLimits | None = None  # checked on every packet, before inflating
        self.credit_window = credit_window
        self.deliveries = deliveries
        self.sample_log = sample_log
        # guards deliveries and the sample log against checkpoint snapshots
        self.lock = threading.Lock()
        self.inbox: collections.deque[tuple[list[Buffer], Position | None]] = collections.deque()
        self.new_data = threading.Event()
        self.version = 0  # the newest published weight version, written by the training thread
        self.taken = -1  # the newest version that may name another session's weights, written by
                         # the network thread
        self.model_versions: dict[str, int] = {}  # other models: newest published version
                                                  # (training thread)
        self.taken_models: dict[str, int] = {}  # other models: as ``taken`` (network thread)
        self.models: list[str] = [POLICY]  # the slots of the models published so far (training
                                           # thread appends)
        self.server_session = ""  # the server process that sent the last WELCOME
        # log end of fetched packets
        self.ingested: Position | None = sample_log.end() if sample_log else None
        self.granted = self.received = 0  # credits granted, bundles received: this connection
        self.last_progress: list[Any] | None = None
        # the training thread's side of publishing: snapshots, encodings, WEIGHTS commands (through
        # self.command as it is when called: a test may replace it on the instance)
        self.sender = WeightSender(name, session, lambda frames, track=False: self.command(frames, track),
                                   self.encoder)
        # the server's counts of slow and unmeasured workers: small parts; adaptive: compact ones
        self.sender.server_stats = lambda: self.link.server_stats
        if weight_format == "adaptive":
            self.sender.compact = lambda: bool(self.link.server_stats.get("slow_workers"))
        self.stats: collections.Counter[str] = collections.Counter()
        self.outboxes = Outboxes(self.stats)  # model -> its newest version's parts (network thread)
        self.refused_notices = 0  # the server's NOTICEs that it refused our messages
        self.layout_causes: set[str] = set()  # why the server refused packets for our layout
        # revocations and lifts heard of, for the loop; its revocations, answers and report, to send
        self.operator = OperatorBox(name, lambda: self.wake(), self.new_data.set)

    # -- SampleSource, called from the training thread ---------------------------------------------
    def fetch(self) -> list[Buffer]:
        self._check()
        out: list[Buffer] = []
        taken = 0
        while self.inbox:
            bufs, end = self.inbox.popleft()
            out += bufs
            self.ingested = end
            taken += 1
        if taken:
            # wake the network thread: it can grant the server new credit right away
            self.command([command_head(Command.CREDIT)])
        return out

    def revocations(self) -> list[str]:
        """Training thread: the workers the server revoked since the last call (drop their rows)."""
        return self.operator.revocations()

    def revoke(self, worker: str, reason: str) -> None:
        """Training thread: ask the server to revoke ``worker`` (trainer.implausible: refuse)."""
        self.operator.revoke(worker, reason)

    def wait(self, timeout: float) -> None:
        self.new_data.wait(timeout)
        self.new_data.clear()
        self._check()

    def _check(self) -> None:
        if self.error is not None or self.link.fatal:
            raise NetrlError(f"trainer cannot continue: {self.link.fatal or self.error}")

    def announce(self, collect: dict[str, Any]) -> None:
        """Training thread: every version published from now on tells the workers how to collect
        (sync mode, its fragment length and batch mode; see :mod:`netrl.worker.runners.sync`): the
        worker config does not repeat them, so the two cannot disagree."""
        self.sender.collect = dict(collect)

    def wake(self) -> None:
        """Wake the network thread (it sends what waits: credit, revocations, lift answers)."""
        self.command([command_head(Command.CREDIT)])

    def command(self, frames: Any, track: bool = False) -> zmq.MessageTracker | None:
        with self._command_lock:
            return super().command(frames, track)

    def halt(self, timeout: float = 5.0) -> None:
        """Stop the thread, after the encoding thread has handed on what it was given
        (up to ``timeout`` s)."""
        if self.encoder is not None:
            self.encoder.wait(timeout)
            self.encoder.close(timeout)
        super().halt(timeout)

    def weight_metrics(self) -> dict[str, float]:
        """The newest lossy version's measured error per format, for the
        metrics (``weights_max_error/<format>``)."""
        errors = self.encoder.max_errors if self.encoder is not None else {}
        return {f"weights_max_error/{name}": error for name, error in errors.items()}

    @property
    def weights(self) -> list[list[Any]]:
        """Every part of the policy's newest version."""
        return self.outboxes[POLICY].parts

    @property
    def weights_version(self) -> int:
        return self.outboxes[POLICY].version

    def taken_model_version(self, model: str) -> int:
        """As :meth:`taken_version`, for another model than the policy."""
        return self.taken_models.get(model, -1)

    def publish(self, actor: torch.nn.Module, version: int, trained_steps: int, model: str = POLICY) -> None:
        """Snapshot the actor (or the named ``model``) into a reused flat buffer and send it in
        parts (training goes on meanwhile)."""
        # only a server that was sent such a version can have made this number
        if version > MAX_POLICY_VERSION:
            raise NetrlError(f"cannot number weights v{version}: the largest weight "
                             f"version is v{MAX_POLICY_VERSION}, and the server reports "
                             f"v{self.taken} as taken. Another trainer, or a peer holding "
                             f"the trainer key, sent it that version: restart the server to "
                             f"clear its weights cache, and check who holds keys/trainer/")
        if self.record_version is not None:
            self.record_version(version, model)
        if model == POLICY:
            self.version = version
        else:
            self.model_versions[model] = version
            if model not in self.models:
                self.models.append(model)  # before the command that names its slot
        slot = self.models.index(model) << _SLOT_SHIFT
        self.sender.send(actor, model, slot, version, trained_steps, keep=4 * len(self.models))

    def progress(self, trained_steps: int, samples: int, wanted: int, batch: tuple[int, int] | None = None) -> None:
        """``batch``: sync collection's batch under way, (its version, env steps so far)."""
        body = {"trained_steps": trained_steps, "samples": samples, "wanted": wanted,
                **self.operator.take_report()}  # the workers' standing, once a second
        if batch is not None and batch[0] >= 0:
            body["batch_version"], body["batch_steps"] = batch
        msg = Message(MsgType.PROGRESS, self.link.name, body=body)
        self.command([command_head(Command.PROGRESS), *encode(msg)])

    def taken_version(self) -> int:
        return self.taken

    def delivery_state(self) -> dict[str, Any]:
        """Packets seen so far, consistent with the sample log (for a checkpoint)."""
        with self.lock:
            return self.deliveries.to_json()

    # -- network thread ----------------------------------------------------------------------------
    def on_ready(self) -> None:
        self.granted = self.received = 0
        self._note_server_version()
        if self.schema is not None:  # first, so that the server checks packets before queueing them
            self.link.send(encode(Message(MsgType.SCHEMA, self.link.name, body=self.schema.to_wire())))
        self._grant()
        self.outboxes.restart(self._outnumbered)
        self._send_weights()
        if self.last_progress is not None:
            self.link.send(self.last_progress)

    def _note_server_version(self) -> None:
        """The newest version the server has seen is taken, unless it can only be
        this session's own."""
        reported = self.link.welcome.get("weights_version", -1)
        server = self.link.welcome.get("server_session", "")
        same_server, self.server_session = server == self.server_session, server
        # Back on the server process that told us its versions at our first WELCOME: what it has
        # now, up to our newest, is ours (it never names two actors). A new server process may
        # have them from another session.
        models = self.link.welcome.get("models")
        for model, newest in (models if isinstance(models, dict) else {}).items():
            if (model == POLICY or not isinstance(newest, int) or model not in self.model_versions
                    or (same_server and newest <= self.model_versions[model])):
                # (a model this session does not publish: none of its numbers are
                # this session's to give)
                continue
            if newest > self.taken_models.get(model, -1):
                self.taken_models[model] = newest
                self.new_data.set()
        if same_server and reported <= self.version:
            return
        if reported > self.taken:
            self.taken = reported
            self.new_data.set()  # wake the training loop: it publishes again under a new number

    def _outnumbered(self, version: int, model: str = POLICY) -> bool:
        """Weights numbered before a WELCOME said the number is taken are never sent: the loop
        publishes the actor (or the model) again under a new number (publish() numbers after
        taken_version()), so no sample carries a number that reads as stale."""
        return version <= (self.taken if model == POLICY else self.taken_models.get(model, -1))

    def _grant(self) -> None:
        """Keep at most ``credit_window`` bundles either granted-but-unsent or
        waiting in the inbox."""
        if not self.link.ready or self.error is not None:
            return
        extra = self.credit_window - (self.granted - self.received) - len(self.inbox)
        if extra > 0 and self.link.send(encode(Message(MsgType.CREDIT, self.link.name, body={"bundles": extra}))):
            self.granted += extra

    def on_tick(self) -> None:
        self._grant()
        self._send_weights()
        self._status_line()

    def _status_line(self) -> None:
        """Every ``status_interval_s``: one line with the loop's rates and state (the
        first tick only starts)."""
        if self.live is None or not self._status.due():
            return
        try:
            s = self.live()
        # e.g. a user's memory whose __len__ is not safe from this thread: never stop training
        except Exception:
            log.exception("could not read the training loop's counters "
                          "for the status line; no more status lines")
            self.live = None
            return
        rates = self._status.rates({"trained_steps": s["trained_steps"], "samples": s["samples"]})
        if rates is None:
            return
        log.info("%s", status_line(self.link.name, s, rates, self.link.state()))

    def on_command(self, frames: list[Any]) -> None:
        (kind, values), payload = read_command(frames[0]), frames[1:]
        if kind is Command.CREDIT:
            self._grant()
            while self.operator.outgoing and self.link.ready:
                self.link.send(encode(self.operator.outgoing.popleft()))
            return
        if kind is Command.WEIGHTS:
            slotted, version = values
            # (the part number itself is in the message)
            model = self.models[slotted >> _SLOT_SHIFT]
            if self._outnumbered(version, model):
                return
            self.outboxes.take(model, version, payload, self.link.ready)
            self._send_weights()
            return
        if kind is not Command.PROGRESS:
            raise ValueError(f"a {kind.name} command on the trainer's network "
                             f"thread, which takes CREDIT, WEIGHTS and PROGRESS")
        self.last_progress = payload
        self.link.send(payload)

    def _send_weights(self) -> None:
        if self.link.ready:
            self.outboxes.send(self.link.send_tracked)

    def on_message(self, msg: Message) -> None:
        if msg.type is MsgType.BUNDLE:
            self._take_bundle(msg)
        elif msg.type is MsgType.NOTICE and msg.body.get("refused"):  # one of its own messages
            self.refused_notices += 1
            if worth_logging(self.refused_notices):
                log.warning("the server refused a message of this trainer: %s (%d so far)",
                            printable(msg.body["reason"]), self.refused_notices)
        elif msg.type is MsgType.NOTICE:
            self._notice(msg.body["cause"], msg.body["reason"])
        elif not self.operator.on_message(msg):  # REVOKE and LIFT
            log.debug("ignored a %s message from the server", msg.type.value)

    def _take_bundle(self, msg: Message) -> None:
        # stopping after a failed write: the server keeps what it cannot deliver
        if self.error is not None:
            return
        bufs = []
        duplicates: list[tuple[str, int]] = []  # (stream, seq) already taken
        refused: dict[str, list[int]] = {}  # the parts refused, told back in the ACK
        for i, part in enumerate(msg.parts):
            # a bundle of 4,096 packets can take seconds on a busy CPU
            if i % KEEPALIVE_PARTS == KEEPALIVE_PARTS - 1:
                self.link.keepalive()
            try:
                sample_msg = decode(part, self.link.net.max_message_bytes, limits=self.packet_limits)
                if sample_msg.type is not MsgType.SAMPLES:
                    raise ProtocolError(f"bundle part is a {sample_msg.type.value} message")
                if self.schema is not None:
                    self.schema.check(sample_msg.body, sample_msg.arrays,
                                      f"{sample_msg.sender!r} (via the server)", inflated=True)
                buf = buffer_from_message(sample_msg)
                newest = int(buf.policy_version.max(initial=-1))
                if newest > max(self.version, self.taken, FOREIGN_VERSION_LIMIT):
                    raise SampleRejected(f"{buf.worker} names weights v{newest}, which this "
                                         f"trainer session never published; versions it did not "
                                         f"publish are taken only up to v{FOREIGN_VERSION_LIMIT}")
            except (ProtocolError, SampleRejected) as exc:
                self._refused(msg.seq, i, exc, refused)
                continue
            # a version this session never published: another's
            if newest > max(self.version, self.taken):
                self.stats["foreign_versions"] += 1
                if worth_logging(self.stats["foreign_versions"]):
                    log.warning("%s sent samples from weights v%d, which this trainer "
                                "session never published (its newest is v%d): new versions "
                                "are numbered after it, so that no number names two actors",
                                buf.worker, newest, max(self.version, self.taken))
                self.taken = newest
            # what the loop is about to number after: lag >= 0
            buf.recv_version = max(self.version, self.taken)
            with self.lock:
                if self.deliveries.seen(buf.worker, buf.seq):
                    self.stats["duplicates"] += 1  # resent after a reconnect or a server restart
                    duplicates.append((buf.worker, buf.seq))
                    continue
                if self.sample_log is not None:  # on disk before it is acknowledged
                    try:
                        self.sample_log.append(part, buf.worker, buf.seq, len(buf), buf.recv_version)
                    except OSError as exc:
                        self._stop_after_failed_write(exc)
                        return  # no ACK: the server and the worker keep this bundle's packets
                self.deliveries.add(buf.worker, buf.seq)  # once on disk: a checkpoint may save it
            bufs.append(buf)
        self.stats["bundles"] += 1
        self.received += 1
        self.inbox.append((bufs, self.sample_log.end() if self.sample_log else None))
        self.new_data.set()
        self._acknowledge(msg.seq, refused, bufs, duplicates)

    def _acknowledge(self, bundle: int, refused: dict[str, list[int]], bufs: list[Buffer],
                     duplicates: list[tuple[str, int]]) -> None:
        """At once (logged, queued); netrl.interop's collector: once it has yielded them."""
        self.link.send(encode(Message(MsgType.ACK, self.link.name, body={"seqs": [bundle], **refused})))

    def _refused(self, bundle: int, part: int, exc: ProtocolError | SampleRejected,
                 refused: dict[str, list[int]]) -> None:
        """Count and log a packet of a bundle refused; its part goes back in the bundle's ACK, so
        the server keeps one refused for its layout for a trainer of it and drops the others."""
        why = "layout_refused" if isinstance(exc, LayoutMismatch) else "rejected"
        refused.setdefault(why, []).append(part)
        self.stats[why] += 1
        if worth_logging(self.stats[why]):
            held = why == "layout_refused"  # the server keeps it on disk for a trainer of its layout
            log.warning("%s a sample packet in bundle %d (%d so far): %s%s", "refused" if held else
                        "rejected", bundle, self.stats[why], exc, " (its layout; the server keeps "
                        "it on disk for a trainer with that layout)" if held else "")

    def _notice(self, cause: str, reason: str) -> None:
        """The server refuses workers' packets for this trainer's sample layout: logged once per
        cause (the server says each once per connection), since this trainer is the one to fix."""
        if cause in self.layout_causes or len(self.layout_causes) >= MAX_LAYOUT_CAUSES:
            return
        self.layout_causes.add(cause)
        log.error("the server refuses workers' packets: their sample layout is not this trainer's: "
                  "%s. This trainer gets none of their samples; the workers keep them (up to "
                  "worker.max_backlog_bytes each) and send them to the first trainer whose layout "
                  "matches theirs: stop this one and start it with the workers' sample_compressor "
                  "and pipeline (config.json: the same env.pipeline)", printable(reason))

    def _stop_after_failed_write(self, exc: OSError) -> None:
        """End this thread cleanly; the training loop raises the advice at its next fetch."""
        assert self.sample_log is not None
        advice = write_failed("the sample log in", self.sample_log.log.dir, exc)
        self.error = NetrlError(f"{advice}; then start the trainer again, and it resumes "
                                f"from its last checkpoint. Nothing is lost: packets "
                                f"the log does not hold were not acknowledged, so "
                                f"the server and the workers still have them")
        self.stop_soon()
        self.new_data.set()
