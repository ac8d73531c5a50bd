"""n-step returns in ReplayMemory against a brute-force reference built from what the envs really did.

A fake worker runs several envs with random episodes (terminated, truncated, or cut by nothing), builds packets with
the worker's own BufferBuilder and concat_segments, marks random rows stale as the training loop does, and sends them
through the wire codec into a small ring that wraps many times. Each row's action is the id of its env step, so a
sampled transition names its ground truth; the reference walks that env's episode forward in Python, one step at a
time, and stops where the rule says (episode end, a stale step, a step not yet or no longer stored); windows follow
their env's trajectory into the next packet.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from netrl.agents.dqn import DQNAgent
from netrl.agents.sac import MLPActorCritic, SACAgent
from netrl.memory.replay import ReplayMemory
from netrl.protocol.wire import buffer_from_message, decode, encode, samples_message
from netrl.samples import Batch, Buffer, BufferBuilder, concat_segments
from netrl.util import partial
from tests.fakes import ACT, OBS

GAMMA = 0.9


@dataclass
class Step:
    env: int
    episode: int
    t: int
    rew: float
    terminated: bool
    truncated: bool
    obs_before: float  # the id of the observation the action was taken in
    obs_after: float
    packet: int = -1
    stale: bool = False


class FakeWorker:
    """Envs whose observations and steps carry unique ids; ``packet()`` cuts one multi-env packet."""

    def __init__(self, envs: int, rng: np.random.Generator) -> None:
        self.rng = rng
        self.builders = [BufferBuilder(capacity=64, overlap=1) for _ in range(envs)]
        self.steps: dict[int, Step] = {}  # step id (the row's action) -> ground truth
        self.by_pos: dict[tuple[int, int, int], int] = {}  # (env, episode, t) -> step id
        self.episode = [0] * envs
        self.t = [0] * envs
        self.obs = [0.0] * envs
        self.next_id = 1
        self.packets = 0
        for e in range(envs):
            self._reset(e)

    def _new_id(self) -> float:
        self.next_id += 1
        return float(self.next_id)

    def _reset(self, e: int) -> None:
        self.episode[e] += 1
        self.t[e] = 0
        self.obs[e] = self._new_id()
        self.builders[e].add(np.zeros(1, np.float32), np.array([self.obs[e]], np.float32), 0.0, False, False, True, 0)

    def step(self, e: int) -> None:
        sid, obs = int(self._new_id()), self._new_id()
        u = self.rng.random()
        term, trunc = bool(u < 0.06), bool(0.06 <= u < 0.12)
        rew = float(np.float32(self.rng.normal()))
        self.steps[sid] = Step(e, self.episode[e], self.t[e], rew, term, trunc, self.obs[e], obs)
        self.by_pos[(e, self.episode[e], self.t[e])] = sid
        self.builders[e].add(np.array([sid], np.float32), np.array([obs], np.float32), rew, term, trunc, False, 0)
        self.t[e] += 1
        self.obs[e] = obs
        if term or trunc:
            self._reset(e)

    def packet(self, stale_chance: float) -> Buffer | None:
        segments = []
        for e, builder in enumerate(self.builders):
            buf = builder.cut()
            if buf is not None:
                segments.append((e, buf))
        if not segments:
            return None
        packet = concat_segments(segments)
        ends = ~(packet.reset | packet.context)
        stale = ends & (self.rng.random(len(packet)) < stale_chance)
        if stale.any():
            packet.weight = np.where(stale, 0.0, 1.0).astype(np.float32)  # as the training loop drops stale rows
        for i in np.flatnonzero(ends):
            s = self.steps[int(packet.act[i, 0])]
            s.packet, s.stale = self.packets, bool(stale[i])
        self.packets += 1
        return packet


def through_wire(buf: Buffer, seq: int) -> Buffer:
    """The packet as the trainer gets it: encoded by the worker's codec, decoded and checked at the receiver."""
    received = buffer_from_message(decode(encode(samples_message(buf, "w", "session", seq, seq))))
    received.weight = buf.weight  # set by the training loop on arrival
    return received


