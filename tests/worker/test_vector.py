"""Many envs per worker (worker.num_envs): per-env episodes, autoreset, truncation, test episodes and clocks, packets
as env-major segments, and the memory stitching each env's transitions apart."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import gymnasium
import numpy as np
import pytest

from netrl.config import load_config
from netrl.envs.realtime import StepTimer
from netrl.errors import ConfigError, MalformedMessage
from netrl.memory.replay import ReplayMemory
from netrl.protocol.wire import BUNDLE_HEADER_ROOM, buffer_from_message, decode, encode, samples_message
from netrl.samples import Buffer
from netrl.worker.runners.one_env import OneEnvRunner
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, Counter, TagActor, wait_until


class SingleActor(TagActor):
    """tmrl style: the first observation's action only."""

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        return obs[0, :1].numpy().copy()


@pytest.fixture(autouse=True)
def fresh_counters() -> None:
    Counter.made = []


def memory_of(packets: list[Buffer]) -> ReplayMemory:
    mem = ReplayMemory(memory_size=10_000, batch_size=4)
    for buf in packets:  # through the wire, as the trainer gets them
        mem.append_buffer(buffer_from_message(decode(encode(samples_message(buf, "w", "s", 1, 0)))))
    return mem


def test_every_transition_stays_within_one_env_one_episode_and_one_packet() -> None:
    worker = RolloutWorker(Counter, TagActor, num_envs=3, seed=0, min_samples_per_worker_packet=4,
                           max_samples_per_episode=4)
    worker.local_packets = []
    worker.run(0, nb_episodes=12)
    worker.sink.send()  # the rows left at the end (a networked worker sends them as it closes)
    packets = worker.local_packets
    assert len(packets) >= 4
    for buf in packets:
        assert buf.env is not None and np.all(np.diff(buf.env.astype(int)) >= 0)
        starts = np.flatnonzero(np.diff(np.concatenate([[-1], buf.env.astype(int)])))
        assert np.all(buf.reset[starts] | buf.context[starts])  # each env's segment starts with context or reset
        assert set(buf.env.tolist()) == {0, 1, 2}
    mem = memory_of(packets)
    assert len(mem) == worker.produced > 0
    for k in range(len(mem)):
        o, a, _r, o2, term, trunc, _ = mem.get_transition(k)
        assert (o2[0], o2[1], o2[2]) == (o[0], o[1], o[2] + 1) and a[0] == o[0], (o, a, o2)
        # env 1's 5-step episodes are cut at 4 (max_samples_per_episode): truncated, never terminated
        assert (term, trunc) == ((o2[2] == Counter.LENGTHS[int(o[0])], False) if o[0] != 1 else (False, o2[2] == 4))
    assert mem._cols["env"][:mem._size].max() == 2  # the memory keeps each row's env
    # one batched act() call per vector step, for all three envs
    assert {n for n, _ in worker.actor.calls} == {3}


def test_autoreset_records_the_final_observation_and_the_next_reset_row_per_env() -> None:
    worker = RolloutWorker(Counter, TagActor, num_envs=2, seed=0, min_samples_per_worker_packet=100)
    worker.local_packets = []
    worker.run(0, nb_episodes=4)  # env 0 ends episodes at steps 3, 6, 9; env 1 at 5
    worker.sink.send()
    rows = [(int(e), tuple(o.tolist()), bool(r), bool(t)) for buf in worker.local_packets
            for e, o, r, t in zip(buf.env, buf.obs, buf.reset, buf.terminated, strict=True)]
    env0 = [(o, r, t) for e, o, r, t in rows if e == 0]
    assert env0[:5] == [((0, 0, 0), True, False), ((0, 0, 1), False, False), ((0, 0, 2), False, False),
                        ((0, 0, 3), False, True), ((0, 1, 0), True, False)]  # final obs, then the next first one
    stats = sorted((e.env, e.length, e.ret) for buf in worker.local_packets for e in buf.episodes)
    assert stats[:3] == [(0, 3, 3.0), (0, 3, 3.0), (0, 3, 3.0)] and (1, 5, 5.0) in stats
    assert worker.episodes_done >= 4


