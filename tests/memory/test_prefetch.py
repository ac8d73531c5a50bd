"""Batches prepared ahead (netrl.memory.prefetch): the training loop gathers batch k+1 while the agent trains on batch
k, batch k stays intact meanwhile, the loop names the workers of the batch it trained on, the time the update waits
for its batch is what ``sample_fraction`` counts, and end to end (worker -> server -> trainer -> memory -> batch) every
batch the agent sees holds real transitions, with the memory's columns in host memory or as tensors."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
import zmq

from netrl.actor import ActorModule
from netrl.agents.base import TrainingAgent
from netrl.memory import prefetch
from netrl.memory.base import MemoryDataloading, Transition
from netrl.memory.prefetch import BatchesAhead
from netrl.memory.replay import ReplayMemory
from netrl.samples import Batch, Buffer, BufferBuilder
from netrl.server.server import Server
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, Counter, ListSource, TagActor

OBS = gymnasium.spaces.Box(-1e6, 1e6, (3,), np.float32)
ACT = gymnasium.spaces.Box(-1e6, 1e6, (1,), np.float32)


@pytest.fixture(autouse=True)
def a_core_is_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gather ahead whatever this machine's cores and torch's threads: the tests are about what it does."""
    monkeypatch.setattr(prefetch, "core_free", lambda: True)
    Counter.made = []


def counting_packets(episodes: int, length: int, worker: str = "w", capacity: int = 7) -> list[Buffer]:
    """Packets as a worker cuts them, of episodes whose rows say where they are: obs = [0, episode, t], act = [0],
    reward t; so a transition is real when next_obs[2] == obs[2] + 1 within one episode."""
    builder, out = BufferBuilder(capacity=capacity, overlap=1), []
    for ep in range(episodes):
        for t in range(length + 1):
            builder.add(np.zeros(1, np.float32), np.array([0, ep, t], np.float32), float(t), t == length, False,
                        t == 0, 0)
            if builder.full:
                out.append(builder.cut())
    out.append(builder.cut())
    packets = [p for p in out if p is not None]
    for seq, p in enumerate(packets):
        p.worker, p.seq = worker, seq
    return packets


def check_transitions(batch: Batch) -> None:
    o, a, r, o2 = (t.cpu() for t in batch[:4])
    assert torch.equal(o2[:, 2], o[:, 2] + 1) and torch.equal(o2[:, 1], o[:, 1]), (o, o2)  # one step of one episode
    assert torch.equal(r, o2[:, 2]) and torch.equal(a[:, 0], o[:, 0])


class CheckingAgent(TrainingAgent):
    """Trains on nothing; checks every batch: real transitions, and unchanged once the gather of the next batch is
    done (``settle`` returns when it is)."""

    settle: Callable[[], None] = staticmethod(lambda: None)
    check: Callable[[Batch], None] = staticmethod(check_transitions)

    def __init__(self, observation_space: Any, action_space: Any, device: str) -> None:
        super().__init__(observation_space, action_space, device)
        self.actor = TagActor(observation_space, action_space)
        self.trained = 0

    def train(self, batch: Batch) -> dict[str, float]:
        before = [t.clone() for t in batch[:6]]
        self.settle()
        for name, was, now in zip(Batch._fields, before, batch[:6], strict=False):
            assert torch.equal(was, now), f"batch {self.trained}'s {name} changed while the next batch was gathered"
        self.check(batch)
        self.trained += 1
        return {"loss": 0.0}

    def get_actor(self) -> ActorModule:
        return self.actor


def loop(memory_cls: Any = ReplayMemory, **kw: Any) -> TrainingOffline:
    training = TrainingOffline(env_cls=(OBS, ACT), memory_cls=memory_cls, training_agent_cls=CheckingAgent, epochs=1,
                               rounds=1, steps=40, update_buffer_interval=5, max_training_steps_per_env_step=100,
                               memory_size=60, batch_size=16, seed=0, device="cpu", **kw)
    training.build()
    agent = training.agent
    assert isinstance(agent, CheckingAgent)
    ingester = training.ingester
    assert ingester is not None
    agent.settle = lambda: ingester.batches.settle() if ingester.batches is not None else None
    return training


