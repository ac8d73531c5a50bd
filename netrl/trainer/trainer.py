"""Trainer: samples from the server -> replay memory -> TrainingAgent.train ->
versioned weights to the server.

The training loop (:class:`~netrl.training.loop.TrainingOffline`) runs on the calling thread; a
network thread (:class:`~netrl.trainer.link.TrainerLink`) receives sample packets, logs them to
disk and acknowledges them. The Trainer saves its policy and a checkpoint after every epoch and
when stopped (see :mod:`netrl.trainer.saving`). A restarted Trainer loads the checkpoint, rebuilds
the replay memory by replaying the sample log, so every sample a worker produced enters the memory
exactly once, and continues the weight version numbering after the newest version it ever sent out
(noted in the run folder before each send: see :mod:`netrl.trainer.resume`) and, once connected,
after the newest the server or a worker has seen (see :mod:`netrl.trainer.link`).
"""

from __future__ import annotations

import collections
import logging
import math
import os
import threading
from pathlib import Path
from typing import Any

from netrl.actor import declared_extras
from netrl.agents.base import ModelSpec
from netrl.config.load import config_to_dict
from netrl.config.sections import Config, NetworkConfig
from netrl.envs.checks import check_sample_compressor
from netrl.errors import NetrlError
from netrl.lifecycle.runs import Runs, ctrl_c_stops
from netrl.lifecycle.tmrl_args import TMRL_ONLY, is_path, is_text, tmrl_arguments
from netrl.lifecycle.torch_threads import apply_torch_threads
from netrl.memory.disk import close_ring_storage
from netrl.monitor.metrics import MetricsLogger, WandbMode
from netrl.net.keys import ClientKeys, client_keys
from netrl.net.transport import new_session
from netrl.protocol.models import check_model_names, version_columns
from netrl.protocol.schema import SampleSchema, probe_copy
from netrl.protocol.weight_formats import formats_for
from netrl.protocol.wire import PacketLimits, sample_row_bytes
from netrl.samples.info import check_info_keys, info_spec
from netrl.storage.folderlock import FolderLock
from netrl.storage.weight_files import remove_stale_temps
from netrl.trainer.delivery import Deliveries, SampleLog
from netrl.trainer.link import TrainerLink
from netrl.trainer.resume import check_model_path, restore
from netrl.trainer.saving import RunSaver
from netrl.trainer.status_line import trainer_label
from netrl.training.loop import TrainingOffline
from netrl.training.settings import TrainingSettings
from netrl.util import partial

__all__ = ["Trainer", "TrainerLink"]

log = logging.getLogger(__name__)


def finished(training: TrainingOffline) -> str:
    """What ended a run that was not stopped, and how to train it longer: the key (and flag) that
    ended it, since a run that stops mid-learning without a word leaves the user guessing."""
    if training.frames_done():
        return (f"trainer.total_frames reached ({training.total_samples} env steps arrived from all "
                f"workers together, of {training.settings.total_frames}) after "
                f"{training.total_updates} training steps. To train longer, raise "
                f"trainer.total_frames (--total-frames; Python: TrainingOffline(total_frames=...)) "
                f"and start the trainer again: it resumes")
    return (f"trainer.epochs reached ({training.epoch} epochs of {training.rounds} rounds x "
            f"{training.steps} steps: {training.total_updates} training steps, "
            f"{training.total_samples} env steps arrived). To train longer, raise trainer.epochs "
            f"(--epochs; Python: TrainingOffline(epochs=...)), or set it to null to train until "
            f"stopped, and start the trainer again: it resumes")


