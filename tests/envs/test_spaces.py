"""Every kind of space netrl carries, end to end: a worker steps a small env, its packets cross the real wire, pass
the server's and the trainer's layout and value checks, and the memory's batches hold exactly what the env produced,
in the smallest integer dtype that holds each discrete leaf."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from netrl.actor import ActorModule
from netrl.envs.checks import ACTION_MASK, check_spaces, mask_size, value_limits
from netrl.memory.replay import ReplayMemory
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import buffer_from_message, decode, encode, samples_message
from netrl.samples import Buffer, flatten
from netrl.worker.worker import RolloutWorker
from tests.recording import local_packets

S = gymnasium.spaces
STEP = S.Box(0, np.inf, (1,), np.float32)  # a counter in every observation: which env step a row is


class SpaceEnv(gymnasium.Env):
    """Observations drawn from ``observation_space`` (seeded by a step counter, which a ``"t"`` entry or first
    element carries), episodes of 4 steps. It keeps every transition it made, by the counter of its first
    observation, and refuses an action outside its space or its mask."""

    metadata: dict[str, Any] = {}

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space) -> None:
        self.observation_space, self.action_space = observation_space, action_space
        self.count, self.t = 0, 0
        self.last: Any = None
        self.truth: dict[int, tuple[Any, Any, Any]] = {}  # counter of obs -> (obs, action, next obs)

    def _observe(self) -> Any:
        self.count += 1
        space = self.observation_space
        space.seed(self.count)
        obs = space.sample()
        if isinstance(obs, dict):
            obs["t"] = np.full(1, self.count, np.float32)
            if ACTION_MASK in obs:  # at least one allowed action (per part of a MultiDiscrete)
                mask = obs[ACTION_MASK]
                parts = np.cumsum([0, *np.atleast_1d(getattr(self.action_space, "nvec", len(mask)))])
                for a in parts[:-1]:
                    mask[a + self.count % (parts[1] - parts[0])] = 1
        else:
            obs = (np.full(1, self.count, np.float32), *obs[1:])
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.t, self.last = 0, self._observe()
        return self.last, {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        assert self.action_space.contains(np.asarray(action, self.action_space.dtype)), action
        if isinstance(self.last, dict) and ACTION_MASK in self.last:
            assert allowed(self.last[ACTION_MASK], self.action_space, action), (self.last[ACTION_MASK], action)
        obs = self._observe()
        self.truth[int(counter(self.last))] = (self.last, np.asarray(action), obs)
        self.t += 1
        self.last = obs
        return obs, float(self.count % 7), self.t >= 4, False, {}


def counter(obs: Any) -> Any:
    return obs["t"][..., 0] if isinstance(obs, dict) else obs[0][..., 0]


def allowed(mask: np.ndarray, space: gymnasium.Space, action: Any) -> bool:
    flat = np.atleast_1d(action) - np.atleast_1d(getattr(space, "start", 0))
    offsets = np.cumsum([0, *np.atleast_1d(getattr(space, "nvec", len(mask)))])[:-1]
    return bool(np.asarray(mask)[offsets + flat].all())


class RandomActor(ActorModule):
    """Valid random actions, as an integer numpy array of the env's own dtype (int64), within the mask if any."""

    def __init__(self, observation_space: Any, action_space: Any) -> None:
        super().__init__(observation_space, action_space)
        self.rng = np.random.default_rng(0)

    def act(self, obs: Any, test: bool = False) -> Any:
        space = self.action_space
        if isinstance(obs, dict) and ACTION_MASK in obs:
            mask = obs[ACTION_MASK][0].numpy().astype(bool)
            parts = np.atleast_1d(getattr(space, "nvec", len(mask)))
            chosen, at = [], 0
            for n in parts:
                chosen.append(self.rng.choice(np.flatnonzero(mask[at:at + n])))
                at += n
            start = np.atleast_1d(getattr(space, "start", 0))
            action = np.asarray(chosen) + start
            return action[0] if isinstance(space, S.Discrete) else action
        space.seed(int(self.rng.integers(1 << 30)))
        return np.asarray(space.sample()).astype(np.int64 if space.dtype.kind in "iu" else space.dtype)


def run(observation_space: gymnasium.Space, action_space: gymnasium.Space,
        episodes: int = 3) -> tuple[list[Buffer], SpaceEnv, SampleSchema]:
    """Packets of ``episodes`` episodes as the trainer receives them, after the server's and trainer's checks."""
    made: list[SpaceEnv] = []

    def make() -> SpaceEnv:
        made.append(SpaceEnv(observation_space, action_space))
        return made[-1]

    check_spaces(observation_space, action_space)
    worker = RolloutWorker(make, RandomActor, min_samples_per_worker_packet=3)
    schema = SampleSchema.from_spaces(observation_space, action_space,
                                      limits=value_limits(observation_space, action_space))
    received = []
    for buf in local_packets(worker, [False] * episodes):
        frames = encode(samples_message(buf, "w", "s", 1, len(buf)), "zstd")
        at_server = decode(frames, inflate=False)  # relay-only: compressed integer arrays stay compressed
        schema.check(at_server.body, at_server.arrays, "w")
        msg = decode(frames)
        schema.check(msg.body, msg.arrays, "w")
        problem = schema.limits.problem({k: v for k, v in msg.arrays.items() if k.startswith(("act", "obs"))},
                                        msg.arrays["rew"], msg.arrays["reset"])  # the trainer's value check
        assert problem is None, problem
        received.append(buffer_from_message(msg))
    return received, made[0], schema


