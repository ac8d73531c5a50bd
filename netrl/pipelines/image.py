"""The image pipeline: ImageReach seen as 4 stacked 64x64 grayscale frames, one
frame sent per step, CNN SAC.

::

    worker:  ImageReach-v0 (OpenCV, no display) -> a (1, 64, 64) uint8 frame -> env.transforms
             -> CatFrames(4) -> obs (4, 64, 64) -> FrameStackCompressor -> newest frame
    wire:    one frame per row (+4 context rows per packet), zstd packet compression by default
    trainer: FrameStackMemory (each frame stored once, stacks rebuilt per batch)
             -> SAC with CNNActorCritic

Settings are module constants; :func:`image_pipeline` takes them as arguments for tests
and benchmarks. Size the replay memory for images: ``memory.memory_size`` rows cost 4 KB
each (100,000 rows: 400 MB).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from netrl.agents.cnn import CNNActor, CNNActorCritic
from netrl.agents.common.encoders import EncoderHead
from netrl.config.sections import Config
from netrl.envs.gym import GenericGymEnv
from netrl.envs.image import ENV_ID
from netrl.envs.transforms import CatFrames, Compose, compose_from_config, transformed
from netrl.errors import ConfigError
from netrl.memory.frames import FrameCodec, FrameStackCompressor, FrameStackMemory
from netrl.pipelines.algorithms import Parts, recurrent_sac, sac_agent
from netrl.pipelines.base import Pipeline
from netrl.util import partial

__all__ = ["FRAME_CODEC", "FRAME_SIZE", "STACK", "image_pipeline"]

STACK = 4  # frames per observation
FRAME_SIZE = 64  # pixels per side
FRAME_CODEC: FrameCodec = "raw"  # per-frame codec on the worker: raw (zstd on the wire does
                                 # the rest), png, jpeg
JPEG_QUALITY = 90
ENCODER_HEAD: EncoderHead = "keypoints"  # "keypoints" (spatial softmax) or "linear"


def image_pipeline(cfg: Config, *, stack: int = STACK, size: int = FRAME_SIZE, codec: FrameCodec = FRAME_CODEC,
                   quality: int = JPEG_QUALITY, env_kwargs: dict[str, Any] | None = None,
                   head: EncoderHead = ENCODER_HEAD) -> Pipeline:
    """Build the image pipeline (``env_kwargs`` go to :class:`~netrl.envs.image.ImageReachEnv`):
    CNN SAC, or with ``agent.recurrent`` the recurrent SAC with the CNN encoder before its core,
    on sequences of ``memory.sequence_length`` rows."""
    hidden = tuple(cfg.agent.hidden_sizes)
    # the env draws one frame a step; env.transforms (a Resize, a FrameSkipTransform...) see it,
    # then CatFrames stacks the frames the agent saw
    gym_kwargs = {"size": size, **(env_kwargs or {}), "stack": 1}
    frame_shape = (gym_kwargs["size"], gym_kwargs["size"])
    user = compose_from_config(cfg.env.transforms)
    if user is not None:
        frame_shape = _transformed_frames(user, frame_shape)
    transform = Compose(*(user.transforms if user is not None else ()), CatFrames(stack, dim=-3))
    env_cls = transformed(partial(GenericGymEnv, id=f"netrl.envs.image:{ENV_ID}",
                                  gym_kwargs=gym_kwargs), transform)
    memory = partial(FrameStackMemory, stack=stack, frame_shape=frame_shape)
    if cfg.agent.recurrent is not None:
        parts = recurrent_sac(cfg, memory, encoder="cnn", head=head)
    else:
        parts = Parts(partial(CNNActor, hidden_sizes=hidden, head=head), memory,
                      sac_agent(cfg, partial(CNNActorCritic, hidden_sizes=hidden, head=head)))
    return Pipeline(
        env_cls=env_cls,
        **parts._asdict(),
        sample_compressor=FrameStackCompressor(codec, quality),
        overlap=stack,  # the first transition of a packet reads `stack` rows back
    )


def _transformed_frames(transform: Compose, frame_shape: tuple[int, int]) -> tuple[int, int]:
    """The frame shape after ``env.transforms``; ConfigError unless they leave one uint8 frame
    (a Resize does; a GrayScale or an ObservationNorm has nothing to apply to)."""
    space = gymnasium.spaces.Box(0, 255, (1, *frame_shape), np.uint8)
    try:
        out = transform.transform_observation_space(space)
    except ValueError as exc:
        raise ConfigError([f'env.transforms: {exc} (env.pipeline "image" draws '
                           f"{frame_shape[0]}x{frame_shape[1]} gray frames)"]) from None
    if not (isinstance(out, gymnasium.spaces.Box) and out.dtype == np.uint8
            and len(out.shape) == 3 and out.shape[0] == 1):
        raise ConfigError([f'env.transforms turn env.pipeline "image"\'s frames into {out}; '
                           f"its memory stores (1, H, W) uint8 frames, stacked"])
    return int(out.shape[1]), int(out.shape[2])
