"""The trainer's delivery records: de-duplication ranges that stay bounded, and the sample log it trims and restarts
from."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from netrl.config.sections import NetworkConfig
from netrl.protocol.wire import encode, samples_message
from netrl.samples import Buffer
from netrl.trainer.delivery import Deliveries, SampleLog
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from tests.fakes import ACT, OBS


def test_deliveries_detect_duplicates_and_keep_gaps_small() -> None:
    d = Deliveries()
    for seq in [1, 2, 3, 7, 5, 6, 4]:
        assert d.add("w/a", seq)
    assert not d.add("w/a", 5) and d.seen("w/a", 7) and not d.seen("w/a", 8)
    assert d.streams() == {"w/a": [[1, 7]]}  # seven packets, one range
    for seq in range(10, 1000, 2):  # every other packet dropped: ranges, not a growing set
        d.add("w/b", seq)
    assert d.count("w/b") == 495 and len(d.streams()["w/b"]) == 495
    restored = Deliveries(json.loads(json.dumps(d.to_json())))
    assert restored.seen("w/a", 4) and not restored.add("w/b", 998) and restored.add("w/b", 999)


def test_deliveries_stay_bounded_whatever_sequence_numbers_and_sessions_arrive(
        caplog: pytest.LogCaptureFixture) -> None:
    d = Deliveries(max_ranges=100, max_streams=50)
    for seq in range(100_000, 0, -2):  # a gap after every packet, newest first (13 s for 200k if quadratic)
        assert d.add("w/gaps", seq)
    ranges = d.streams()["w/gaps"]
    assert len(ranges) == 100 and ranges[0] == [2, 99_802] and d.gaps_closed == 49_900
    assert d.seen("w/gaps", 3)  # inside the closed gaps: taken as delivered
    assert "packets 99801 to 99801 are taken as delivered (1 gaps closed so far)" in caplog.text
    for session in range(200):  # a new session per packet
        d.add(f"w/{session}", 1)
    assert len(d.streams()) == 50 and "w/gaps" not in d.streams() and d.seen("w/199", 1) and not d.seen("w/0", 1)
    assert d.streams_forgotten == 151 and "forgot which packets w/gaps sent" in caplog.text


def test_sample_log_trims_whole_segments_beyond_what_memory_holds(tmp_path: Path) -> None:
    log = SampleLog(tmp_path, keep_rows=50, segment_bytes=300)
    for seq in range(1, 40):
        log.append([b"r" * 100], "w/a", seq, rows=10, recv_version=1)
    kept = list(log.read())
    assert sum(r.meta["rows"] for r in kept) >= 50  # enough to rebuild a 50-row memory
    assert kept[0].meta["seq"] > 1 and kept[-1].meta["seq"] == 39
    assert len(log.log.segments()) < 39


def test_a_restarted_trainer_numbers_weights_after_any_version_in_its_sample_log(tmp_path: Path) -> None:
    # killed after publishing v139, with its last checkpoint at v121: the samples it logged meanwhile name v139
    n = 9
    buf = Buffer(act=np.zeros((n, 1), np.float32), obs=np.arange(n, dtype=np.float32)[:, None],
                 rew=np.zeros(n, np.float32), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                 reset=np.arange(n) == 0, context=np.zeros(n, bool), policy_version=np.full(n, 139))
    sample_log = SampleLog(tmp_path / "samples", keep_rows=1000)
    sample_log.append(encode(samples_message(buf, "w", "s", 1, n - 1)), "w/s", 1, n, recv_version=139)
    sample_log.close()
    training = TrainingOffline(env_cls=(OBS, ACT), memory_size=100, batch_size=8, seed=0)
    training.build()
    assert training.publisher is not None
    training.publisher.version = 121  # what load_state(checkpoint) sets
    trainer = Trainer(partial(lambda: training), run_dir=tmp_path, wandb_mode="disabled")
    trainer._restore(training, threading.Event())
    assert training.publisher.version == 139  # the next version is v140
    assert len(training.memory or []) == n - 1


def test_a_restart_keeps_every_logged_packet_the_configured_message_limit_let_in(tmp_path: Path) -> None:
    import gymnasium

    from netrl.protocol.wire import decode

    row, n = 1 << 20, 260  # 260 MiB once inflated: over decode()'s default limit of 256 MiB, under the 512 MiB set
    buf = Buffer(act=np.zeros((n, 1), np.float32), obs=np.zeros((n, row), np.uint8), rew=np.zeros(n, np.float32),
                 terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), reset=np.arange(n) == 0,
                 context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64))
    frames = encode(samples_message(buf, "w", "s", 1, n - 1), "zstd")
    net = NetworkConfig(max_message_bytes=512 << 20)
    assert decode(frames, net.max_message_bytes).body["n"] == n  # what the trainer took on arrival
    log = SampleLog(tmp_path / "samples", keep_rows=10_000)
    log.append(frames, "w/s", 1, n, recv_version=1)
    log.close()
    space = gymnasium.spaces.Box(0, 255, (row,), np.uint8)
    training = TrainingOffline(env_cls=(space, gymnasium.spaces.Box(-1, 1, (1,), np.float32)), memory_size=300,
                               batch_size=4, seed=0, device="cpu")
    training.build()
    trainer = Trainer(lambda: training, run_dir=tmp_path, network=net, wandb_mode="disabled")
    trainer._restore(training, threading.Event())
    assert training.memory is not None and len(training.memory) == n - 1
