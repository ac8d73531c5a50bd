"""RolloutWorker on its own: what it refuses before anything reaches the network, and its episode log."""

from __future__ import annotations

import copy
import csv
import errno
import logging
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium
import msgpack
import numpy as np
import pytest
import torch

import netrl.worker.policy
import netrl.worker.runners.one_env
import netrl.worker.worker
from netrl.actor import ActorModule
from netrl.agents.sac import MLPActor
from netrl.config.load import config_from_dict
from netrl.config.sections import NetworkConfig
from netrl.envs.gym import GenericGymEnv
from netrl.errors import ConfigError, NetrlError
from netrl.launch import free_port
from netrl.net.thread import Command, command_head
from netrl.net.transport import new_session
from netrl.pipelines.image import image_pipeline
from netrl.protocol.messages import PEER_NAME, Message, MsgType
from netrl.protocol.wire import BUNDLE_HEADER_ROOM, decode, encode, samples_message
from netrl.util import partial
from netrl.worker.link import WorkerLink
from netrl.worker.names import default_worker_id
from netrl.worker.packets import PacketMaker
from netrl.worker.worker import RolloutWorker
from tests.fakes import MakeServer, running_server, sample_buffer, wait_until


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_packet_bigger_than_the_server_can_relay_stops_the_worker_with_what_to_change(
        codec: str, caplog: pytest.LogCaptureFixture) -> None:
    net = NetworkConfig(max_message_bytes=1 << 16, heartbeat_interval_s=0.2)
    # 2,000 Pendulum rows take about 60 KB: under max_message_bytes, but over it less the bundle header's room
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           min_samples_per_worker_packet=2000, max_packet_delay_s=600.0, compression=codec,
                           server_ip="127.0.0.1", server_port=free_port(), network=net, worker_id="w", seed=0)
    with pytest.raises(ConfigError) as err:
        worker.run(nb_episodes=20)  # closes the worker however it ends
    text = str(err.value)
    assert "worker w: a packet of 200" in text and f"less {BUNDLE_HEADER_ROOM}" in text
    assert "worker.min_samples_per_worker_packet (2000)" in text and "network.max_message_bytes = 65536" in text
    # known from the first row's size, compressed or not (a receiver refuses arrays that inflate past its limit)
    assert worker.seq == 0 and worker.produced == 0 and "2001 samples takes" in text
    assert ("bytes uncompressed, more than" in text) == (codec == "zstd")


class Recorder:
    def __init__(self, sent: list[list[Any]]) -> None:
        self.hand_over = sent.append


@pytest.mark.parametrize("codec", ["zstd", "lz4", "none"])
def test_the_configured_codec_compresses_what_the_worker_sends(codec: str, tmp_path: Path) -> None:
    cfg = config_from_dict({"env": {"pipeline": "image"}, "security": "none", "weights_folder": str(tmp_path),
                            "worker": {"compression": codec, "min_samples_per_worker_packet": 8}}, "config.json")
    # camera frames without sensor noise, which both codecs shrink (lz4 finds little in noisy ones)
    worker = RolloutWorker.from_config(cfg, image_pipeline(cfg, env_kwargs={"noise": 0.0}))
    sent: list[list[bytes]] = []
    worker.sink.link = Recorder(sent)  # type: ignore[assignment]  # what the worker hands its network thread
    worker.env = worker.env_cls()
    obs, _ = worker.env.reset(seed=0)
    worker.sink.record(worker.env.action_space.sample(), obs, 0.0, False, False, {}, True, worker.version)
    while not sent:
        obs, rew, term, trunc, info = worker.env.step(worker.env.action_space.sample())
        worker.sink.record(worker.env.action_space.sample(), obs, float(rew), term, trunc, info, False, -1)
    codecs = {a["name"]: a["codec"] for a in msgpack.unpackb(sent[0][1])["arrays"]}
    assert codecs["obs"] == codec  # frames (uint8) use the codec; float arrays never do
    assert codecs["rew"] == "none"
    worker.env.close()
    assert worker.name_lock is not None
    worker.name_lock.release()  # what close() does last (close() itself would flush to the Recorder)


def test_worker_ids_are_names_the_server_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="worker_id 'robot 1' is not a valid name"):
        RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                      worker_id="robot 1")
    monkeypatch.setattr(socket, "gethostname", lambda: "_labo pc (2)." + "x" * 80)
    default = default_worker_id()
    assert PEER_NAME.fullmatch(default) and default.startswith("labo-pc--2-.xx") and default.endswith(f"-{os.getpid()}")


