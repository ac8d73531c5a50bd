"""memory.storage disk: ring columns in memory-mapped files (netrl.memory.disk)."""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from netrl.config.load import load_config
from netrl.errors import ConfigError, FolderInUse
from netrl.memory import disk as disk_module
from netrl.memory.build import build_memory
from netrl.memory.dataset import save_dataset
from netrl.memory.disk import DiskRing, file_rss
from netrl.memory.frames import FrameStackMemory
from netrl.memory.replay import ReplayMemory
from netrl.memory.rollout import RolloutMemory
from netrl.samples import Batch, Buffer


def packet(n: int, frame: tuple[int, ...], seed: int, episode: int = 9) -> Buffer:
    """``n`` rows of random uint8 frames, an episode every ``episode`` rows."""
    rng = np.random.default_rng(seed)
    return Buffer(
        act=rng.uniform(-1, 1, (n, 2)).astype(np.float32),
        obs=rng.integers(0, 256, (n, *frame), dtype=np.uint8),
        rew=rng.normal(size=n).astype(np.float32),
        terminated=np.arange(n) % episode == episode - 1,
        truncated=np.zeros(n, bool),
        reset=np.arange(n) % episode == 0,
        context=np.zeros(n, bool),
        policy_version=np.zeros(n, np.int64),
    )


def batches(memory: Any, count: int) -> list[Batch]:
    memory.rng = np.random.default_rng(5)
    return [
        Batch(*(torch.clone(t) if isinstance(t, torch.Tensor) else t for t in memory.sample()))
        for _ in range(count)
    ]


def same(a: list[Batch], b: list[Batch]) -> bool:
    return all(
        torch.equal(x, y)
        for p, q in zip(a, b, strict=True)
        for x, y in zip(p[:6], q[:6], strict=True)
    )


@pytest.mark.parametrize("kind", ["replay", "frames"])
def test_a_memory_on_disk_holds_and_samples_what_one_in_ram_does_through_wraparound(
    tmp_path: Path, kind: str
) -> None:
    def make(storage: DiskRing | None) -> Any:
        if kind == "frames":
            return FrameStackMemory(
                memory_size=300, batch_size=32, stack=4, seed=0, ring_storage=storage
            )
        return ReplayMemory(memory_size=300, batch_size=32, seed=0, ring_storage=storage)

    ram, storage = make(None), DiskRing(tmp_path / "replay")
    on_disk = make(storage)
    for seq in range(20):  # 700 rows into 300
        buf = packet(35, (12, 12), seq)
        ram.append_buffer(buf)
        on_disk.append_buffer(buf)
    frames = on_disk._cols["frame" if kind == "frames" else "obs"]
    assert (
        isinstance(frames.base, memoryview) or frames.base is not None
    )  # over a map, not owned memory
    files = sorted(p.name for p in (tmp_path / "replay").glob("*.ring"))
    assert files == [
        "frame.ring" if kind == "frames" else "obs.ring"
    ]  # 144 bytes a row; the small columns in RAM
    assert len(on_disk) == len(ram) and on_disk.total_appended == 700
    assert same(batches(on_disk, 4), batches(ram, 4))
    storage.close()
    assert not list((tmp_path / "replay").glob("*.ring"))  # removed
    storage.close()  # idempotent


def test_the_column_files_blocks_are_reserved_when_they_are_made(tmp_path: Path) -> None:
    """A disk that fills after the memory was made cannot fail a write into the map (SIGBUS)."""
    storage = DiskRing(tmp_path)
    memory = FrameStackMemory(memory_size=20_000, batch_size=8, stack=4, ring_storage=storage)
    memory.append_buffer(packet(40, (84, 84), 0))
    st = (tmp_path / "frame.ring").stat()
    assert st.st_size == 20_000 * 84 * 84
    assert st.st_blocks * 512 >= st.st_size  # every block, not just the 40 rows' written
    storage.close()


def test_a_disk_that_filled_since_the_check_is_a_config_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_module.os, "posix_fallocate", full, raising=False)
    storage = DiskRing(tmp_path)
    memory = FrameStackMemory(memory_size=1000, batch_size=8, stack=4, ring_storage=storage)
    with pytest.raises(ConfigError, match=r"frame.ring could not reserve 7,056,000 bytes, its disk is "
                                          r"full: set memory.storage_folder"):
        memory.append_buffer(packet(5, (84, 84), 0))
    assert len(memory) == 0
    storage.close()


