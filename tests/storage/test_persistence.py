"""On disk: segment logs survive torn writes and damage, checkpoints are atomic, weights files keep their version
labels, and a folder has one live holder."""

from __future__ import annotations

import errno
import json
import logging
import multiprocessing
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import crc32c
import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netrl.agents.sac import MLPActor
from netrl.envs.gym import GenericGymEnv
from netrl.errors import CheckpointError, FolderInUse, NetrlError
from netrl.launch import free_port
from netrl.server.server import Server
from netrl.server.spool import Spool
from netrl.storage import checkpoint
from netrl.storage.folderlock import FolderLock
from netrl.storage.segments import Position, SegmentLog
from netrl.storage.weight_files import read_weights_file, write_weights_file
from netrl.trainer.delivery import SampleLog
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.fakes import flip_byte, upto


def test_segment_log_cuts_a_torn_tail_and_keeps_everything_before(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=400)
    for i in range(12):
        log.append([bytes([i]) * 30, b"x" * i], {"i": i})
    log.close()
    assert len(log.segments()) > 1  # records rolled over into several segment files
    last = tmp_path / f"{log.segments()[-1]:08d}.seg"
    last.write_bytes(last.read_bytes()[:-5])  # a crash in the middle of the last write
    reopened = SegmentLog(tmp_path, segment_bytes=400)
    records = list(reopened.read())
    assert [r.meta["i"] for r in records] == list(range(11))
    assert bytes(records[3].frames[0]) == bytes([3]) * 30 and bytes(records[3].frames[1]) == b"xxx"
    reopened.append([b"new"], {"i": 99})  # appends continue cleanly after the cut
    assert [r.meta["i"] for r in SegmentLog(tmp_path, segment_bytes=400).read()][-2:] == [10, 99]


@pytest.mark.parametrize("segment_bytes", [10_000, 200])  # the damage in the last segment, or in a closed one
def test_a_damaged_record_is_skipped_and_reported_once_and_the_records_around_it_are_kept(
        tmp_path: Path, segment_bytes: int, caplog: pytest.LogCaptureFixture) -> None:
    log = SegmentLog(tmp_path, segment_bytes=segment_bytes)
    for i in range(5):
        log.append([b"payload-%d" % i], {"i": i})
    log.close()
    path = flip_byte(log, 2)
    size = path.stat().st_size
    with caplog.at_level(logging.INFO, logger="netrl.storage.segments"):
        reopened = SegmentLog(tmp_path, segment_bytes=segment_bytes)  # damage is not an OSError that stops the process
        assert [r.meta["i"] for r in reopened.read()] == [0, 1, 3, 4]  # only the damaged record is lost
        assert [r.meta["i"] for r in reopened.read()] == [0, 1, 3, 4]
        reopened.append([b"new"], {"i": 5})
    assert path.stat().st_size >= size  # nothing in the damaged file was cut
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # once per damaged stretch, however often it is read
    assert re.fullmatch(rf"{re.escape(str(path))} is damaged from offset \d+ to \d+: the records in those \d+ bytes "
                        r"are lost and skipped; the records around them are read as usual", warnings[0])
    assert [r.meta["i"] for r in SegmentLog(tmp_path, readonly=True).read()] == [0, 1, 3, 4, 5]


def test_a_whole_last_record_with_a_bad_checksum_is_reported_as_lost_not_cut_as_a_torn_write(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = SegmentLog(tmp_path)
    for i in range(3):
        log.append([b"payload-%d" % i], {"i": i})
    log.close()
    path = flip_byte(log, 2)
    with caplog.at_level(logging.INFO, logger="netrl.storage.segments"):
        assert [r.meta["i"] for r in SegmentLog(tmp_path).read()] == [0, 1]
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "the last record, at offset" in caplog.text and "fails its checksum" in caplog.text
    caplog.clear()
    path.write_bytes(path.read_bytes() + b"NRL3\x00")  # a write cut short by a crash: nothing acknowledged is lost
    with caplog.at_level(logging.INFO, logger="netrl.storage.segments"):
        assert [r.meta["i"] for r in SegmentLog(tmp_path).read()] == [0, 1]
    assert [r.levelno for r in caplog.records] == [logging.INFO] and "a torn write" in caplog.text


@pytest.mark.parametrize("field", [0, 8])  # the magic, the segment number: fields the checksum does not vouch for
def test_a_last_record_with_a_damaged_magic_or_segment_number_is_reported_as_lost_not_cut_as_a_torn_write(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, field: int) -> None:
    # Such a record reads as one that belongs to no segment of this log, as a recycled file's old records do: taken
    # for one, it would be cut with only an INFO line about a torn write, though it has been acknowledged.
    log = SegmentLog(tmp_path)
    for i in range(3):
        log.append([b"payload-%d" % i], {"i": i})
    log.close()
    last = list(log.read())[-1].position
    path = tmp_path / f"{last.segment:08d}.seg"
    data = bytearray(path.read_bytes())
    data[last.offset + field] ^= 0x01
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="netrl.storage.segments"):
        assert [r.meta["i"] for r in SegmentLog(tmp_path).read()] == [0, 1]
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "the last record, at offset" in caplog.text and "has a damaged magic or segment number" in caplog.text


