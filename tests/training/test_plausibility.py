"""Valid but implausible values (issue 43, items 1 and 2): a worker's rewards of 1e5 on a
Pendulum run (rewards in [-16, 0]) pushed the critic loss to 7.8e11 while trainer.max_abs_reward
was 1e6. The bound now follows the env's declared reward_range where it has one, and a robust
statistic over recent rows judges the rest: the worker is warned about, quarantined (its rows
never sampled) or revoked."""

from __future__ import annotations

import json
import logging
from typing import Any

import gymnasium
import numpy as np
import pytest

from netrl.agents.sac import MLPActorCritic, SACAgent
from netrl.samples import Buffer
from netrl.trainer.status_line import status_line
from netrl.training import plausibility
from netrl.training.loop import TrainingOffline
from netrl.training.plausibility import Plausibility, declared_reward_range, reward_bound
from netrl.util import partial
from tests.fakes import ListSource

# Pendulum-v1's spaces; its rewards lie in [-16.3, 0] but it declares no reward_range
OBS = gymnasium.spaces.Box(np.array([-1, -1, -8], np.float32), np.array([1, 1, 8], np.float32))
ACT = gymnasium.spaces.Box(-2, 2, (1,), np.float32)
WARM = (
    plausibility.MIN_ROWS // plausibility.SAMPLED_PER_PACKET + 2
)  # honest packets before anything is judged


def packet(seq: int, worker: str = "w1", n: int = 40, reward: float | None = None) -> Buffer:
    """``n`` rows of Pendulum-like samples from ``worker``; with ``reward``, every reward is
    that."""
    rng = np.random.default_rng(seq)
    theta = rng.uniform(-np.pi, np.pi, n)
    obs = np.stack([np.cos(theta), np.sin(theta), rng.uniform(-8, 8, n)], 1).astype(np.float32)
    rew = (
        -(theta**2 + 0.1 * obs[:, 2] ** 2).astype(np.float32)
        if reward is None
        else np.full(n, reward, np.float32)
    )
    return Buffer(
        act=rng.uniform(-2, 2, (n, 1)).astype(np.float32),
        obs=obs,
        rew=rew,
        terminated=np.zeros(n, bool),
        truncated=np.zeros(n, bool),
        reset=np.arange(n) == 0,
        context=np.zeros(n, bool),
        policy_version=np.zeros(n, np.int64),
        recv_version=1,
        worker=f"{worker}/s-{worker}",
        seq=seq,
    )


def training(env: Any = (OBS, ACT), **kw: Any) -> TrainingOffline:
    t = TrainingOffline(
        env_cls=env,
        training_agent_cls=partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(16,))),
        epochs=1,
        rounds=1,
        memory_size=100_000,
        batch_size=256,
        seed=0,
        device="cpu",
        **kw,
    )
    t.build()
    return t


def batch_rewards(t: TrainingOffline, draws: int = 40) -> np.ndarray:
    assert t.memory is not None
    return np.concatenate([np.asarray(t.memory.sample().rew) for _ in range(draws)])


def test_rewards_of_1e5_from_one_worker_on_a_pendulum_run_never_reach_the_batches(
    caplog: pytest.LogCaptureFixture,
) -> None:
    t = training()
    for seq in range(1, WARM + 1):  # two honest workers
        t.add(packet(seq, "w1"))
        t.add(packet(1000 + seq, "w2"))
    with caplog.at_level(logging.WARNING, logger="netrl.training.plausibility"):
        for seq in range(1, 21):  # within trainer.max_abs_reward's old default, 1e6
            assert t.add(packet(5000 + seq, "attacker", reward=1e5)) == 0
            t.add(packet(2000 + seq, "w1"))
    assert batch_rewards(t).max() <= 0.0  # the attacker's rows are never sampled
    assert "packet 5001 of worker attacker/s-attacker holds implausible values" in caplog.text
    assert (
        "reward 100000 in row 0 is" in caplog.text and "trainer.implausible_factor" in caplog.text
    )
    assert "worker attacker is quarantined" in caplog.text
    assert t.ingester is not None and t.ingester.plausibility is not None
    metrics = t.ingester.plausibility.metrics()
    assert (
        metrics["implausible_packets"] == 1 and metrics["quarantined_workers"] == 1
    )  # quarantine holds the rest
    assert metrics["quarantined_rows"] == 20 * 40
    assert t._round_summary(0)["quarantined_workers"] == 1  # in the round's metrics


def test_warn_trains_on_the_packet_and_counts_it() -> None:
    t = training(implausible="warn")
    for seq in range(1, WARM + 1):
        t.add(packet(seq))
    assert t.add(packet(999, "odd", reward=1e5)) == 39
    assert batch_rewards(t, 200).max() == pytest.approx(1e5)
    assert t.ingester is not None and t.ingester.plausibility is not None
    assert t.ingester.plausibility.metrics()["implausible_packets"] == 1