def test_a_worker_from_config_is_named_after_its_host_and_keeps_that_name_across_restarts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from netrl.errors import FolderInUse
    from netrl.pipelines.make import make_pipeline
    from netrl.worker.names import claim_worker_id

    monkeypatch.setattr(socket, "gethostname", lambda: "robot lab")
    cfg = config_from_dict({"weights_folder": str(tmp_path), "security": "none"})
    first = RolloutWorker.from_config(cfg, make_pipeline(cfg))
    with caplog.at_level(logging.INFO, logger="netrl.worker.names"):
        second = RolloutWorker.from_config(cfg, make_pipeline(cfg))  # another worker on this machine, running too
    assert (first.worker_id, second.worker_id) == ("robot-lab", "robot-lab-2")
    assert (f"worker names taken by other workers on this machine: robot-lab (pid {os.getpid()}); this worker is "
            "'robot-lab-2'") in caplog.text
    assert first.episode_log is not None and first.episode_log.path == cfg.run_dir / "episodes_robot-lab.csv"
    assert first.model_path == str(cfg.run_dir / "worker_policy_robot-lab.pt")
    with pytest.raises(FolderInUse, match=r"worker name 'robot-lab-2' in the run folder .* is in use by this "
                                          rf"process \(pid {os.getpid()}\), .* otherwise give each worker on this "
                                          r"machine its own --worker-id"):
        claim_worker_id(cfg.run_dir, "robot-lab-2")  # a name given twice is refused, not shared
    first.close()  # as when it stops or crashes (the OS releases its lock): its restart takes the same name again
    restarted = RolloutWorker.from_config(cfg, make_pipeline(cfg))
    assert restarted.worker_id == "robot-lab"
    monkeypatch.setattr(socket, "gethostname", lambda: "h" * 80)
    (long_name, held), (next_name, held_too) = claim_worker_id(tmp_path, None), claim_worker_id(tmp_path, None)
    assert (long_name, next_name) == ("h" * 64, "h" * 62 + "-2")  # cut to stay valid names
    for worker in (second, restarted):
        worker.close()
    for lock in (held, held_too):
        lock.release()


def test_a_restarted_worker_continues_the_episode_and_step_counts_of_its_csv(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    csv_path = tmp_path / "episodes_w.csv"
    for _ in range(2):  # the same worker id twice, as after a restart: one CSV
        worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                               max_samples_per_episode=5, worker_id="w", episode_log=str(csv_path), seed=0)
        worker.local_packets = []  # no network; samples are still recorded and counted
        with caplog.at_level(logging.INFO, logger="netrl.worker.worker"):
            worker.run(nb_episodes=2)
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["episode"]) for r in rows] == [1, 2, 3, 4]
    assert [int(r["env_steps"]) for r in rows] == [5, 10, 15, 20]  # one increasing x axis for --plot
    assert "training episode 4: return" in caplog.text and "over 5 steps (policy none)" in caplog.text  # no weights


def test_a_csv_line_cut_short_by_a_crash_neither_swallows_the_next_row_nor_breaks_the_plot(tmp_path: Path) -> None:
    from netrl.monitor.metrics import CsvLog
    from netrl.monitor.plot import plot_run

    path = tmp_path / "episodes_w.csv"
    log = CsvLog(path)
    for episode in (1, 2):
        log.write({"time": 0.0, "episode": episode, "test": 0, "return": -1.0, "length": 5, "env_steps": 5 * episode,
                   "policy_version": 1})
    with path.open("a") as f:
        f.write("0.0,3,0,-1")  # the crash: half a row, no newline
    restarted = CsvLog(path)
    assert restarted.last_ints("episode", "env_steps") == [2, 10]  # the torn row is not the last complete one
    restarted.write({"time": 0.0, "episode": 3, "test": 0, "return": -1.0, "length": 5, "env_steps": 15,
                     "policy_version": 1})
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["episode"] for r in rows] == ["1", "2", "3", "3"] and rows[-1]["env_steps"] == "15"  # its own line
    assert plot_run(tmp_path).read_bytes()[:4] == b"\x89PNG"  # the torn row is skipped, not a traceback


def test_a_csv_with_damaged_bytes_reads_and_a_row_the_disk_refuses_is_skipped_and_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from netrl.monitor.metrics import CsvLog
    from netrl.monitor.plot import plot_run

    path = tmp_path / "episodes_w.csv"
    row = {"time": 0.0, "episode": 1, "test": 0, "return": -1.0, "length": 5, "env_steps": 5, "policy_version": 1}
    log = CsvLog(path)
    for episode in (1, 2, 3):
        log.write({**row, "episode": episode, "env_steps": 5 * episode})
    path.write_bytes(path.read_bytes().replace(b"\n0.0,2,0,-1.0", b"\n0.0,\xff\xfe,0,-1.0"))  # not UTF-8
    restarted = CsvLog(path)  # not UnicodeDecodeError
    assert restarted.last_ints("episode", "env_steps") == [3, 15]
    before = path.read_bytes()
    quoted = before.replace(b"\n0.0,3,", b'\n0.0,"3,')  # a damaged quote opens a field it never closes
    path.write_bytes(quoted + b"0.0,4,0,-1.0,5,20,1\n")
    assert CsvLog(path).last_ints("episode", "env_steps") == [4, 20]  # not every later line read as one cell
    path.write_bytes(before)
    assert plot_run(tmp_path).read_bytes()[:4] == b"\x89PNG"

    real_open = Path.open

    def full_disk(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if self.parent == tmp_path and "r" not in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", full_disk)
    with caplog.at_level(logging.INFO, logger="netrl.monitor.metrics"):
        restarted.write({**row, "episode": 4})
        restarted.write({**row, "episode": 5, "new_column": 1})  # a new column cannot be written either
        assert "could not write to" in caplog.text and "No space left" in caplog.text
        monkeypatch.setattr(Path, "open", real_open)
        restarted.write({**row, "episode": 6, "new_column": 2})
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]  # warned once, then resumed
    assert "writing to" in caplog.text and "again; 2 rows before this one were skipped" in caplog.text
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        rows = list(csv.DictReader(f))
    assert [r["episode"] for r in rows] == ["1", "\ufffd\ufffd", "3", "6"] and rows[-1]["new_column"] == "2"


