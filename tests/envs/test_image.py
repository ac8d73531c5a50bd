"""ImageReach: stacks rendered without a display, the first frame repeated at a reset, and the goal reached."""

from __future__ import annotations

import numpy as np
import pytest

from netrl.envs.gym import GenericGymEnv
from netrl.envs.image import ENV_ID, ImageReachEnv


def test_env_renders_stacks_without_a_display_and_repeats_the_first_frame() -> None:
    env = GenericGymEnv(f"netrl.envs.image:{ENV_ID}", {"max_steps": 3})
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 64, 64) and obs.dtype == np.uint8
    assert all(np.array_equal(obs[0], obs[i]) for i in range(4))  # a reset stack repeats the first frame
    obs1, rew, _, _, info = env.step(np.array([1.0, 0.0], np.float32))
    np.testing.assert_array_equal(obs1[:3], obs[1:])  # stacks shift by one frame per step
    assert not np.array_equal(obs1[3], obs[3]) and rew == -info["distance"]
    env.step(np.zeros(2, np.float32))
    assert env.step(np.zeros(2, np.float32))[3]  # truncated after max_steps
    assert env.render().shape == (64, 64, 3)
    with pytest.raises(ValueError, match="noise >= 0"):
        ImageReachEnv(noise=-1)
    with pytest.raises(ValueError, match=r"0 < goal_radius < 0\.4 \(got .*goal_radius=0\.5\)"):
        ImageReachEnv(goal_radius=0.5)  # no start is 3 radii from a central target: reset() would loop for ever
    wide = ImageReachEnv(goal_radius=0.39)
    for seed in range(20):  # a central target leaves starts only in the corners: found, or another target drawn
        wide.reset(seed=seed)
        assert np.linalg.norm(wide._pos - wide._target) > 3 * 0.39


def test_env_reaches_the_goal_and_terminates() -> None:
    env = ImageReachEnv(max_steps=200)
    env.reset(seed=1)
    for _ in range(200):
        direction = env._target - env._pos
        _, rew, terminated, truncated, _ = env.step((direction / max(np.abs(direction).max(), 1e-9)).astype(
            np.float32))
        if terminated or truncated:
            break
    assert terminated and rew > -env.goal_radius