class RevokingSource(ListSource):
    def __init__(self, bufs: list[Buffer], revoked: list[str] | None = None) -> None:
        super().__init__(bufs)
        self.asked: list[tuple[str, str]] = []
        self.heard = list(revoked or [])

    def revoke(self, worker: str, reason: str) -> None:
        self.asked.append((worker, reason))

    def revocations(self) -> list[str]:
        out, self.heard = self.heard, []
        return out


def test_refuse_asks_the_server_to_revoke_the_worker_and_refuses_its_packets() -> None:
    t = training(implausible="refuse")
    honest = [packet(seq) for seq in range(1, WARM + 1)]
    source = RevokingSource([*honest, packet(999, "odd", reward=-1e5), packet(1000, "odd")])
    t.ingest(source)  # type: ignore[arg-type]
    t.ingest(source)  # type: ignore[arg-type]  # the next ingest sends what the last one asked for
    assert [w for w, _ in source.asked] == ["odd"]
    assert "the trainer found implausible values: reward -100000" in source.asked[0][1]
    assert t.ingester is not None and t.ingester.plausibility is not None
    assert t.ingester.plausibility.counts["revoked_packets"] == 1  # its honest-looking packet too
    assert batch_rewards(t).min() > -1000


def test_the_bound_follows_the_envs_declared_reward_range_and_a_users_value_wins() -> None:
    class Declared(gymnasium.Env):  # type: ignore[type-arg]
        observation_space, action_space = OBS, ACT
        reward_range = (-16.5, 0.0)

    assert declared_reward_range(Declared()) == (-16.5, 0.0)
    assert (
        declared_reward_range(gymnasium.make("Pendulum-v1")) is None
    )  # gymnasium 1.x declares none
    assert reward_bound(None, (-16.5, 0.0)) == 16.5
    assert reward_bound(None, None) == plausibility.DEFAULT_MAX_ABS_REWARD
    assert (
        reward_bound(50.0, (-16.5, 0.0)) == 50.0
    )  # an explicit trainer.max_abs_reward is the user's
    t = training(env=Declared)
    assert t.safeguards is not None and t.safeguards.limits.max_abs_reward == 16.5
    assert t.add(packet(1, "w1", reward=-100.0)) == 0  # beyond the bound: refused whole
    assert t.safeguards.refused == 1
    # inside the bound, outside the range: implausible from the first packet, no warm-up needed
    assert t.add(packet(2, "w2", reward=10.0)) == 0
    assert t.ingester is not None and t.ingester.plausibility is not None
    assert t.ingester.plausibility.metrics()["quarantined_workers"] == 1
    assert t.add(packet(3, "w1")) == 39
    explicit = training(env=Declared, max_abs_reward=1000.0)
    assert explicit.safeguards is not None and explicit.safeguards.limits.max_abs_reward == 1000.0


def test_honest_workers_are_not_flagged_by_sparse_large_rewards_or_drifting_observations() -> None:
    check = Plausibility("quarantine", 200.0, None, 10_000, rows=None)
    for seq in range(1, 200):
        buf = packet(seq, f"w{seq % 3}")
        buf.obs[:, 2] += seq * 0.05  # a slowly drifting feature
        if seq % 20 == 0:
            buf.rew[5] = 100.0  # a goal's reward, rare (as MountainCarContinuous's)
        assert check.admit(buf), seq
    assert check.metrics()["implausible_packets"] == 0


def test_the_check_is_judged_per_packet_in_one_vectorised_step() -> None:
    check = Plausibility("warn", 200.0, None, 10_000, rows=None)
    for seq in range(1, WARM + 1):
        check.admit(packet(seq))
    big = packet(7, n=4096)
    big.obs[4000, 1] = 1e4
    assert check.admit(big) and check.metrics()["implausible_packets"] == 1


def test_the_trainers_status_line_shows_implausible_packets_once_there_are_any() -> None:
    t = training()
    for seq in range(1, WARM + 1):
        t.add(packet(seq))
    rates = {"trained_steps": 0.0, "samples": 0.0}
    assert "implausible" not in status_line("trainer", t.live(), rates, "connected")
    t.add(packet(999, "odd", reward=1e5))
    line = status_line("trainer", t.live(), rates, "connected")
    assert "| implausible packets 1, workers quarantined 1, revoked 0" in line


def test_a_restarted_trainer_holds_a_quarantined_workers_packets_and_refuses_a_revoked_ones() -> None:
    t = training()
    for seq in range(1, WARM + 1):
        t.add(packet(seq))
    assert t.add(packet(999, "odd", reward=1e5)) == 0
    assert t.ingester is not None and t.ingester.plausibility is not None
    t.ingester.plausibility.revoked("gone")
    state = json.loads(json.dumps(t.state()))  # as the checkpoint keeps it
    again = training()
    again.load_state(state)
    # replaying the sample log: the ring is empty again, so nothing would be judged yet
    assert again.add(packet(999, "odd", reward=1e5), new=False) == 0
    assert again.add(packet(1000, "gone"), new=False) == 0
    assert again.add(packet(1, "w1"), new=False) == 39
    assert again.ingester is not None and again.ingester.plausibility is not None
    metrics = again.ingester.plausibility.metrics()
    assert metrics["quarantined_workers"] == 1 and metrics["implausible_packets"] == 1