def test_a_csv_the_disk_refuses_to_read_stops_neither_the_trainer_nor_a_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from netrl.monitor.metrics import CsvLog, MetricsLogger

    path = tmp_path / "metrics.csv"
    path.write_text("epoch,round,trained_steps\n0,0,10\n0,1,20\n")
    real_open = Path.open

    def failing_reads(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if self == path and mode == "r":
            raise OSError(errno.EIO, "Input/output error")
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", failing_reads)
    with caplog.at_level(logging.INFO, logger="netrl.monitor.metrics"):
        metrics = MetricsLogger(tmp_path, "run", wandb_mode="disabled")  # the OSError does not stop the trainer
        metrics.rewind(10)  # a resumed trainer drops the rounds past its checkpoint: here it cannot, and says so
        assert CsvLog(path).last_ints("round", "trained_steps") == [0, 0]  # a worker's counts start again
        metrics.csv.write({"epoch": 0, "round": 2, "trained_steps": 30})  # skipped: its columns are unknown
        assert path.read_bytes() == b"epoch,round,trained_steps\n0,0,10\n0,1,20\n"
        monkeypatch.setattr(Path, "open", real_open)
        metrics.csv.write({"trained_steps": 40, "epoch": 0, "round": 3})
        metrics.close()
    assert [r.getMessage() for r in caplog.records] == [
        f"could not read {path} ([Errno 5] Input/output error): rows it should drop stay in it",
        f"could not read {path} ([Errno 5] Input/output error): round and trained_steps count from 0 again",
        f"could not read {path} ([Errno 5] Input/output error): its rows are skipped until that works again (training "
        "and checkpoints go on)",
        f"writing to {path} again; 1 rows before this one were skipped"]
    assert path.read_text() == "epoch,round,trained_steps\n0,0,10\n0,1,20\n0,3,40\n"  # under the right columns
    failures = [OSError(errno.EIO, "Input/output error")]  # a read that fails once, at start, then works again

    def one_failed_read(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if self == path and mode == "r" and failures:
            raise failures.pop()
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", one_failed_read)
    resumed = MetricsLogger(tmp_path, "run", wandb_mode="disabled")
    resumed.rewind(20)  # the header reads now: the round past the checkpoint goes, under the file's own columns
    resumed.close()
    assert path.read_text() == "epoch,round,trained_steps\n0,0,10\n0,1,20\n"  # not every value wiped


def test_an_episodes_first_observation_is_never_sent_alone() -> None:
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           worker_id="w", seed=0)
    worker.local_packets = []  # what would go to the server
    worker.env = worker.env_cls()
    obs, _ = worker.env.reset(seed=0)
    worker.sink.record(worker.host.default_action(), obs, 0.0, False, False, {}, True, worker.version)
    worker.sink.send()  # as when it stops, or waits for the trainer, right after a reset
    assert worker.local_packets == []  # a packet of no transitions would be relayed, logged and counted for nothing
    act = worker.env.action_space.sample()
    obs, rew, term, trunc, info = worker.env.step(act)
    worker.sink.record(act, obs, float(rew), term, trunc, info, False, -1)
    worker.sink.send()
    (buf,) = worker.local_packets
    assert buf.reset.tolist() == [True, False]  # the first observation went with its transition
    worker.env.close()


def test_the_status_line_says_when_a_worker_waits_for_the_trainer(caplog: pytest.LogCaptureFixture) -> None:
    produced = [0]
    link = WorkerLink(NetworkConfig(), "robot-1", "s" * 16, free_port(), None, 1 << 20, 1 << 20,
                      lambda: produced[0], status_interval_s=1e-9, last_return=lambda: -12.34)
    try:
        with caplog.at_level(logging.INFO, logger="netrl.worker.link"):
            produced[0] = 200
            link.waiting_for_pace = True  # as the control path sets it while throttled
            link._status_line()
            link.waiting_for_pace = False
            link._status_line()
            link.counts["rejected_samples"], link.last_rejection = 40, "the obs structure differs from the trainer's"
            link._status_line()
    finally:
        link.halt()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[-1] == ("status | worker robot-1 | 40 samples REJECTED in all, the newest because: the obs "
                         "structure differs from the trainer's")
    line = (r"status \| worker robot-1 \| \d+ steps/s \| weights none \| server unreachable \| backlog 0 packets "
            r"\(0.0 MiB\) \| acked 0, dropped 0 samples \| last return -12.3")
    assert re.fullmatch(line + r" \| waiting for the trainer to ask for samples \(worker.throttle\)", lines[0])
    assert re.fullmatch(line, lines[1]) and re.fullmatch(line, lines[2])


def test_a_weights_ack_the_link_refuses_is_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker whose queue to the server is full of packets (after an outage) may see the link refuse the ACK of the
    # weights it has just loaded: unless it is sent again, the server, waiting for it, never sends it another version.
    link = WorkerLink(NetworkConfig(), "w", "s" * 16, free_port(), None, 1 << 20, 1 << 20)  # never started
    sent: list[Message] = []
    full = [True]

    def send(frames: list[Any]) -> bool:
        if full[0]:
            return False
        sent.append(decode(frames))
        return True

    monkeypatch.setattr(link.link, "send", send)
    try:
        link.on_message(Message(MsgType.WEIGHTS, "server", policy_version=3, body={"part": 0, "parts": 1}))
        link.on_tick()
        assert sent == []  # still refused
        full[0] = False
        link.on_tick()
        link.on_tick()
        assert [(m.type, m.body["seqs"]) for m in sent] == [(MsgType.ACK, [3])]  # once
    finally:
        link.halt()


def test_a_stopping_worker_reconnects_without_waiting_out_its_back_off_to_deliver_its_backlog(
        tmp_path: Path) -> None:
    net = NetworkConfig(heartbeat_interval_s=0.1, heartbeat_liveness=5, reconnect_initial_s=30, reconnect_max_s=30)
    ports = {"trainer_port": free_port(), "worker_port": free_port()}
    session = new_session()
    link = WorkerLink(net, "w", session, ports["worker_port"], None, 1 << 20, 1 << 20)
    try:
        with running_server(network=net, spool_dir=tmp_path / "spool", **ports):
            link.start()
            wait_until(lambda: link.link.ready, 5, "the first connection", poll=0.02)
        wait_until(lambda: not link.link.ready, 5, "the server's BYE", poll=0.02)  # reconnecting in 30 s
        with running_server(network=net, spool_dir=tmp_path / "spool", **ports) as (srv, _):  # back at once
            frames = encode(samples_message(sample_buffer(5), "w", session, 1, 5))
            link.command([command_head(Command.PACKET, 1, 4), *frames])
            assert link.flush(1, 3.0)  # within a stop's flush_timeout_s, not after the back-off
            assert srv.stats["samples_spooled"] == 4
    finally:
        link.halt()


def test_packets_waiting_in_the_pipe_for_a_starved_network_thread_are_bounded_and_drops_are_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    frames = encode(samples_message(sample_buffer(5), "w", "s" * 16, 1, 5))
    size = sum(memoryview(f).nbytes for f in frames)
    link = WorkerLink(NetworkConfig(), "w", "s" * 16, free_port(), None, max_backlog_bytes=size * 5 // 2,
                      send_window_bytes=size)
    try:
        with caplog.at_level(logging.WARNING, logger="netrl.worker.link"):
            handed = [link.hand_over([command_head(Command.PACKET, seq, 4), *frames])
                      for seq in range(1, 5)]  # not started yet: nothing takes packets off the pipe
        assert handed == [True, True, False, False]
        stats = link._heartbeat_stats()["stats"]
        assert (stats["dropped_packets"], stats["dropped_samples"]) == (2, 8)
        (warning,) = [r.getMessage() for r in caplog.records]  # one warning, not one per packet
        assert "worker w network thread is behind" in warning and "worker.max_backlog_bytes" in warning
        link.start()  # no server: the packets stay in its backlog, but the pipe empties
        wait_until(lambda: link.taken_bytes == link.piped_bytes, 5, "the pipe to be taken", poll=0.02)
        assert sorted(link.backlog) == [1, 2]
        assert link.hand_over([command_head(Command.PACKET, 5, 4), *frames])
    finally:
        link.halt()


def test_a_worker_hands_its_packets_over_through_the_bounded_pipe(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(WorkerLink, "start", lambda self: None)  # a network thread that never gets the CPU
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           server_ip="127.0.0.1", server_port=free_port(), worker_id="w", seed=0,
                           min_samples_per_worker_packet=4, max_backlog_bytes=1, send_window_bytes=1,
                           flush_timeout_s=0.1)
    with caplog.at_level(logging.INFO, logger="netrl.worker.worker"):
        worker.run(nb_episodes=1)  # closes the worker at the end
    assert worker.net is not None
    dropped = worker.net.dropped()
    assert worker.packets.seq > 10 and worker.net.piped_bytes > 0  # the first went in: the pipe was empty
    assert dropped["dropped_packets"] == worker.packets.seq - 1
    kept = worker.produced - dropped["dropped_samples"]
    assert 0 < kept <= 4
    # the books balance: the packet still in the pipe when the worker stopped is counted as unacknowledged
    summary = f"{worker.produced} samples produced in {worker.packets.seq} packets; 0 acknowledged, " \
              f"{dropped['dropped_samples']} dropped, 0 rejected, {kept} unacknowledged"
    assert summary in caplog.text
    assert f"stopped with 1 packets ({kept} samples) unacknowledged" in caplog.text


def test_the_first_action_after_a_wait_for_the_trainer_uses_the_weights_that_came_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WorkerLink, "start", lambda self: None)  # the test plays the network thread
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           server_ip="127.0.0.1", server_port=free_port(), worker_id="w", seed=0, throttle=True)
    worker.start()
    net, weights = worker.net, worker.weights
    assert net is not None and weights is not None
    tagged: list[int] = []
    record = worker.sink.record  # (act, obs, rew, terminated, truncated, info, reset, version, ...)
    monkeypatch.setattr(worker.sink, "record", lambda *a, **kw: (tagged.append(a[7]), record(*a, **kw)))

    failed: list[AssertionError] = []

    def trainer() -> None:  # trains while the worker waits: a new version first, then a larger allowance
        try:
            wait_until(lambda: net.waiting_for_pace, 10, "the worker to wait for its allowance", poll=0.01)
        except AssertionError as exc:  # reported below; the worker still gets its allowance, or it waits for ever
            failed.append(exc)
        weights.slot.put(7, "s" * 16, copy.deepcopy(worker.actor))
        with net.pace_cond:
            net.allowance, net.paced = 10, True
            net.pace_cond.notify_all()

    helper = threading.Thread(target=trainer)
    helper.start()
    try:
        next(worker.episode_steps(test=False, stop=threading.Event()))  # waits for the allowance, then one step
    finally:
        helper.join()
        worker.close()
    assert not failed, failed
    assert tagged[-1] == 7 and worker.version == 7  # not the version from before the wait


