"""env.transforms in config.json: the checks that name a bad entry, the pipelines that apply the
transforms, and a real worker run through them."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from netrl.actor import ActorModule
from netrl.config.load import config_from_dict
from netrl.envs.image import ImageReachEnv
from netrl.envs.transforms import compose_from_config, transformed
from netrl.errors import ConfigError
from netrl.pipelines.make import make_pipeline
from netrl.samples import Buffer
from netrl.worker.worker import RolloutWorker
from tests.recording import over_the_wire


def problems_of(entries: list[Any]) -> str:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"env": {"transforms": entries}})
    return str(err.value)


@pytest.mark.parametrize(("entries", "expected"), [
    ([{"name": "Grayscale"}], 'entry 1 names the transform "Grayscale", which netrl does not '
                              'have (did you mean "GrayScale"?)'),
    ([{"name": "StepCounter"}, {"name": "Resize", "w": 0}],
     "entry 2 (Resize) w must be an integer from 1 to 65536 (got 0)"),
    ([{"name": "Resize", "width": 84}], "entry 1 (Resize) has no option width (its options: w, h, "
                                        "interpolation, in_keys); needs the option w"),
    ([{"name": "RewardScaling", "scale": 0}], "entry 1 (RewardScaling) scale must be a finite "
                                              "number other than 0 (got 0)"),
    ([{"name": "RewardClipping", "clamp_min": 1, "clamp_max": -1}],
     "entry 1 (RewardClipping) clamp_min must be <= clamp_max (got 1, -1)"),
    ([{"name": "FrameSkipTransform", "frame_skip": 2.5}],
     "entry 1 (FrameSkipTransform) frame_skip must be an integer from 1 to 10000 (got 2.5)"),
    ([{"name": "ObservationNorm", "loc": [0, "x"], "scale": 1}],
     'entry 1 (ObservationNorm) loc must be a finite number (got [0, "x"])'),
    ([{"name": "ObservationNorm"}, {"name": "Resize", "w": 8}],
     "entry 1 (ObservationNorm of the synced statistics) is applied to the observations as they "
     "are used, after every transform, but entries 2 (Resize) change them after it"),
    ([{"name": "ObservationNorm", "clip": 3}], "entry 1 (ObservationNorm without loc and scale: the "
                                               "synced statistics of env.normalize_obs) takes no "
                                               "options (got clip)"),
    ([7], 'env.transforms must be a list of objects (got [7])'),
])
def test_a_bad_entry_is_named_with_what_is_wrong(entries: list[Any], expected: str) -> None:
    assert expected in problems_of(entries)


def test_every_bad_entry_is_reported_at_once() -> None:
    message = problems_of([{"name": "Resize"}, {"name": "GrayScale"}, {"name": "Nope"}])
    assert "entry 1 (Resize) needs the option w" in message and "entry 3 names" in message
    assert "entry 2" not in message


def test_the_synced_observation_norm_is_env_normalize_obs_and_stays_out_of_the_env() -> None:
    cfg = config_from_dict({"env": {"transforms": [{"name": "RewardScaling", "scale": 2.0},
                                                   {"name": "ObservationNorm"}]}})
    assert cfg.env.normalize_obs  # the worker's act and the trainer's batches normalise
    compose = compose_from_config(cfg.env.transforms)
    assert compose is not None and [type(t).__name__ for t in compose.transforms] == ["RewardScaling"]
    assert not config_from_dict({"env": {"transforms": [{"name": "StepCounter"}]}}).env.normalize_obs


def test_the_gym_pipeline_builds_its_env_through_the_transforms() -> None:
    cfg = config_from_dict({"env": {"id": "Pendulum-v1", "transforms": [
        {"name": "ObservationNorm", "loc": [0, 0, 0], "scale": [1, 1, 0.125]},
        {"name": "FrameSkipTransform", "frame_skip": 2}, {"name": "StepCounter", "max_steps": 4}]}})
    env = make_pipeline(cfg).env_cls()  # what the worker, the trainer and --check-env build
    assert env.observation_space.high.tolist() == [1, 1, 1]  # the velocity's [-8, 8] scaled
    env.reset(seed=0)
    truncated = [env.step(env.action_space.sample())[3] for _ in range(4)]
    assert truncated == [False, False, False, True]
    env.close()


def test_the_image_pipeline_stacks_frames_with_cat_frames_as_its_env_did() -> None:
    """Behaviour kept: the pipeline's env (one frame a step, CatFrames(4)) gives the
    observations ImageReachEnv(stack=4) gives."""
    ours = make_pipeline(config_from_dict({"env": {"pipeline": "image"}})).env_cls()
    theirs = ImageReachEnv(stack=4)
    assert ours.observation_space == theirs.observation_space
    assert np.array_equal(ours.reset(seed=5)[0], theirs.reset(seed=5)[0])
    rng = np.random.default_rng(0)
    for _ in range(60):
        a = rng.uniform(-1, 1, 2).astype(np.float32)
        mine, other = ours.step(a), theirs.step(a)
        assert np.array_equal(mine[0], other[0]) and mine[1:4] == other[1:4]
        if mine[2] or mine[3]:
            assert np.array_equal(ours.reset()[0], theirs.reset()[0])


def test_the_image_pipeline_sizes_its_memory_for_resized_frames_and_refuses_others() -> None:
    cfg = config_from_dict({"env": {"pipeline": "image", "transforms": [
        {"name": "Resize", "w": 32, "h": 24}, {"name": "FrameSkipTransform", "frame_skip": 2}]}})
    pipeline = make_pipeline(cfg)
    assert pipeline.memory_cls.keywords["frame_shape"] == (24, 32)  # type: ignore[attr-defined]
    assert pipeline.env_cls().observation_space.shape == (4, 24, 32)
    cfg = config_from_dict({"env": {"pipeline": "image", "transforms": [{"name": "GrayScale"}]}})
    with pytest.raises(ConfigError, match=r'GrayScale.*env.pipeline "image" draws 64x64 gray'):
        make_pipeline(cfg)


def test_the_drone_pipeline_refuses_transforms_its_action_buffer_cannot_follow() -> None:
    cfg = config_from_dict({"env": {"pipeline": "drone", "transforms": [
        {"name": "RewardScaling", "scale": 2.0}, {"name": "FrameSkipTransform", "frame_skip": 2}]}})
    with pytest.raises(ConfigError, match=r"FrameSkipTransform\(frame_skip=2\), but env.pipeline "
                                          r'"drone" drops rtgym\'s action buffer'):
        make_pipeline(cfg)


# -- a real worker run -----------------------------------------------------------------------------
class Frames(gymnasium.Env[Any, Any]):
    """An RGB camera whose frame at step t has the channels t, 2t, 3t (mod 256); reward t."""

    def __init__(self) -> None:
        self.observation_space = gymnasium.spaces.Box(0, 255, (3, 8, 8), np.uint8)
        self.action_space = gymnasium.spaces.Box(-1, 1, (1,), np.float32)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.stack([np.full((8, 8), (k * self.t) % 256, np.uint8) for k in (1, 2, 3)])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        return self._obs(), float(self.t), False, False, {}


class Shapes(ActorModule):
    """Records the observation shapes act() gets."""

    def __init__(self, observation_space: Any, action_space: Any) -> None:
        super().__init__(observation_space, action_space)
        self.p = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, ...]] = []

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        self.seen.append(tuple(obs.shape))
        return np.zeros((obs.shape[0], 1), np.float32)


def test_a_worker_steps_its_envs_through_the_configured_transforms() -> None:
    cfg = config_from_dict({"env": {"transforms": [
        {"name": "GrayScale"}, {"name": "Resize", "w": 4, "h": 4}, {"name": "FrameSkipTransform",
                                                                    "frame_skip": 2},
        {"name": "RewardScaling", "scale": 0.5}, {"name": "StepCounter", "max_steps": 3}]}})
    compose = compose_from_config(cfg.env.transforms)
    assert compose is not None
    worker = RolloutWorker(transformed(Frames, compose), Shapes, seed=0, num_envs=2, run_dir=None,
                           min_samples_per_worker_packet=5)
    worker.local_packets = []
    worker.start()
    try:
        worker.run(0, nb_episodes=4)
        worker.sink.send()
        packets: list[Buffer] = [over_the_wire(b) for b in worker.local_packets]
    finally:
        worker.close()
    assert set(worker.actor.seen) == {(2, 1, 4, 4)}  # the actor sees the transformed frames
    rows = [(b.obs[i], float(b.rew[i]), bool(b.truncated[i]), bool(b.reset[i]))
            for b in packets for i in np.flatnonzero(~b.context)]
    assert len(rows) >= 16 and all(obs.shape == (1, 4, 4) and obs.dtype == np.uint8
                                   for obs, *_ in rows)
    for obs, rew, truncated, reset in rows:
        # the agent's step k holds env steps 2k - 1 and 2k: the frame of t = 2k, half their sum
        k = 0 if reset else round((2 * rew + 1) / 4)
        t = 2 * k
        assert reset or rew == 0.5 * ((2 * k - 1) + 2 * k)
        gray = np.rint(0.2989 * (t % 256) + 0.587 * (2 * t % 256) + 0.114 * (3 * t % 256))
        assert (obs == gray).all(), (k, obs[0, 0, 0], gray)
        assert truncated == (k == 3)  # StepCounter's max_steps, in agent steps
    assert {round((2 * r + 1) / 4) for _, r, _, reset in rows if not reset} == {1, 2, 3}
