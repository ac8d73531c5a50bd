"""Nothing lost: real processes on 127.0.0.1, samples counted by (worker session, sequence number).

Each test kills a role with SIGKILL mid-stream and checks, from the trainer's sample log (what entered its replay
memory), the workers' own counters and the server's spool, that every sample arrived exactly once.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import Procs
from tests.fakes import FAST_TRAINER, small_config, wait_until
from tests.reliability import delivered, first_line, log_time, spooled, worker_summary


def check_exactly_once(run_dir: Path, logs: list[str]) -> int:
    """Every packet of every worker reached the trainer's memory once (delivered() fails on duplicates)."""
    got = delivered(run_dir)
    total = 0
    for text in logs:
        s = worker_summary(text)
        assert s.dropped == s.rejected == s.unacked == 0, s
        seqs = sorted(seq for session, seq in got if session == s.session)
        missing = set(range(1, s.packets + 1)) - set(seqs)
        assert seqs == list(range(1, s.packets + 1)), f"{s.name}: missing packets {sorted(missing)}"
        samples = sum(n for (session, _), n in got.items() if session == s.session)
        assert samples == s.produced, f"{s.name}: {samples} samples in memory, {s.produced} produced"
        total += samples
    return total


# Its waits end on their conditions, with deadlines (60 + 120 + 60 s) against a hang beyond the
# suite's 120 s per test: at load 15 the 6,000 throttled env steps ran past 120 s.
@pytest.mark.timeout(360)
def test_server_kill9_mid_stream_loses_nothing_and_workers_carry_on(tmp_path: Path, procs: Procs) -> None:
    config = small_config(tmp_path, trainer=FAST_TRAINER,
                          worker={"throttle": True, "flush_timeout_s": 20, "min_samples_per_worker_packet": 25})
    run_dir = tmp_path / "weights" / "test"
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    trainer = procs.spawn("trainer", config)
    workers = [procs.spawn("worker", config, "--episodes", "15", "--worker-id", f"w{i}") for i in range(2)]
    wait_until(lambda: sum(delivered(run_dir).values()) >= 1500, 60, "1500 samples at the trainer")
    server.send_signal(signal.SIGKILL)  # mid-stream: workers hold unacknowledged packets, the spool may hold some
    server.wait()
    before = sum(delivered(run_dir).values())
    time.sleep(1.0)  # time passes on purpose: an outage, in which the workers keep what they cannot send
    server = procs.spawn("server", config)  # same spool folder
    for w in workers:  # the same worker processes resume on their own
        assert w.wait(timeout=120) == 0, procs.log(w)[-3000:]
    logs = [procs.log(w) for w in workers]
    produced = sum(worker_summary(t).produced for t in logs)
    assert produced == 2 * 15 * 200 and before < produced
    wait_until(lambda: sum(delivered(run_dir).values()) >= produced, 60, "every sample at the trainer")
    for w in workers:
        assert "reconnect" in procs.log(w) or "saying HELLO again" in procs.log(w)
    for p in (trainer, server):
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == 0
    assert check_exactly_once(run_dir, logs) == produced


