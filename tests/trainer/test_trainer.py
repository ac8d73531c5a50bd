"""The Trainer without a network: weight numbering after a restart, a full disk, saves, and metrics on resume.

:class:`FakeLink` is the real :class:`TrainerLink` with no socket and no thread: each time the training loop
fetches, it first receives a bundle of one new packet, as its network thread would, and what it sends to the
server is kept in ``sent``.
"""

from __future__ import annotations

import csv
import errno
import logging
import os
import re
import threading
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium
import msgpack
import numpy as np
import pytest
import torch

import netrl.__main__
from netrl.actor import ActorModule
from netrl.agents.base import TrainingAgent
from netrl.agents.sac import MLPActorCritic, SACAgent
from netrl.config.sections import NetworkConfig
from netrl.errors import CheckpointError, NetrlError
from netrl.monitor.metrics import MetricsLogger
from netrl.net.transport import new_session
from netrl.protocol.messages import MAX_POLICY_VERSION, Message, MsgType
from netrl.protocol.wire import decode, encode, samples_message
from netrl.samples import Batch, Buffer, BufferBuilder, EpisodeStats
from netrl.storage import checkpoint
from netrl.storage.segments import Position
from netrl.trainer.delivery import Deliveries, SampleLog
from netrl.trainer.link import FOREIGN_VERSION_LIMIT, TrainerLink
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from tests.fakes import small_config

OBS = gymnasium.spaces.Box(-1, 1, (3,), np.float32)  # Pendulum's layout, as the CLI's default pipeline has it
ACT = gymnasium.spaces.Box(-2, 2, (1,), np.float32)


def packet(session: str, seq: int, version: int, rows: int = 6, episode: float | None = None) -> list[bytes]:
    """A worker's SAMPLES message: an episode's first observation, then ``rows - 1`` steps chosen by ``version``
    (and, with ``episode``, the report of an episode with that return)."""
    b = BufferBuilder(rows + 2, 1)
    rng = np.random.default_rng(seq)
    b.add(np.zeros(1, np.float32), rng.uniform(-1, 1, 3).astype(np.float32), 0.0, False, False, True, version)
    for _ in range(rows - 1):
        b.add(rng.uniform(-2, 2, 1).astype(np.float32), rng.uniform(-1, 1, 3).astype(np.float32),
              float(rng.normal()), False, False, False, version)
    buf = b.cut()
    assert buf is not None
    if episode is not None:
        buf.episodes.append(EpisodeStats(episode, rows - 1, False, version))
    return [bytes(f) for f in encode(samples_message(buf, "w", session, seq, seq * rows))]


class FakeLink(TrainerLink):
    at: dict[int, Callable[[FakeLink], None]] = {}  # fetch number -> what happens before that fetch

    def start(self) -> None:
        self.sent: list[Message] = []
        self.published: list[tuple[int, int]] = []  # (version, trained steps)
        self.fetches = self.bundles = 0
        self.packet_version: int | None = None  # the policy version of the packets workers send; None: ours
        self.episode: float | None = None  # the return of an episode each packet reports; None: no episode
        self.worker_session = new_session()  # a worker process per link: a restart's packets are not duplicates
        self.link.ready = True
        self.link.send = self._send  # type: ignore[method-assign]
        self.link.send_tracked = self._send_tracked  # type: ignore[method-assign]

    def _send(self, frames: Sequence[Any]) -> bool:
        self.sent.append(decode(frames))
        return True

    def _send_tracked(self, frames: Sequence[Any]) -> Any:
        self._send(frames)
        return types.SimpleNamespace(done=True)  # written at once

    def welcome(self, server_session: str, weights_version: int) -> int:
        """A WELCOME from the server; returns the version the link now counts as taken."""
        self.link.welcome = {"server_session": server_session, "heartbeat_interval_s": 1.0,
                             "weights_version": weights_version}
        self.on_ready()
        return self.taken_version()

    def receive(self, version: int) -> None:
        self.bundles += 1  # one packet per bundle, both numbered like this
        parts = [packet(self.worker_session, self.bundles, version, episode=self.episode)]
        self.on_message(Message(MsgType.BUNDLE, "server", seq=self.bundles, parts=parts))

    def publish(self, actor: torch.nn.Module, version: int, trained_steps: int) -> None:
        self.published.append((version, trained_steps))
        super().publish(actor, version, trained_steps)

    def fetch(self) -> list[Buffer]:
        self.fetches += 1
        action = self.at.get(self.fetches)
        if action is not None:
            action(self)
        if self.error is None:
            self.receive(self.version if self.packet_version is None else self.packet_version)
        return super().fetch()


class Links(FakeLink):
    made: list[FakeLink]  # every link a Trainer made, oldest first


@pytest.fixture
def links(monkeypatch: pytest.MonkeyPatch) -> type[Links]:
    """The Trainer's TrainerLink class, replaced for this test by a FakeLink that keeps every instance."""
    class Link(Links):
        made: list[FakeLink] = []
        at: dict[int, Callable[[FakeLink], None]] = {}

        def start(self) -> None:
            super().start()
            self.made.append(self)

    monkeypatch.setattr("netrl.trainer.trainer.TrainerLink", Link)
    return Link


