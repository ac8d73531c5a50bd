"""Observation normalisation (env.normalize_obs): the statistics, the rule, and the two places it is applied (the
worker's act input and the memory's batches), which must agree bit for bit for one statistics version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Dict, Discrete, Tuple

from netrl.actor import ActorModule
from netrl.config.load import load_config
from netrl.envs.normalize import EPS, ObsNormalizer
from netrl.errors import ConfigError
from netrl.memory.history import HistoryMemory
from netrl.memory.prefetch import BatchesAhead
from netrl.memory.replay import ReplayMemory
from netrl.memory.rollout import RolloutMemory
from netrl.protocol.weights import check_weights
from netrl.samples import Buffer
from netrl.training.loop import TrainingOffline
from netrl.worker.worker import RolloutWorker
from tests.fakes import ListSource, small_config
from tests.recording import over_the_wire

MIXED = Dict({"pos": Box(-1e6, 1e6, (3,), np.float32), "image": Box(0, 255, (2, 4, 4), np.uint8),
              "mode": Discrete(5), "speed": Box(-1e6, 1e6, (), np.float32)})


def mixed_rows(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"pos": (rng.normal(size=(n, 3)) * [50, 0.01, 3] + [1000, -2, 0]).astype(np.float32),
            "image": rng.integers(0, 256, (n, 2, 4, 4), dtype=np.uint8), "mode": rng.integers(0, 5, n, dtype=np.uint8),
            "speed": rng.exponential(4.0, n).astype(np.float32)}


def test_buffers_name_the_float_leaves_by_their_index() -> None:
    norm = ObsNormalizer(MIXED)
    # flatten's order (sorted keys): obs/image 0, obs/mode 1, obs/pos 2, obs/speed 3
    assert list(norm.state_dict()) == ["mean_2", "var_2", "mean_3", "var_3", "count"]
    assert norm.leaf_names == ["obs/image", "obs/mode", "obs/pos", "obs/speed"]
    assert norm.mean_2.dtype == torch.float32 and norm.count.dtype == torch.float64
    assert torch.equal(norm.mean_2, torch.zeros(3)) and torch.equal(norm.var_3, torch.ones(()))


def test_updates_of_different_sizes_match_numpy_over_the_concatenated_rows() -> None:
    rng = np.random.default_rng(0)
    norm = ObsNormalizer(MIXED)
    seen: list[dict[str, np.ndarray]] = []
    for n in (1, 7, 0, 300, 2, 45):
        rows = mixed_rows(rng, n)
        norm.update(rows)
        seen.append(rows)
        if not sum(len(r["pos"]) for r in seen):
            continue
        for key, i in (("pos", 2), ("speed", 3)):
            data = np.concatenate([r[key] for r in seen]).astype(np.float64)
            # float64 accumulators: as exact as numpy's two-pass result; the buffers are their float32 rounding
            np.testing.assert_allclose(norm._mean[i], data.mean(0), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(norm._var[i], data.var(0), rtol=1e-10)
            assert np.array_equal(getattr(norm, f"mean_{i}").numpy(), norm._mean[i].astype(np.float32))
            assert np.array_equal(getattr(norm, f"var_{i}").numpy(), norm._var[i].astype(np.float32))
    assert float(norm.count) == 355.0


def test_forward_is_the_clipped_rule_and_passes_other_leaves_through() -> None:
    norm = ObsNormalizer(MIXED, clip=3.0)
    norm.update(mixed_rows(np.random.default_rng(1), 200))
    rows = mixed_rows(np.random.default_rng(2), 64)
    rows["pos"][:4] = [[1e5, 0, 0], [-1e5, 0, 0], [1000, 50, -50], [1000, -2, 0]]  # far beyond 3 sigmas, both ways
    batch = {k: torch.from_numpy(v) for k, v in rows.items()}
    out = norm(batch)
    assert list(out) == list(batch)  # the same structure, in the same key order
    assert out["image"] is batch["image"] and out["mode"] is batch["mode"]  # untouched, not copied
    mean, var = norm.mean_2.numpy(), norm.var_2.numpy()
    want = np.clip((rows["pos"] - mean) / np.sqrt(var + np.float32(EPS)), -3.0, 3.0)
    np.testing.assert_allclose(out["pos"].numpy(), want, rtol=1e-6)
    assert out["pos"][0, 0] == 3.0 and out["pos"][1, 0] == -3.0 and out["pos"][2, 1] == 3.0
    assert out["pos"].abs().max() <= 3.0 and (out["pos"].abs() < 3.0).float().mean() > 0.9
    assert torch.equal(batch["pos"], torch.from_numpy(rows["pos"]))  # the input is not changed in place


def test_a_fresh_normaliser_is_the_identity_within_the_clip() -> None:
    norm = ObsNormalizer(Box(-5, 5, (2,), np.float32), clip=10.0)
    x = torch.tensor([[0.5, -4.0], [30.0, -30.0]])
    assert torch.allclose(norm(x), torch.tensor([[0.5, -4.0], [10.0, -10.0]]))


def test_statistics_of_another_shape_are_refused_naming_the_leaf_both_shapes_and_the_setting() -> None:
    trained = ObsNormalizer(Tuple((Discrete(3), Box(-1, 1, (4,), np.float32))))
    here = ObsNormalizer(Tuple((Discrete(3), Box(-1, 1, (3,), np.float32))))
    with pytest.raises(ValueError, match=r"env\.normalize_obs: the statistics' mean_1 for observation leaf obs/1 has "
                                         r"the shape \(4,\), this observation space's leaf has \(3,\)"):
        here.load_state_dict(trained.state_dict())
    # the worker's weight checks see the same state: its problems name the buffers; check_state names leaf and key
    assert check_weights(here, {k: v.numpy() for k, v in trained.state_dict().items()})
    assert all("env.normalize_obs" in p and "obs/1" in p for p in here.check_state(trained.state_dict()))


def test_loaded_statistics_are_continued_by_later_updates() -> None:
    rng = np.random.default_rng(3)
    space = Box(-1e6, 1e6, (2,), np.float32)
    first, second = (rng.normal(3, 2, (40, 2)).astype(np.float32) for _ in range(2))
    trainer = ObsNormalizer(space)
    trainer.update(first)
    restarted = ObsNormalizer(space)
    restarted.load_state_dict(trainer.state_dict())
    restarted.update(second)
    both = np.concatenate([first, second]).astype(np.float64)
    np.testing.assert_allclose(restarted.mean_0.numpy(), both.mean(0), rtol=1e-5)
    np.testing.assert_allclose(restarted.var_0.numpy(), both.var(0), rtol=1e-5)
    assert float(restarted.count) == 80


def test_rows_that_do_not_fit_are_refused_and_change_nothing() -> None:
    norm = ObsNormalizer(MIXED)
    norm.update(mixed_rows(np.random.default_rng(4), 10))
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    bad = mixed_rows(np.random.default_rng(5), 10)
    bad["pos"] = bad["pos"][:, :2]
    with pytest.raises(ValueError, match=r"observation leaf obs/pos arrives with rows of shape \(2,\), its space's "
                                         r"shape is \(3,\)"):
        norm.update(bad)
    huge = mixed_rows(np.random.default_rng(5), 10)
    huge["speed"] = np.array([3e38, -3e38] * 5, np.float32)
    huge["pos"] = huge["pos"].astype(np.float64) * 1e300
    with pytest.raises(ValueError, match="non-finite"):
        norm.update(huge)
    assert all(torch.equal(before[k], v) for k, v in norm.state_dict().items())


@pytest.mark.parametrize("space", [Discrete(4), Box(0, 255, (8, 8), np.uint8), Tuple((Discrete(2), Discrete(3)))])
def test_a_space_without_a_float_box_leaf_is_refused_naming_the_key(space: Any) -> None:
    with pytest.raises(ConfigError, match=r"env\.normalize_obs is true, but the observation space .* has no float Box "
                                          r"leaf to normalise .*set env\.normalize_obs to false"):
        ObsNormalizer(space)
    loop = TrainingOffline(env_cls=(space, Box(-1, 1, (1,), np.float32)), normalize_obs=True, device="cpu")
    with pytest.raises(ConfigError, match=r"env\.normalize_obs"):
        loop.build()


def test_the_config_keys_and_their_checks(tmp_path: Path) -> None:
    cfg = load_config(small_config(tmp_path, env={"normalize_obs": True, "normalize_obs_every": 5}))
    assert (cfg.env.normalize_obs, cfg.env.normalize_obs_clip, cfg.env.normalize_obs_every) == (True, 10.0, 5)
    with pytest.raises(ConfigError) as err:
        load_config(small_config(tmp_path, env={"normalize_obs_clip": 0, "normalize_obs_every": -1}))
    assert "env.normalize_obs_clip must be > 0" in str(err.value)
    assert "env.normalize_obs_every must be >= 0" in str(err.value)


# -- the worker's act input and the memory's batches ---------------------------------------------------------------
POS = Box(-1e6, 1e6, (3,), np.float32)


class Walk(gymnasium.Env):  # type: ignore[type-arg]
    """obs = (float32 [1000 + 7t + 100 ep + 3 (env % 2), -3t, t/8], t % 5): far from mean 0 and var 1; 9 steps an
    episode; ``env`` numbers the instances, so that two envs' observations differ."""

    made = 0

    def __init__(self) -> None:
        self.env, Walk.made = Walk.made, Walk.made + 1
        self.observation_space = Tuple((POS, Discrete(5)))
        self.action_space = Box(-1, 1, (1,), np.float32)
        self.ep, self.t = -1, 0

    def _obs(self) -> tuple[np.ndarray, int]:
        pos = [1000 + 7 * self.t + 100 * self.ep + 3 * (self.env % 2), -3 * self.t, self.t / 8]
        return np.array(pos, np.float32), self.t % 5

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.ep, self.t = self.ep + 1, 0
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), 1.0, self.t >= 9, False, {}