def test_trainer_kill9_resumes_from_checkpoint_and_gets_the_outage_samples(tmp_path: Path, procs: Procs) -> None:
    # unthrottled workers keep producing while the trainer is down, like robots would
    config = small_config(tmp_path, trainer=FAST_TRAINER, server={"min_samples_per_server_packet": 500},
                          worker={"throttle": False, "flush_timeout_s": 20, "min_samples_per_worker_packet": 100})
    run_dir = tmp_path / "weights" / "test"
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    trainer = procs.spawn("trainer", config)
    procs.wait_for(trainer, "connected to trainer server")
    workers = [procs.spawn("worker", config, "--episodes", "50", "--worker-id", f"w{i}") for i in range(2)]
    wait_until(lambda: sum(delivered(run_dir).values()) >= 1500, 60, "1500 samples at the trainer")
    procs.wait_for(trainer, "checkpoint saved")
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    current = json.loads((run_dir / "checkpoint" / "CURRENT").read_text())["number"]
    saved = json.loads((run_dir / "checkpoint" / f"state_{current:06d}.json").read_text())
    at_kill = sum(delivered(run_dir).values())
    time.sleep(1.5)  # the outage: workers keep producing up to their allowance; the server spools
    procs.wait_for(server, "no trainer is connected")  # the server spools what the workers produce meanwhile
    trainer = procs.spawn("trainer", config)
    restored = procs.wait_for(trainer, "replay memory restored to its checkpoint state")
    m = re.search(r"restored to its checkpoint state: (\d+) transitions \(checkpoint: (\d+)\)", restored)
    assert m and m.group(1) == m.group(2) == str(saved["memory_len"])  # the same memory as at the checkpoint
    procs.wait_for(trainer, f"loaded checkpoint {current}")
    for w in workers:
        assert w.wait(timeout=120) == 0, procs.log(w)[-3000:]
    logs = [procs.log(w) for w in workers]
    produced = sum(worker_summary(t).produced for t in logs)
    wait_until(lambda: sum(delivered(run_dir).values()) >= produced, 60, "every sample at the trainer")
    assert produced > at_kill  # samples produced during and after the outage arrived after the restart
    for p in (trainer, server):
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == 0
    spooled_total = int(re.search(r"(\d+) samples spooled in all", procs.log(server)).group(1))  # type: ignore[union-attr]
    assert spooled_total > 0  # the server kept what the workers produced while no trainer was there
    assert check_exactly_once(run_dir, logs) == produced
    final = json.loads((run_dir / "checkpoint" / "CURRENT").read_text())["number"]
    after = json.loads((run_dir / "checkpoint" / f"state_{final:06d}.json").read_text())
    assert after["version"] > saved["version"]  # version numbering continued, it did not restart at 1
    assert after["total_updates"] >= saved["total_updates"]


def test_worker_churn_is_noticed_and_a_new_worker_gets_the_newest_weights_fast(tmp_path: Path, procs: Procs) -> None:
    config = small_config(tmp_path, trainer=FAST_TRAINER, worker={"throttle": True})
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    trainer = procs.spawn("trainer", config)
    old = procs.spawn("worker", config, "--worker-id", "old", log_level="DEBUG")
    wait_until(lambda: len(re.findall(r"weights v\d+ ready", procs.log(old))) >= 3, 60, "weights at the old worker")
    killed_at = time.time()
    old.send_signal(signal.SIGKILL)
    old.wait()
    window = 0.2 * 5  # heartbeat_interval_s * heartbeat_liveness in small_config
    lost = first_line(procs.wait_for(server, "'old'.* lost"), r"'old'.* lost")
    assert log_time(lost) - killed_at <= window + 0.6, lost
    new = procs.spawn("worker", config, "--worker-id", "new", log_level="DEBUG")
    text = procs.wait_for(new, "weights v")
    hello = log_time(first_line(text, r"connected to worker server"))
    first = first_line(text, r"weights v\d+ ready")
    assert log_time(first) - hello <= 1.0, (hello, first)
    newest = int(re.findall(r"weights v(\d+) ready", procs.log(new))[0])
    server_log = procs.log(server)
    assert re.search(r"worker 'new' .* connected", server_log)
    old_versions = [int(v) for v in re.findall(r"weights v(\d+) ready", procs.log(old))]
    assert newest >= max(old_versions)  # at least as new as anything the old worker had
    for p in (new, trainer):  # the worker first, so that its last packets reach the server (or it exits 1)
        p.send_signal(signal.SIGINT)
    for p in (new, trainer):
        assert p.wait(timeout=10) == 0, procs.log(p)[-2000:]
    server.send_signal(signal.SIGINT)
    assert server.wait(timeout=10) == 0