def test_a_log_of_another_netrl_format_is_never_cut(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Read as this format after an upgrade that changed it, the last segment of an old spool would be truncated to
    # 0 bytes with an INFO line, and a middle one reported as damage, without saying why.
    log = SegmentLog(tmp_path, segment_bytes=100)  # two records per segment
    for i in range(4):
        log.append([b"payload-%d" % i], {"i": i})
    log.close()
    paths = [tmp_path / f"{seg:08d}.seg" for seg in log.segments()]
    old = {path: path.read_bytes().replace(b"NRL3", b"NRL2") for path in paths}
    for path, data in old.items():
        path.write_bytes(data)
    with caplog.at_level(logging.INFO, logger="netrl.storage.segments"):
        reopened = SegmentLog(tmp_path, segment_bytes=100)
        assert list(reopened.read()) == []
        reopened.append([b"new"], {"i": 9})
        assert [r.meta["i"] for r in reopened.read()] == [9]
    aside = paths[-1].with_name(paths[-1].name + ".foreign")
    assert aside.read_bytes() == old[paths[-1]] and paths[0].read_bytes() == old[paths[0]]  # both untouched
    assert "holds records of another netrl log format (b'NRL2', this version writes b'NRL3')" in caplog.text
    assert f"moved aside to {aside.name}" in caplog.text
    assert f"{paths[0]} holds records of another netrl log format (b'NRL2') at offset 0" in caplog.text
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_files_with_names_the_log_never_writes_are_ignored_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # "1.seg" would stop the log from opening (it would look for 00000001.seg); "4294967296.seg", beyond the
    # header's 32-bit segment number, would be cut to 0 bytes and the next append raise struct.error.
    log = SegmentLog(tmp_path)
    log.append([b"a"], {"i": 1})
    log.close()
    strays = {"1.seg": b"one", "4294967296.seg": b"big", "notes.seg": b"mine"}
    for name, data in strays.items():
        (tmp_path / name).write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="netrl.storage.segments"):
        reopened = SegmentLog(tmp_path)
        reopened.append([b"b"], {"i": 2})
        assert [r.meta["i"] for r in reopened.read()] == [1, 2]
    assert all((tmp_path / name).read_bytes() == data for name, data in strays.items())
    for name in strays:
        assert caplog.text.count(f"ignoring {name}, not a segment file name this log writes") == 1


def test_a_wide_gap_between_segment_files_is_named_as_a_range(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                                ) -> None:
    # Listing the missing names one by one, from a set of every number between, a stray 99999999.seg beside
    # 00000001.seg would take gigabytes (and 4294967296.seg beside it, more than the machine has).
    log = SegmentLog(tmp_path)
    log.append([b"a"], {"i": 1})
    log.close()
    (tmp_path / "99999999.seg").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="netrl.storage.segments"):
        reopened = SegmentLog(tmp_path)
        reopened.append([b"b"], {"i": 2})
    assert [r.meta["i"] for r in reopened.read()] == [1, 2]
    assert "segment files 00000002.seg to 99999998.seg are missing between 00000001.seg and 99999999.seg" in \
        caplog.text


