"""Replay columns as tensors on the training device (memory.device cuda, netrl.memory.device): the same batches as host
columns from the same seed, gathered where the columns live; sized before they are allocated, and refused naming
memory.memory_size when they do not fit; memory.device cuda refused on a machine without CUDA, and with a CPU trainer.

The tensor code runs with storage_device "cpu" here; the tests marked ``cuda`` run it on a GPU where there is one."""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from netrl.__main__ import configure_torch
from netrl.agents.base import TrainingAgent
from netrl.config.load import load_config
from netrl.errors import ConfigError
from netrl.memory import device as device_memory
from netrl.memory.base import MemoryDataloading
from netrl.memory.device import fit_problem
from netrl.memory.prefetch import BatchesAhead
from netrl.memory.replay import ReplayMemory
from netrl.samples import Batch, Buffer
from netrl.training.loop import TrainingOffline
from tests.fakes import ListSource, small_config

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
NO_CUDA = re.escape('memory.device is "cuda" but torch.cuda.is_available() is False')
STORAGES = ["cpu", pytest.param("cuda", marks=cuda)]


def packet(n: int, start: int, worker: str, weighted: bool = False) -> Buffer:
    """Rows numbered from ``start``: a tuple observation (image-like uint8 and a float vector), actions, rewards and
    an extra output all say which row they are; every 9th row ends an episode."""
    rows = np.arange(start, start + n)
    image = (rows % 251).astype(np.uint8)[:, None, None] * np.ones((1, 4, 4), np.uint8)
    return Buffer(act=rows.astype(np.float32)[:, None], obs=(image, np.stack([rows, -rows], 1).astype(np.float32)),
                  rew=rows.astype(np.float32), terminated=rows % 9 == 8, truncated=rows % 13 == 12,
                  reset=rows % 9 == 0, context=np.zeros(n, bool), policy_version=rows.astype(np.int64), worker=worker,
                  weight=np.where(rows % 5 == 0, 0.5, 1.0).astype(np.float32) if weighted else None,
                  extra={"state_value": (10.0 * rows).astype(np.float32)})


def fill(memory: ReplayMemory) -> None:
    for k in range(12):  # 12 packets of 17 rows into 100: the ring wraps twice
        memory.append_buffer(packet(17, 17 * k, f"w{k % 3}", weighted=k == 5))


def host(x: Any) -> Any:
    return x.cpu() if isinstance(x, torch.Tensor) else x


@pytest.mark.parametrize("storage", STORAGES)
def test_tensor_columns_give_the_batches_host_columns_give_from_the_same_seed(storage: str) -> None:
    ours = ReplayMemory(memory_size=100, batch_size=32, seed=3, storage_device=storage, device=storage)
    theirs = ReplayMemory(memory_size=100, batch_size=32, seed=3)
    fill(ours)
    fill(theirs)
    assert isinstance(ours._cols["obs/0"], torch.Tensor) and ours._cols["obs/0"].device.type == storage
    assert isinstance(ours._cols["end"], np.ndarray)  # rows are drawn on the host
    assert len(ours) == len(theirs) and ours.total_appended == theirs.total_appended
    for _ in range(3):
        a, b = ours.sample(), theirs.sample()
        assert a.obs[0].device.type == storage and a.obs[0].dtype == torch.uint8
        for x, y in zip([*a.obs, a.act, a.rew, *a.next_obs, a.terminated, a.truncated, a.weight,
                         a.extra["state_value"]],
                        [*b.obs, b.act, b.rew, *b.next_obs, b.terminated, b.truncated, b.weight,
                         b.extra["state_value"]], strict=True):
            assert torch.equal(host(x), y)
        assert ours.batch_workers() == theirs.batch_workers()
        np.testing.assert_array_equal(host(a.obs[1])[:, 0] + 1, host(a.next_obs[1])[:, 0])  # real transitions
    for k in (0, 7, len(ours) - 1):
        mine, other = ours.get_transition(k), theirs.get_transition(k)
        for x, y in zip(mine[0] + (mine[1],) + mine[3], other[0] + (other[1],) + other[3], strict=True):
            assert isinstance(x, np.ndarray)
            np.testing.assert_array_equal(x, y)
        assert mine[2:3] + mine[4:] == other[2:3] + other[4:]


def test_a_packet_the_tensor_columns_cannot_hold_is_refused_before_anything_is_written() -> None:
    memory = ReplayMemory(memory_size=50, batch_size=4, seed=0, storage_device="cpu")
    memory.append_buffer(packet(10, 0, "w"))
    before = {name: host(col).clone() if isinstance(col, torch.Tensor) else col.copy()
              for name, col in memory._cols.items()}
    bad = packet(10, 10, "w")
    bad.obs = (bad.obs[0].astype(np.float32), bad.obs[1])
    with pytest.raises(ValueError, match=r"column 'obs/0' has dtype float32; the memory stores uint8"):
        memory.append_buffer(bad)
    for name, col in memory._cols.items():
        assert (torch.equal(col, before[name]) if isinstance(col, torch.Tensor)
                else np.array_equal(col, before[name])), name


def test_the_memory_says_what_it_needs_before_allocating_and_refuses_what_does_not_fit(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "netrl.memory.device")
    row = 4 + 16 + 8 + 4 + 4 + 1 + 1 + 4  # act, the two obs leaves, rew, weight, flags, extra (not end and the like)
    monkeypatch.setattr(device_memory, "_free_bytes", lambda device: 1000 * row)  # room for 800 rows
    small = ReplayMemory(memory_size=800, batch_size=4, storage_device="cpu")
    small.append_buffer(packet(10, 0, "w"))
    assert f"replay memory on cpu: memory.memory_size 800 rows x {row} bytes" in caplog.text
    big = ReplayMemory(memory_size=801, batch_size=4, storage_device="cpu")
    with pytest.raises(ConfigError) as refused:
        big.append_buffer(packet(10, 0, "w"))
    (problem,) = refused.value.problems
    assert problem.startswith("memory.memory_size is 801: the replay memory on cpu needs") and "about 800 rows fit" \
        in problem and 'memory.device to "cpu"' in problem
    assert big._cols == {} and len(big) == 0  # nothing allocated, nothing stored