def test_where_blocks_cannot_be_reserved_the_files_stay_sparse_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(disk_module.os, "posix_fallocate", raising=False)  # as on macOS
    storage = DiskRing(tmp_path)
    memory = FrameStackMemory(memory_size=20_000, batch_size=8, stack=4, ring_storage=storage)
    with caplog.at_level("WARNING", logger="netrl.memory.disk"):
        memory.append_buffer(packet(40, (84, 84), 0))
    assert re.search(r"frame.ring stays sparse.*SIGBUS", caplog.text)
    st = (tmp_path / "frame.ring").stat()
    assert st.st_blocks * 512 < st.st_size / 20  # 40 rows' blocks written, not 20,000
    assert len(memory) > 0 and memory.sample().obs.shape[0] == 8  # and it serves
    storage.close()


def test_a_second_memory_on_the_folder_is_refused_naming_it_until_the_first_lets_it_go(
    tmp_path: Path,
) -> None:
    first = DiskRing(tmp_path / "replay")
    with pytest.raises(
        FolderInUse,
        match=r"replay memory folder .*replay is in use by this process.*storage_folder",
    ):
        DiskRing(tmp_path / "replay")
    first.close()
    DiskRing(tmp_path / "replay").close()


def test_files_a_crashed_run_left_are_reused_from_zero(tmp_path: Path) -> None:
    (tmp_path / "obs.ring").write_bytes(b"\xff" * 8192)  # a killed trainer's
    (tmp_path / "extra%2Fold.ring").write_bytes(b"\xff" * 10)  # a column this memory does not have
    storage = DiskRing(tmp_path)
    memory = ReplayMemory(memory_size=100, batch_size=4, ring_storage=storage)
    memory.append_buffer(packet(3, (64,), 0))
    assert not memory._cols["obs"][3:].any()  # the rows not written yet read as zeros
    assert sorted(p.name for p in tmp_path.glob("*.ring")) == ["obs.ring"]
    storage.close()


def test_a_disk_without_room_for_the_ring_is_a_config_error_with_the_bytes_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(disk_module.shutil, "disk_usage", lambda _: usage._replace(free=10**6))
    storage = DiskRing(tmp_path)
    memory = FrameStackMemory(memory_size=1000, batch_size=8, stack=4, ring_storage=storage)
    need = (
        1000 * 84 * 84
    )  # the frames: the actions and the stack's offsets (8 and 4 bytes a row) stay in RAM
    with pytest.raises(
        ConfigError,
        match=rf"needs {need:,} bytes .* for memory.memory_size 1000 rows in "
        rf".*has 1,000,000 bytes free, about 1\d\d rows.*memory.storage_folder",
    ):
        memory.append_buffer(packet(5, (84, 84), 0))
    assert len(memory) == 0 and not list(tmp_path.glob("*.ring"))
    storage.close()


def test_a_dataset_loaded_at_construction_goes_to_disk(tmp_path: Path) -> None:
    buf = packet(30, (8, 8), 0)
    save_dataset(tmp_path / "d.npz", buf)
    storage = DiskRing(tmp_path / "replay")
    memory = ReplayMemory(
        memory_size=100, batch_size=4, dataset_path=str(tmp_path / "d.npz"), ring_storage=storage
    )
    assert (
        memory.total_appended == 30
        and (tmp_path / "replay" / "obs.ring").stat().st_size == 100 * 64
    )
    storage.close()


def test_batches_are_read_from_the_files_without_mapping_their_pages(tmp_path: Path) -> None:
    storage = DiskRing(tmp_path, resident_bytes=0)
    memory = FrameStackMemory(
        memory_size=6000, batch_size=256, stack=4, seed=0, ring_storage=storage
    )
    buf = packet(1000, (84, 84), 0)
    while memory.total_appended < 6000:
        memory.append_buffer(buf)
    storage.trim()
    before = file_rss()
    for _ in range(40):  # 40 x 256 stacks of 5 frames: about 70 MB of frames read
        memory.sample()
    assert file_rss() - before < 4 * 2**20  # type: ignore[operator]
    storage.close()


def test_gather_reads_any_rows_of_a_column_and_nothing_else(tmp_path: Path) -> None:
    storage = DiskRing(tmp_path)
    ring = storage.allocate(50, {"obs": ((4, 4), np.float32), "rew": ((), np.float32)})
    ring["obs"][:] = np.random.default_rng(0).normal(size=(50, 4, 4))
    rng = np.random.default_rng(1)
    for idx in [
        np.array([[48, 49, 0, 1], [3, 3, 3, 4]]),
        rng.integers(0, 50, (7, 5)),
        np.arange(50),
    ]:
        out = np.empty((*idx.shape, 4, 4), np.float32)
        assert storage.gather(ring["obs"], idx, out)
        assert np.array_equal(out, ring["obs"][idx])
    out = np.empty((1, 4, 4), np.float32)
    assert not storage.gather(ring["rew"], np.zeros(1, np.int64), out)  # in RAM
    assert not storage.gather(
        ring["obs"][1:], np.zeros(1, np.int64), out
    )  # a view: not the column itself
    with pytest.raises(IndexError, match=r"rows 50\.\.50 are not all within the 50 rows"):
        storage.gather(ring["obs"], np.array([50]), out)
    storage.close()
    assert not storage.gather(ring["obs"], np.zeros(1, np.int64), out)  # its files are closed