def test_each_env_runs_its_own_test_episodes_unrecorded_and_acted_on_with_test_true() -> None:
    worker = RolloutWorker(Counter, TagActor, num_envs=3, seed=0, min_samples_per_worker_packet=5)
    worker.local_packets = []
    worker.run(1, nb_episodes=9)  # a test episode after every training episode of each env
    worker.sink.send()
    episodes = [e for buf in worker.local_packets for e in buf.episodes]
    tests = [e for e in episodes if e.test]
    assert {e.env for e in tests} == {0, 1, 2}
    for env in range(3):  # per env, training and test episodes alternate
        flags = [e.test for e in episodes if e.env == env]
        assert flags == [i % 2 == 1 for i in range(len(flags))]
    # test episodes' rows are not recorded: every recorded observation belongs to a training episode
    recorded = {(int(o[0]), int(o[1])) for buf in worker.local_packets for o in buf.obs}
    assert {e for e, _ in recorded} == {0, 1, 2} and all(ep % 2 == 0 for _, ep in recorded)
    assert any(test for _, test in worker.actor.calls) and any(n < 3 for n, _ in worker.actor.calls)


def test_a_packet_that_would_join_two_envs_is_refused_naming_worker_and_row() -> None:
    worker = RolloutWorker(Counter, TagActor, num_envs=2, seed=0, min_samples_per_worker_packet=4)
    worker.local_packets = []
    worker.run(0, nb_episodes=4)
    buf = next(b for b in worker.local_packets[1:] if b.context[0])
    seam = int(np.flatnonzero(np.diff(buf.env.astype(int)))[0]) + 1
    decode(encode(samples_message(buf, "w", "s", 7, 0)))  # as sent: accepted
    buf.context[seam] = buf.reset[seam] = False  # env 1's first row now ends a transition from env 0's last
    with pytest.raises(MalformedMessage, match=rf"packet 7 from 'w': row {seam} starts env 1's segment"):
        decode(encode(samples_message(buf, "w", "s", 7, 0)))
    buf.env[-1] = 0  # env-major order broken
    with pytest.raises(MalformedMessage, match="goes from 1 back to 0"):
        decode(encode(samples_message(buf, "w", "s", 7, 0)))


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_num_envs_below_one_is_refused(bad: Any, tmp_path: Any) -> None:
    with pytest.raises(ValueError, match=rf"num_envs must be an integer >= 1 \(got {bad!r}\)"):
        RolloutWorker(Counter, TagActor, num_envs=bad)
    if isinstance(bad, int) and not isinstance(bad, bool):
        path = tmp_path / "config.json"
        path.write_text(f'{{"worker": {{"num_envs": {bad}, "vectorization": "threads"}}}}')
        with pytest.raises(ConfigError) as err:
            load_config(path)
        assert "worker.num_envs must be >= 1" in str(err.value) and "worker.vectorization" in str(err.value)


def test_an_actor_that_cannot_take_a_batch_is_named() -> None:
    worker = RolloutWorker(Counter, SingleActor, num_envs=2, seed=0)
    worker.local_packets = []
    with pytest.raises(ValueError, match=r"SingleActor.act returned an array of shape \(1,\) for a batch of 2 "):
        worker.run(0, nb_episodes=1)


def test_one_env_is_unchanged_single_observations_and_no_env_column() -> None:
    worker = RolloutWorker(Counter, TagActor, seed=0, min_samples_per_worker_packet=4)
    worker.local_packets = []
    stats = worker.run_episode()
    assert stats is not None and (stats.length, stats.env) == (3, 0)
    assert isinstance(worker.runner, OneEnvRunner) and {n for n, _ in worker.actor.calls} == {1}
    assert all(buf.env is None for buf in worker.local_packets)


def test_run_episode_with_several_envs_returns_the_first_episode_that_ends() -> None:
    worker = RolloutWorker(Counter, TagActor, num_envs=2, seed=0)
    worker.local_packets = []
    try:
        first = worker.run_episode()
        assert first is not None and (first.env, first.length) == (0, 3)
        with pytest.raises(ValueError, match="runs 2 envs: each runs its own test episodes"):
            worker.run_episode(test=True)
    finally:
        worker.close()