class Seen(ActorModule):
    """Records the float leaf of every observation act() gets, as bytes, and the Discrete leaf."""

    def __init__(self, observation_space: Any, action_space: Any) -> None:
        super().__init__(observation_space, action_space)
        self.p = torch.nn.Parameter(torch.zeros(1))
        self.pos: set[bytes] = set()
        self.modes: list[Any] = []

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        pos, mode = obs
        assert pos.dtype == torch.float32
        self.pos.update(bytes(row.numpy().tobytes()) for row in pos)
        self.modes.append(mode)
        return np.zeros((pos.shape[0], 1), np.float32)


def trained_statistics() -> ObsNormalizer:
    """A trainer's statistics (not those of Walk's observations, so that some values are clipped)."""
    norm = ObsNormalizer(Tuple((POS, Discrete(5))), clip=2.5)
    rng = np.random.default_rng(6)
    norm.update((rng.normal([1100, -10, 0.5], [60, 5, 0.3], (500, 3)).astype(np.float32),
                 rng.integers(0, 5, 500, dtype=np.uint8)))
    return norm


def run_worker(norm: ObsNormalizer, num_envs: int) -> tuple[RolloutWorker, list[Buffer]]:
    worker = RolloutWorker(Walk, Seen, seed=0, num_envs=num_envs, run_dir=None, normalize_obs=True,
                           normalize_obs_clip=2.5, min_samples_per_worker_packet=7)
    worker.local_packets = []
    worker.start()
    try:
        assert worker.obs_norm is not None and torch.equal(worker.obs_norm.var_0, torch.ones(3))  # until one arrives
        worker.obs_norm.load_state_dict(norm.state_dict())  # what the model transport does with a version
        worker.run(0, nb_episodes=4)
        worker.sink.send()
        return worker, [over_the_wire(b) for b in worker.local_packets]
    finally:
        worker.close()


