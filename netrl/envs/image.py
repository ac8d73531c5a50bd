"""ImageReach: a small image env for the image pipeline, rendered with OpenCV
and needing no display.

A point robot moves on a square table seen by an overhead 64x64 grayscale camera; it must reach a
target disc. The camera image is the only observation: a stack of the last ``stack`` frames,
``(stack, size, size)`` uint8, newest last, with ``stack`` copies of the first frame at reset (so a
memory can rebuild stacks from single frames, see :mod:`netrl.memory.frames`). Frames carry Gaussian
sensor noise (``noise``, in gray levels) over a fixed textured background, so that compression
figures resemble a real camera's rather than a flat synthetic image's.

* action: velocity command in ``[-1, 1]^2``, scaled by ``speed`` (world units per step;
  the table is ``[-1, 1]^2``)
* reward: minus the distance to the target; the episode terminates when the robot is within
  ``goal_radius`` and is truncated after ``max_steps`` steps

Import this module (or use the id ``"netrl.envs.image:ImageReach-v0"``) to
register ``ImageReach-v0``.
"""

from __future__ import annotations

import itertools
from typing import Any

import cv2
import gymnasium
import numpy as np
from gymnasium.envs.registration import register, registry

__all__ = ["ENV_ID", "ImageReachEnv"]

ENV_ID = "ImageReach-v0"


class ImageReachEnv(gymnasium.Env[np.ndarray, np.ndarray]):
    """Reach a target seen through a noisy 64x64 grayscale camera (see the module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(self, size: int = 64, stack: int = 4, max_steps: int = 50, noise: float = 3.0, speed: float = 0.1,
                 goal_radius: float = 0.12, render_mode: str | None = None) -> None:
        # the start is drawn over 3 goal radii from the target, inside [-0.85, 0.85]^2: at
        # most 0.85 * sqrt(2) away from a target at the centre, so a radius from 0.4 on has no start
        # there (reset() would loop for ever)
        if size < 16 or stack < 1 or max_steps < 1 or noise < 0 or speed <= 0 or not 0 < goal_radius < 0.4:
            raise ValueError(f"ImageReachEnv needs size >= 16, stack >= 1, max_steps >= 1, "
                             f"noise >= 0, speed > 0 and 0 < goal_radius < 0.4 (got "
                             f"size={size}, stack={stack}, max_steps={max_steps}, "
                             f"noise={noise}, speed={speed}, goal_radius={goal_radius})")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array' (got {render_mode!r})")
        self.size, self.stack, self.max_steps = size, stack, max_steps
        self.noise, self.speed, self.goal_radius = noise, speed, goal_radius
        self.render_mode = render_mode
        self.observation_space = gymnasium.spaces.Box(0, 255, (stack, size, size), np.uint8)
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self._background = _background(size)
        self._frames = np.zeros((stack, size, size), np.uint8)
        self._pos = np.zeros(2)
        self._target = np.zeros(2)
        self._steps = 0

    def _pixel(self, xy: np.ndarray) -> tuple[int, int]:
        """World coordinates to pixel centre, with 4 bits of sub-pixel precision
        for anti-aliased drawing."""
        scale = (self.size - 1) / 2 * 16
        return round((xy[0] + 1) * scale), round((xy[1] + 1) * scale)

    def _render_frame(self) -> np.ndarray:
        img = self._background.copy()
        r = self.size / 64
        cv2.circle(img, self._pixel(self._target), int(5 * r * 16), 230, -1, cv2.LINE_AA, shift=4)
        cv2.circle(img, self._pixel(self._pos), int(4 * r * 16), 20, -1, cv2.LINE_AA, shift=4)
        if self.noise > 0:
            noisy = img + self.np_random.normal(0.0, self.noise, img.shape)
            img = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
        return img

    def _observe(self, first: bool) -> np.ndarray:
        frame = self._render_frame()
        if first:
            self._frames[:] = frame
        else:
            self._frames[:-1] = self._frames[1:]
            self._frames[-1] = frame
        return self._frames.copy()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._target = self.np_random.uniform(-0.75, 0.75, 2)
        for tries in itertools.count(1):
            self._pos = self.np_random.uniform(-0.85, 0.85, 2)
            if np.linalg.norm(self._pos - self._target) > 3 * self.goal_radius:
                break
            # a large radius and a central target leave starts only in the far corners
            if tries % 1000 == 0:
                self._target = self.np_random.uniform(-0.75, 0.75, 2)
        self._steps = 0
        return self._observe(first=True), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = np.clip(np.asarray(action, np.float64).reshape(2), -1.0, 1.0)
        self._pos = np.clip(self._pos + self.speed * a, -1.0, 1.0)
        self._steps += 1
        dist = float(np.linalg.norm(self._pos - self._target))
        terminated = dist < self.goal_radius
        truncated = not terminated and self._steps >= self.max_steps
        return self._observe(first=False), -dist, terminated, truncated, {"distance": dist}

    def render(self) -> np.ndarray:
        """The newest frame as an RGB image (no window is ever opened)."""
        return np.repeat(self._frames[-1][:, :, None], 3, axis=2)


def _background(size: int) -> np.ndarray:
    """A fixed table texture: a soft diagonal gradient and a faint grid, like a
    floor under a camera."""
    y, x = np.mgrid[0:size, 0:size]
    img = 90 + 40 * (x + y) / (2 * size)
    img[(x % 16 == 0) | (y % 16 == 0)] += 25
    return img.astype(np.float64)


if ENV_ID not in registry:
    register(id=ENV_ID, entry_point="netrl.envs.image:ImageReachEnv")