def through_memory(bufs: list[Buffer], env: SpaceEnv) -> tuple[Any, Any, Any]:
    """Every transition of ``bufs`` sampled from a ReplayMemory: (batch, leaves of obs, leaves of act) checked
    against what the env did."""
    memory = ReplayMemory(memory_size=1000, batch_size=64, seed=0)
    for buf in bufs:
        memory.append_buffer(buf)
    assert len(memory) == len(env.truth)
    batch = memory.sample()
    for i, t in enumerate(counter(batch.obs).numpy().astype(int).tolist()):
        obs, act, next_obs = env.truth[t]
        for got, want in ((batch.obs, obs), (batch.next_obs, next_obs), (batch.act, act)):
            _, got_leaves = flatten(got, "x")
            _, want_leaves = flatten(want, "x")
            for (name, g), (_, w) in zip(got_leaves, want_leaves, strict=True):
                np.testing.assert_array_equal(g[i].numpy(), np.asarray(w, g.numpy().dtype), err_msg=name)
    return batch, dict(flatten(batch.obs, "obs")[1]), batch.act


@pytest.mark.parametrize(("action_space", "dtype", "shape"), [
    (S.Discrete(3), torch.uint8, ()),
    (S.Discrete(3, start=-1), torch.int8, ()),
    (S.Discrete(300, start=5), torch.uint16, ()),
    (S.MultiDiscrete([2, 5, 3]), torch.uint8, (3,)),
    (S.MultiBinary(4), torch.uint8, (4,)),
])
def test_discrete_actions_travel_from_worker_to_batch_as_the_smallest_integers(
        action_space: gymnasium.Space, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    obs_space = S.Tuple((STEP, S.Box(-1, 1, (2,), np.float32)))
    bufs, env, schema = run(obs_space, action_space)
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    assert schema.leaves["act"] == (np_dtype.str, shape)
    assert all(b.act.dtype == np_dtype for b in bufs)
    starts = [b.act[b.reset] for b in bufs if b.reset.any()]  # each episode's first row holds a valid action
    assert starts and all(action_space.contains(a.astype(action_space.dtype)) for s in starts for a in s)
    _, _, act = through_memory(bufs, env)
    assert act.dtype == dtype and tuple(act.shape[1:]) == shape


def test_discrete_leaves_inside_tuple_and_dict_observations_keep_their_values_and_small_dtypes() -> None:
    image = S.Box(0, 255, (6, 5, 3), np.uint8)
    tuple_space = S.Tuple((STEP, S.Discrete(4, start=2), S.MultiDiscrete([[3, 2], [4, 1000]]), S.MultiBinary(5),
                           image))
    bufs, env, _ = run(tuple_space, S.Box(-1, 1, (2,), np.float32))
    batch, obs, act = through_memory(bufs, env)
    assert [obs[f"obs/{i}"].dtype for i in range(1, 5)] == [torch.uint8, torch.uint16, torch.uint8, torch.uint8]
    assert tuple(obs["obs/2"].shape[1:]) == (2, 2) and obs["obs/1"].shape[1:] == ()
    assert act.dtype == torch.float32 and batch.next_obs[4].dtype == torch.uint8  # an integer image stays uint8

    dict_space = S.Dict({"t": STEP, "gear": S.Discrete(5, start=-2), "keys": S.MultiBinary(3),
                         "pad": S.MultiDiscrete([70000, 2])})
    bufs, env, _ = run(dict_space, S.Discrete(2))
    _, obs, act = through_memory(bufs, env)
    assert (obs["obs/gear"].dtype, obs["obs/keys"].dtype, obs["obs/pad"].dtype) == (torch.int8, torch.uint8,
                                                                                     torch.uint32)
    assert int(obs["obs/gear"].min()) >= -2 and act.dtype == torch.uint8


@pytest.mark.parametrize("action_space", [S.Discrete(5, start=1), S.MultiDiscrete([3, 4])])
def test_an_action_mask_travels_as_an_observation_leaf_for_this_state_and_the_next(
        action_space: gymnasium.Space) -> None:
    size = mask_size(action_space)
    assert size is not None
    obs_space = S.Dict({"t": STEP, ACTION_MASK: S.MultiBinary(size)})
    bufs, env, _ = run(obs_space, action_space, episodes=6)
    batch, _, act = through_memory(bufs, env)
    masks, next_masks = batch.obs[ACTION_MASK], batch.next_obs[ACTION_MASK]
    assert masks.dtype == next_masks.dtype == torch.uint8 and tuple(masks.shape[1:]) == (size,)
    for mask, a in zip(masks.numpy(), act.numpy(), strict=True):  # the actor kept to the mask of its state
        assert allowed(mask, action_space, a)
    assert not torch.equal(masks, next_masks)  # the next state's own mask, for the bootstrap target