def test_resident_file_pages_stay_bounded_while_batches_are_sampled(tmp_path: Path) -> None:
    budget = 24 * 2**20
    storage = DiskRing(tmp_path, resident_bytes=budget)
    memory = FrameStackMemory(
        memory_size=6000, batch_size=256, stack=4, seed=0, ring_storage=storage
    )
    buf = packet(1000, (84, 84), 0)  # 42 MB of frames in all
    base = file_rss()
    assert base is not None
    while memory.total_appended < 6000:
        memory.append_buffer(buf)
    deadline = time.monotonic() + 3
    peak = 0
    while time.monotonic() < deadline:
        memory.sample()
        rss = file_rss()
        assert rss is not None
        peak = max(peak, rss)
    time.sleep(0.3)  # the trim thread's turn
    assert storage.trims > 0
    assert file_rss() <= base + budget + 8 * 2**20, (base, file_rss())  # type: ignore[operator]
    storage.close()


def test_trim_unmaps_the_pages_and_keeps_what_was_written(tmp_path: Path) -> None:
    storage = DiskRing(tmp_path, resident_bytes=0)  # no thread: trimmed by hand only
    memory = ReplayMemory(memory_size=5000, batch_size=16, seed=0, ring_storage=storage)
    buf = packet(5000, (64, 64), 1)  # 20 MB
    memory.append_buffer(buf)
    before = file_rss()
    storage.trim()
    after = file_rss()
    assert before is not None and after is not None and before - after > 15 * 2**20
    assert np.array_equal(
        memory._cols["obs"], buf.obs
    )  # read back from the page cache (or the file)
    storage.close()


def test_build_memory_refuses_disk_where_it_cannot_serve_and_frees_the_folder(tmp_path: Path) -> None:
    build = functools.partial(build_memory, device="cpu", steps=1, memory_size=10, batch_size=2, seed=0)
    with pytest.raises(ConfigError, match=r"RolloutMemory keeps its rows its own way.*memory.storage to \"ram\""):
        build(RolloutMemory, storage="disk", storage_folder=str(tmp_path))
    with pytest.raises(ConfigError, match=r'memory.storage must be "ram" or "disk" \(got "tape"\)'):
        build(ReplayMemory, storage="tape", storage_folder=str(tmp_path))
    with pytest.raises(ValueError, match=r"needs memory_folder"):
        build(ReplayMemory, storage="disk")
    memory, _, _ = build(ReplayMemory, storage="disk", storage_folder=str(tmp_path), resident_mib=64)  # free again
    assert isinstance(memory.ring_storage, DiskRing) and memory.ring_storage.resident_bytes == 64 * 2**20
    memory.ring_storage.close()


def test_config_refuses_disk_storage_with_cuda_columns_naming_both_keys(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"memory": {"device": "cuda", "storage": "disk"}}')
    with pytest.raises(ConfigError, match=r'memory.device "cuda" .* memory.storage "disk"'):
        load_config(path)


def test_the_settings_put_the_column_files_in_the_run_folder_unless_told(tmp_path: Path) -> None:
    from netrl.training.settings import TrainingSettings

    path = tmp_path / "config.json"
    path.write_text(
        f'{{"weights_folder": "{tmp_path}", "run_name": "r", "memory": {{"storage": "disk"}}}}'
    )
    s = TrainingSettings.from_config(load_config(path))
    assert (s.memory_storage, s.memory_folder, s.memory_resident_mib) == (
        "disk",
        str(tmp_path / "r" / "replay"),
        1024,
    )
    path.write_text(f'{{"memory": {{"storage": "disk", "storage_folder": "{tmp_path / "big"}"}}}}')
    assert TrainingSettings.from_config(load_config(path)).memory_folder == str(tmp_path / "big")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_forked_child_that_exits_leaves_its_parents_files(tmp_path: Path) -> None:
    storage = DiskRing(tmp_path)
    ring = storage.allocate(10, {"obs": ((64,), np.uint8)})
    pid = os.fork()
    if pid == 0:  # an env's helper process, exiting through atexit (the finalizer's way)
        storage._finalizer()
        os._exit(0)
    os.waitpid(pid, 0)
    assert (tmp_path / "obs.ring").exists()
    ring["obs"][3] = 7
    out = np.empty((1, 64), np.uint8)
    assert storage.gather(ring["obs"], np.array([3]), out) and (out == 7).all()  # its fd still open
    storage.close()
    assert not (tmp_path / "obs.ring").exists()