def reference(worker: FakeWorker, stored: set[int], sid: int, n: int) -> tuple[float, float, bool, bool, int]:
    """(return, next obs id, terminated, truncated, steps) by walking the env's episode one step at a time."""
    first = cur = worker.steps[sid]
    ret, m = first.rew, 1
    while m < n and not (cur.terminated or cur.truncated):
        nxt_id = worker.by_pos.get((first.env, first.episode, first.t + m))
        if nxt_id is None or nxt_id not in stored:
            break
        nxt = worker.steps[nxt_id]
        if nxt.stale:  # a window follows its env's trajectory into the next packet, but not past a stale row
            break
        ret += GAMMA ** m * nxt.rew
        cur, m = nxt, m + 1
    return ret, cur.obs_after, cur.terminated, cur.truncated, m


def stored_steps(log: list[Buffer], memory_size: int) -> set[int]:
    """Step ids of the non-context, non-reset rows among the newest ``memory_size`` rows appended."""
    acts = np.concatenate([b.act[:, 0] for b in log])[-memory_size:]
    ends = np.concatenate([~(b.reset | b.context) for b in log])[-memory_size:]
    return {int(a) for a in acts[ends]}


@pytest.mark.parametrize("n", [2, 3, 5])
def test_n_step_batches_match_a_brute_force_walk_over_the_envs_episodes(n: int) -> None:
    rng = np.random.default_rng(n)
    worker = FakeWorker(envs=3, rng=rng)
    memory = ReplayMemory(memory_size=127, batch_size=256, n_step=n, gamma=GAMMA, seed=n)
    log: list[Buffer] = []
    causes: Counter[str] = Counter()
    for _ in range(60):
        for _ in range(int(rng.integers(1, 12))):
            for e in range(3):
                if rng.random() < 0.8:
                    worker.step(e)
        cut = worker.packet(stale_chance=0.05)
        if cut is None:
            continue
        packet = through_wire(cut, len(log) + 1)
        memory.append_buffer(packet)
        log.append(packet)
        if len(memory) == 0:
            continue
        stored = stored_steps(log, memory.memory_size)
        batch = memory.sample()
        steps = batch.extra["steps_to_next_obs"].numpy()
        assert batch.extra["discount"].numpy() == pytest.approx(GAMMA ** steps.astype(np.float64), rel=1e-6)
        for i, sid in enumerate(batch.act[:, 0].numpy().astype(int).tolist()):
            ret, next_obs, term, trunc, m = reference(worker, stored, sid, n)
            s = worker.steps[sid]
            assert batch.obs[i, 0].item() == s.obs_before  # the window starts at the sampled transition
            assert (steps[i], batch.next_obs[i, 0].item()) == (m, next_obs), f"step {sid}"
            assert (bool(batch.terminated[i]), bool(batch.truncated[i])) == (term, trunc)
            assert batch.rew[i].item() == pytest.approx(ret, abs=1e-4)
            end = worker.steps[worker.by_pos.get((s.env, s.episode, s.t + m - 1), sid)]
            nxt = worker.by_pos.get((s.env, s.episode, s.t + m))
            causes["full" if m == n else "terminated" if end.terminated else "truncated" if end.truncated else
                   "not stored yet" if nxt is None or (nxt not in stored and nxt > max(stored)) else
                   "stale" if worker.steps[nxt].stale else "unexplained"] += 1
            causes["crossed a packet"] += end.packet != s.packet
    assert memory.total_appended > 6 * memory.memory_size  # the ring wrapped many times
    assert min(causes[c] for c in ("full", "terminated", "truncated", "stale", "crossed a packet")) > 0, causes
    assert causes["unexplained"] == 0, causes


def two_step_memory(n_step: int) -> ReplayMemory:
    """One env: reset, then steps with rewards 1, 2, 4 (the last truncated)."""
    builder = BufferBuilder(capacity=8)
    builder.add(np.zeros(2, np.float32), np.zeros(3, np.float32), 0.0, False, False, True, 0)
    for k, rew in enumerate((1.0, 2.0, 4.0), start=1):
        builder.add(np.zeros(2, np.float32), np.full(3, k, np.float32), rew, False, k == 3, False, 0)
    memory = ReplayMemory(memory_size=16, batch_size=64, n_step=n_step, gamma=0.5, seed=0)
    packet = builder.cut()
    assert packet is not None
    memory.append_buffer(packet)
    return memory