def make_trainer(run_dir: Path, epochs: float, agent: Any = SACAgent, **kwargs: Any) -> Trainer:
    training_cls = partial(TrainingOffline, env_cls=(OBS, ACT), epochs=epochs, rounds=2, steps=10,
                           training_agent_cls=partial(agent, model_cls=partial(MLPActorCritic, hidden_sizes=(16,))),
                           update_model_interval=5, update_buffer_interval=2, start_training=10, worker_lead=10,
                           memory_size=1000, batch_size=8, seed=0, sleep_between_buffer_retrieval_attempts=0.01)
    return Trainer(training_cls, "127.0.0.1", run_dir=run_dir, wandb_mode="disabled", **kwargs)


def metrics(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_trainer_numbers_after_the_servers_newest_version_and_publishes_again_at_once(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    trainer = make_trainer(tmp_path, epochs=1)
    welcomed_at: list[int] = []

    def server_with_v40(link: FakeLink) -> None:  # an earlier trainer session published up to v40 before it crashed
        assert trainer.training is not None
        welcomed_at.append(trainer.training.total_updates)
        link.welcome("server-1", 40)
        link.packet_version = 40  # and workers still send samples its v40 chose

    links.at[4] = server_with_v40
    links.at[9] = lambda link: setattr(link, "packet_version", None)
    with caplog.at_level(logging.INFO):
        trainer.run()
    (link,) = links.made
    before = [v for v, steps in link.published if steps < welcomed_at[0]]
    after = link.published[len(before):]
    assert before and max(before) < 40
    assert after[0][0] == 41 and after[0][1] - welcomed_at[0] <= 1  # at once, not at the next scheduled publish
    assert all(v > 40 for v, _ in after) and [v for v, _ in after] == sorted({v for v, _ in after})
    assert caplog.text.count("publishing the current actor as v41") == 1
    lags = [int(r["lag_min"]) for r in metrics(tmp_path) if r["lag_min"]]
    assert lags and min(lags) >= 0  # samples from the crashed session's v40 arrived when the trainer was at v2


def test_a_worker_naming_versions_no_one_published_moves_the_numbering_at_most_to_half_the_largest_version(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    # The trainer numbers after versions it never published (another session's, still with workers), but takes a
    # worker's word only up to FOREIGN_VERSION_LIMIT. Without it, samples naming v2**63-1 would make the trainer number
    # past int64: its lag arithmetic would overflow, and the restarted trainer die again replaying its sample log.
    def foreign(version: int) -> Callable[[FakeLink], None]:
        return lambda link: setattr(link, "packet_version", version)

    links.at.update({3: foreign(FOREIGN_VERSION_LIMIT + 1), 4: foreign(FOREIGN_VERSION_LIMIT), 5: foreign(None)})
    with caplog.at_level(logging.WARNING):
        make_trainer(tmp_path, epochs=1).run()
    assert (f"names weights v{FOREIGN_VERSION_LIMIT + 1}, which this trainer session never published; versions it "
            f"did not publish are taken only up to v{FOREIGN_VERSION_LIMIT}") in caplog.text
    assert f"sent samples from weights v{FOREIGN_VERSION_LIMIT}, which this trainer session never" in caplog.text
    (link,) = links.made
    assert link.stats["rejected"] == 1 and FOREIGN_VERSION_LIMIT < max(v for v, _ in link.published) < 2 * 10**12
    make_trainer(tmp_path, epochs=2).run()  # replays the sample log, and numbers after it
    assert links.made[1].published[0][0] > max(v for v, _ in link.published)
    link.taken = MAX_POLICY_VERSION  # only a server that was sent such a version can report it
    with pytest.raises(NetrlError, match=rf"cannot number weights v{MAX_POLICY_VERSION + 1}: the largest weight "
                                         r"version is .*restart the server to clear its weights cache"):
        link.publish(torch.nn.Linear(1, 1), MAX_POLICY_VERSION + 1, 0)


def test_a_logged_packet_that_todays_checks_refuse_is_skipped_on_restart_not_fatal(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    make_trainer(tmp_path, epochs=1).run()
    old = packet(new_session(), 1, 0)  # as an older netrl logged it: a session id today's wire refuses
    header = msgpack.unpackb(old[0])
    header["body"]["session"] = "not a valid id!"
    log = SampleLog(tmp_path / "samples", keep_rows=10_000)
    log.append([msgpack.packb(header), *old[1:]], "w/x", 1, 6, 0)
    log.close()
    with caplog.at_level(logging.WARNING):
        make_trainer(tmp_path, epochs=2).run()  # skipped: the MalformedMessage would stop every restart
    assert "skipped a packet in the sample log at" in caplog.text and "is not a valid id" in caplog.text
    assert checkpoint.load_state(tmp_path)["epoch"] == 2  # type: ignore[index]


def test_a_sample_log_an_older_protocol_version_wrote_is_replayed_after_an_upgrade(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    make_trainer(tmp_path, epochs=1).run()
    session = new_session()
    old = packet(session, 1, 0)
    header = msgpack.unpackb(old[0])
    header["v"] = 1  # as netrl before protocol version 2 logged it: the same fields
    log = SampleLog(tmp_path / "samples", keep_rows=10_000)
    log.append([msgpack.packb(header), *old[1:]], f"w/{session}", 1, 6, 0)
    log.close()
    with caplog.at_level(logging.INFO):
        make_trainer(tmp_path, epochs=2).run()
    assert "skipped a packet in the sample log" not in caplog.text
    assert re.search(r"rebuilt the replay memory from the sample log: \d+ samples from before the checkpoint, 5 "
                     r"received after it", caplog.text), caplog.text  # its 5 steps (the first row is a reset)
    assert f"w/{session}" in checkpoint.load_state(tmp_path)["deliveries"]  # type: ignore[index]


def test_a_restarted_trainer_numbers_after_every_version_it_sent_out_though_the_server_forgot_them(
        tmp_path: Path, links: type[Links], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # No sample log, whose packets would name the versions in force when they arrived: the versions published after
    # the last logged packet (while the server was away, say) are known from PUBLISHED alone.
    make_trainer(tmp_path, epochs=1, persist_samples=False).run()  # checkpoint after epoch 0
    real_save = checkpoint.save_checkpoint
    monkeypatch.setattr(checkpoint, "save_checkpoint", lambda *args, **kwargs: None)
    make_trainer(tmp_path, epochs=2, persist_samples=False).run()  # publishes more, then dies before its checkpoint
    sent = max(v for v, _ in links.made[1].published)
    assert sent > checkpoint.load_state(tmp_path)["version"]  # type: ignore[index]
    assert checkpoint.published_version(tmp_path) == sent
    monkeypatch.setattr(checkpoint, "save_checkpoint", real_save)
    with caplog.at_level(logging.INFO):  # a new server process too: no WELCOME names the old versions
        make_trainer(tmp_path, epochs=2, persist_samples=False).run()
    assert links.made[2].published[0][0] == sent + 1
    assert f"weight versions continue after v{sent}, the newest this run sent out" in caplog.text

    (tmp_path / "checkpoint" / "PUBLISHED").write_text("{torn")
    with pytest.raises(CheckpointError, match=r"PUBLISHED is unreadable .*remove it"):
        make_trainer(tmp_path, epochs=3).run()


def test_a_version_that_cannot_be_noted_on_disk_is_not_sent_and_the_trainer_stops_with_advice(
        tmp_path: Path, links: type[Links], monkeypatch: pytest.MonkeyPatch) -> None:
    def no_room(run_dir: Path, version: int, fsync: bool = False) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "record_published", no_room)
    with pytest.raises(CheckpointError, match=r"could not write the newest weight version to .*No space left.*v1 "
                                              r"was not sent"):
        make_trainer(tmp_path, epochs=1).run()
    (link,) = links.made
    # nothing went to the network thread
    assert link.version == 0 and not link.sender.snapshots.held


def test_the_link_counts_a_servers_versions_as_taken_unless_only_its_own_can_have_them(tmp_path: Path) -> None:
    link = FakeLink(NetworkConfig(), "trainer", new_session(), 1, 4, Deliveries(), None)
    link.start()
    try:
        link.version = 5
        assert link.welcome("server-1", 3) == 3  # older than ours: the loop has nothing to do (3 < 5)
        assert link.welcome("server-1", 5) == 3  # a reconnect to the same server process, which has our v5
        assert link.welcome("server-1", 7) == 7  # a number this session never published
        link.version = 10
        assert link.welcome("server-2", 10) == 10  # a new server process with our number: maybe another actor
        link.receive(12)  # a packet chosen by a version no one told us about
        assert link.taken_version() == 12 and link.fetch()[0].recv_version == 12  # so its lag is 0, not -2
    finally:
        link.halt()


def test_a_full_disk_stops_the_trainer_with_advice_exit_code_1_and_no_ack_for_what_it_could_not_log(
        tmp_path: Path, links: type[Links], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = small_config(tmp_path, trainer={"epochs": 1, "rounds": 2, "steps": 20, "update_buffer_interval": 2,
                                             "start_training": 10, "worker_lead": 10})
    real_append = SampleLog.append

    def append(log: SampleLog, frames: Sequence[Any], stream: str, seq: int, rows: int, recv_version: int) -> Any:
        if seq == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(log, frames, stream, seq, rows, recv_version)

    def no_room(*args: Any, **kwargs: Any) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SampleLog, "append", append)
    monkeypatch.setattr(checkpoint, "save_checkpoint", no_room)  # the disk is full for the checkpoint too
    monkeypatch.setattr(netrl.__main__, "install_stop_signals", lambda stop: None)  # keep pytest's SIGINT
    monkeypatch.setattr(netrl.__main__, "configure_torch", lambda cfg, role: None)  # keep this process's torch threads
    assert netrl.__main__.main(["--trainer", "--config", str(config)]) == 1
    out = capsys.readouterr().out
    samples = tmp_path / "weights" / "test" / "samples"
    assert "Traceback" not in out
    assert re.search(rf" E \[trainer \d+\] netrl: trainer cannot continue: could not write the sample log in "
                     rf"{re.escape(str(samples))} \(\[Errno 28\] No space left on device\): free disk space", out)
    assert "could not write a checkpoint in" in out  # logged too; the first error is the one reported
    (link,) = links.made
    acked = [seq for m in link.sent if m.type is MsgType.ACK for seq in m.body["seqs"]]
    assert acked == [1, 2, 3]  # bundle 4 was not logged, so the server and the worker keep it
    assert list(link.deliveries.streams().values()) == [[[1, 3]]]  # a checkpoint would not mark it as seen


def test_a_stop_while_the_trainer_starts_publishes_and_saves_nothing(tmp_path: Path, links: type[Links]) -> None:
    stop = threading.Event()
    stop.set()  # Ctrl+C while wandb starts, say
    make_trainer(tmp_path, epochs=1).run(stop)
    assert not (tmp_path / "policy.pt").exists() and not checkpoint.exists(tmp_path)
    assert checkpoint.published_version(tmp_path) < 1 and not links.made  # the link never started
    make_trainer(tmp_path, epochs=1).run()
    assert links.made[0].published[0][0] == 1  # an aborted start does not use up a version


def test_a_finished_run_saves_once_per_epoch_and_a_stop_saves_what_is_new(
        tmp_path: Path, links: type[Links], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    saves: list[int] = []
    real_save = checkpoint.save_checkpoint

    def counted(run_dir: Path, agent_state: dict[str, Any], state: dict[str, Any], fsync: bool = False) -> Path:
        saves.append(state["total_updates"])
        return real_save(run_dir, agent_state, state, fsync)

    monkeypatch.setattr(checkpoint, "save_checkpoint", counted)
    with caplog.at_level(logging.INFO):
        make_trainer(tmp_path, epochs=2).run()
    assert saves == [20, 40]  # one per epoch; closing the finished run has nothing new to save
    assert "trainer started: 2 epochs" in caplog.text
    policy = (tmp_path / "policy.pt").read_bytes()

    stop = threading.Event()
    links.at[3] = lambda link: stop.set()
    with caplog.at_level(logging.INFO):
        make_trainer(tmp_path, epochs=3, name="gpu-box").run(stop)
    assert len(saves) == 3 and saves[-1] > 40  # stopped mid-epoch: its progress is saved
    assert "trainer 'gpu-box' started: 3 epochs" in caplog.text
    assert (tmp_path / "policy.pt").read_bytes() != policy

    policy = (tmp_path / "policy.pt").read_bytes()
    caplog.clear()
    with caplog.at_level(logging.INFO), pytest.raises(CheckpointError, match=r"trainer\.resume is false"):
        make_trainer(tmp_path, epochs=3, resume=False).run()
    assert len(saves) == 3 and (tmp_path / "policy.pt").read_bytes() == policy  # an untrained actor saved nowhere
    # it never started: no "trainer stopped" summary ahead of the error, which says it all
    assert "trainer stopped" not in caplog.text and "policy saved" not in caplog.text


def test_a_resumed_trainer_drops_the_rounds_it_logged_after_its_checkpoint(
        tmp_path: Path, links: type[Links], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    make_trainer(tmp_path, epochs=1).run()  # checkpoint after epoch 0
    real_save = checkpoint.save_checkpoint
    monkeypatch.setattr(checkpoint, "save_checkpoint", lambda *args, **kwargs: None)
    make_trainer(tmp_path, epochs=2).run()  # logs epoch 1's rounds, then dies before its checkpoint reaches disk
    assert len(metrics(tmp_path)) == 4
    monkeypatch.setattr(checkpoint, "save_checkpoint", real_save)
    with caplog.at_level(logging.INFO):
        make_trainer(tmp_path, epochs=2).run()  # resumes after epoch 0 and trains epoch 1 again
    rows = metrics(tmp_path)
    assert [(r["epoch"], r["round"]) for r in rows] == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    steps = [int(r["trained_steps"]) for r in rows]
    assert steps == sorted(set(steps))  # one history, as --plot draws it
    assert "dropped 2 rounds" in caplog.text


def test_the_trainer_logs_a_live_status_line_between_rounds(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    trainer = make_trainer(tmp_path, epochs=1, status_interval_s=1e-9)  # a line at every tick after the first
    memory_at: list[int] = []

    def tick(link: FakeLink) -> None:
        link.on_tick()  # what the network thread does after every poll
        assert trainer.training is not None and trainer.training.memory is not None
        memory_at.append(len(trainer.training.memory))

    for fetch in (1, 2, 9):
        links.at[fetch] = tick
    links.at[6] = lambda link: setattr(link, "episode", -123.4)  # from here, each packet reports an episode:
    # the loop ingests every 2 steps, so at fetch 9 it holds those of fetches 6 and 7
    with caplog.at_level(logging.INFO, logger="netrl.trainer.link"):
        trainer.run()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("status |")]
    assert len(lines) == 2  # the first tick only starts the clock
    line = (r"status \| trainer \| \d+ training steps/s \| samples in \d+/s \| memory {} of 1,000 \([\d.]+%\) \| "
            r"weights v\d+")
    # fetch 2: one 5-step packet in memory, before start_training (10): no episode yet, and it says when training starts
    assert re.fullmatch(line.format(memory_at[1]) + r" \| lag 0/0.0/0 \| return - \| server connected \| training "
                        r"starts at 10 samples", lines[0]), lines[0]
    assert re.fullmatch(line.format(memory_at[2]) + r" \| lag \d+/[\d.]+/\d+ \| return -123.4 over 2 eps this round \| "
                        r"server connected",
                        lines[1]), lines[1]
    assert memory_at[2] > memory_at[1] > 0


def test_a_status_line_that_cannot_read_the_loop_never_stops_the_network_thread(
        caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def broken() -> dict[str, Any]:
        calls.append(1)
        raise RuntimeError("a memory whose __len__ is not thread-safe")

    link = TrainerLink(NetworkConfig(), "trainer", new_session(), 1, 8, Deliveries(), None, None, None, 1e-9, broken)
    try:
        with caplog.at_level(logging.INFO, logger="netrl.trainer.link"):
            for _ in range(3):
                link.on_tick()  # raising here would end the network thread, and the trainer with it
    finally:
        link.halt()
    assert len(calls) == 1 and "no more status lines" in caplog.text


class TutorialAgent(TrainingAgent):
    """As in tmrl's tutorial: ``train`` and ``get_actor`` only, no ``state_dict``/``load_state_dict``."""

    def __init__(self, observation_space: Any, action_space: Any, device: str, model_cls: Any) -> None:
        super().__init__(observation_space, action_space, device)
        self.sac = SACAgent(observation_space, action_space, device, model_cls=model_cls)

    def train(self, batch: Batch) -> dict[str, float]:
        return self.sac.train(batch)

    def get_actor(self) -> ActorModule:
        return self.sac.get_actor()


def actor_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    assert trainer.training is not None and trainer.training.agent is not None
    return {k: v.clone() for k, v in trainer.training.agent.get_actor().state_dict().items()}


def test_an_agent_without_state_dict_is_warned_once_checkpoints_its_actor_and_resumes_with_it(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        trainer = make_trainer(tmp_path, epochs=1, agent=TutorialAgent)
        trainer.run()  # without the fallback to its actor, it would train an epoch, then fail in the checkpoint, twice
    assert caplog.text.count("TutorialAgent does not implement state_dict() and load_state_dict(): checkpoints will "
                             "hold its actor's weights") == 1
    assert "Implement TutorialAgent.state_dict() and TutorialAgent.load_state_dict(state)" in caplog.text
    assert "checkpoint saved to" in caplog.text and "trainer stopped; policy saved to" in caplog.text
    state = checkpoint.load_state(tmp_path)
    assert state is not None and state["agent_state"] == "actor" and state["epoch"] == 1
    trained = actor_state(trainer)

    caplog.clear()
    with caplog.at_level(logging.INFO):
        resumed = make_trainer(tmp_path, epochs=1, agent=TutorialAgent)
        resumed.run()  # a finished run: restores, then stops
    assert "restored them into TutorialAgent's actor" in caplog.text
    assert all(torch.equal(trained[k], v) for k, v in actor_state(resumed).items())
    make_trainer(tmp_path, epochs=2, agent=TutorialAgent).run()  # and trains on from there
    state = checkpoint.load_state(tmp_path)
    assert state is not None and state["epoch"] == 2 and state["total_updates"] == 40


class FailingAgent(SACAgent):
    """User code that fails in train() after a few steps, and again in state_dict() while the trainer saves."""

    def train(self, batch: Batch) -> dict[str, float]:
        if getattr(self, "trained", 0) == 3:
            raise RuntimeError("train() failed")
        self.trained = getattr(self, "trained", 0) + 1
        return super().train(batch)

    def state_dict(self) -> dict[str, Any]:
        raise RuntimeError("state_dict() failed too")


def test_a_failing_save_on_the_error_path_is_logged_and_the_first_error_is_raised(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError, match=r"^train\(\) failed$") as err:
        make_trainer(tmp_path, epochs=1, agent=FailingAgent).run()
    assert err.value.__context__ is None  # not chained under the save's error
    failed = [r for r in caplog.records if "saving the checkpoint and the policy failed too" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None and "state_dict() failed too" in caplog.text
    assert "the error that stopped the trainer follows" in failed[0].getMessage()
    assert "trainer stopped by the error that follows; the policy could not be saved" in caplog.text


def test_a_finished_run_says_what_to_change_in_python_and_in_config_json(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    make_trainer(tmp_path, epochs=1).run()
    with caplog.at_level(logging.WARNING):
        make_trainer(tmp_path, epochs=1).run()
    assert (f"{tmp_path} holds a finished run (1 of 1 epochs): nothing to train. To train it further, raise the epochs "
            "(Python: TrainingOffline(epochs=...); config.json: trainer.epochs); to start a new run, choose another "
            "folder (Python: Trainer(run_dir=...); config.json: run_name)") in caplog.text


def test_a_trainer_stopped_mid_round_resumes_where_it_stopped(tmp_path: Path, links: type[Links]) -> None:
    stop = threading.Event()
    first = make_trainer(tmp_path, epochs=1)

    def stop_after_13_steps(link: FakeLink) -> None:
        if first.training is not None and first.training.total_updates >= 13:
            stop.set()

    links.at = dict.fromkeys(range(1, 1000), stop_after_13_steps)
    first.run(stop)
    assert first.training is not None and 13 <= first.training.total_updates < 20  # in round 1 of 2
    links.at = {}
    second = make_trainer(tmp_path, epochs=1)
    second.run()
    assert second.training is not None and second.training.total_updates == 20  # the epoch's 20, not 20 more
    rows = metrics(tmp_path)
    assert [(r["epoch"], r["round"], r["trained_steps"]) for r in rows] == [("0", "0", "10"), ("0", "1", "20")]


def test_weights_numbered_before_the_welcome_said_the_number_was_taken_are_never_sent() -> None:
    from netrl.agents.sac import MLPActor
    from netrl.launch import free_port

    link = FakeLink(NetworkConfig(), "trainer", new_session(), free_port(), 8, Deliveries(), None)
    link.start()
    actor = MLPActor(OBS, ACT, hidden_sizes=(8,))

    def deliver() -> list[int]:  # what the network thread does with the training thread's commands
        while link._pipe_in.poll(100):
            link.on_command(link._pipe_in.recv_multipart(copy=False))
        return [m.policy_version for m in link.sent if m.type is MsgType.WEIGHTS]

    try:
        link.publish(actor, 1, 0)
        assert deliver() == [1]
        assert link.welcome("server-1", 40) == 40  # a reconnect: an earlier session's v40 is out there
        assert deliver() == [1]  # v1 is not sent again: workers would tag samples with a number that reads 39 old
        link.publish(actor, 2, 5)  # published before the loop saw the WELCOME
        assert deliver() == [1]
        link.publish(actor, 41, 6)  # what the loop publishes once it has seen it
        assert deliver() == [1, 41]
    finally:
        link.halt()


def test_tmrls_unlimited_epochs_train_until_stopped(tmp_path: Path, links: type[Links],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    trainer = make_trainer(tmp_path, epochs=np.inf)  # the tutorial's advice; "%d" of it would break the start line
    stop = threading.Event()
    links.at = dict.fromkeys(range(1, 10_000), lambda link: stop.set() if trainer.training.epoch >= 2 else None)  # type: ignore[union-attr]
    with caplog.at_level(logging.INFO, logger="netrl.trainer.trainer"):
        trainer.run(stop)
    assert "started: unlimited epochs x 2 rounds x 10 steps" in caplog.text
    assert len(metrics(tmp_path)) >= 4  # 2 rounds per epoch: it went on past the first epochs


def test_run_with_wandb_is_run_with_wandb_online(tmp_path: Path, links: type[Links],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, ...]] = []

    class Logger(MetricsLogger):  # records what the trainer asks for, and logs nowhere (no network here)
        def __init__(self, run_dir: Path, run_name: str, mode: str, project: str, entity: str | None,
                     config: Any = None, run_id: str | None = None) -> None:
            seen.append((mode, project, entity, run_id))
            super().__init__(run_dir, run_name, "disabled")

    monkeypatch.setattr("netrl.trainer.trainer.MetricsLogger", Logger)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    make_trainer(tmp_path / "a", epochs=1).run_with_wandb(entity="lab", project="drone", run_id="r1", key="k" * 40)
    assert seen == [("online", "drone", "lab", "r1")]
    assert os.environ["WANDB_API_KEY"] == "k" * 40
    make_trainer(tmp_path / "b", epochs=1, wandb_project="mine").run_with_wandb()  # None keeps the constructor's
    assert seen[1] == ("online", "mine", None, None)


def test_a_restart_that_cannot_rebuild_the_checkpoints_memory_says_so(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    import shutil

    make_trainer(tmp_path, epochs=1).run()
    with caplog.at_level(logging.WARNING, logger="netrl.trainer"):
        make_trainer(tmp_path, epochs=1).run()  # the sample log is whole: nothing to warn about
    assert "transitions" not in caplog.text
    shutil.rmtree(tmp_path / "samples")  # say, only checkpoint/ was copied to a new machine
    with caplog.at_level(logging.WARNING, logger="netrl.trainer"):
        make_trainer(tmp_path, epochs=1).run()
    assert re.search(r"does not reach the checkpoint's position, so the replay memory holds 0 of the \d+ transitions",
                     caplog.text)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="netrl.trainer"):
        make_trainer(tmp_path, epochs=1, persist_samples=False).run()
    assert re.search(r"persist_samples is off, so the replay memory starts empty: the \d+ transitions", caplog.text)


def test_a_stop_while_the_memory_is_rebuilt_ends_the_start_at_once_and_saves_nothing(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # The first Ctrl+C must not wait until the whole sample log is read (11 s for a million rows, minutes for images).
    make_trainer(tmp_path, epochs=1).run()
    before = checkpoint.load_state(tmp_path)
    stop, added = threading.Event(), []
    real_add = TrainingOffline.add

    def add(self: TrainingOffline, buf: Any, new: bool = True) -> int:
        added.append(len(buf))
        stop.set()  # Ctrl+C after the first packet
        return real_add(self, buf, new=new)

    monkeypatch.setattr(TrainingOffline, "add", add)
    with caplog.at_level(logging.INFO, logger="netrl.trainer"):
        make_trainer(tmp_path, epochs=2).run(stop)
    assert len(added) == 1 and "stopped while rebuilding the replay memory" in caplog.text
    assert checkpoint.load_state(tmp_path) == before  # a part-built memory and delivery state are never saved
    assert "trainer started" not in caplog.text


def test_a_damaged_sample_log_record_is_skipped_with_a_warning_and_the_run_resumes(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    make_trainer(tmp_path, epochs=1).run()
    log = SampleLog(tmp_path / "samples", keep_rows=10_000)
    records = list(log.read())
    log.close()
    assert len(records) > 2
    path = tmp_path / "samples" / f"{records[1].position.segment:08d}.seg"
    data = bytearray(path.read_bytes())
    data[records[1].next.offset - 3] ^= 0xFF  # a failing disk flips a byte in the second packet
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO):
        make_trainer(tmp_path, epochs=2).run()  # skipped: an OSError traceback would stop every restart
    assert f"{path} is damaged from offset {records[1].position.offset} to {records[2].position.offset}" in caplog.text
    assert re.search(r"rebuilt the replay memory from the sample log: \d+ samples from before the checkpoint",
                     caplog.text)
    assert checkpoint.load_state(tmp_path)["epoch"] == 2  # type: ignore[index]
    at = Position(*checkpoint.load_state(tmp_path)["log_position"])  # type: ignore[index]
    log = SampleLog(tmp_path / "samples", keep_rows=10_000)
    last = next(r for r in log.read() if r.next == at)
    log.append(packet(new_session(), 1, 0), "w/x", 1, 6, 0)  # a packet that arrived after the checkpoint
    log.close()
    path = tmp_path / "samples" / f"{last.position.segment:08d}.seg"
    data = bytearray(path.read_bytes())
    data[last.next.offset - 3] ^= 0xFF  # now the packet just before the checkpoint's position
    path.write_bytes(bytes(data))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        make_trainer(tmp_path, epochs=3).run()
    assert "is damaged from offset" in caplog.text and "restored to its checkpoint state" in caplog.text
    assert "does not reach the checkpoint" not in caplog.text  # a false alarm would say "holds 55 of the 55"


def test_a_damaged_checkpoint_gives_way_to_the_one_before_and_the_run_goes_on(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    make_trainer(tmp_path, epochs=2).run()  # checkpoints 1 and 2, one per epoch
    folder = tmp_path / "checkpoint"
    assert sorted(p.name for p in folder.glob("agent_*.pt")) == ["agent_000001.pt", "agent_000002.pt"]
    (folder / "agent_000002.pt").write_bytes(b"PK\x03\x04 a failing disk")
    with caplog.at_level(logging.INFO):
        make_trainer(tmp_path, epochs=3).run()  # not "cannot read ..." and exit 1
    assert "resuming from checkpoint 1, the one before it" in caplog.text
    assert "replay memory restored to its checkpoint state" in caplog.text  # the log replays up to checkpoint 1...
    assert "does not reach the checkpoint" not in caplog.text  # ...and on from there
    assert checkpoint.load_state(tmp_path)["epoch"] == 3  # type: ignore[index]
    assert [int(r["epoch"]) for r in metrics(tmp_path)] == [0, 0, 1, 1, 2, 2]  # epoch 1's rounds logged once


def test_resuming_with_another_model_says_what_changed_and_what_to_do(tmp_path: Path, links: type[Links]) -> None:
    make_trainer(tmp_path, epochs=1).run()
    bigger = partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(32,)))
    trainer = Trainer(partial(TrainingOffline, env_cls=(OBS, ACT), epochs=2, rounds=2, steps=10,
                              training_agent_cls=bigger, memory_size=1000, batch_size=8, seed=0),
                      "127.0.0.1", run_dir=tmp_path, wandb_mode="disabled")
    with pytest.raises(CheckpointError, match=r"the checkpoint does not fit this SACAgent \(Error\(s\) in loading "
                                              r"state_dict for .*; size mismatch .*\): the model or the env changed "
                                              r"since it was saved; revert that change to resume, or start a new run"):
        trainer.run()


def test_the_trainers_schema_probe_leaves_a_compressor_in_use_by_a_worker_alone() -> None:
    # The trainer probes its sample compressor with a random row. FrameStackCompressor checks each stack against
    # the one before, so with a worker in the same process sharing the instance mid-episode (as tmrl's tutorial
    # shares one pipeline between its roles), a probe of the instance's own state would raise, and so would the
    # worker's next row.
    from netrl.memory.frames import FrameStackCompressor
    from netrl.protocol.schema import SampleSchema, probe_copy

    obs_space = gymnasium.spaces.Box(0, 255, (4, 16, 16), np.uint8)
    act_space = gymnasium.spaces.Box(-1, 1, (2,), np.float32)
    frames = np.random.default_rng(0).integers(0, 256, (6, 16, 16), dtype=np.uint8)
    compressor = FrameStackCompressor("raw")
    act = np.zeros(2, np.float32)
    compressor(act, np.stack([frames[0]] * 4), 0.0, False, False, {})  # the worker's episode so far
    compressor(act, np.stack([frames[0]] * 3 + [frames[1]]), 0.0, False, False, {})
    schema = SampleSchema.from_spaces(obs_space, act_space, probe_copy(compressor))  # a random stack, probed on a copy
    assert schema.leaves["obs"] == ("|u1", (16, 16))
    compressor(act, np.stack([frames[0]] * 2 + [frames[1], frames[2]]), 0.0, False, False, {})  # continues fine
    SampleSchema.from_spaces(obs_space, act_space, compressor)  # even probing the instance itself leaves it be
    compressor(act, np.stack([frames[0], frames[1], frames[2], frames[3]]), 0.0, False, False, {})
    with pytest.raises(ValueError, match="does not continue the previous one"):  # the check itself still works
        compressor(act, np.stack([frames[5]] * 3 + [frames[4]]), 0.0, False, False, {})


def test_a_trainer_runs_once_and_a_second_run_says_to_create_a_new_trainer(tmp_path: Path, links: type[Links]) -> None:
    trainer = make_trainer(tmp_path, epochs=1)
    trainer.run()
    with pytest.raises(NetrlError, match=f"a Trainer runs once; create a new Trainer on {tmp_path} to resume"):
        trainer.run()  # a notebook cell run again: it would lock the run folder and never let it go
    closed = make_trainer(tmp_path, epochs=2)
    closed.close()
    with pytest.raises(NetrlError, match="runs once"):
        closed.run()
    resumed = make_trainer(tmp_path, epochs=2)
    resumed.run()  # the run folder is free
    assert len(links.made) == 2 and resumed.training is not None and resumed.training.total_updates == 40


def test_close_from_another_thread_stops_the_run_which_saves_and_closes_itself(tmp_path: Path,
                                                                               links: type[Links]) -> None:
    trainer = make_trainer(tmp_path, epochs=1)
    closer = threading.Thread(target=trainer.close)

    def close_meanwhile(link: FakeLink) -> None:
        closer.start()
        closer.join(0.5)  # it waits for run() to stop, and run() for this: training goes on once it timed out

    links.at[4] = close_meanwhile
    trainer.run()
    closer.join(5)
    assert not closer.is_alive()
    assert trainer.training is not None and 0 < trainer.training.total_updates < 20  # stopped mid-epoch
    state = checkpoint.load_state(tmp_path)
    assert state is not None and state["total_updates"] == trainer.training.total_updates  # saved after it stopped


def test_a_second_interrupt_during_a_save_starts_no_other_save(tmp_path: Path, links: type[Links],
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    saves: list[int] = []
    stop = threading.Event()
    real_save = checkpoint.save_checkpoint

    def interrupted(run_dir: Path, agent_state: dict[str, Any], state: dict[str, Any], fsync: bool = False) -> Path:
        saves.append(state["total_updates"])
        stop.set()  # the first Ctrl+C, as the CLI's handler has it
        raise KeyboardInterrupt  # the second, in the middle of the end-of-epoch checkpoint

    monkeypatch.setattr(checkpoint, "save_checkpoint", interrupted)
    with pytest.raises(KeyboardInterrupt):
        make_trainer(tmp_path, epochs=2).run(stop)
    assert saves == [20]  # the save it cut short, and no other
    stop.clear()
    links.at[3] = lambda link: stop.set()  # the first Ctrl+C mid-epoch; the second cuts short the save at the stop
    with pytest.raises(KeyboardInterrupt):
        make_trainer(tmp_path, epochs=2).run(stop)
    assert len(saves) == 2
    monkeypatch.setattr(checkpoint, "save_checkpoint", real_save)

    def notebook_interrupt(link: FakeLink) -> None:
        raise KeyboardInterrupt  # a notebook's Ctrl+C, with no stop event set: what was trained is saved

    links.at[3] = notebook_interrupt
    with caplog.at_level(logging.INFO), pytest.raises(KeyboardInterrupt):
        make_trainer(tmp_path, epochs=2).run()  # the run folder was let go
    assert checkpoint.exists(tmp_path)
    assert "trainer stopped by KeyboardInterrupt (Ctrl+C); policy saved to" in caplog.text  # no error follows
    assert "by the error that follows" not in caplog.text


# -- what a run that ends by itself says: the key that ended it and how to train longer (a run that stopped
# mid-learning without a word left the user guessing which of a dozen keys to raise)
def test_a_run_its_epochs_ended_names_trainer_epochs_and_how_to_train_longer(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="netrl.trainer.trainer"):
        make_trainer(tmp_path, epochs=2).run()
    assert re.search(r"trainer finished: trainer\.epochs reached \(2 epochs of 2 rounds x 10 steps: 40 training "
                     r"steps, \d+ env steps arrived\)\. To train longer, raise trainer\.epochs \(--epochs; Python: "
                     r"TrainingOffline\(epochs=\.\.\.\)\), or set it to null to train until stopped, and start the "
                     r"trainer again: it resumes", caplog.text), caplog.text[-2000:]


def test_a_run_total_frames_ended_names_trainer_total_frames_and_how_to_train_longer(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    trainer = make_trainer(tmp_path, epochs=1000)
    trainer.training_cls = partial(trainer.training_cls, total_frames=40)  # packets of 5 samples
    with caplog.at_level(logging.INFO, logger="netrl.trainer.trainer"):
        trainer.run()
    assert re.search(r"trainer finished: trainer\.total_frames reached \(40 env steps arrived from all workers "
                     r"together, of 40\) after \d+ training steps\. To train longer, raise trainer\.total_frames "
                     r"\(--total-frames; Python: TrainingOffline\(total_frames=\.\.\.\)\) and start the trainer "
                     r"again: it resumes", caplog.text), caplog.text[-2000:]
    assert "trainer.epochs reached" not in caplog.text


def test_a_stopped_run_says_nothing_finished(tmp_path: Path, links: type[Links],
                                             caplog: pytest.LogCaptureFixture) -> None:
    trainer = make_trainer(tmp_path, epochs=float("inf"))
    stop = threading.Event()
    links.at = dict.fromkeys(range(1, 10_000), lambda link: stop.set() if link.fetches >= 30 else None)
    with caplog.at_level(logging.INFO, logger="netrl.trainer.trainer"):
        trainer.run(stop)
    assert "finished:" not in caplog.text and "trainer stopped" in caplog.text


def test_total_frames_ends_training_with_a_save_and_a_resumed_run_says_it_is_finished(
        tmp_path: Path, links: type[Links], caplog: pytest.LogCaptureFixture) -> None:
    trainer = make_trainer(tmp_path, epochs=1000)
    trainer.training_cls = partial(trainer.training_cls, total_frames=40)  # packets of 5 samples
    with caplog.at_level(logging.INFO):
        trainer.run()
    assert re.search(r"trainer finished: trainer\.total_frames reached \(40 env steps arrived from all workers "
                     r"together, of 40\) after \d+ training steps", caplog.text)
    state = checkpoint.load_state(tmp_path)
    assert state is not None and state["total_samples"] == 40 and state["epoch"] == 0  # not the epochs: the frames
    assert int(metrics(tmp_path)[-1]["samples"]) == 40  # the round it cut short is logged
    assert f"policy saved to {tmp_path / 'policy.pt'}" in caplog.text
    caplog.clear()
    again = make_trainer(tmp_path, epochs=1000)
    again.training_cls = partial(again.training_cls, total_frames=40)
    with caplog.at_level(logging.WARNING):
        again.run()
    assert (f"{tmp_path} holds a finished run (40 samples of total_frames 40): nothing to train. To train it "
            "further, raise the total_frames (Python: TrainingOffline(total_frames=...); config.json: "
            "trainer.total_frames)") in caplog.text