def test_a_real_time_env_keeps_its_own_clock_per_env() -> None:
    timers: list[StepTimer] = []

    def timed() -> StepTimer:  # as the drone pipeline builds its env: one StepTimer per env
        timers.append(StepTimer(Counter(), nominal_s=0.01))
        return timers[-1]

    worker = RolloutWorker(timed, TagActor, num_envs=2, seed=0)
    worker.local_packets = []
    worker.run(0, nb_episodes=4)  # 4 training episodes end: env 0 after 3, 6, 9 steps; env 1 after 5
    assert len(timers) == 2
    steps = [sum(1 for b in worker.local_packets for e in b.env if e == i) for i in range(2)]
    # each clock counts only its own env's steps, from its own resets (none the other env's)
    assert [t.steps for t in timers] == [9, 9] and sum(steps) > 0
    assert timers[0].periods != timers[1].periods


def test_async_vectorization_steps_envs_in_processes() -> None:
    worker = RolloutWorker(Counter, TagActor, num_envs=2, vectorization="async", seed=0)
    worker.local_packets = []
    stop = threading.Event()
    worker.run(0, nb_episodes=3, stop=stop)
    assert worker.produced >= 9 and {e.env for b in worker.local_packets for e in b.episodes} == {0, 1}


def test_packets_of_all_envs_too_large_for_the_server_stop_the_worker_at_its_first_row_naming_num_envs(
        server: Any) -> None:
    srv, _ = server
    # one env's packet of 4 + 1 rows (3 + 1 floats and 22 bytes a row: 190 bytes) fits; three envs' do not
    net = dataclasses.replace(NET, max_message_bytes=BUNDLE_HEADER_ROOM + 400)
    worker = RolloutWorker(Counter, TagActor, num_envs=3, server_ip="127.0.0.1", server_port=srv.worker_port,
                           worker_id="big", network=net, seed=0, min_samples_per_worker_packet=4, flush_timeout_s=0.5)
    try:
        with pytest.raises(ConfigError, match=r"a packet of 15 samples takes \d+ bytes uncompressed.*"
                                              r"or worker.num_envs \(3\)"):
            worker.run(0, nb_episodes=1)
    finally:
        worker.close()


def test_the_episodes_csv_names_each_episodes_env_and_status_shows_the_envs(tmp_path: Any,
                                                                           server: Any) -> None:
    import csv

    from netrl.monitor.status import format_status

    srv, _ = server
    log = tmp_path / "episodes_vec.csv"
    worker = RolloutWorker(Counter, TagActor, num_envs=2, server_ip="127.0.0.1", server_port=srv.worker_port,
                           worker_id="vec", network=NET, seed=0, episode_log=str(log), flush_timeout_s=2.0)
    try:
        worker.start()
        wait_until(lambda: srv.peers.workers(), 5, "the worker's HELLO", poll=0.02)
        table = format_status(srv.snapshot())
        worker.run(0, nb_episodes=5)
    finally:
        worker.close()
    with log.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["env"], r["length"]) for r in rows][:3] == [("0", "3"), ("1", "5"), ("0", "3")]  # steps 3, 5, 6
    steps = [int(r["env_steps"]) for r in rows]
    assert steps == sorted(steps) and steps[-1] <= worker.produced  # env steps of all envs together
    lines = table.splitlines()
    at = next(i for i, line in enumerate(lines) if "envs" in line.split())  # the workers' table, then its row
    header, row = lines[at].split(), lines[at + 1].split()
    # counted from the right: the key column is blank without CURVE; then samples, backlog, dropped, "last seen"
    assert header[-6] == "envs" and row[0] == "vec" and row[-6] == "2"