def test_fsync_also_syncs_the_folders_new_files_and_renames_live_in(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # fsync of a file does not write its folder: with fsync on, a power cut could still lose a new segment file's
    # name (and every acknowledged record in it), and the spool's HEAD needs an fsync of its own.
    synced: list[str] = []
    real = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    spool = Spool(tmp_path / "spool", max_bytes=10_000, fsync=True).open()
    spool.push([b"x" * 10], {"worker": "w", "session": "s", "seq": 1, "steps": 1})
    assert str(tmp_path / "spool") in synced  # the new segment file's name
    (packet,) = spool.take(upto(1, 10_000))
    synced.clear()
    spool.ack(packet.position)  # the head moves: saved (here at once, the first time), before any segment is dropped
    spool.close()
    assert synced == [str(tmp_path / "spool" / "HEAD.tmp"), str(tmp_path / "spool")]
    synced.clear()
    checkpoint.save_checkpoint(tmp_path / "run", {"w": torch.zeros(1)}, {"epoch": 0}, fsync=True)
    assert synced.count(str(tmp_path / "run" / "checkpoint")) == 3  # agent, state and CURRENT each renamed there
    synced.clear()
    log = SegmentLog(tmp_path / "nosync")
    log.append([b"a"], {"i": 1})
    assert synced == []  # fsync off: nothing


def test_free_files_left_without_any_segment_file_are_not_reused_as_new_segments(tmp_path: Path) -> None:
    # Numbers start again at 1 when every segment file is gone (deleted by hand): a recycled file that was once
    # segment 1 still holds records naming segment 1, which would be read back as new ones after the new records.
    log = SegmentLog(tmp_path, segment_bytes=200, recycle=4)
    for i in range(12):
        log.append([b"%02d" % i * 20], {"i": i})
    log.drop_before(log.end())
    log.close()
    assert list(tmp_path.glob("*.free"))
    for seg in tmp_path.glob("*.seg"):
        seg.unlink()
    fresh = SegmentLog(tmp_path, segment_bytes=200, recycle=4)
    fresh.append([b"new"], {"i": 99})
    fresh.close()
    assert [r.meta["i"] for r in SegmentLog(tmp_path, segment_bytes=200).read()] == [99]


def raw_record(segment: int, meta: Any, lengths: Any, data: bytes) -> bytes:
    """A record as segments.py writes one, with any metadata and frame lengths (its checksum right)."""
    header = msgpack.packb({"m": meta, "l": lengths})
    crc = crc32c.crc32c(data, crc32c.crc32c(header, crc32c.crc32c(struct.pack("<I", segment))))
    return struct.pack("<4sIIIQ", b"NRL3", crc, segment, len(header), len(data)) + header + data


def test_intact_records_the_spool_or_the_sample_log_cannot_use_are_skipped_and_reported(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A record with a good checksum but other metadata (another version's, or not the owner's) would stop the
    # server (KeyError: 'steps') and the trainer (KeyError: 'rows') on every start.
    good = {"worker": "w", "session": "s", "seq": 1, "steps": 10}
    records = [raw_record(1, good, [4], b"good"),
               raw_record(1, {**good, "seq": 2, "steps": None}, [4], b"bad1"),
               raw_record(1, {"worker": "w", "session": "s", "seq": 3, "samples": 10}, [4], b"bad2"),
               raw_record(1, [1, 2], [4], b"bad3"),
               raw_record(1, {**good, "seq": 5}, [9], b"bad4"),  # frame lengths that do not add up
               raw_record(1, {**good, "seq": 6}, [4], b"good")]
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "00000001.seg").write_bytes(b"".join(records))
    with caplog.at_level(logging.WARNING, logger="netrl.storage.segments"):
        spool = Spool(tmp_path / "spool", max_bytes=10_000).open()
        assert (spool.packets, spool.steps) == (2, 20)
        assert [p.meta["seq"] for p in spool.take(upto(100, 10_000))] == [1, 6]
    assert "holds a record this version of netrl cannot use (its metadata's 'steps' is None, not a non-negative " \
           "int) at offset" in caplog.text
    assert "cannot use (its metadata has no 'steps')" in caplog.text
    assert "cannot use (its metadata is a list, not a map)" in caplog.text
    assert "is damaged from offset" in caplog.text  # the lengths: not a header this code wrote
    caplog.clear()
    entry = {"stream": "w/s", "seq": 1, "rows": 5, "recv_version": -1}
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "00000001.seg").write_bytes(raw_record(1, entry, [1], b"a") + raw_record(
        1, {"stream": "w/s", "seq": 2, "samples": 5, "recv_version": 3}, [1], b"b") + raw_record(
        1, {**entry, "seq": 3, "recv_version": "3"}, [1], b"c") + raw_record(1, {**entry, "seq": 4}, [1], b"d"))
    with caplog.at_level(logging.WARNING, logger="netrl.storage.segments"):
        sample_log = SampleLog(tmp_path / "log", keep_rows=100)
        assert [r.meta["seq"] for r in sample_log.read()] == [1, 4]
    assert "cannot use (its metadata has no 'rows')" in caplog.text
    assert "cannot use (its metadata's 'recv_version' is '3', not an int >= -1)" in caplog.text


