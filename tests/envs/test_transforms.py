"""The env transforms (netrl.envs.transforms): each against a brute-force computation, their
composition, their spaces and the reward range a transformed env declares."""

from __future__ import annotations

import math
from typing import Any

import cv2
import gymnasium
import numpy as np
import pytest

from netrl.envs.transforms import (
    CatFrames,
    Compose,
    FrameSkipTransform,
    GrayScale,
    ObservationNorm,
    PermuteTransform,
    Resize,
    RewardClipping,
    RewardScaling,
    StepCounter,
    TransformedEnv,
)
from netrl.training.plausibility import declared_reward_range


class Counting(gymnasium.Env[Any, Any]):
    """Step t (from 1) gives the observation ``obs_fn(t)`` and the reward t; the episode
    terminates after ``length`` steps; every action is recorded."""

    def __init__(self, space: Any, obs_fn: Any, length: int = 5,
                 reward_range: tuple[float, float] | None = None) -> None:
        self.observation_space = space
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.obs_fn, self.length = obs_fn, length
        self.t = 0
        self.actions: list[float] = []
        if reward_range is not None:
            self.reward_range = reward_range

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.t = 0
        return self.obs_fn(0), {"reset": True}

    def step(self, action: Any) -> Any:
        self.t += 1
        self.actions.append(float(np.asarray(action).reshape(-1)[0]))
        return self.obs_fn(self.t), float(self.t), self.t >= self.length, False, {"t": self.t}


def scalar_env(length: int = 5, reward_range: tuple[float, float] | None = None) -> Counting:
    space = gymnasium.spaces.Box(-100.0, 100.0, (2,), np.float32)
    return Counting(space, lambda t: np.array([t, -t], np.float32), length, reward_range)


# -- Resize: each output pixel from its definition ------------------------------------------------
def brute_resize(x: np.ndarray, h: int, w: int, how: str) -> np.ndarray:
    """Each output pixel computed on its own from the interpolation's definition (float64)."""
    *lead, H, W = x.shape
    out = np.zeros((*lead, h, w))

    def taps(i: int, n_in: int, n_out: int) -> list[tuple[int, float]]:
        s = n_in / n_out
        if how == "nearest":
            return [(min(int(i * s), n_in - 1), 1.0)]
        if how == "bilinear":
            c = max((i + 0.5) * s - 0.5, 0.0)
            lo = min(int(c), n_in - 1)
            return [(lo, 1 - (c - lo)), (min(lo + 1, n_in - 1), c - lo)]
        a, b = i * s, (i + 1) * s  # area: the overlap of [a, b) with each input pixel
        return [(j, (min(b, j + 1) - max(a, j)) / s) for j in range(n_in)
                if min(b, j + 1) > max(a, j)]

    for i in range(h):
        for j in range(w):
            for yi, wy in taps(i, H, h):
                for xj, wx in taps(j, W, w):
                    out[..., i, j] += wy * wx * x[..., yi, xj].astype(np.float64)
    return out


@pytest.mark.parametrize("how", ["bilinear", "nearest", "area"])
@pytest.mark.parametrize("size", [(5, 7), (26, 34), (13, 17)])
def test_resize_matches_each_pixel_computed_alone(how: str, size: tuple[int, int]) -> None:
    rng = np.random.default_rng(0)
    h, w = size
    img = rng.integers(0, 256, (2, 13, 17), dtype=np.uint8)
    t = Resize(w, h, interpolation=how)  # type: ignore[arg-type]
    space = t.transform_observation_space(gymnasium.spaces.Box(0, 255, (2, 13, 17), np.uint8))
    assert space.shape == (2, h, w) and space.dtype == np.uint8
    got = t.observation(img)
    want = np.clip(np.rint(brute_resize(img, h, w, how)), 0, 255).astype(np.uint8)
    assert got.dtype == np.uint8 and np.array_equal(got, want)
    assert space.contains(got)
    flt = rng.uniform(-1, 1, (3, 13, 17)).astype(np.float32)
    tf = Resize(w, h, interpolation=how)  # type: ignore[arg-type]
    tf.transform_observation_space(gymnasium.spaces.Box(-1, 1, (3, 13, 17), np.float32))
    np.testing.assert_allclose(tf.observation(flt), brute_resize(flt, h, w, how), atol=1e-6)


