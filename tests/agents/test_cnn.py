"""The CNN encoder: the frames it takes."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest


def test_the_cnn_encoder_refuses_frames_it_would_scale_wrongly() -> None:
    # forward() divides by 255: a float [0, 1] image space, if accepted, would reach it 255 times too small.
    from netrl.agents.common.encoders import ConvEncoder

    with pytest.raises(ValueError, match=r"ConvEncoder takes uint8 frames \(0-255\), which it scales to \[0, 1\] \(got "
                                         r"a float32 space"):
        ConvEncoder(gymnasium.spaces.Box(0.0, 1.0, (4, 64, 64), np.float32))
    assert ConvEncoder(gymnasium.spaces.Box(0, 255, (4, 64, 64), np.uint8)).features == 64
