"""TorchRL envs on netrl's workers (netrl.interop.envs): specs as spaces, the check_env_specs checks at
start with errors naming the key, flags and info keys, and a real RolloutWorker stepping one TorchRL env
or a batch of them (SerialEnv, ParallelEnv) in its vector runner."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

torchrl = pytest.importorskip("torchrl")

import gymnasium  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    Unbounded,
)
from torchrl.envs import (  # noqa: E402
    CatFrames,
    EnvBase,
    GymEnv,
    ObservationNorm,
    SerialEnv,
    StepCounter,
    TransformedEnv,
)

from netrl.errors import ConfigError  # noqa: E402
from netrl.interop.envs import (  # noqa: E402
    TorchRLEnv,
    TorchRLEnvFactory,
    TorchRLVectorEnv,
    torchrl_env,
    torchrl_pipeline,
)
from netrl.interop.specs import leaf, leaves  # noqa: E402
from netrl.samples.info import InfoKey  # noqa: E402
from netrl.worker.settings import WorkerSettings  # noqa: E402
from netrl.worker.worker import RolloutWorker  # noqa: E402
from tests.fakes import TagActor  # noqa: E402
from tests.recording import local_packets  # noqa: E402


class Ticks(EnvBase):  # type: ignore[misc]
    """TorchRL's twin of tests.fakes.Counter: observation [tag, episode, t]; env ``tag`` ends its episodes after
    ``LENGTHS[tag]`` steps (terminated), and refuses an action that is not its tag, so a row given to the wrong env
    fails. StepCounter over it truncates."""

    LENGTHS = (3, 5, 4)
    made = 0
    strict = True  # refuse an action that is not the tag (False: take any, for random actions)

    def __init__(self) -> None:
        super().__init__(batch_size=torch.Size([]))
        self.tag = Ticks.made
        Ticks.made += 1
        self.length = self.LENGTHS[self.tag % len(self.LENGTHS)]
        self.observation_spec = Composite(observation=Unbounded((3,), dtype=torch.float32))
        self.action_spec = Bounded(-1e6, 1e6, (1,), dtype=torch.float32)
        self.reward_spec = Unbounded((1,), dtype=torch.float32)
        self.ep, self.t = -1, 0

    def _obs(self) -> torch.Tensor:
        return torch.tensor([self.tag, self.ep, self.t], dtype=torch.float32)

    def _reset(self, td: Any) -> TensorDict:
        self.ep, self.t = self.ep + 1, 0
        return TensorDict(observation=self._obs(), done=torch.zeros(1, dtype=torch.bool),
                          terminated=torch.zeros(1, dtype=torch.bool))

    def _step(self, td: Any) -> TensorDict:
        action = td.get("action")
        assert action.shape == (1,) and (action[0] == self.tag or not self.strict), (action, self.tag)
        self.t += 1
        end = torch.tensor([self.t >= self.length])
        return TensorDict(observation=self._obs(), reward=torch.ones(1), done=end.clone(), terminated=end)

    def _set_seed(self, seed: int | None) -> None:
        pass


@pytest.fixture(autouse=True)
def _fresh_tags() -> None:
    Ticks.made = 0


def counted(max_steps: int = 100) -> EnvBase:
    return TransformedEnv(Ticks(), StepCounter(max_steps=max_steps))


STEPS = [InfoKey("step_count", "int64")]


# -- specs as spaces ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "space", "value", "gym_value"), [
    (Bounded(-2.0, 3.0, (2,), dtype=torch.float64), gymnasium.spaces.Box(-2, 3, (2,), np.float32),
     torch.tensor([1.0, -1.5], dtype=torch.float64), np.array([1.0, -1.5], np.float32)),
    (Unbounded((3,), dtype=torch.int32), gymnasium.spaces.Box(-2**31, 2**31 - 1, (3,), np.int32),
     torch.tensor([1, -7, 9], dtype=torch.int32), np.array([1, -7, 9], np.int32)),
    (Categorical(5, (), dtype=torch.int64), gymnasium.spaces.Discrete(5), torch.tensor(3), np.int64(3)),
    (Categorical(5, (1,), dtype=torch.int64), gymnasium.spaces.Discrete(5), torch.tensor([4]), np.int64(4)),
    (Categorical(3, (2,), dtype=torch.int64), gymnasium.spaces.MultiDiscrete([3, 3]), torch.tensor([2, 0]),
     np.array([2, 0])),
    (OneHot(4), gymnasium.spaces.Discrete(4), torch.tensor([False, False, True, False]), np.int64(2)),
    (MultiCategorical([2, 5]), gymnasium.spaces.MultiDiscrete([2, 5]), torch.tensor([1, 4]), np.array([1, 4])),
    (MultiOneHot([2, 3]), gymnasium.spaces.MultiDiscrete([2, 3]), torch.tensor([False, True, True, False, False]),
     np.array([1, 0])),
    (Binary(3), gymnasium.spaces.MultiBinary(3), torch.tensor([1, 0, 1], dtype=torch.int8),
     np.array([1, 0, 1], np.int8)),
])
def test_each_spec_kind_maps_to_its_gymnasium_space_and_values_convert_both_ways(
        spec: Any, space: gymnasium.Space, value: torch.Tensor, gym_value: Any) -> None:
    got = leaf(spec, ("x",))
    assert got.space == space
    converted = got.to_numpy(value)
    assert np.array_equal(converted, gym_value) and converted.dtype == np.asarray(gym_value).dtype
    assert got.space.contains(converted)
    back = got.to_tensor(converted, ())
    assert back.dtype == spec.dtype and torch.equal(back.to(value.dtype), value)
    batch = got.to_tensor(np.stack([converted, converted]), (2,))  # batched: a leading dim kept
    assert torch.equal(batch[1].to(value.dtype), value) and np.array_equal(got.to_numpy(batch)[0], gym_value)


def test_a_composite_maps_to_a_nested_dict_and_a_spec_without_a_space_is_refused_naming_its_key() -> None:
    spec = Composite(pixels=Bounded(0, 255, (2, 2), dtype=torch.uint8),
                     agent=Composite(pos=Unbounded((2,)), mode=Categorical(3, ())))
    found = {x.key: x.space for x in leaves(spec)}
    assert found == {("pixels",): gymnasium.spaces.Box(0, 255, (2, 2), np.uint8),
                     ("agent", "pos"): gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                     ("agent", "mode"): gymnasium.spaces.Discrete(3)}
    with pytest.raises(ValueError, match=r"observation key \('agent', 'text'\) has the spec NonTensor.*Exclude"):
        leaves(Composite(agent=Composite(text=NonTensor(shape=()))))


def test_a_dict_observation_comes_from_several_observation_keys_and_info_keys_leave_it() -> None:
    env = torchrl_env(lambda: TransformedEnv(GymEnv("Pendulum-v1"), CatFrames(2, dim=-1, in_keys=["observation"],
                                                                             out_keys=["stacked"])))()
    assert isinstance(env.observation_space, gymnasium.spaces.Dict)
    assert set(env.observation_space.spaces) == {"observation", "stacked"}
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and np.array_equal(obs["stacked"][3:], obs["observation"])
    env.close()
    plain = torchrl_env(counted, info_keys=STEPS)()  # step_count is an info column, not an observation entry
    assert plain.observation_space == gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    plain.close()


# -- flags and info keys -----------------------------------------------------------------------------------------


def test_terminated_and_truncated_map_to_netrls_flags_and_step_count_travels_as_info() -> None:
    env = torchrl_env(lambda: TransformedEnv(Ticks(), StepCounter(max_steps=2)), info_keys=STEPS)()  # tag 0: 3 steps
    obs, info = env.reset()
    assert info == {"step_count": 0} and obs.dtype == np.float32
    assert env.step(np.zeros(1, np.float32))[1:] == (1.0, False, False, {"step_count": 1})
    _, _, term, trunc, info = env.step(np.zeros(1, np.float32))
    assert (term, trunc, info["step_count"]) == (False, True, 2)  # StepCounter's truncation
    env.close()
    env = torchrl_env(Ticks)()  # no truncated key: done and not terminated is none (tag 1: 5 steps)
    obs, _ = env.reset()
    flags = [env.step(obs[:1])[2:4] for _ in range(5)]
    assert flags == [(False, False)] * 4 + [(True, False)]
    env.close()


class TwoRewards(Ticks):
    def __init__(self) -> None:
        super().__init__()
        self.reward_spec = Unbounded((2,), dtype=torch.float32)


def test_a_reward_of_more_than_one_number_is_refused_naming_it_and_the_env_is_closed() -> None:
    made: list[EnvBase] = []

    def make() -> EnvBase:
        made.append(TwoRewards())
        return made[-1]

    with pytest.raises(ValueError, match=r"reward 'reward' has the spec UnboundedContinuous\(shape=\[2\], "
                                         r"dtype=torch.float32\): netrl records one number per step"):
        torchrl_env(make)()
    assert made[0].is_closed


def test_an_info_key_the_env_does_not_have_or_of_another_size_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"info key 'speed' is declared, but the TorchRL env's observation_spec has no "
                                         r"key 'speed' \(it has 'observation', 'step_count'\)"):
        torchrl_env(counted, info_keys=[InfoKey("speed")])()
    with pytest.raises(ValueError, match=r"info key 'step_count' is declared with shape \(2,\).*\[1\]"):
        torchrl_env(counted, info_keys=[InfoKey("step_count", "int64", (2,))])()


# -- what check_env_specs checks, at start, naming the key -----------------------------------------------------


class WrongDtype(Ticks):
    def _step(self, td: Any) -> TensorDict:
        return super()._step(td).set("observation", self._obs().double())


class WrongShape(Ticks):
    def _step(self, td: Any) -> TensorDict:
        return super()._step(td).set("observation", torch.zeros(4))


class MissingKey(Ticks):
    def _reset(self, td: Any) -> TensorDict:
        return super()._reset(td).exclude("observation")


class MissingStepKey(Ticks):  # a batch's buffers would read the missing observation as zeros
    def _step(self, td: Any) -> TensorDict:
        return super()._step(td).exclude("observation")


class OutOfBounds(Ticks):  # t beyond 1.5 from the second step
    def __init__(self) -> None:
        super().__init__()
        high = torch.tensor([1e6, 1e6, 1.5])
        self.observation_spec = Composite(observation=Bounded(-high, high, (3,), dtype=torch.float32))


class UndeclaredKey(Ticks):
    def _step(self, td: Any) -> TensorDict:
        return super()._step(td).set("speed", torch.ones(1))


@pytest.mark.parametrize(("env_cls", "message"), [
    (WrongDtype, r"step\(\)'s 'next''s 'observation' has dtype torch.float64, but its spec says torch.float32"),
    (WrongShape, r"step\(\)'s 'next''s 'observation' has shape \[4\], but its spec says \[3\]"),
    (MissingKey, r"reset\(\) has no key 'observation', which the env's specs declare"),
    (MissingStepKey, r"step\(\)'s 'next' has no key 'observation', which the env's specs declare"),
    (UndeclaredKey, r"step\(\)'s 'next' holds 'speed', which none of the env's specs declares"),
    (OutOfBounds, r"step\(\)'s 'next''s 'observation' holds \[\d\.0, \d\.0, 2\.0\], outside its spec "
                  r"\(BoundedContinuous\(shape=\[3\], dtype=torch.float32\), low \[-1000000\.0, -1000000\.0, -1\.5\], "
                  r"high \[1000000\.0, 1000000\.0, 1\.5\]\)"),
])
@pytest.mark.parametrize("num_envs", [1, 2])
def test_a_broken_env_stops_the_worker_at_start_with_an_error_naming_the_key(
        env_cls: type[Ticks], message: str, num_envs: int) -> None:
    worker = RolloutWorker(torchrl_env(env_cls), TagActor, seed=0, num_envs=num_envs)
    with pytest.raises(ValueError, match=rf"TorchRL env \w+: {message}"):
        worker.local_packets = []
        worker.start()
        try:
            worker.run(0, nb_episodes=2)
        finally:
            worker.close()


def test_only_the_first_check_steps_steps_are_checked() -> None:
    env = torchrl_env(WrongDtype, check_steps=0)()
    obs, _ = env.reset()
    assert env.step(obs[:1])[0].dtype == np.float64  # unchecked: the conversion alone, what the env gave
    env.close()
    env = torchrl_env(WrongDtype, check_steps=2)()
    obs, _ = env.reset()
    with pytest.raises(ValueError, match=r"dtype torch\.float64"):
        env.step(obs[:1])
    env.close()


def test_the_checks_inside_a_batch_leave_the_env_after_check_steps_steps() -> None:
    from netrl.interop.specs import watch_from_inside

    env = watch_from_inside(Ticks(), 2)
    td = env.reset()
    assert "_step" in vars(env)  # checking
    for _ in range(2):
        td = env.step_mdp(env.step(td.set("action", torch.zeros(1))))
    assert "_step" not in vars(env) and "reset" not in vars(env)  # the class's own again: nothing added per call
    env.step(td.set("action", torch.zeros(1)))


class LaterBadReset(Ticks):  # its third episode starts outside the spec
    def _reset(self, td: Any) -> TensorDict:
        out = super()._reset(td)
        return out.set("observation", out["observation"].double()) if self.ep == 2 else out


def test_resets_after_the_checked_steps_are_not_checked_as_a_gymnasium_envs_are_not() -> None:
    env = torchrl_env(LaterBadReset, check_steps=3)()  # tag 0: episodes of 3 steps
    obs, _ = env.reset()
    for _ in range(3):
        env.step(obs[:1])
    env.reset()  # the second episode's, after the checked steps: unchecked (and fine)
    assert env.reset()[0].dtype == np.float64  # the third: what the env gave, unchecked
    env.close()
    early = torchrl_env(LaterBadReset, check_steps=20)()
    for _ in range(2):
        early.reset()
    with pytest.raises(ValueError, match=r"reset\(\)'s 'observation' has dtype torch\.float64"):
        early.reset()  # still among the checked calls
    early.close()


def test_a_batched_env_given_as_one_env_is_refused_saying_how_to_batch() -> None:
    with pytest.raises(ValueError, match=r"make\(\) returned SerialEnv with batch_size \[2\]: give make for one "
                                         r"unbatched env; netrl batches it with worker.num_envs"):
        torchrl_env(lambda: SerialEnv(2, Ticks))()


# -- a real worker: one env, and netrl's vector worker over SerialEnv ------------------------------------------


@pytest.mark.parametrize("num_envs", [1, 3])
def test_a_worker_runs_a_torchrl_env_rows_flags_and_info_columns_as_with_a_gymnasium_env(num_envs: int) -> None:
    worker = RolloutWorker(torchrl_env(lambda: counted(max_steps=4), info_keys=STEPS), TagActor, seed=0,
                           num_envs=num_envs, min_samples_per_worker_packet=4, info_keys=STEPS)
    if num_envs > 1:
        worker.local_packets = []
        worker.start()
        try:
            assert isinstance(worker.env, TorchRLVectorEnv) and worker.env.num_envs == 3
            worker.run(0, nb_episodes=12)
            worker.sink.send()
        finally:
            worker.close()
        bufs = list(worker.local_packets)
    else:
        bufs = list(local_packets(worker, [False] * 4))
        assert isinstance(worker.env, TorchRLEnv)
    rows = ends = cut = 0
    tags: dict[int, set[int]] = {}
    for buf in bufs:
        assert buf.info is not None
        live = ~buf.context
        tag, ep, t = buf.obs[:, 0], buf.obs[:, 1], buf.obs[:, 2]
        assert np.array_equal(buf.info["step_count"][live], t[live])  # the row's own step, reset rows 0
        if num_envs > 1:
            assert buf.env is not None
            for i, row_tag in zip(buf.env[live].tolist(), tag[live].tolist(), strict=True):
                tags.setdefault(i, set()).add(row_tag)
        length = np.array(Ticks.LENGTHS)[tag.astype(int) % len(Ticks.LENGTHS)]
        step = live & ~buf.reset
        # terminated when the env's length is reached, truncated by StepCounter at 4 (with a length of 4 both,
        # as StepCounter says)
        assert np.array_equal(buf.terminated[step], (t == length)[step])
        assert np.array_equal(buf.truncated[step], (t == 4)[step])
        assert not (buf.terminated | buf.truncated)[buf.reset].any() and (ep >= 0).all()
        rows += int(np.count_nonzero(live))
        ends += int(np.count_nonzero(buf.terminated[step]))
        cut += int(np.count_nonzero(buf.truncated[step]))
    assert rows >= 12 and ends > 0 and (cut > 0) == (num_envs > 1)
    # each env's rows come from one env (SerialEnv builds one more first, to read the specs)
    assert all(len(t) == 1 for t in tags.values()) and len(tags) == (num_envs if num_envs > 1 else 0)


def test_a_cut_episode_resets_its_env_alone_in_the_batched_env() -> None:
    worker = RolloutWorker(torchrl_env(Ticks), TagActor, seed=0, num_envs=3, max_samples_per_episode=2)
    worker.local_packets = []
    worker.start()
    try:
        worker.run(0, nb_episodes=9)
        worker.sink.send()
    finally:
        worker.close()
    for buf in worker.local_packets:
        live = ~buf.context & ~buf.reset
        assert (buf.obs[live, 2] <= 2).all()  # max_samples_per_episode cut every episode at 2 steps
        assert np.array_equal(buf.truncated[live], buf.obs[live, 2] == 2)


class Pick(TagActor):
    """Any action of the space (for envs whose actions TagActor's tag is not)."""

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        return np.stack([self.action_space.sample() for _ in range(obs.shape[0])])


def cartpole() -> EnvBase:
    return TransformedEnv(GymEnv("CartPole-v1"), ObservationNorm(loc=0.0, scale=2.0, in_keys=["observation"]))


def test_a_parallel_env_runs_in_the_vector_worker_with_async_vectorization() -> None:
    worker = RolloutWorker(torchrl_env(cartpole), Pick, seed=0, num_envs=2, vectorization="async",
                           min_samples_per_worker_packet=8)
    worker.local_packets = []
    worker.start()
    try:
        assert type(worker.env.torchrl_env).__name__ == "ParallelEnv"
        assert worker.action_space == gymnasium.spaces.Discrete(2)
        worker.run(0, nb_episodes=2)
        worker.sink.send()
    finally:
        worker.close()
    bufs = worker.local_packets
    assert sum(len(b) for b in bufs) > 10 and any(b.terminated.any() for b in bufs)
    assert all(b.env is not None and set(b.env.tolist()) <= {0, 1} for b in bufs)


def test_the_worker_hook_refuses_a_vector_env_of_another_size_or_autoreset_mode() -> None:
    from netrl.worker.env_host import make_vector_env

    class OwnVector:
        def __init__(self, n: int, mode: Any) -> None:
            self.n, self.mode = n, mode

        def __call__(self) -> gymnasium.Env:
            return gymnasium.make("CartPole-v1")

        def make_vector_env(self, num_envs: int, vectorization: str) -> Any:
            return gymnasium.vector.SyncVectorEnv([self] * self.n, autoreset_mode=self.mode)

    same = gymnasium.vector.AutoresetMode.SAME_STEP
    assert make_vector_env(OwnVector(2, same), 2, "sync").num_envs == 2
    for wrong in (OwnVector(3, same), OwnVector(2, gymnasium.vector.AutoresetMode.NEXT_STEP)):
        with pytest.raises(ValueError, match=r"make_vector_env\(2, 'sync'\) returned \d envs autoresetting in mode "
                                             r".*: a worker needs 2 \(worker.num_envs\) in AutoresetMode.SAME_STEP"):
            make_vector_env(wrong, 2, "sync")
    one_more = TorchRLEnvFactory(Ticks, batch=lambda n, make: SerialEnv(n + 1, make))
    with pytest.raises(ValueError, match=r"batch\(2, make\) returned SerialEnv with batch_size \[3\], not \[2\]"):
        one_more.make_vector_env(2, "sync")


# -- how a user configures it: env.pipeline "module:function" returning torchrl_pipeline(cfg, make=...) --------


def cartpole_pipeline(cfg: Any) -> Any:
    return torchrl_pipeline(cfg, make=lambda: cartpole().append_transform(StepCounter()), info_keys=STEPS)


def test_a_torchrl_pipeline_picks_the_agent_for_the_envs_actions_and_its_worker_records_the_info() -> None:
    from netrl.agents.dqn import DQNActor
    from netrl.config.load import config_from_dict
    from netrl.pipelines.make import make_pipeline

    cfg = config_from_dict({"env": {"pipeline": "tests.interop.test_envs:cartpole_pipeline"}})
    pipeline = make_pipeline(cfg)
    assert isinstance(pipeline.env_cls, TorchRLEnvFactory) and pipeline.info_keys == tuple(STEPS)
    assert pipeline.actor_module_cls.func is DQNActor  # CartPole's OneHot actions: Discrete(2), DQN's
    worker = RolloutWorker(pipeline.env_cls, pipeline.actor_module_cls, info_keys=pipeline.info_keys, num_envs=2,
                           seed=0, run_dir=None)
    worker.local_packets = []
    worker.start()
    try:
        worker.run(0, nb_episodes=2)
        worker.sink.send()
    finally:
        worker.close()
    bufs = worker.local_packets
    assert bufs and all(b.info is not None and (b.info["step_count"][b.reset] == 0).all() for b in bufs)
    assert max(int(b.info["step_count"].max()) for b in bufs if b.info is not None) >= 8
    realtime = torchrl_pipeline(cfg, make=cartpole, realtime=True)  # a robot's: never paused by the trainer's pace
    throttled = dataclasses.replace(cfg, worker=dataclasses.replace(cfg.worker, throttle=True), security="none")
    settings = WorkerSettings.from_config(throttled, realtime, "w")
    assert realtime.realtime and not settings.throttle
    with pytest.raises(ConfigError, match=r'agent.algorithm "sac" needs Box actions, but the TorchRL env has '
                                          r"Discrete\(2\)"):
        make_pipeline(config_from_dict({"env": {"pipeline": "tests.interop.test_envs:cartpole_pipeline"},
                                        "agent": {"algorithm": "sac"}}))


def test_the_docs_example_builds_a_pipeline_whose_worker_runs() -> None:
    import re
    from pathlib import Path

    from netrl.agents.sac import MLPActor
    from netrl.config.load import config_from_dict

    page = (Path(__file__).resolve().parents[2] / "docs" / "torchrl.md").read_text()
    example = re.search(r"```python\n(# my_torchrl\.py.*?)```", page, re.S)
    assert example is not None
    scope: dict[str, Any] = {}
    exec(compile(example.group(1), "docs/torchrl.md", "exec"), scope)
    pipeline = scope["pipeline"](config_from_dict({}))
    assert pipeline.actor_module_cls.func is MLPActor  # Pendulum's Box actions: SAC's
    worker = RolloutWorker(pipeline.env_cls, pipeline.actor_module_cls, info_keys=pipeline.info_keys, seed=0,
                           run_dir=None)
    bufs = list(local_packets(worker, [False]))
    assert sum(int((~b.reset & ~b.context).sum()) for b in bufs) == 200  # StepCounter's cut, a truncation
    assert any(b.truncated.any() for b in bufs) and not any(b.terminated.any() for b in bufs)
    assert max(int(b.info["step_count"].max()) for b in bufs if b.info is not None) == 200


def test_check_env_runs_a_torchrl_env_and_reports_a_broken_one_naming_the_key() -> None:
    from netrl.envs.preflight import preflight

    report = preflight(torchrl_env(lambda: cartpole().append_transform(StepCounter()), info_keys=STEPS), steps=60,
                       info_keys=tuple(STEPS))
    assert report.ok, report.format()

    class AnyAction(WrongDtype):
        strict = False

    report = preflight(torchrl_env(AnyAction), steps=20)
    assert not report.ok and "'observation' has dtype torch.float64, but its spec says torch.float32" in report.format()


def test_a_batch_with_dict_observations_autoresets_in_the_same_step_with_each_final_observation() -> None:
    def stacked() -> EnvBase:
        env = TransformedEnv(Ticks(), CatFrames(2, dim=-1, in_keys=["observation"], out_keys=["stacked"]))
        return env.append_transform(StepCounter(max_steps=2))

    Ticks.strict = False
    try:
        vec = torchrl_env(stacked, info_keys=STEPS).make_vector_env(2, "sync")
        assert vec.single_observation_space == gymnasium.spaces.Dict(
            {"observation": gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32),
             "stacked": gymnasium.spaces.Box(-np.inf, np.inf, (6,), np.float32)})
        obs, info = vec.reset(seed=0)
        assert obs["observation"].shape == (2, 3) and np.array_equal(info["step_count"], [0, 0])
        first, _, term, trunc, info = vec.step(np.zeros((2, 1), np.float32))
        assert "final_obs" not in info and not (term | trunc).any()
        obs, _, term, trunc, info = vec.step(np.zeros((2, 1), np.float32))
        assert trunc.all() and not term.any() and info["_final_obs"].all()
        for i in range(2):  # the final observation: step 2 of the episode, stacked on step 1; then a new episode
            final = info["final_obs"][i]
            assert final["observation"][2] == 2 and np.array_equal(final["stacked"][:3], first["observation"][i])
            assert obs["observation"][i][2] == 0 and obs["observation"][i][1] == final["observation"][1] + 1
        assert np.array_equal(info["final_info"]["step_count"], [2, 2]) and np.array_equal(info["step_count"], [0, 0])
        vec.close()
        vec.close()  # idempotent
    finally:
        Ticks.strict = True