def test_resize_agrees_with_opencv_where_they_define_the_same_thing() -> None:
    """OpenCV's INTER_LINEAR is bilinear with half-pixel centres; INTER_AREA shrinking by a
    whole factor is the block mean."""
    rng = np.random.default_rng(1)
    img = rng.uniform(0, 1, (1, 40, 60)).astype(np.float32)
    for how, flag, (w, h) in (("bilinear", cv2.INTER_LINEAR, (23, 17)),
                              ("area", cv2.INTER_AREA, (20, 10))):
        t = Resize(w, h, interpolation=how)  # type: ignore[arg-type]
        t.transform_observation_space(gymnasium.spaces.Box(0, 1, (1, 40, 60), np.float32))
        np.testing.assert_allclose(t.observation(img)[0], cv2.resize(img[0], (w, h),
                                                                      interpolation=flag),
                                   atol=1e-5)


def test_a_channels_last_image_is_permuted_then_resized_not_resized_as_w_by_c() -> None:
    """A (96, 96, 3) camera (CarRacing's) resized as if its last two axes were H and W would give
    (96, 84, 84) without a word: refused, naming the PermuteTransform that fixes it."""
    space = gymnasium.spaces.Box(0, 255, (96, 96, 3), np.uint8)
    with pytest.raises(ValueError, match=r"channels-last image \(H, W, C\): put a "
                                         r"PermuteTransform with dims \[-1, -3, -2\]"):
        Resize(84).transform_observation_space(space)
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)
    env = TransformedEnv(Counting(space, lambda t: img), Compose(PermuteTransform([-1, -3, -2]),
                                                                  GrayScale(), Resize(84)))
    assert env.observation_space.shape == (1, 84, 84)
    chw = PermuteTransform([-1, -3, -2])
    chw.transform_observation_space(space)
    moved = chw.observation(img)
    assert moved.shape == (3, 96, 96) and moved.flags.c_contiguous
    assert all(moved[c, i, j] == img[i, j, c] for c in range(3) for i in (0, 50, 95)
               for j in (0, 7, 95))
    with pytest.raises(ValueError, match=r"dims must be a reordering of -n \.\.\. -1"):
        PermuteTransform([-1, -1, -2])


# -- GrayScale, ObservationNorm, CatFrames -------------------------------------------------------
def test_grayscale_is_torchvisions_luma_per_pixel() -> None:
    rng = np.random.default_rng(2)
    img = rng.integers(0, 256, (3, 6, 5), dtype=np.uint8)
    t = GrayScale()
    space = t.transform_observation_space(gymnasium.spaces.Box(0, 255, (3, 6, 5), np.uint8))
    assert space.shape == (1, 6, 5)
    got = t.observation(img)
    for i in range(6):
        for j in range(5):
            r, g, b = (float(img[c, i, j]) for c in range(3))
            assert got[0, i, j] == np.rint(0.2989 * r + 0.587 * g + 0.114 * b)
    with pytest.raises(ValueError, match=r"GrayScale.*\(\.\.\., 3, H, W\)"):
        GrayScale().transform_observation_space(gymnasium.spaces.Box(0, 255, (4, 6, 5), np.uint8))