class Trainer:
    """Runs a :class:`TrainingOffline` against the server (tmrl's ``Trainer``),
    with checkpoints and resume.

    Args:
        training_cls: a callable returning a :class:`TrainingOffline` (usually a ``partial``).
        server_ip: address of the server.
        model_path: where the trainer saves its current policy (state_dict + JSON) after every
            epoch; default ``<run_dir>/policy.pt``. A path outside ``run_dir`` that holds another
            run's policy is refused at start, rather than overwritten.
        server_port, network, name: connection settings.
        run_dir: folder for the checkpoint, the sample log, metrics.csv and wandb files.
        wandb_mode, wandb_project, wandb_entity: wandb settings ("disabled" turns it off).
        credit_window: bundles the server may send ahead of the training loop.
        resume: continue from the checkpoint in ``run_dir`` if there is one.
        persist_samples: keep a sample log so that a restart rebuilds the replay memory.
        fsync: fsync the sample log and checkpoints.
        sample_compressor: the workers' compressor, so the trainer knows the
            packet layout to expect.
        keys: CURVE keys to connect with (:func:`netrl.net.keys.client_keys`);
            None connects unencrypted.
        status_interval_s: seconds between status log lines (0: none); 10 s, as ``python -m netrl``.
        torch_threads: ``torch.set_num_threads`` when the run starts (None: leave torch's
            setting); 1, as ``python -m netrl``: torch's default of one thread per core slows
            training on a machine that the trainer shares with a worker or the server.
        max_rows_per_packet: rows a sample packet may hold (the server's
            ``server.max_rows_per_packet``): a packet beyond it, or beyond that many rows of the
            expected layout in bytes, is refused before it is inflated.
        weight_format, weight_budget_s: how weights are encoded for the workers
            (``network.weight_format``: float32, float16, bfloat16, int8, delta,
            auto or a registered format) and auto's time per version to a worker; None:
            the ``network`` config's.
        models: further modules to sync to the workers besides the actor, by name (those of the
            agent's ``extra_models()`` come too): each published every ``ModelSpec.every`` training
            steps under a version counter of its own, loaded by the workers into their target of the
            same name, and recorded in every sample row as ``batch.extra["<name>_version"]``.
        info_keys: the env info entries the workers record (the pipeline's, see
            :mod:`netrl.samples.info`), expected in every packet and carried by the batches as
            ``batch.extra["info/<name>"]``.
    """

    @tmrl_arguments("Trainer", ("training_cls", "server_ip", "server_port", "password"), TMRL_ONLY,
                    "today's tmrl has server_port, password and tlspyo's settings there; "
                    "netrl takes the port as server_port=... and CURVE keys as keys=...", {
                        "server_ip": (is_text, "a string or None"), "model_path": (is_path, "a path or None")})
    def __init__(self, training_cls: Any = TrainingOffline, server_ip: str | None = None,
                 model_path: str | None = None, *, server_port: int = 55555, network: NetworkConfig | None = None,
                 name: str = "trainer", run_dir: str | Path = "weights/run", run_name: str = "run",
                 wandb_mode: WandbMode = "offline", wandb_project: str = "netrl", wandb_entity: str | None = None,
                 config: dict[str, Any] | None = None, credit_window: int = 8, resume: bool = True,
                 persist_samples: bool = True, fsync: bool = False, sample_compressor: Any = None,
                 keys: ClientKeys | None = None, status_interval_s: float = 10.0,
                 max_rows_per_packet: int = 65_536, torch_threads: int | None = 1,
                 models: dict[str, ModelSpec] | None = None, weight_format: str | None = None,
                 weight_budget_s: float | None = None, info_keys: Any = ()) -> None:
        if torch_threads is not None and not 1 <= torch_threads <= 1024:
            raise ValueError(f"torch_threads must be between 1 and 1024, or None to "
                             f"leave torch's setting (got {torch_threads!r})")
        if sample_compressor is not None:
            check_sample_compressor(sample_compressor)
        self.info_keys = check_info_keys(info_keys, "Trainer(info_keys=...)")
        self.models = dict(models or {})
        check_model_names(self.models, "Trainer(models=...)")
        self.training_cls = training_cls
        self.network = network or NetworkConfig()
        if server_ip is not None:
            from dataclasses import replace

            self.network = replace(self.network, server_ip=server_ip)
        self.weight_format = self.network.weight_format if weight_format is None else weight_format
        self.weight_budget_s = self.network.weight_budget_s if weight_budget_s is None else weight_budget_s
        # FormatError naming the known ones (a custom format: register it first)
        formats_for(self.weight_format)
        if not 0 <= self.weight_budget_s <= 3600:
            raise ValueError(f"weight_budget_s must be between 0 (the time between "
                             f"publications) and 3600 s (got {self.weight_budget_s!r})")
        self.server_port = server_port
        self.run_dir = Path(run_dir)
        self.model_path = Path(model_path) if model_path else self.run_dir / "policy.pt"
        self.name, self.run_name = name, run_name
        self.wandb = (wandb_mode, wandb_project, wandb_entity)
        self.wandb_run_id: str | None = None  # resume this wandb run (run_with_wandb)
        self.config = config
        self.credit_window = credit_window
        self.resume, self.persist_samples, self.fsync = resume, persist_samples, fsync
        self.sample_compressor, self.keys = sample_compressor, keys
        self.status_interval = status_interval_s
        self.max_rows_per_packet = max_rows_per_packet
        self.torch_threads = torch_threads
        self.session = new_session()
        self.training: TrainingOffline | None = None
        self.net: TrainerLink | None = None
        self.metrics: MetricsLogger | None = None
        self._saver = RunSaver(self.run_dir, self.model_path, self.session, config, fsync)
        self._runs = Runs(lambda: NetrlError(f"this Trainer has already run or was closed: a "
                                             f"Trainer runs once; create a new Trainer on "
                                             f"{self.run_dir} to resume from its checkpoint"),
                          lambda runner: NetrlError(f"this Trainer is already running (run() "
                                                    f"was called in {runner.name}): call "
                                                    f"run() once; to train two runs at "
                                                    f"once, create a Trainer for each"))
        self._lock = FolderLock(self.run_dir, "run folder",
                                "two trainers would interleave its sample log and checkpoints; "
                                "stop that one first, or give this trainer another run folder "
                                "(config.json: run_name; Python: Trainer(run_dir=...))")

    @classmethod
    def from_config(cls, cfg: Config, pipeline: Any) -> Trainer:
        t = cfg.trainer
        training_cls = partial(  # tmrl's parameters, then netrl's settings
            TrainingOffline, pipeline.env_cls, pipeline.memory_cls, pipeline.training_agent_cls,
            epochs=math.inf if t.epochs is None else t.epochs, rounds=t.rounds, steps=t.steps,
            update_model_interval=t.update_model_interval,
            update_buffer_interval=t.update_buffer_interval,
            max_training_steps_per_env_step=t.max_training_steps_per_env_step,
            start_training=t.start_training, device=t.device,
            settings=TrainingSettings.from_config(cfg))
        return cls(training_cls, cfg.network.server_ip, str(cfg.run_dir / "policy.pt"),
                   server_port=cfg.network.trainer_port, network=cfg.network, run_dir=cfg.run_dir,
                   run_name=cfg.run_name, wandb_mode=cfg.wandb.mode, wandb_project=cfg.wandb.project,
                   wandb_entity=cfg.wandb.entity, config=config_to_dict(cfg), credit_window=t.credit_window,
                   resume=t.resume, persist_samples=t.persist_samples, fsync=t.fsync,
                   sample_compressor=pipeline.sample_compressor,
                   info_keys=getattr(pipeline, "info_keys", ()),
                   keys=client_keys(cfg.keys_dir, "trainer", "trainer") if cfg.security == "curve" else None,
                   status_interval_s=cfg.status_interval_s, max_rows_per_packet=cfg.server.max_rows_per_packet,
                   torch_threads=cfg.torch_threads)

    def run(self, stop: threading.Event | None = None) -> None:
        """Train for ``epochs`` epochs or until ``stop`` is set, checkpointing
        each epoch, then close.

        A Trainer runs once: its run folder lock, network thread and sample log are gone once it
        closes, so a second run() (or a run() after close()) raises NetrlError; a new Trainer on
        the same ``run_dir`` resumes."""
        run_stop = self._runs.enter(stop, once=True)
        try:
            # the checkpoint saved on the way out too
            with ctrl_c_stops(run_stop, trainer_label(self.name)):
                self._run(run_stop)
        finally:
            self._runs.leave()

    def _run(self, run_stop: threading.Event) -> None:
        try:
            self._train(run_stop)
        except KeyboardInterrupt:
            # With stop already set, this is a second Ctrl+C (the first set stop), which must
            # interrupt at once, not start another save. Without (a notebook's Ctrl+C), save what
            # was trained, as a stop does.
            again = run_stop.is_set()
            if again:
                log.warning("interrupted again: stopping without saving; a new Trainer "
                            "resumes from the last checkpoint in %s", self.run_dir)
            self._close(raise_errors=False, failing=True, save=not again, interrupted=True)
            raise
        except BaseException:
            # the error that stopped training is the one to report
            self._close(raise_errors=False, failing=True)
            raise
        self.close()

    def run_with_wandb(self, entity: str | None = None, project: str | None = None, run_id: str | None = None,
                       key: str | None = None, stop: threading.Event | None = None) -> None:
        """tmrl's name for :meth:`run` with wandb online: ``entity`` and ``project`` replace the
        constructor's (None keeps them), ``run_id`` resumes that wandb run, and ``key`` is the API
        key (better: leave it None and set ``WANDB_API_KEY`` or run ``wandb login``, so that it
        stays out of your code). :meth:`run` logs to wandb too, offline by default."""
        if key is not None:
            os.environ["WANDB_API_KEY"] = key
        _, default_project, default_entity = self.wandb
        self.wandb = ("online", project or default_project, entity or default_entity)
        self.wandb_run_id = run_id
        self.run(stop)

    def _train(self, stop: threading.Event) -> None:
        # before the agent and memory are built
        apply_torch_threads(self.torch_threads, trainer_label(self.name))
        self.training = training = self.training_cls()
        training.build()
        publisher = training.publisher
        assert publisher is not None
        publisher.add_models(self.models, "Trainer(models=...)")
        check_model_names(publisher.models, f"the models {type(training.agent).__name__}"
                          ".extra_models() and Trainer(models=...) declare")
        self._lock.acquire()  # creates the folder
        check_model_path(self.model_path, self.run_dir)
        # what a trainer killed while saving its policy left
        remove_stale_temps(self.model_path.parent)
        deliveries, sample_log = self._restore(training, stop)
        if stop.is_set():  # stopped while rebuilding the memory: nothing trained, nothing to save
            if sample_log is not None:
                sample_log.close()
            return
        if training.epoch >= training.epochs or training.frames_done():
            done, setting = ((f"{training.epoch} of {int(training.epochs)} epochs", "epochs")
                             if training.epoch >= training.epochs else
                             (f"{training.total_samples} samples of total_frames "
                              f"{training.settings.total_frames}",
                              "total_frames"))
            log.warning("%s holds a finished run (%s): nothing to train. To train it further, "
                        "raise the %s (Python: TrainingOffline(%s=...); config.json: "
                        "trainer.%s); to start a new run, choose another folder (Python: "
                        "Trainer(run_dir=...); config.json: run_name)", self.run_dir, done,
                        setting, setting, setting)
            if sample_log is not None:
                sample_log.close()
            return
        self.metrics = MetricsLogger(self.run_dir, self.run_name, *self.wandb, config=self.config,
                                     run_id=self.wandb_run_id)
        self.metrics.rewind(training.total_updates)
        # as the worker probes; if it cannot be copied, the instance
        probe = probe_copy(self.sample_compressor)
        guards = training.safeguards
        schema = SampleSchema.from_spaces(training.observation_space, training.action_space,
                                          self.sample_compressor if probe is None else probe,
                                          guards.limits if guards is not None else None,
                                          {**declared_extras(training.agent.get_actor() if training.agent else None),
                                           **version_columns(publisher.models)},
                                          info_spec(self.info_keys))
        # bounds only where the workers' compressor sends leaves as the spaces describe them
        if guards is not None:
            guards.limits = schema.limits
        self.net = net = TrainerLink(self.network, self.name, self.session, self.server_port,
                                     self.credit_window, deliveries, sample_log, schema, self.keys,
                                     self.status_interval, training.live,
                                     self._saver.record_version, self.weight_format,
                                     self.weight_budget_s)
        net.version = publisher.version
        rows = self.max_rows_per_packet
        net.packet_limits = PacketLimits(rows, min(self.network.max_message_bytes, rows * sample_row_bytes(
            schema.leaves)), f"server.max_rows_per_packet is {rows}, in the trainer's config too")
        self._saver.note_saved(training, net)  # what the checkpoint on disk (if any) holds
        if stop.is_set():  # Ctrl+C while starting (wandb takes seconds): publish
                           # nothing, save nothing
            return
        net.start()
        training.start(net)
        # tmrl's np.inf
        epochs = "unlimited" if training.epochs == float("inf") else f"{training.epochs:g}"
        log.info("%s started: %s epochs x %d rounds x %d steps on %s",
                 trainer_label(self.name), epochs,
                 training.rounds, training.steps, training.device)
        while training.epoch < training.epochs and not stop.is_set() and not training.frames_done():
            for stats in training.run_epoch(net, stop):
                self.metrics.log_round({**stats, "duplicates": net.stats["duplicates"], **net.weight_metrics()})
            if not stop.is_set():
                self._save()
        if not stop.is_set():  # (saved just above)
            log.info("%s finished: %s", trainer_label(self.name), finished(training))

    def _restore(self, training: TrainingOffline, stop: threading.Event
                 ) -> tuple[Deliveries, SampleLog | None]:
        """The checkpoint and the sample log into ``training`` (see :mod:`netrl.trainer.resume`)."""
        restored = restore(training, self.run_dir, resume=self.resume,
                           persist_samples=self.persist_samples, fsync=self.fsync,
                           max_message_bytes=self.network.max_message_bytes, stop=stop)
        self._saver.published = restored.published
        return restored.deliveries, restored.sample_log

    def _save(self) -> None:
        """The policy file, then the checkpoint; an actor that needs a version of its own is
        published under it, unless the trainer is closing (its network thread has halted)."""
        self._saver.save(self.training, self.net, publish=not self._runs.shutting)

    def checkpoint(self) -> None:
        """Save agent, counters, weight version, sample-log position and delivery
        state (atomically)."""
        self._saver.checkpoint(self.training, self.net)

    def save_policy(self) -> None:
        """Write the current actor to ``model_path`` (state_dict plus a JSON
        sidecar with its version)."""
        self._saver.save_policy(self.training, self.net, publish=not self._runs.shutting)

    def close(self) -> None:
        """Checkpoint and save the policy if anything changed since the last save, disconnect and
        flush metrics. Idempotent. Called from another thread while :meth:`run` runs, it stops the
        run as its ``stop`` would and waits until run() has saved and closed (the training loop must
        not go on under a checkpoint)."""
        # (and a run() after close() would lock the run folder again, never to release it)
        if self._runs.close():
            return
        self._close(raise_errors=True)

    def _close(self, raise_errors: bool, failing: bool = False, save: bool = True, interrupted: bool = False) -> None:
        if not self._runs.shut_once():
            return
        try:
            self._close_steps(raise_errors, failing, save, interrupted)
        # even when a second Ctrl+C cut the save short: a new Trainer in this
        # process may take the folder
        finally:
            if self.net is not None and self.net.sample_log is not None:
                self.net.sample_log.close()
            if self.metrics is not None:
                self.metrics.close()
            if self.training is not None:  # memory.storage disk: its files go, its folder is free
                close_ring_storage(self.training.memory)
            self._lock.release()

    def _close_steps(self, raise_errors: bool, failing: bool, save: bool, interrupted: bool) -> None:
        failed: Exception | None = None
        if self.net is not None:
            self.net.halt()  # stop receiving first, so the checkpoint's delivery state is final
        # stopped mid-epoch, or failed
        unsaved = self._saver.unsaved(self.training, self.net)
        if save and unsaved:
            try:
                self._save()
            except NetrlError as exc:  # says what to do: one line is enough
                failed = exc
                if not raise_errors:
                    log.error("%s (the error that stopped the trainer follows)", exc)
            except Exception as exc:  # user code (the agent, the actor) failed while saving
                failed = exc
                # log it, and report the error that stopped training, not one chained on it
                if not raise_errors:
                    log.exception("saving the checkpoint and the policy failed "
                                  "too; the error that stopped the trainer follows")
        # it never got to train: the error that follows says it all
        if failing and self.net is None:
            return
        stats = self.net.stats if self.net is not None else collections.Counter()
        malformed = self.net.link.rejected_messages if self.net is not None else 0
        if failed:
            policy = "the policy could not be saved"
        elif unsaved and not save:
            policy = "what it trained since its last save is not saved"
        elif not self._saver.policy_saved:
            policy = "no policy saved (nothing was trained)"
        else:
            policy = f"policy saved to {self.model_path}"
        guards = self.training.safeguards if self.training else None
        ingester = self.training.ingester if self.training else None
        unstored = ingester.unstored if ingester is not None else 0
        over_share = sum(ingester.over_share.values()) if ingester is not None else 0
        log.info("trainer stopped%s; %s; %d sample packets rejected, %d the memory could "
                 "not store, %d malformed messages from the server, %d duplicate packets "
                 "dropped, %d refused for their values, %d training steps undone (not finite), "
                 "%d refused over their worker's share of the memory; "
                 "%d packets refused for their sample layout (the server keeps them for a "
                 "trainer with theirs where it can: its last line says where each is)",
                 " by KeyboardInterrupt (Ctrl+C)" if interrupted else " by the error that follows" if failing else "",
                 policy,
                 stats["rejected"], unstored, malformed, stats["duplicates"],
                 guards.refused if guards else 0, guards.nonfinite_steps if guards else 0, over_share,
                 stats["layout_refused"])
        if failed is not None and raise_errors:
            raise failed