def test_a_missing_segment_file_is_reported_and_the_others_are_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = SegmentLog(tmp_path, segment_bytes=100)  # two records per segment
    for i in range(6):
        log.append([b"payload-%d" % i], {"i": i})
    log.close()
    segments = log.segments()
    assert len(segments) >= 3
    (tmp_path / f"{segments[1]:08d}.seg").unlink()  # deleted by hand
    with caplog.at_level(logging.WARNING, logger="netrl.storage.segments"):
        kept = [r.meta["i"] for r in SegmentLog(tmp_path, segment_bytes=100).read()]
    assert kept == [0, 1, 4, 5]
    assert f"segment files {segments[1]:08d}.seg are missing" in caplog.text and "records they held are lost" in \
        caplog.text


def test_recycled_segments_are_reused_and_their_old_records_never_come_back(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=1000, recycle=2)
    written = []
    for i in range(60):
        written.append(log.append([bytes([i % 256]) * 90], {"i": i}))
        log.drop_before(Position(log.end().segment - 1, 0))  # keep the current segment and the one before
    files = {p.name for p in tmp_path.iterdir()}
    assert sum(name.endswith(".free") for name in files) <= 2 and len(files) <= 4  # disk use stays bounded
    kept = list(log.read())
    assert [r.meta["i"] for r in kept] == list(range(kept[0].meta["i"], 60))  # only live records, in order
    assert all(bytes(r.frames[0]) == bytes([r.meta["i"]]) * 90 for r in kept)
    # A crash right after a record boundary in a recycled file: what follows are valid records of an older life of
    # the file. Reopening must treat them as the end of the log, not as records (nor as damage).
    current = tmp_path / f"{log.end().segment:08d}.seg"
    log.close()
    stale = bytes(current.read_bytes())
    assert len(stale) > log.end().offset  # the file is recycled: old bytes follow the live records
    reopened = SegmentLog(tmp_path, segment_bytes=1000, recycle=2)
    assert [r.meta["i"] for r in reopened.read()] == [r.meta["i"] for r in kept]
    reopened.append([b"after"], {"i": 999})
    assert [r.meta["i"] for r in SegmentLog(tmp_path, readonly=True).read()][-2:] == [59, 999]
    # Rolling on truncates a recycled segment at its last record, so closed segments hold nothing stale.
    for i in range(30):
        reopened.append([b"y" * 90], {"i": 1000 + i})
    closed = [s for s in reopened.segments() if s != reopened.end().segment]
    assert closed
    for seg in closed:
        path = tmp_path / f"{seg:08d}.seg"
        records = [r for r in reopened.read() if r.position.segment == seg]
        assert path.stat().st_size == records[-1].next.offset


def test_a_failed_append_leaves_no_partial_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = SegmentLog(tmp_path)
    log.append([b"a" * 100], {"i": 1})
    real_writev = os.writev

    def disk_full(fd: int, parts: list[bytes]) -> int:  # writes part of the record, then the disk is full
        os.write(fd, bytes(parts[0])[:7])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", disk_full)
    with pytest.raises(OSError, match="No space"):
        log.append([b"b" * 100], {"i": 2})
    monkeypatch.setattr(os, "writev", real_writev)
    log.append([b"c" * 100], {"i": 3})  # space again: the next record starts where the failed one did
    log.close()
    assert [(r.meta["i"], bytes(r.frames[0])) for r in SegmentLog(tmp_path).read()] == [(1, b"a" * 100),
                                                                                        (3, b"c" * 100)]


def test_a_spool_or_sample_log_the_disk_refuses_stops_with_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "00000001.seg").mkdir()  # a folder where a segment file belongs: reading it fails
    with pytest.raises(NetrlError, match=r"cannot read the server's spool in .*spool: \[Errno 21\] Is a directory"):
        Spool(tmp_path / "spool", max_bytes=10_000).open()
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "00000001.seg").mkdir()
    with pytest.raises(NetrlError, match=r"cannot read the trainer's sample log in .*samples: \[Errno 21\]"):
        SampleLog(tmp_path / "samples", keep_rows=100)