def test_observation_norm_is_affine_per_element_and_its_space_holds_the_values() -> None:
    space = gymnasium.spaces.Box(np.array([-1, 0, -5], np.float32), np.array([1, 2, 5], np.float32),
                                 dtype=np.float32)
    loc, scale = [0.5, -1.0, 2.0], [2.0, -0.5, 3.0]
    for standard in (False, True):
        t = ObservationNorm(loc, scale, standard_normal=standard)
        out_space = t.transform_observation_space(space)
        space.seed(3)
        for _ in range(200):
            x = space.sample()
            got = t.observation(x)
            for k in range(3):
                want = ((np.float32(x[k]) - np.float32(loc[k])) / np.float32(scale[k])
                        if standard else np.float32(x[k]) * np.float32(scale[k])
                        + np.float32(loc[k]))
                assert got[k] == want
            assert out_space.contains(got), (got, out_space)
    with pytest.raises(ValueError, match="scale must be a finite number other than 0"):
        ObservationNorm(0.0, [1.0, 0.0])


def test_cat_frames_stacks_the_last_n_with_copies_of_the_first_at_reset() -> None:
    space = gymnasium.spaces.Box(0, 255, (1, 2, 2), np.uint8)
    env = TransformedEnv(Counting(space, lambda t: np.full((1, 2, 2), t, np.uint8), length=9),
                         CatFrames(3, dim=-3))
    assert env.observation_space.shape == (3, 2, 2)
    seen = [env.reset()[0]]
    seen += [env.step(np.zeros(1))[0] for _ in range(4)]
    frames = [0, 0, 0, 1, 2, 3, 4]  # the env's frames, padded with the first
    for t, obs in enumerate(seen):
        assert [int(obs[c, 0, 0]) for c in range(3)] == frames[t:t + 3]
    assert [int(v) for v in env.reset()[0][:, 1, 1]] == [0, 0, 0]  # a reset starts over


# -- rewards and steps -----------------------------------------------------------------------------
def test_reward_scaling_and_clipping_are_torchrls_formulas() -> None:
    for r in (-7.5, -1.0, 0.0, 0.3, 12.0):
        assert RewardScaling(loc=1.5, scale=-2.0).reward(r) == r * -2.0 + 1.5
        assert RewardScaling(1.5, 4.0, standard_normal=True).reward(r) == (r - 1.5) / 4.0
        assert RewardClipping(-1.0, 0.5).reward(r) == min(max(r, -1.0), 0.5)
        assert RewardClipping(clamp_max=0.0).reward(r) == min(r, 0.0)
    with pytest.raises(ValueError, match="clamp_min must be <= clamp_max"):
        RewardClipping(1.0, -1.0)


def test_frame_skip_repeats_the_action_sums_rewards_and_stops_at_the_episode_end() -> None:
    inner = scalar_env(length=5)
    env = TransformedEnv(inner, FrameSkipTransform(3))
    env.reset()
    obs, rew, term, trunc, info = env.step(np.array([0.25], np.float32))
    assert rew == 1 + 2 + 3 and not (term or trunc) and info == {"t": 3}
    assert obs.tolist() == [3, -3]
    obs, rew, term, trunc, info = env.step(np.array([-0.5], np.float32))
    assert rew == 4 + 5 and term and not trunc and info == {"t": 5}  # 2 of 3 repeats
    assert inner.actions == [0.25] * 3 + [-0.5] * 2


def test_step_counter_counts_per_reset_and_truncates_at_max_steps() -> None:
    env = TransformedEnv(scalar_env(length=100), StepCounter(max_steps=3))
    assert env.reset()[1] == {"reset": True, "step_count": 0}
    steps = [env.step(np.zeros(1)) for _ in range(3)]
    assert [s[4]["step_count"] for s in steps] == [1, 2, 3]
    assert [s[3] for s in steps] == [False, False, True]
    env.reset()
    assert env.step(np.zeros(1))[4]["step_count"] == 1