def test_fit_problem_counts_the_headroom_and_names_the_key() -> None:
    assert fit_problem(100, 10, 2000, "cuda:0") is None
    problem = fit_problem(1_000_000, 12_288, 8 * 2**30, "cuda:0")  # 84x84x... images: 11.4 GiB into 8 GiB free
    assert problem is not None and problem.startswith("memory.memory_size is 1000000: the replay memory on cuda:0 "
                                                      "needs 11.44 GiB (12288 bytes per row), and cuda:0 has 8.00 GiB "
                                                      "free, of which the memory may take 80%")
    assert "about 559,240 rows fit" in problem


def test_a_sample_preprocessor_is_refused_with_tensor_columns() -> None:
    with pytest.raises(ValueError, match=r"sample_preprocessor runs on numpy batches.*storage_device 'cpu'.*set "
                                         r"memory.device to \"cpu\""):
        ReplayMemory(storage_device="cpu", sample_preprocessor=lambda o, a, r, o2, te, tr: (o, a, r, o2, te, tr))


class NoAgent(TrainingAgent):
    def train(self, batch: Batch) -> dict[str, float]:
        raise AssertionError("not trained")

    def get_actor(self) -> Any:
        raise AssertionError("not published")


def training(**kw: Any) -> TrainingOffline:
    obs, act = gymnasium.spaces.Box(-1, 1, (3,), np.float32), gymnasium.spaces.Box(-1, 1, (1,), np.float32)
    return TrainingOffline(env_cls=(obs, act), training_agent_cls=NoAgent, memory_size=100, batch_size=8,
                           memory_device="cuda", **kw)


@no_cuda
def test_memory_device_cuda_is_refused_without_cuda_by_the_config_the_loop_and_the_memory(tmp_path: Any) -> None:
    cfg = load_config(small_config(tmp_path, memory={"device": "cuda"}))
    with pytest.raises(ConfigError, match=NO_CUDA):
        configure_torch(cfg, "trainer")
    configure_torch(cfg, "worker")  # one config.json serves CPU-only workers too
    with pytest.raises(ConfigError, match=NO_CUDA):
        training().build()
    with pytest.raises(ConfigError, match=NO_CUDA):
        ReplayMemory(storage_device="cuda")


def test_memory_device_cuda_with_a_cpu_trainer_or_a_memory_that_cannot_is_refused(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r'memory.device "cuda" keeps the replay memory on the training device, but '
                                          r'trainer.device is "cpu"'):
        load_config(small_config(tmp_path, memory={"device": "cuda"}, trainer={"device": "cpu"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the checks after CUDA's own
    with pytest.raises(ConfigError, match=r'memory.device is "cuda" but the training device is "cpu" '
                                          r'\(trainer.device\)'):
        training(device="cpu").build()

    class TmrlMemory(MemoryDataloading):
        def __init__(self, device: str, nb_steps: int, memory_size: int, batch_size: int) -> None:
            super().__init__(device, nb_steps, memory_size=memory_size, batch_size=batch_size)

    with pytest.raises(ConfigError, match=r'memory.device is "cuda", but TmrlMemory.__init__ takes no storage_device '
                                          r'argument'):
        training(device="cuda", memory_cls=TmrlMemory).build()


@cuda
def test_on_cuda_batches_are_gathered_on_the_device_and_prepared_ahead_on_a_side_stream() -> None:
    loop = training(device="cuda", epochs=1, rounds=1, steps=30, max_training_steps_per_env_step=100)
    loop.training_agent_cls = CudaAgent
    loop.build()
    memory = loop.memory
    assert isinstance(memory, ReplayMemory) and memory._storage == "cuda"
    rows = [packet(17, 17 * k, "w") for k in range(6)]
    for b in rows:  # the loop's spaces: (3,) observations and (1,) actions within [-1, 1]
        b.obs, b.act, b.extra = np.repeat(b.obs[1][:, :1], 3, axis=1) / 1e3, b.act / 1e3, None
    list(loop.run_epoch(ListSource(rows), threading.Event()))  # type: ignore[arg-type]
    assert isinstance(loop.agent, CudaAgent) and loop.agent.trained == 30
    assert memory._cols["obs"].is_cuda and not memory._pinned


class CudaAgent(NoAgent):
    trained = 0

    def train(self, batch: Batch) -> dict[str, float]:
        step = batch.next_obs[:, 0] - batch.obs[:, 0]  # real transitions: one row further
        assert batch.obs.is_cuda and batch.act.is_cuda and torch.allclose(step, torch.full_like(step, 1e-3), atol=1e-6)
        self.trained += 1
        return {}


@cuda
def test_host_columns_for_a_cuda_trainer_are_gathered_into_page_locked_buffers_ahead() -> None:
    memory = ReplayMemory(memory_size=100, batch_size=32, seed=0, device="cuda")
    fill(memory)
    with BatchesAhead(memory, "cuda") as batches:
        assert batches.ahead and memory._pinned
        first = batches.next()
        kept = [t.clone() for t in first.obs]
        batches.settle()
        assert all(torch.equal(t, k) for t, k in zip(first.obs, kept, strict=True)) and first.obs[0].is_cuda
        assert all(torch.from_numpy(out).is_pinned() for out in memory._out.values())