def row_bytes(t: torch.Tensor) -> set[bytes]:
    return {bytes(row.numpy().tobytes()) for row in t.reshape(-1, 3)}


@pytest.mark.parametrize("num_envs", [1, 2])
def test_the_worker_and_the_memory_normalise_bit_identically_and_the_memory_keeps_raw_rows(num_envs: int) -> None:
    norm = trained_statistics()
    worker, packets = run_worker(norm, num_envs)
    actor = worker.actor
    assert len(actor.pos) >= 30
    raw = np.concatenate([b.obs[0] for b in packets])
    assert raw[:, 0].min() >= 1000  # packets carry the raw observation
    memory = ReplayMemory(memory_size=1000, batch_size=1024, seed=0)
    memory.obs_transform = norm
    for b in packets:
        memory.append_buffer(b)
    batch = memory.sample()
    # every transition's obs is an observation the actor acted on: the same float32 bytes; all of them were drawn
    assert row_bytes(batch.obs[0]) == actor.pos
    assert len(row_bytes(batch.next_obs[0]) - actor.pos) <= 4 * num_envs  # each episode's last obs: never acted on
    assert batch.obs[0].abs().max() == 2.5  # some clipped, as the worker clipped them
    assert batch.obs[1].dtype == torch.uint8 and set(batch.obs[1].tolist()) == set(range(5))  # passed through
    o, _a, _r, o2, *_ = memory.get_transition(0)
    assert o[0][0] >= 1000 and o2[0][0] >= 1000  # the memory holds raw rows
    with BatchesAhead(memory, "cpu", ahead=True) as ahead:  # a batch gathered in the prefetch thread
        assert ahead.ahead
        assert row_bytes(ahead.next().obs[0]) == actor.pos
    memory.obs_transform = None
    assert row_bytes(memory.sample().obs[0]).isdisjoint(actor.pos)  # the comparison above could fail


def test_a_prefetched_batch_uses_the_statistics_current_when_it_was_gathered() -> None:
    norm = trained_statistics()
    _, packets = run_worker(norm, 1)
    memory = ReplayMemory(memory_size=1000, batch_size=64, seed=0)
    memory.obs_transform = norm
    for b in packets:
        memory.append_buffer(b)
    with BatchesAhead(memory, "cpu", ahead=True) as ahead:
        ahead.next()  # the batch after it is gathered meanwhile, under these statistics
        ahead.settle()  # what the training loop does before it updates the statistics
        before = _normalised_rows(norm, memory)
        norm.update((np.full((10, 3), 5.0, np.float32), np.zeros(10, np.uint8)))
        after = _normalised_rows(norm, memory)
        second, third = ahead.next(), ahead.next()
    assert row_bytes(second.obs[0]) <= before and not row_bytes(second.obs[0]) & after
    assert row_bytes(third.obs[0]) <= after