@pytest.mark.parametrize("storage", [None, "cpu"], ids=["host-columns", "tensor-columns"])
def test_batch_k_stays_intact_while_batch_k_plus_1_is_gathered_and_packets_arrive(storage: str | None) -> None:
    # packets arrive between steps (update_buffer_interval 5) and wrap the 60-row ring: the gather ahead must
    # neither reuse batch k's buffers nor read the ring while a packet is written into it
    training = loop(partial(ReplayMemory, storage_device=storage) if storage else ReplayMemory)
    sampled = []
    memory = training.memory
    assert isinstance(memory, ReplayMemory)
    draw = memory.sample_indices
    memory.sample_indices = lambda: sampled.append(threading.current_thread().name) or draw()  # type: ignore[method-assign]
    source = ListSource(counting_packets(episodes=40, length=6))
    rounds = list(training.run_epoch(source, threading.Event()))  # type: ignore[arg-type]
    agent = training.agent
    assert isinstance(agent, CheckingAgent) and agent.trained == 40 and rounds[0]["trained_steps"] == 40
    assert len(sampled) == 41  # the 41st batch was gathered ahead, never trained on
    assert all(name.startswith("netrl-batches") for name in sampled)
    assert training.ingester is not None and training.ingester.batches is None
    assert not any(t.name.startswith("netrl-batches") for t in threading.enumerate())


def test_without_prefetch_each_batch_is_sampled_in_the_loop_when_asked() -> None:
    training = loop(prefetch=False)
    memory = training.memory
    assert isinstance(memory, ReplayMemory)
    sampled: list[str] = []
    draw = memory.sample_indices
    memory.sample_indices = lambda: sampled.append(threading.current_thread().name) or draw()  # type: ignore[method-assign]
    list(training.run_epoch(ListSource(counting_packets(episodes=10, length=6)), threading.Event()))  # type: ignore[arg-type]
    assert sampled == ["MainThread"] * 40


def test_the_workers_named_are_those_of_the_batch_trained_on_not_of_the_one_gathered_ahead() -> None:
    memory = ReplayMemory(memory_size=30, batch_size=8, seed=0)
    for p in counting_packets(episodes=4, length=6, worker="a"):
        memory.append_buffer(p)
    with BatchesAhead(memory, "cpu") as batches:
        assert batches.ahead
        batches.next()
        second = batches.next()  # gathered ahead from a's rows; the gather of the third is under way
        batches.settle()
        for p in counting_packets(episodes=6, length=6, worker="b"):  # replaces every row of a
            memory.append_buffer(p)
        third = batches.next()  # gathered before b's rows came
        assert batches.batch_workers() == ["a"] and torch.equal(third.obs[:, 1] < 4, torch.ones(8, dtype=torch.bool))
        batches.settle()
        assert memory.batch_workers() == ["b"]  # the memory's last gather: the fourth batch, ahead
        fourth = batches.next()
        assert batches.batch_workers() == ["b"] and second is not fourth


class FailingMemory(ReplayMemory):
    calls = 0

    def sample_indices(self) -> np.ndarray:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("the rows are gone")
        return super().sample_indices()


def test_an_error_in_the_gather_ahead_is_raised_by_the_next_batch_and_stops_nothing_else() -> None:
    memory = FailingMemory(memory_size=30, batch_size=8, seed=0)
    for p in counting_packets(episodes=3, length=6):
        memory.append_buffer(p)
    batches = BatchesAhead(memory, "cpu")
    check_transitions(batches.next())  # the gather of the next one fails
    with pytest.raises(RuntimeError, match="the rows are gone"):
        batches.next()
    batches.close()
    batches.close()  # idempotent
    check_transitions(batches.next())  # closed: sampled when asked


class OwnSampleMemory(MemoryDataloading):
    """A tmrl-style memory with a sample() of its own: whether its batches outlive the next call is unknown."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.threads: list[str] = []

    def append_buffer(self, buffer: Buffer) -> None:
        pass

    def __len__(self) -> int:
        return 1

    def get_transition(self, item: int) -> Transition:
        raise NotImplementedError

    def sample(self) -> Batch:
        self.threads.append(threading.current_thread().name)
        return Batch(*(torch.zeros(2) for _ in range(6)))


def test_a_memory_that_does_not_keep_its_batches_is_sampled_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "netrl.memory.prefetch")
    memory = OwnSampleMemory()
    with BatchesAhead(memory, "cpu") as batches:
        assert not batches.ahead
        batches.next()
        batches.next()
    assert memory.threads == ["MainThread", "MainThread"]
    assert "OwnSampleMemory does not say that its batches stay valid through the next sample()" in caplog.text


def test_on_cpu_without_a_free_core_batches_are_sampled_when_asked(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "netrl.memory.prefetch")
    monkeypatch.setattr(prefetch, "core_free", lambda: False)
    memory = ReplayMemory(memory_size=30, batch_size=8, seed=0)
    assert not BatchesAhead(memory, "cpu").ahead and "sampled when the agent asks for them, not ahead" in caplog.text
    with BatchesAhead(memory, "cpu", ahead=True) as told:  # told to: it does
        assert told.ahead


class SlowMemory(ReplayMemory):
    """Its gather takes as long as the agent's update below: the gather ahead should hide it."""

    def sample_indices(self) -> np.ndarray:
        time.sleep(0.02)
        return super().sample_indices()