# -- composition -----------------------------------------------------------------------------------
def test_compose_applies_in_list_order_the_first_next_to_the_env() -> None:
    rng = np.random.default_rng(4)
    frames = rng.integers(0, 256, (10, 3, 12, 16), dtype=np.uint8)
    space = gymnasium.spaces.Box(0, 255, (3, 12, 16), np.uint8)
    env = TransformedEnv(Counting(space, lambda t: frames[t], length=9),
                         Compose(GrayScale(), Resize(8, 6), FrameSkipTransform(2),
                                 RewardScaling(scale=0.5), RewardClipping(clamp_max=2.0),
                                 StepCounter()))
    assert env.observation_space.shape == (1, 6, 8)
    gray, small = GrayScale(), Resize(8, 6)
    small.transform_observation_space(gray.transform_observation_space(space))

    def want(t: int) -> np.ndarray:
        return small.observation(gray.observation(frames[t]))  # type: ignore[no-any-return]

    assert np.array_equal(env.reset()[0], want(0))
    obs, rew, _, _, info = env.step(np.zeros(1))
    # two env steps (rewards 1 and 2) scaled, summed (1.5), then clipped; one agent step counted
    assert np.array_equal(obs, want(2)) and rew == 1.5 and info["step_count"] == 1
    obs, rew, _, _, info = env.step(np.zeros(1))
    assert np.array_equal(obs, want(4)) and rew == 2.0 and info["step_count"] == 2  # 3.5 clipped
    # the other order: clipped per env step, then scaled
    other = TransformedEnv(scalar_env(9), Compose(RewardClipping(clamp_max=2.0),
                                                  RewardScaling(scale=0.5)))
    other.reset()
    assert [other.step(np.zeros(1))[1] for _ in range(3)] == [0.5, 1.0, 1.0]


def test_each_wrapped_env_has_its_own_transform_state() -> None:
    t = Compose(StepCounter(), CatFrames(2, dim=-1))
    a, b = TransformedEnv(scalar_env(9), t), TransformedEnv(scalar_env(9), t)
    a.reset()
    b.reset()
    for _ in range(3):
        a.step(np.zeros(1))
    assert b.step(np.zeros(1))[4]["step_count"] == 1
    assert b.step(np.zeros(1))[0].tolist() == [1, -1, 2, -2]  # [previous, newest]
    with pytest.raises(TypeError, match="wrap"):
        t.step(scalar_env(), np.zeros(1))


def test_leaves_of_a_tuple_observation_are_chosen_by_in_keys() -> None:
    space = gymnasium.spaces.Tuple((gymnasium.spaces.Box(0, 255, (1, 4, 4), np.uint8),
                                    gymnasium.spaces.Box(-1, 1, (2,), np.float32)))
    env = Counting(space, lambda t: (np.full((1, 4, 4), t, np.uint8),
                                     np.array([0.5, -0.5], np.float32)))
    wrapped = TransformedEnv(env, Compose(Resize(2, 2), ObservationNorm(1.0, 2.0,
                                                                        in_keys=["obs/1"])))
    assert wrapped.observation_space[0].shape == (1, 2, 2)  # Resize took the image leaf only
    img, vec = wrapped.reset()[0]
    assert img.shape == (1, 2, 2) and vec.tolist() == [2.0, 0.0]
    with pytest.raises(ValueError, match="no leaf obs/2"):
        TransformedEnv(env, ObservationNorm(in_keys=["obs/2"]))
    with pytest.raises(ValueError, match="cannot apply to observation leaf obs/0"):
        TransformedEnv(env, ObservationNorm(in_keys=["obs/0"]))


def test_a_transformed_env_declares_the_reward_range_its_rewards_keep_to() -> None:
    """The trainer refuses rewards outside the range an env declares: a scaled, clipped or
    summed reward must come with its own range (before, the env's range went through
    unchanged and a RewardScaling(scale=10) made every reward implausible)."""
    env = TransformedEnv(scalar_env(reward_range=(-1.0, 2.0)),
                         Compose(FrameSkipTransform(4), RewardScaling(loc=1.0, scale=-3.0),
                                 RewardClipping(clamp_min=-20.0)))
    lo, hi = declared_reward_range(env) or (math.nan, math.nan)
    assert (lo, hi) == (-20.0, 13.0)  # [-4, 8] summed, then -3x + 1: [-23, 13], clipped at -20
    assert declared_reward_range(TransformedEnv(scalar_env(), StepCounter())) is None