def test_checkpoint_is_atomic_and_a_damaged_one_gives_way_to_the_one_before(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert checkpoint.load_checkpoint(tmp_path) is None
    for n in range(1, 4):
        checkpoint.save_checkpoint(tmp_path, {"w": torch.full((2,), float(n))},
                                   {"epoch": n, "total_updates": n, "version": n, "total_samples": n})
    agent, state = checkpoint.load_checkpoint(tmp_path)  # type: ignore[misc]
    assert state["epoch"] == 3 and torch.equal(agent["w"], torch.full((2,), 3.0))
    files = sorted(p.name for p in (tmp_path / "checkpoint").iterdir())
    assert files == ["CURRENT", "agent_000002.pt", "agent_000003.pt", "state_000002.json", "state_000003.json"]
    # a crash after writing the tensors but before CURRENT moved leaves the previous checkpoint current
    (tmp_path / "checkpoint" / "agent_000004.pt").write_bytes(b"half a file")
    assert checkpoint.load_checkpoint(tmp_path)[1]["epoch"] == 3  # type: ignore[index]
    (tmp_path / "checkpoint" / "agent_000003.pt").write_bytes(b"garbage")  # the current one is damaged
    with caplog.at_level(logging.WARNING, logger="netrl.storage.checkpoint"):
        agent, state = checkpoint.load_checkpoint(tmp_path)  # type: ignore[misc]
    assert state["epoch"] == 2 and torch.equal(agent["w"], torch.full((2,), 2.0))  # the one kept for this
    assert re.search(r"cannot read .*agent_000003\.pt: not a tensor file netrl wrote \(.*\): resuming from checkpoint "
                     r"2, the one before it", caplog.text)
    assert "\n" not in caplog.records[0].getMessage() and "weights_only" not in caplog.text  # torch's 12 lines, cut
    assert json.loads((tmp_path / "checkpoint" / "CURRENT").read_text()) == {"number": 2}  # resumed from 2...
    checkpoint.save_checkpoint(tmp_path, {"w": torch.full((2,), 4.0)}, {"epoch": 4, "total_updates": 4, "version": 4,
                                                                        "total_samples": 4})
    files = sorted(p.name for p in (tmp_path / "checkpoint").glob("agent_*.pt"))
    assert files[:2] == ["agent_000002.pt", "agent_000003.pt"]  # ...so its next save replaced the damaged 3, kept 2
    assert checkpoint.load_checkpoint(tmp_path)[1]["epoch"] == 4  # type: ignore[index]
    (tmp_path / "checkpoint" / "agent_000003.pt").write_bytes(b"garbage")
    (tmp_path / "checkpoint" / "state_000002.json").write_text("{torn")
    with pytest.raises(CheckpointError, match=r"cannot read .*agent_000003\.pt: .*, and no older checkpoint in .* "
                                              r"reads either: remove .*CURRENT to start this run afresh"):
        checkpoint.load_checkpoint(tmp_path)
    (tmp_path / "checkpoint" / "state_000003.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"state_000003\.json has format 'list'; this netrl reads format 1"):
        checkpoint.load_state(tmp_path)  # another format is not damage: no fallback


def test_an_unreadable_checkpoint_pointer_falls_back_to_the_newest_complete_checkpoint(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for n in range(1, 4):
        checkpoint.save_checkpoint(tmp_path, {"w": torch.full((2,), float(n))},
                                   {"epoch": n, "total_updates": n, "version": n, "total_samples": n})
    folder = tmp_path / "checkpoint"
    (folder / "agent_000003.pt").unlink()  # the newest is incomplete
    (folder / "CURRENT").write_text("{torn")
    agent, state = checkpoint.load_checkpoint(tmp_path)  # type: ignore[misc]
    assert state["epoch"] == 2 and torch.equal(agent["w"], torch.full((2,), 2.0))
    assert "CURRENT is unreadable" in caplog.text and "using checkpoint 2, the newest whose files" in caplog.text
    checkpoint.save_checkpoint(tmp_path, {"w": torch.zeros(2)}, {"epoch": 3, "total_updates": 3, "version": 3,
                                                                  "total_samples": 3})
    assert json.loads((folder / "CURRENT").read_text()) == {"number": 3}  # numbered after it, and readable again
    for f in folder.glob("agent_*.pt"):
        f.unlink()
    (folder / "CURRENT").write_text("{torn")
    with pytest.raises(CheckpointError, match=r"CURRENT is unreadable .* holds no complete checkpoint: remove "
                                              r".*CURRENT to start this run afresh"):
        checkpoint.load_checkpoint(tmp_path)


class Killed(BaseException):
    """A SIGKILL at an exact point of a write: nothing after it runs, not even an except clause."""


def test_weights_keep_their_version_label_whenever_the_writer_is_killed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "policy.pt"
    linear = [torch.nn.Linear(2, 2) for _ in range(4)]
    write_weights_file(path, linear[1], {"version": 1, "trained_steps": 600})
    real_replace = os.replace
    calls: list[str] = []

    def killed_before_the_weights(src: Any, dst: Any) -> None:  # the sidecar is replaced first, then the weights
        calls.append(Path(dst).name)
        if Path(dst) == path:
            raise Killed
        real_replace(src, dst)

    monkeypatch.setattr("netrl.storage.weight_files.os.replace", killed_before_the_weights)
    with pytest.raises(Killed):
        write_weights_file(path, linear[2], {"version": 2, "trained_steps": 700})
    assert calls == ["policy.pt.json", "policy.pt"]
    state, meta = read_weights_file(path)
    assert meta["version"] == 1 and torch.equal(state["weight"], linear[1].weight)  # old weights, old label
    assert meta["trained_steps"] == 600  # and the old counts, not the new version's
    monkeypatch.setattr("netrl.storage.weight_files.os.replace", real_replace)
    write_weights_file(path, linear[3], {"version": 3})  # the next save, by the restarted writer
    state, meta = read_weights_file(path)
    assert meta["version"] == 3 and torch.equal(state["weight"], linear[3].weight)

    monkeypatch.setattr("netrl.storage.weight_files.os.replace", killed_before_the_weights)
    for version in (4, 5):  # killed twice at the same point: the label cannot be known
        with pytest.raises(Killed):
            write_weights_file(path, linear[0], {"version": version})
    monkeypatch.setattr("netrl.storage.weight_files.os.replace", real_replace)
    with caplog.at_level(logging.WARNING, logger="netrl.storage.weight_files"):
        state, meta = read_weights_file(path)
    assert meta == {} and torch.equal(state["weight"], linear[3].weight)  # unknown, never a wrong label
    assert "policy.pt.json does not describe" in caplog.text and "taken as of unknown version" in caplog.text
    (tmp_path / "policy.pt.json").write_text('{"version": 7}')  # written by an older netrl or by hand: trusted
    assert read_weights_file(path)[1]["version"] == 7
    for version in (8, 9):  # the same weights saved again under a new number (a trainer renumbering its actor)
        write_weights_file(path, linear[3], {"version": version})
    assert read_weights_file(path)[1]["version"] == 9


def test_worker_loads_saved_weights_at_start_and_keeps_a_history(tmp_path: Path) -> None:
    env_cls = partial(GenericGymEnv, id="Pendulum-v1")
    actor_cls = partial(MLPActor, hidden_sizes=(8,))
    env = env_cls()
    saved = actor_cls(env.observation_space, env.action_space)
    path = tmp_path / "policy.pt"
    write_weights_file(path, saved, {"version": 41})
    worker = RolloutWorker(env_cls, actor_cls, model_path=str(path), standalone=True,
                           model_path_history=str(tmp_path / "hist"), model_history=2)
    # what workers killed while saving left (pid-thread names), one being written now, and a file of the user's
    stale = [tmp_path / "policy.pt.tmp-4242-139", tmp_path / "policy.pt.json.tmp-4242-139",
             tmp_path / "hist_v000012.pt.tmp-77-1"]
    for f in [*stale, tmp_path / "policy.pt.tmp-4243-139", tmp_path / "notes.tmp-a-b"]:
        f.write_bytes(b"half a file")
    for f in [*stale, tmp_path / "notes.tmp-a-b"]:
        os.utime(f, (1e9, 1e9))  # long ago
    worker.start()
    assert sorted(f.name for f in tmp_path.glob("*.tmp-*")) == ["notes.tmp-a-b", "policy.pt.tmp-4243-139"]
    assert worker.version == 41
    for name, value in saved.state_dict().items():
        assert torch.equal(worker.actor.state_dict()[name], value)
    for version in (42, 43, 44, 45):  # what the network thread does for each received version
        worker.save_model(worker.actor, version, "trainer-session")
    assert json.loads(Path(str(path) + ".json").read_text())["version"] == 45
    assert sorted(p.name for p in tmp_path.glob("hist_v*.pt")) == ["hist_v000043.pt", "hist_v000045.pt"]
    worker.close()
    assert Position(1, 0) < Position(1, 5) < Position(2, 0)  # positions order like the log


def test_a_folder_has_one_live_holder_and_a_dead_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    first = FolderLock(tmp_path / "run", "run folder", "stop it")
    first.acquire()
    first.acquire()  # idempotent
    # held by this very process (a notebook's Trainer not closed): "another process" would name the reader's own pid
    with pytest.raises(FolderInUse, match=rf"run folder {tmp_path / 'run'} is in use by this process "
                                          rf"\(pid {os.getpid()}\), by an object not closed yet \(close\(\) it "
                                          rf"first\); otherwise stop it"):
        FolderLock(tmp_path / "run", "run folder", "stop it").acquire()
    holder = ("import sys, time; from netrl.storage.folderlock import FolderLock; "
              "FolderLock(sys.argv[1], 'x', 'y').acquire(); print('held', flush=True); time.sleep(60)")
    first.release()
    child = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match=rf"\(pid {child.pid}\)"):  # another process
            first.acquire()
        child.kill()  # SIGKILL: no cleanup ran, and still the lock is gone with the process
        child.wait()
        first.acquire()
    finally:
        child.kill()
        child.wait()
        first.release()


def _run_until_killed(running: Any) -> None:
    running.set()
    time.sleep(60)


def test_a_child_forked_while_a_lock_is_held_does_not_keep_it_after_its_parent(tmp_path: Path) -> None:
    lock = FolderLock(tmp_path, "run folder", "stop it")
    lock.acquire()
    fork = multiprocessing.get_context("fork")
    running = fork.Event()
    child = fork.Process(target=_run_until_killed, args=(running,), daemon=True)
    child.start()  # say, an env's helper process, forked with the parent's open files
    try:
        assert running.wait(30)
        lock.release()  # as when the parent ends; the child runs on
        again = FolderLock(tmp_path, "run folder", "stop it")
        again.acquire()  # not FolderInUse: the child's copy of the lock file does not keep the lock
        again.release()
    finally:
        child.kill()
        child.join()


def test_a_file_system_without_locks_is_named_and_a_worker_runs_unlocked_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import netrl.storage.folderlock
    from netrl.worker.names import claim_worker_id, host_name

    def no_locks(fd: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(netrl.storage.folderlock, "_lock", no_locks)  # as on some network file systems
    with pytest.raises(NetrlError, match=rf"cannot lock the run folder {tmp_path}: \[Errno {errno.ENOLCK}\] No locks "
                                         "available; its file system may not support file locks: choose a folder on "
                                         "a local disk"):  # not "in use by another process (pid unknown)"
        FolderLock(tmp_path, "run folder", "stop it").acquire()
    with caplog.at_level(logging.WARNING, logger="netrl.worker.names"):
        name, lock = claim_worker_id(tmp_path / "run", None)  # not names tried without end, a file for each
    assert (name, lock) == (host_name(), None) and len(list((tmp_path / "run").iterdir())) == 1
    assert f"this worker runs as {host_name()!r} with no lock on that name, so another worker" in caplog.text
    (tmp_path / "file").write_text("")
    with caplog.at_level(logging.WARNING, logger="netrl.worker.names"):  # a run folder that cannot be made
        assert claim_worker_id(tmp_path / "file" / "run", "robot-1") == ("robot-1", None)
    assert (f"cannot use {tmp_path / 'file' / 'run'} as the run folder: {tmp_path / 'file'} is a file, not a folder: "
            "move it away, or choose another folder; this worker runs as 'robot-1' with no lock") in caplog.text


def test_a_file_where_a_folder_belongs_is_named_in_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "spool").write_text("not a folder")
    server = Server(trainer_port=free_port(), worker_port=free_port(), spool_dir=tmp_path / "spool")
    with pytest.raises(NetrlError, match=rf"cannot use {tmp_path / 'spool'} as the spool folder: "
                                         rf"{tmp_path / 'spool'} is a file, not a folder: move it away"):
        server.open()
    server.close()
    (tmp_path / "weights").write_text("not a folder")  # a parent of the run folder
    with pytest.raises(NetrlError, match=rf"cannot use {tmp_path / 'weights' / 'run'} as the run folder: "
                                         rf"{tmp_path / 'weights'} is a file"):
        FolderLock(tmp_path / "weights" / "run", "run folder", "stop it").acquire()
    (tmp_path / "samples").write_text("not a folder")
    with pytest.raises(NetrlError, match=rf"as the trainer's sample log folder: {tmp_path / 'samples'} is a file"):
        SampleLog(tmp_path / "samples", keep_rows=10)


def test_a_weights_file_that_cannot_be_written_raises_oserror_and_keeps_the_previous_one(tmp_path: Path) -> None:
    # torch.save reports a full disk (here: a file-size limit) as a RuntimeError naming neither file nor cause
    script = """
import resource, sys, torch
from pathlib import Path
from netrl.storage.weight_files import write_weights_file
path = Path(sys.argv[1])
write_weights_file(path, torch.nn.Linear(2, 2), {"version": 1})
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    write_weights_file(path, torch.nn.Linear(200, 200), {"version": 2})
except OSError as exc:
    print("OSError", exc.filename, exc)
"""
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "w.pt")], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.startswith(f"OSError {tmp_path / 'w.pt'}.tmp-"), out.stdout + out.stderr
    assert "torch.save said" in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.pt", "w.pt.json"]  # no temporary file left
    assert json.loads((tmp_path / "w.pt.json").read_text())["version"] == 1
    assert torch.load(tmp_path / "w.pt", weights_only=True)["weight"].shape == (2, 2)