def test_a_window_cut_by_truncation_bootstraps_from_where_it_was_cut() -> None:
    batch = two_step_memory(3).sample()
    by_start = {int(o): (float(r), int(o2), float(t), float(d), int(m)) for o, r, o2, t, d, m in zip(
        batch.obs[:, 0], batch.rew, batch.next_obs[:, 0], batch.truncated, batch.extra["discount"] * 8,
        batch.extra["steps_to_next_obs"], strict=True)}
    assert by_start == {0: (1 + 0.5 * 2 + 0.25 * 4, 3, 1.0, 1.0, 3), 1: (2 + 0.5 * 4, 3, 1.0, 2.0, 2),
                        2: (4.0, 3, 1.0, 4.0, 1)}


def test_one_step_batches_are_unchanged_and_carry_no_n_step_keys() -> None:
    batch = two_step_memory(1).sample()
    assert "discount" not in batch.extra and "steps_to_next_obs" not in batch.extra
    assert sorted(batch.rew.tolist()) == sorted(batch.rew.tolist()) and set(batch.rew.tolist()) == {1.0, 2.0, 4.0}


@pytest.mark.parametrize("kwargs, message", [
    ({"n_step": 0}, r"memory.n_step must be an integer >= 1 \(got 0\)"),
    ({"n_step": 3}, r"ReplayMemory\(n_step=3\) needs gamma, the agent's discount \(agent.gamma\)"),
    ({"n_step": 20, "gamma": 0.9, "memory_size": 10}, r"memory.n_step \(20\) must be <= memory.memory_size \(10\)"),
])
def test_bad_n_step_settings_are_refused_naming_the_key(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplayMemory(**kwargs)


def sac(gamma: float) -> SACAgent:
    return SACAgent(OBS, ACT, model_cls=partial(MLPActorCritic, hidden_sizes=(16, 16)), gamma=gamma)


def test_sac_and_dqn_bootstrap_with_the_batchs_discount() -> None:
    """The critic target uses extra["discount"] when present: a discount of 0 makes it the reward alone."""
    torch.manual_seed(0)
    o = torch.randn(16, 3)
    plain = Batch(o, torch.rand(16, 2), torch.randn(16), torch.randn(16, 3), torch.zeros(16), torch.zeros(16))
    no_future = plain._replace(extra={"discount": torch.zeros(16)})
    torch.manual_seed(1)
    a = sac(gamma=0.99)
    torch.manual_seed(2)
    with_zero = a.train(no_future)["loss_critic"]
    torch.manual_seed(1)
    b = sac(gamma=0.0)
    torch.manual_seed(2)
    assert b.train(plain)["loss_critic"] == pytest.approx(with_zero)  # gamma 0 or discount 0: the same target
    torch.manual_seed(1)
    c = sac(gamma=0.99)
    torch.manual_seed(2)
    assert c.train(plain)["loss_critic"] != pytest.approx(with_zero)  # without the key, gamma is used

    from gymnasium.spaces import Discrete

    acts = torch.randint(0, 3, (16,))
    q_plain = Batch(o, acts, torch.randn(16), torch.randn(16, 3), torch.zeros(16), torch.zeros(16))
    q_zero = q_plain._replace(extra={"discount": torch.zeros(16)})
    torch.manual_seed(1)
    d1 = DQNAgent(OBS, Discrete(3), hidden_sizes=(16,), gamma=0.99)
    with_zero = d1.train(q_zero)["loss_q"]
    torch.manual_seed(1)
    d2 = DQNAgent(OBS, Discrete(3), hidden_sizes=(16,), gamma=0.0)
    assert d2.train(q_plain)["loss_q"] == pytest.approx(with_zero)
    torch.manual_seed(1)
    d3 = DQNAgent(OBS, Discrete(3), hidden_sizes=(16,), gamma=0.99)
    assert d3.train(q_plain)["loss_q"] != pytest.approx(with_zero)  # without the key, gamma is used