def test_every_finished_episode_travels_with_the_packet_of_its_last_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WorkerLink, "start", lambda self: None)  # what is handed over is all this test looks at
    sent: list[Any] = []
    to_frames = PacketMaker.to_frames
    monkeypatch.setattr(PacketMaker, "to_frames", lambda self, buf, produced: (sent.append(buf),
                                                                               to_frames(self, buf, produced))[1])
    for min_samples in (1, 3):  # a packet that ends exactly at the last row, and one that does not
        sent.clear()
        worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                               server_ip="127.0.0.1", server_port=free_port(), worker_id="w", seed=0,
                               min_samples_per_worker_packet=min_samples, max_samples_per_episode=6,
                               flush_timeout_s=0.05)
        worker.run(nb_episodes=3)
        for buf in sent:  # each packet carries the episodes whose last row it holds, and only those
            assert len(buf.episodes) == int(np.count_nonzero((buf.terminated | buf.truncated) & ~buf.context))
        assert sum(len(buf.episodes) for buf in sent) == 3 and worker.packets.pending_episodes == []


def test_a_worker_the_server_refuses_still_closes_its_env_and_network_thread(make_server: MakeServer) -> None:
    closed: list[bool] = []

    class Env(GenericGymEnv):
        def close(self) -> None:
            closed.append(True)
            super().close()

    srv, _ = make_server()
    worker = RolloutWorker(partial(Env, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           server_ip="127.0.0.1", server_port=srv.trainer_port,  # the wrong port: refused
                           worker_id="w", seed=0, min_samples_per_worker_packet=100_000, flush_timeout_s=0.2)
    with pytest.raises(NetrlError, match="this is the trainer port"):
        worker.run(nb_episodes=1000)
    assert closed == [True] and worker.net is not None and worker.net.ctx.closed  # close() went all the way


def test_rows_from_before_a_test_episode_leave_after_max_packet_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    class SlowEnv(GenericGymEnv):  # real time: 20 ms per step
        def step(self, action: Any) -> Any:
            time.sleep(0.02)
            return super().step(action)

    monkeypatch.setattr(WorkerLink, "start", lambda self: None)
    handed: list[float] = []
    monkeypatch.setattr(WorkerLink, "hand_over", lambda self, frames: handed.append(time.monotonic()) or True)
    worker = RolloutWorker(partial(SlowEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           server_ip="127.0.0.1", server_port=free_port(), worker_id="w", seed=0,
                           min_samples_per_worker_packet=1000, max_packet_delay_s=0.1, max_samples_per_episode=30,
                           flush_timeout_s=0.01)
    try:
        worker.start()
        worker.run_episode(test=False)
        ended = time.monotonic()
        worker.run_episode(test=True)  # 0.6 s, and it records no rows
        assert handed and handed[-1] > ended  # the training episode's last rows left during the test episode
        assert handed[-1] - ended < 0.4
    finally:
        worker.close()


def test_a_worker_whose_last_packet_was_dropped_at_the_pipe_stops_without_waiting_for_it(
        make_server: MakeServer) -> None:
    srv, _ = make_server()
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           server_ip="127.0.0.1", server_port=srv.worker_port, worker_id="w", seed=0,
                           min_samples_per_worker_packet=50, flush_timeout_s=10.0)
    worker.run_episode(test=False)
    net = worker.net
    assert net is not None
    wait_until(lambda: not net.backlog and net.last_seq == worker.packets.seq, 10, "every packet acknowledged",
               poll=0.02)
    obs, _ = worker.env.reset()
    worker.sink.record(worker.env.action_space.sample(), obs, 0.0, False, False, {}, True, worker.version)
    worker.sink.record(worker.env.action_space.sample(), obs, 0.0, False, False, {}, False, -1)
    net.piped_bytes += 1 << 40  # as if its network thread were far behind: the last packet is dropped
    t0 = time.monotonic()
    worker.close()
    assert time.monotonic() - t0 < 5  # not the 10 s flush timeout, waiting for a packet that never comes
    assert net.dropped()["dropped_packets"] == 1


def test_a_throttled_worker_flags_its_wait_for_the_status_line() -> None:
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           worker_id="w", throttle=True, seed=0)
    worker.net = WorkerLink(NetworkConfig(), "w", "s" * 16, free_port(), None, 1 << 20, 1 << 20)  # never started
    worker.pacer.link = worker.net  # what the worker waits on
    stop, seen = threading.Event(), []

    def watch() -> None:
        deadline = time.monotonic() + 10
        while not (worker.net and worker.net.waiting_for_pace) and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(worker.net is not None and worker.net.waiting_for_pace)
        stop.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        worker.pacer.wait_for_pace(stop)  # allowance 0: it waits until stopped
    finally:
        watcher.join()
        worker.net.halt()
    assert seen == [True] and not worker.net.waiting_for_pace