@settings(max_examples=300, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damage_anywhere_loses_only_the_records_it_touches(tmp_path_factory: pytest.TempPathFactory,
                                                           data: st.DataObject) -> None:
    folder = tmp_path_factory.mktemp("log")
    sizes = data.draw(st.lists(st.integers(0, 120), min_size=1, max_size=12), label="record sizes")
    segment_bytes = data.draw(st.sampled_from([150, 400, 1 << 20]), label="segment bytes")
    log = SegmentLog(folder, segment_bytes=segment_bytes)
    written = [(i, bytes([i]) * n) for i, n in enumerate(sizes)]
    for i, payload in written:
        log.append([payload, b"NRL3" * (i % 3)], {"i": i})  # the magic inside data must never pass for a record
    log.close()
    spans = {r.meta["i"]: (r.position.segment, r.position.offset, r.next.offset) for r in log.read()}
    files = {seg: folder / f"{seg:08d}.seg" for seg in log.segments()}
    hits = data.draw(st.lists(st.tuples(st.sampled_from(sorted(files)), st.integers(0, 1 << 20), st.integers(1, 255)),
                              min_size=1, max_size=4), label="flipped bytes")
    touched = set()
    for seg, where, mask in hits:
        raw = bytearray(files[seg].read_bytes())
        at = where % len(raw)
        raw[at] ^= mask
        files[seg].write_bytes(bytes(raw))
        touched |= {i for i, (s, start, end) in spans.items() if s == seg and start <= at < end}
    read = [(r.meta["i"], bytes(r.frames[0])) for r in SegmentLog(folder, segment_bytes=segment_bytes).read()]
    assert [i for i, _ in read] == sorted(i for i, _ in read)  # in order, each once
    assert all(payload == written[i][1] for i, payload in read)  # never a damaged or invented record
    assert {i for i, _ in written} - touched <= {i for i, _ in read}  # every untouched record is still there


def test_a_log_appends_bytes_zmq_frames_and_typed_views_as_their_bytes(tmp_path: Path) -> None:
    # append() views a frame only when it must: bytes and a zmq.Frame's buffer go to writev as they
    # are; a view of floats is cast to bytes, so its size is its bytes, not its elements
    import numpy as np
    import zmq

    from netrl.storage.segments import SegmentLog

    floats = np.arange(6, dtype=np.float32).reshape(2, 3)
    frames = [b"head", zmq.Frame(b"frame-bytes"), memoryview(floats), b""]
    log = SegmentLog(tmp_path / "log")
    log.append(frames, {"n": 1})
    (record,) = list(log.read())
    log.close()
    assert [bytes(f) for f in record.frames] == [b"head", b"frame-bytes", floats.tobytes(), b""]
