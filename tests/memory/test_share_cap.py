"""Each worker's share of the replay memory, enforced where packets enter it (training/ingest.py):
issue 43's attack, one worker key replacing the whole memory with rows nobody can learn from."""

from __future__ import annotations

import logging
from typing import Any

import gymnasium
import numpy as np
import pytest

from netrl.agents.sac import SACAgent
from netrl.config.load import config_from_dict
from netrl.errors import ConfigError
from netrl.memory.history import HistoryMemory
from netrl.memory.replay import ReplayMemory
from netrl.samples import Buffer
from netrl.training import TrainingSettings
from netrl.training.ingest import RECENT_S
from netrl.training.loop import TrainingOffline
from netrl.util import partial

SIZE = 1000


def honest(worker: str, seq: int, n: int = 50) -> Buffer:
    """A piece of an episode: a reset row, then transitions whose observations are never 0."""
    obs = np.random.default_rng(seq).uniform(0.1, 1.0, (n, 3)).astype(np.float32)
    return Buffer(act=np.zeros((n, 1), np.float32), obs=obs, rew=np.ones(n, np.float32),
                  terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), reset=np.arange(n) == 0,
                  context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64), recv_version=1,
                  worker=worker, seq=seq)


def attack(seq: int, n: int, reset_only: bool) -> Buffer:
    """Issue 43's packets: all-zero rows (transitions nobody can learn from), or reset rows only
    (no env step at all, so the old step-counting budgets let any number through); each from a new
    session, as a worker that reconnects for every packet sends them."""
    return Buffer(act=np.zeros((n, 1), np.float32), obs=np.zeros((n, 3), np.float32),
                  rew=np.zeros(n, np.float32), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                  reset=np.ones(n, bool) if reset_only else np.arange(n) == 0, context=np.zeros(n, bool),
                  policy_version=np.zeros(n, np.int64), recv_version=1, worker=f"x/s{seq}", seq=seq)


def training(memory_cls: Any = ReplayMemory, **settings: Any) -> TrainingOffline:
    obs, act = gymnasium.spaces.Box(-1, 1, (3,), np.float32), gymnasium.spaces.Box(-1, 1, (1,), np.float32)
    loop = TrainingOffline(env_cls=(obs, act), memory_cls=memory_cls, training_agent_cls=SACAgent,
                           memory_size=SIZE, batch_size=8, seed=0, device="cpu", **settings)
    loop.build()
    return loop


def honest_transitions(loop: TrainingOffline) -> int:
    assert loop.memory is not None
    return sum(bool(loop.memory.get_transition(i)[3].any()) for i in range(len(loop.memory)))


@pytest.mark.parametrize("reset_only", [False, True])
@pytest.mark.parametrize("memory_cls", [ReplayMemory, HistoryMemory])
def test_one_key_sending_far_more_rows_cannot_take_more_than_its_share_and_the_real_rows_stay(
        memory_cls: Any, reset_only: bool, caplog: pytest.LogCaptureFixture) -> None:
    loop = training(memory_cls)
    seq = 0
    for seq in range(1, 7):  # two real workers, 600 rows
        loop.add(honest("w1", seq))
        loop.add(honest("w2", seq))
    assert honest_transitions(loop) == 12 * 49
    with caplog.at_level(logging.WARNING, logger="netrl.training.ingest"):
        for k in range(20):  # 20 times the memory, in 200-row packets
            loop.add(attack(k, 200, reset_only))
    memory, ingester = loop.memory, loop.ingester
    assert isinstance(memory, (ReplayMemory, HistoryMemory)) and ingester is not None
    # three workers store rows: 1.25 / 3 of the memory each at most, and the real rows stay
    assert honest_transitions(loop) >= (SIZE - 416) * 49 // 50
    assert memory.rows_of("x") <= 416 and memory.rows_of("w1") + memory.rows_of("w2") >= SIZE - 416
    assert ingester.share_cap("x") == 416
    assert ingester.over_share["x"] >= 18  # refused, counted and logged, not silently dropped
    assert "packet 2 of worker x/s2 (200 rows) is refused: the worker would hold 600 of the replay " \
           "memory's 1000 rows, over its share of 416" in caplog.text
    # The attacker stops. The real workers carry on: they may hold their share of three workers
    # (some of their packets are refused meanwhile, while the attacker's rows block the ring's
    # tail), and once it stored nothing for RECENT_S, a share of two, over its rows.
    now = [0.0]
    ingester.clock = lambda: now[0]
    ingester._stored_at = dict.fromkeys(ingester._stored_at, 0.0)
    for seq in range(7, 60):
        now[0] += 1.0
        loop.add(honest("w1", seq))
        loop.add(honest("w2", seq))
    assert memory.rows_of("x") == 0 and memory.rows_of("w1") + memory.rows_of("w2") == SIZE
    assert ingester.over_share.get("w1", 0) <= RECENT_S and ingester.over_share.get("w2", 0) <= RECENT_S