def _normalised_rows(norm: ObsNormalizer, memory: ReplayMemory) -> set[bytes]:
    """Every stored row's float leaf, normalised by ``norm``."""
    return normalised_rows(norm, memory._cols["obs/0"][: memory._size])


def normalised_rows(norm: ObsNormalizer, pos: np.ndarray) -> set[bytes]:
    return row_bytes(norm((torch.from_numpy(pos.copy()), torch.zeros(len(pos), dtype=torch.uint8)))[0])


@pytest.mark.parametrize("memory_cls", [HistoryMemory, RolloutMemory])
def test_the_other_memories_apply_the_transform_to_obs_and_next_obs(memory_cls: Any) -> None:
    norm = trained_statistics()
    _, packets = run_worker(norm, 1)
    memory = memory_cls(memory_size=1000, batch_size=32, seed=0)
    memory.obs_transform = norm
    for b in packets:
        memory.append_buffer(b)
    batch = memory.sample()
    raw = np.concatenate([b.obs[0] for b in packets])
    want = normalised_rows(norm, raw)
    assert row_bytes(batch.obs[0]) <= want and row_bytes(batch.next_obs[0]) <= want
    assert batch.obs[0].abs().max() <= 2.5 and batch.obs[1].dtype == torch.uint8


def test_the_training_loop_learns_from_every_row_once_and_refuses_a_packet_that_does_not_fit() -> None:
    _, packets = run_worker(trained_statistics(), 1)
    assert any(b.context.any() for b in packets)
    bad = Buffer(act=packets[0].act, obs=(packets[0].obs[0][:, :2].copy(), packets[0].obs[1]), rew=packets[0].rew,
                 terminated=packets[0].terminated, truncated=packets[0].truncated, reset=packets[0].reset,
                 context=packets[0].context, policy_version=packets[0].policy_version, worker="bad")
    loop = TrainingOffline(env_cls=Walk, normalize_obs=True, normalize_obs_clip=2.5, device="cpu", memory_size=1000,
                           batch_size=16, seed=0)
    loop.build()
    assert loop.memory is not None and loop.memory.obs_transform is loop.obs_norm
    loop.ingest(ListSource([*packets, bad]))
    assert loop.ingester is not None and loop.ingester.unstored == 1
    rows = np.concatenate([b.obs[0][~b.context] for b in packets]).astype(np.float64)
    assert loop.obs_norm is not None and float(loop.obs_norm.count) == len(rows)
    np.testing.assert_allclose(loop.obs_norm.mean_0.numpy(), rows.mean(0), rtol=1e-6)
    np.testing.assert_allclose(loop.obs_norm.var_0.numpy(), rows.var(0), rtol=1e-5)
    batch = loop.memory.sample()
    assert batch.obs[0].abs().max() < 2.5 and batch.obs[0].mean().abs() < 1.0  # normalised by what it learnt


def test_a_worker_refuses_statistics_of_another_env_naming_the_leaf_and_the_setting(
        caplog: pytest.LogCaptureFixture) -> None:
    from netrl.protocol.weights import flat_layout, snapshot_into
    from netrl.protocol.wire import decode, encode, weight_parts
    from netrl.worker.weight_receiver import WeightReceiver

    space = Dict({"pos": Box(-1, 1, (3,), np.float32), "vel": Box(-1, 1, (2,), np.float32)})
    other = Dict({"pos": Box(-1, 1, (4,), np.float32), "vel": Box(-1, 1, (2,), np.float32)})
    target = ObsNormalizer(space, 10.0)
    rx = WeightReceiver(target, ObsNormalizer(space, 10.0), -1, None)
    theirs = ObsNormalizer(other, 10.0)
    layout, nbytes = flat_layout(theirs)
    flat = np.zeros(nbytes, np.uint8)
    snapshot_into(theirs, layout, flat)
    for msg in weight_parts("trainer", "t", 1, 0, flat, layout, 1 << 20, {"model": "obs_norm"}):
        stats = rx(decode(encode(msg)))
    assert stats["weights_rejected"] == 1 and rx.version == -1
    [error] = [r.getMessage() for r in caplog.records if "rejected weights v1" in r.getMessage()]
    assert "env.normalize_obs: the statistics' mean_0 for observation leaf" in error
    assert "(4,)" in error and "(3,)" in error