class TwoPartEnv(gymnasium.Env):  # type: ignore[type-arg]
    """Observations are two Box(1,) leaves, as in tmrl's tutorial; ``first`` is what reset() returns instead."""

    observation_space = gymnasium.spaces.Tuple((gymnasium.spaces.Box(-1, 1, (1,), np.float32),) * 2)
    action_space = gymnasium.spaces.Box(-1, 1, (2,), np.float32)

    def __init__(self, first: Any = None) -> None:
        self.first, self.t = first, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.t = 0
        return (np.zeros(1, np.float32),) * 2 if self.first is None else self.first, {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return (np.zeros(1, np.float32), np.zeros(1, np.float32)), 0.0, False, self.t >= 3, {}


class FixedActor(ActorModule):
    def __init__(self, observation_space: Any, action_space: Any, action: Any = None) -> None:
        super().__init__(observation_space, action_space)
        self.action = np.zeros(2, np.float32) if action is None else action

    def act(self, obs: Any, test: bool = False) -> Any:
        return self.action


def test_a_first_observation_that_does_not_fit_the_space_names_the_leaf_and_the_env() -> None:
    worker = RolloutWorker(partial(TwoPartEnv, first=[0.5, np.zeros(1, np.float32)]), FixedActor,
                           standalone=True)  # a number for a Box of shape (1,), as in the tutorial
    with pytest.raises(ValueError, match=re.escape(
            "the first observation from the env's reset() does not fit the env's observation_space: "
            "observation_space[0] expects shape (1,), got shape () (float of float64). Make the env's reset() and "
            "step() return observations")):
        worker.run(nb_episodes=1)
    with pytest.raises(ValueError, match=re.escape("observation_space is a Tuple of 2 parts, got 1 part")):
        RolloutWorker(partial(TwoPartEnv, first=(np.zeros(1, np.float32),)), FixedActor,
                      standalone=True).run(nb_episodes=1)


@pytest.mark.parametrize(("action", "problem"), [
    # (1, 2) is a batch of one action (netrl.actor): act_ unwraps it; three actions for one observation do not fit
    (np.zeros((3, 2), np.float32), "action_space expects shape (2,), got shape (3, 2) (ndarray of float32)"),
    (np.zeros(2, np.int64), None),  # fits: int casts to float, as gymnasium takes it
    (np.zeros(2, np.complex64), "action_space expects dtype float32, got complex64, which does not cast to it"),
])
def test_a_first_action_that_does_not_fit_the_space_names_actor_module_act(action: Any, problem: str | None) -> None:
    worker = RolloutWorker(TwoPartEnv, partial(FixedActor, action=action), standalone=True)
    if problem is None:
        worker.run(nb_episodes=1)
        return
    with pytest.raises(ValueError, match=re.escape(
            f"ActorModule.act (FixedActor.act) returned an action that does not fit the env's action_space: {problem}. "
            "act() receives a batch of one observation and must return one action shaped like action_space")):
        worker.run(nb_episodes=1)


def test_observations_and_actions_are_checked_once_per_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    checks: list[str] = []
    loop, policy = netrl.worker.runners.one_env, netrl.worker.policy  # the one-env episode loop, the actor's
    real_obs, real_act = loop.check_observation, policy.check_action
    monkeypatch.setattr(loop, "check_observation", lambda *a: checks.append("obs") or real_obs(*a))
    monkeypatch.setattr(policy, "check_action", lambda *a: checks.append("act") or real_act(*a))
    worker = RolloutWorker(TwoPartEnv, partial(FixedActor, action=torch.zeros(2, dtype=torch.float64)),
                           standalone=True)  # a float64 tensor fits a float32 Box, as gymnasium takes it
    worker.run(nb_episodes=3)
    assert worker.episodes_done == 3 and checks == ["obs", "act", "obs"]  # reset, the first action, the first step


def test_plotting_a_run_that_has_logged_nothing_yet_says_so(tmp_path: Path) -> None:
    from netrl.errors import NetrlError
    from netrl.monitor.plot import plot_run

    (tmp_path / "checkpoint").mkdir()  # a run folder, but no round and no episode finished yet
    with pytest.raises(NetrlError, match=r"has no metrics.csv or episodes_\*.csv yet: the trainer writes"):
        plot_run(tmp_path)
    with pytest.raises(NetrlError, match="is the run name right"):
        plot_run(tmp_path / "no-such-run")


class Float64Env(TwoPartEnv):
    """A plain gymnasium env whose float32 spaces get float64 observations, as numpy makes by default."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.t = 0
        return (np.zeros(1), np.ones(1)), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return (np.full(1, 0.5), np.full(1, -0.5)), 0.0, False, self.t >= 3, {}


def test_observations_and_actions_leave_in_the_dtypes_of_the_spaces() -> None:
    # The worker accepts float64 observations for a float32 space (they cast within their kind): sent as float64,
    # they would make the trainer refuse every packet for good, as its schema comes from the spaces.
    from netrl.protocol.schema import SampleSchema
    from tests.recording import local_packets

    worker = RolloutWorker(Float64Env, partial(FixedActor, action=np.zeros(2)),  # float64 actions too
                           min_samples_per_worker_packet=2)
    packets = list(local_packets(worker, [False]))
    assert packets and all(b.obs[0].dtype == b.obs[1].dtype == b.act.dtype == np.float32 for b in packets)
    np.testing.assert_array_equal(packets[0].obs[1][:2, 0], [1.0, -0.5])
    schema = SampleSchema.from_spaces(Float64Env.observation_space, Float64Env.action_space)
    for b in packets:
        message = samples_message(b, "w", "s", 1, len(b))
        schema.check(message.body, message.arrays, "w")  # what the trainer checks: float64 arrays would raise here


def test_a_space_netrl_cannot_carry_is_refused_naming_every_such_leaf_and_what_to_do() -> None:
    from netrl.envs.checks import check_spaces

    spaces = gymnasium.spaces
    obs = spaces.Dict({"name": spaces.Text(8), "ok": spaces.Discrete(3),
                       "path": spaces.Tuple((spaces.Sequence(spaces.Discrete(2)),))})
    with pytest.raises(ValueError) as err:
        check_spaces(obs, spaces.Text(4))
    assert str(err.value).split("; ")[0] == (
        "observation_space['name'] is a Text, which netrl cannot carry: its leaves must be Box, Discrete, "
        "MultiDiscrete or MultiBinary spaces within Tuple and Dict spaces (encode the text as a Box or MultiDiscrete "
        "of character codes)")
    assert "observation_space['path'][0] is a Sequence" in str(err.value)
    assert "action_space is a Text; netrl carries Box, Discrete, MultiDiscrete and MultiBinary" in str(err.value)
    assert "'ok'" not in str(err.value)


def test_workers_started_from_one_seeded_config_collect_different_but_reproducible_data(tmp_path: Path) -> None:
    # If every worker reset its env with the config's seed and seeded torch with it, two workers started from one
    # config.json with "seed": 1 would collect the same episodes, frame for frame and action for action.
    from netrl.pipelines.make import make_pipeline
    from tests.recording import local_packets

    def first_episode(name: str) -> tuple[np.ndarray, np.ndarray]:
        cfg = config_from_dict({"weights_folder": str(tmp_path), "security": "none", "seed": 1,
                                "worker": {"worker_id": name}})
        torch.manual_seed(1)  # as configure_torch does in every process
        worker = RolloutWorker.from_config(cfg, make_pipeline(cfg))
        try:
            bufs = list(local_packets(worker, [False]))
        finally:
            worker.close()
        return (np.concatenate([b.obs[~b.context] for b in bufs]), np.concatenate([b.act[~b.context] for b in bufs]))

    (obs_a, act_a), (obs_b, act_b), (obs_a2, act_a2) = (first_episode(n) for n in ("robot-a", "robot-b", "robot-a"))
    assert not np.array_equal(obs_a[0], obs_b[0])  # another start state ...
    assert not np.array_equal(act_a[1:20], act_b[1:20])  # ... and other exploration
    assert np.array_equal(obs_a, obs_a2) and np.array_equal(act_a, act_a2)  # the same worker: the same data


@pytest.mark.parametrize("damage", ["truncated", "sidecar"])
def test_an_unreadable_saved_policy_is_ignored_by_a_connected_worker_and_refused_standalone(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    # A policy file cut short (a power cut while the worker saved it) must not stop the worker at every start: the
    # server sends it the current weights anyway.
    from netrl.errors import CheckpointError
    from netrl.storage.weight_files import write_weights_file

    env_cls = partial(GenericGymEnv, id="Pendulum-v1")
    path = tmp_path / "worker_policy.pt"
    env = env_cls()
    write_weights_file(path, MLPActor(env.observation_space, env.action_space, hidden_sizes=(16,)), {"version": 7})
    env.close()
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    else:
        path.with_name(path.name + ".json").write_text('{"version": 7, "crc32c": 1')
    actor = partial(MLPActor, hidden_sizes=(16,))
    worker = RolloutWorker(env_cls, actor, model_path=str(path), server_port=free_port())
    try:
        with caplog.at_level(logging.WARNING, logger="netrl.worker.worker"):
            worker.start()
        assert worker.version == -1 and f"ignoring {path}, which cannot be read" in caplog.text
    finally:
        worker.close()
    standalone = RolloutWorker(env_cls, actor, model_path=str(path), standalone=True)
    try:
        with pytest.raises(CheckpointError, match="this standalone worker runs the weights in it"):
            standalone.start()
    finally:
        standalone.close()


def test_a_worker_starts_once_and_a_closed_one_says_to_create_a_new_one(make_server: MakeServer) -> None:
    envs: list[GenericGymEnv] = []

    def make_env() -> GenericGymEnv:
        envs.append(GenericGymEnv(id="Pendulum-v1"))
        return envs[-1]

    srv, _ = make_server()
    def make_worker() -> RolloutWorker:
        return RolloutWorker(make_env, partial(MLPActor, hidden_sizes=(8,)), server_ip="127.0.0.1",
                             server_port=srv.worker_port, worker_id="w", seed=0, min_samples_per_worker_packet=10,
                             max_samples_per_episode=20, flush_timeout_s=5.0)

    worker = make_worker()
    worker.start()
    net = worker.net
    worker.start()  # does nothing: a second env and network thread would be left running
    worker.run(nb_episodes=1)
    assert len(envs) == 1 and worker.net is net and net is not None and not net.is_alive()
    for again in (worker.run, worker.start, worker.run_episode):  # e.g. a notebook cell run again
        with pytest.raises(NetrlError, match=r"this RolloutWorker \(w\) is closed: .*; create a new one"):
            again()
    closed_first = make_worker()
    closed_first.close()
    with pytest.raises(NetrlError, match="is closed"):
        closed_first.run(nb_episodes=1)
    assert len(envs) == 1 and closed_first.net is None  # it built nothing it would not close


def test_close_from_another_thread_stops_run_which_delivers_its_samples(make_server: MakeServer) -> None:
    srv, _ = make_server()
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           server_ip="127.0.0.1", server_port=srv.worker_port, worker_id="w", seed=0,
                           min_samples_per_worker_packet=7, max_samples_per_episode=50, flush_timeout_s=5.0)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: worker.produced > 100, 20, "100 env steps")
    worker.close()  # returns once run() has stopped and closed
    assert not thread.is_alive() and errors == []
    net = worker.net
    assert net is not None and net.dropped()["acked_samples"] == worker.produced  # the last ones too


def test_a_worker_that_stops_with_samples_unacknowledged_exits_with_code_1(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # `--worker --episodes N` with the server unreachable logs the loss: exiting "cleanly" with code 0, it would
    # leave a script unable to tell it from a run whose samples all arrived.
    from netrl.__main__ import main
    from tests.fakes import small_config

    config = small_config(tmp_path, worker={"throttle": False, "flush_timeout_s": 0.3}, security="none")
    assert main(["--worker", "--config", str(config), "--episodes", "1"]) == 1  # no server is running
    out = capfd.readouterr()
    text = out.out + out.err
    assert re.search(r"worker \S+ stopped with \d+ samples the server had not acknowledged", text), text[-2000:]
    assert "exited cleanly" not in text


def test_a_start_that_fails_halfway_closes_the_env_it_built() -> None:
    # If the actor's constructor raises after the env is built, the env must not stay open, nor a second start()
    # build another beside it.
    closed: list[int] = []

    class Env(GenericGymEnv):
        def close(self) -> None:
            closed.append(id(self))
            super().close()

    def broken_actor(*args: Any) -> Any:
        raise RuntimeError("the actor's constructor failed")

    worker = RolloutWorker(partial(Env, id="Pendulum-v1"), broken_actor, standalone=True)
    for attempt in (1, 2):
        with pytest.raises(RuntimeError, match="constructor failed"):
            worker.start()
        assert len(closed) == attempt and worker.env is None
    worker.close()
    assert len(closed) == 2  # nothing left for close() to close