class SlowAgent(CheckingAgent):
    def train(self, batch: Batch) -> dict[str, float]:
        time.sleep(0.02)
        return super().train(batch)


@pytest.mark.parametrize("ahead", [False, True])
def test_sample_fraction_is_the_time_the_update_waits_for_its_batch(ahead: bool) -> None:
    training = TrainingOffline(env_cls=(OBS, ACT), memory_cls=SlowMemory, training_agent_cls=SlowAgent, epochs=1,
                               rounds=1, steps=20, update_buffer_interval=100, max_training_steps_per_env_step=100,
                               memory_size=200, batch_size=8, seed=0, device="cpu", prefetch=ahead)
    training.build()
    (row,) = training.run_epoch(ListSource(counting_packets(episodes=10, length=6)), threading.Event())  # type: ignore[arg-type]
    assert row["train_fraction"] > 0.3
    if ahead:  # only the first batch is waited for: 1 of 20 gathers
        assert row["sample_fraction"] < 0.2, row
    else:  # every gather, as long as every update
        assert row["sample_fraction"] > 0.3, row
    assert row["train_fraction"] + row["sample_fraction"] <= 1.0


def test_end_to_end_every_batch_holds_real_transitions_with_columns_as_tensors(
        server: tuple[Server, zmq.Context], tmp_path: Path) -> None:
    srv, _ = server
    class CounterAgent(CheckingAgent):
        """Checks Counter's steps: obs = [tag, episode, t], the action its tag, reward 1."""

        @staticmethod
        def check(batch: Batch) -> None:
            o, a, r, o2 = (t.cpu() for t in batch[:4])
            assert torch.equal(o2[:, 2], o[:, 2] + 1) and torch.equal(o2[:, :2], o[:, :2]), (o, o2)
            assert torch.equal(a[:, 0], o[:, 0]) and bool((r == 1).all())

        @staticmethod
        def settle() -> None:
            ingester = trainer.training.ingester if trainer.training is not None else None
            if ingester is not None and ingester.batches is not None:
                ingester.batches.settle()

    training_cls = partial(TrainingOffline, env_cls=(OBS, ACT),
                           memory_cls=partial(ReplayMemory, storage_device="cpu"),  # memory.device's code, on cpu
                           training_agent_cls=CounterAgent, epochs=1, rounds=1, steps=60, start_training=40,
                           update_buffer_interval=4, max_training_steps_per_env_step=0.9, memory_size=50,
                           batch_size=16, seed=0, sleep_between_buffer_retrieval_attempts=0.01, worker_lead=20)
    trainer = Trainer(training_cls, "127.0.0.1", server_port=srv.trainer_port, network=NET, run_dir=tmp_path / "run",
                      wandb_mode="disabled")
    stop = threading.Event()
    trainer_thread = threading.Thread(target=trainer.run, args=(stop,))
    trainer_thread.start()
    worker = RolloutWorker(Counter, TagActor, server_ip="127.0.0.1", server_port=srv.worker_port, network=NET,
                           min_samples_per_worker_packet=4, worker_id="w1", seed=0)
    worker_thread = threading.Thread(target=worker.run, kwargs={"test_episode_interval": 0, "stop": stop})
    try:
        worker_thread.start()
        trainer_thread.join(60)  # one epoch of 60 steps, then the trainer closes
    finally:
        stop.set()
        trainer_thread.join(20)
        worker_thread.join(20)
    assert not trainer_thread.is_alive() and not worker_thread.is_alive()
    training = trainer.training
    assert training is not None and training.total_updates == 60 and isinstance(training.agent, CounterAgent)
    assert training.agent.trained == 60  # CounterAgent raised on any batch that was not real or changed under it
    assert isinstance(training.memory, ReplayMemory) and isinstance(training.memory._cols["obs"], torch.Tensor)
    # the 50-row ring wrapped while batches were gathered ahead: 60 updates at 0.9 a sample need 67
    assert training.total_samples > 50