def test_workers_of_about_the_same_speed_are_never_refused_however_often_the_ring_wraps() -> None:
    loop = training()
    rng = np.random.default_rng(0)
    for seq in range(1000):  # 30 times the memory, three workers, packets of 5 to 15 rows
        for worker in ("w1", "w2", "w3"):
            if rng.random() < 0.9:  # about the same speed: each skips a turn at random
                loop.add(honest(worker, seq, int(rng.integers(5, 16))))
    assert loop.ingester is not None and loop.ingester.over_share == {}
    assert loop.memory is not None and loop.memory.workers_holding() == 3  # type: ignore[attr-defined]


def test_a_single_worker_may_fill_the_memory_and_a_set_share_holds_whoever_sends() -> None:
    alone = training()
    for seq in range(50):
        alone.add(honest("w1", seq))
    assert alone.ingester is not None and alone.ingester.over_share == {}
    assert alone.memory is not None and alone.memory.rows_of("w1") == SIZE  # type: ignore[attr-defined]
    capped = training(settings=TrainingSettings(max_worker_share=0.3))
    for seq in range(50):
        capped.add(honest("w1", seq))
    assert capped.memory is not None and capped.memory.rows_of("w1") == 300  # type: ignore[attr-defined]
    assert capped.ingester is not None and capped.ingester.over_share == {"w1": 44}


def test_the_share_is_a_config_key_with_a_check() -> None:
    cfg = config_from_dict({"memory": {"max_worker_share": 0.25, "min_worker_share": 0.1}})
    settings = TrainingSettings.from_config(cfg)
    assert (settings.max_worker_share, settings.min_worker_share) == (0.25, 0.1)
    with pytest.raises(ConfigError, match=r"memory.max_worker_share must be between 0.0 and 1.0 \(got 1.5\)"):
        config_from_dict({"memory": {"max_worker_share": 1.5}})


def test_a_memory_that_keeps_no_worker_is_not_capped() -> None:
    from netrl.memory.rollout import RolloutMemory

    loop = training(partial(RolloutMemory), max_worker_share=0.01)
    assert loop.ingester is not None and loop.ingester.owned is None
    assert loop.add(honest("w1", 1)) == 49


def test_the_loop_quarantines_and_drops_a_worker_once_no_batch_is_being_gathered() -> None:
    loop = training()
    for seq in range(1, 5):
        loop.add(honest("w1", seq))
        loop.add(attack(seq, 50, reset_only=False))  # all-zero observations: x's rows
    ingester, memory = loop.ingester, loop.memory
    assert ingester is not None and memory is not None
    settled: list[bool] = []
    ingester.batches = type("Batches", (), {"settle": lambda self: settled.append(True)})()  # type: ignore[assignment]
    assert ingester.set_quarantined("x", True) == 200 and honest_transitions(loop) == len(memory) == 4 * 49
    assert ingester.set_quarantined("x", False) == 200 and len(memory) == 8 * 49
    assert ingester.drop_worker("x") == 200 and honest_transitions(loop) == len(memory) == 4 * 49
    assert settled == [True, True, True]