@pytest.mark.timeout(360)  # (60 s of load by design, more on a loaded machine)
def test_slow_trainer_keeps_server_memory_bounded_and_counts_add_up(tmp_path: Path, procs: Procs) -> None:
    """A trainer >= 10x slower than two unthrottled workers, for 60 s.

    The server's resident memory must stay within ``server.max_queue_bytes`` (plus 32 MiB for ZeroMQ's buffers)
    of its idle size; once the spool is full, workers drop their oldest packets and count them. At the end, every
    produced sample is accounted for: acknowledged (in the trainer's memory or the server's spool), dropped, or still
    unacknowledged in its worker.
    """
    queue_bytes, spool_bytes = 1 << 20, 2 << 20
    config = small_config(
        tmp_path,
        # one credit takes one 200-sample bundle (max_bundle_bytes 1: nothing more rides along), so the trainer's
        # intake, not only its training, is 10x slower than the workers
        server={"max_queue_bytes": queue_bytes, "spool_max_bytes": spool_bytes, "min_samples_per_server_packet": 200,
                "max_bundle_bytes": 1},
        worker={"throttle": False, "max_backlog_bytes": 1 << 20, "send_window_bytes": 256 << 10,
                "min_samples_per_worker_packet": 100, "flush_timeout_s": 1.0},
        trainer={"epochs": 100_000, "rounds": 1, "steps": 200, "update_buffer_interval": 200, "credit_window": 1,
                 "start_training": 100, "worker_lead": 100},
        agent={"hidden_sizes": [256, 256]}, memory={"memory_size": 200_000, "batch_size": 256})
    run_dir = tmp_path / "weights" / "test"
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    time.sleep(1.0)  # time passes on purpose: the idle server settles before its size is taken as the baseline
    proc = psutil.Process(server.pid)
    idle_rss = proc.memory_info().rss
    trainer = procs.spawn("trainer", config)
    workers = [procs.spawn("worker", config, "--worker-id", f"w{i}", log_level="WARNING") for i in range(2)]
    peak, t_end = idle_rss, time.monotonic() + 60

    def dropping() -> bool:  # a worker's first drop is logged at once
        return any("backlog is full" in procs.log(w) for w in workers)

    # 60 s filled the spool and made the workers drop on an idle machine, not at load 15 (0
    # dropped): watch on until a worker drops; the deadline only stops a hang
    while time.monotonic() < t_end or not dropping():
        assert time.monotonic() < t_end + 180, "no worker dropped a packet in 240 s"
        peak = max(peak, proc.memory_info().rss)
        time.sleep(0.25)
    assert peak - idle_rss <= queue_bytes + (32 << 20), f"server RSS grew by {(peak - idle_rss) / 2**20:.1f} MiB"

    trainer.send_signal(signal.SIGINT)  # the trainer first: its last acknowledgements still reach the server
    assert trainer.wait(timeout=15) == 0
    for w in workers:
        w.send_signal(signal.SIGINT)
    codes = [w.wait(timeout=15) for w in workers]
    server.send_signal(signal.SIGINT)
    assert server.wait(timeout=10) == 0

    summaries = [worker_summary(procs.log(w)) for w in workers]
    # a full spool leaves packets with their workers: stopped then, a worker says it lost them, and exits 1
    assert codes == [1 if s.unacked else 0 for s in summaries], (codes, summaries)
    got, spool = delivered(run_dir), spooled(tmp_path / "weights" / "server-spool")
    assert not set(got) & set(spool), "a packet is both in the trainer's memory and still spooled"
    in_memory, in_spool = sum(got.values()), sum(spool.values())
    produced = sum(s.produced for s in summaries)
    acked = sum(s.acked for s in summaries)
    dropped = sum(s.dropped for s in summaries)
    unacked = sum(s.unacked for s in summaries)
    for s in summaries:  # each worker's own books balance
        assert s.produced == s.acked + s.dropped + s.unacked and s.rejected == 0, s
    assert produced >= 10 * in_memory, f"trainer took {in_memory} of {produced}: not 10x slower"
    assert dropped > 0 and in_spool > 0  # the caps were reached, and the spool was in use at the end
    # acknowledged samples are in the trainer's memory or the spool; the trainer may also hold a few whose
    # acknowledgement had not reached the worker when it stopped
    assert acked <= in_memory + in_spool <= acked + unacked, (acked, in_memory, in_spool, unacked)
    server_log = procs.log(server)
    spooled_total = int(re.search(r"(\d+) samples spooled in all", server_log).group(1))  # type: ignore[union-attr]
    assert spooled_total >= in_spool


def test_a_second_trainer_on_a_run_folder_in_use_is_refused_and_the_first_carries_on(tmp_path: Path,
                                                                                     procs: Procs) -> None:
    config = small_config(tmp_path, trainer=FAST_TRAINER)
    server = procs.spawn("server", config)
    procs.wait_for(server, "server listening")
    first = procs.spawn("trainer", config)
    procs.wait_for(first, "connected to trainer server")
    second = procs.spawn("trainer", config)  # say, restarted by a supervisor that thought the first one dead
    assert second.wait(timeout=60) == 1
    assert (f"run folder {tmp_path / 'weights' / 'test'} is in use by another process (pid {first.pid}): two trainers"
            in procs.log(second))
    assert "connected to trainer server" not in procs.log(second)  # refused before it reached the server
    assert first.poll() is None and len(re.findall(r"trainer\S* connected \(netrl", procs.log(server))) == 1
    for p in (first, server):
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == 0