def test_the_single_process_mode_trains_on_a_vector_worker() -> None:
    import gymnasium.spaces

    from netrl.agents.sac import MLPActor
    from netrl.envs.gym import GenericGymEnv
    from netrl.local import run_local
    from netrl.training.loop import TrainingOffline
    from netrl.util import partial

    env = partial(GenericGymEnv, id="Pendulum-v1")
    worker = RolloutWorker(env, MLPActor, num_envs=4, seed=0, max_samples_per_episode=25)
    training = TrainingOffline(env_cls=env, memory_cls=ReplayMemory, memory_size=5000, batch_size=16, epochs=1,
                               rounds=1, steps=20, start_training=100, device="cpu")
    run_local(training, worker, threading.Event())
    assert worker.produced >= 100 and worker.episodes_done >= 4  # 4 envs x 25 steps
    assert training.memory is not None and len(training.memory) == worker.produced  # no transition lost or joined
    assert set(training.memory._cols["env"][:training.memory._size].tolist()) == {0, 1, 2, 3}
    assert isinstance(worker.observation_space, gymnasium.spaces.Box) and worker.observation_space.shape == (3,)


class Hangs(Counter):
    """Env 1 of the first vector env hangs in its 4th step: the worker (on_env_failure "reset") builds new envs."""

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.tag == 1 and self.ep == 0 and self.t == 3:
            time.sleep(1.0)
        return super().step(action)


def test_a_hung_env_restarts_every_env_with_a_reset_row_and_no_transition_joins_old_and_new() -> None:
    worker = RolloutWorker(Hangs, TagActor, num_envs=2, seed=0, min_samples_per_worker_packet=3,
                           env_timeout_factor=2.0, env_timeout_min_s=0.2, on_env_failure="reset")
    worker.local_packets = []
    worker.run(0, nb_episodes=6)
    worker.sink.send()
    assert worker.env_failures == 1 and len(Counter.made) == 4  # a new vector env of two new envs
    mem = memory_of(worker.local_packets)
    assert len(mem) == worker.produced
    tags = set()
    for k in range(len(mem)):
        o, a, _r, o2, *_ = mem.get_transition(k)
        assert (o2[0], o2[1], o2[2]) == (o[0], o[1], o[2] + 1) and a[0] == o[0], (o, a, o2)
        tags.add(int(o[0]))
    assert tags == {0, 1, 2, 3}


class MaskedChoice(gymnasium.Env):  # type: ignore[type-arg]
    """Discrete(3) actions with an action mask that allows only action ``t % 3`` (obs["t"] is the step count)."""

    def __init__(self) -> None:
        self.observation_space = gymnasium.spaces.Dict({
            "t": gymnasium.spaces.Box(0, 100, (1,), np.float32), "action_mask": gymnasium.spaces.MultiBinary(3)})
        self.action_space = gymnasium.spaces.Discrete(3)
        self.t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        mask = np.zeros(3, np.int8)
        mask[self.t % 3] = 1
        return {"t": np.array([self.t], np.float32), "action_mask": mask}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        assert int(action) == self.t % 3, (action, self.t)  # only the allowed action
        self.t += 1
        return self._obs(), 1.0, self.t >= 4 + int(self.np_random.integers(3)), False, {}


class MaskActor(TagActor):
    """Takes the first allowed action of each env, as a batch of Discrete actions (shape (B,))."""

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        return obs["action_mask"].numpy().argmax(axis=1)


def test_discrete_actions_and_masks_travel_per_env_from_a_vector_worker() -> None:
    worker = RolloutWorker(MaskedChoice, MaskActor, num_envs=3, seed=0, min_samples_per_worker_packet=5)
    worker.local_packets = []
    worker.run(0, nb_episodes=6)
    worker.sink.send()
    buf = worker.local_packets[0]
    assert buf.act.dtype == np.uint8 and buf.act.shape == (len(buf),)  # a Discrete(3) action per row
    mem = memory_of(worker.local_packets)
    assert len(mem) == worker.produced
    for k in range(len(mem)):
        o, a, _r, o2, *_ = mem.get_transition(k)
        assert o2["t"][0] == o["t"][0] + 1 and o["action_mask"][int(a)] == 1  # the action its state's mask allowed
        assert o2["action_mask"][int(o2["t"][0]) % 3] == 1  # the next state's own mask, for the bootstrap
