"""The image pipeline: ImageReach seen as 4 stacked 64x64 grayscale frames, one
frame sent per step, CNN SAC.

::

    worker:  ImageReach-v0 (OpenCV, no display) -> obs (4, 64, 64) uint8 -> FrameStackCompressor
             -> newest frame
    wire:    one frame per row (+4 context rows per packet), zstd packet compression by default
    trainer: FrameStackMemory (each frame stored once, stacks rebuilt per batch)
             -> SAC with CNNActorCritic

Settings are module constants; :func:`image_pipeline` takes them as arguments for tests
and benchmarks. Size the replay memory for images: ``memory.memory_size`` rows cost 4 KB
each (100,000 rows: 400 MB).
"""

from __future__ import annotations

from typing import Any

from netrl.agents.cnn import CNNActor, CNNActorCritic
from netrl.agents.common.encoders import EncoderHead
from netrl.config.sections import Config
from netrl.envs.gym import GenericGymEnv
from netrl.envs.image import ENV_ID
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
    gym_kwargs = {"size": size, "stack": stack, **(env_kwargs or {})}
    memory = partial(FrameStackMemory, stack=stack, frame_shape=(gym_kwargs["size"], gym_kwargs["size"]))
    if cfg.agent.recurrent is not None:
        parts = recurrent_sac(cfg, memory, encoder="cnn", head=head)
    else:
        parts = Parts(partial(CNNActor, hidden_sizes=hidden, head=head), memory,
                      sac_agent(cfg, partial(CNNActorCritic, hidden_sizes=hidden, head=head)))
    return Pipeline(
        env_cls=partial(GenericGymEnv, id=f"netrl.envs.image:{ENV_ID}", gym_kwargs=gym_kwargs),
        **parts._asdict(),
        sample_compressor=FrameStackCompressor(codec, quality),
        overlap=stack,  # the first transition of a packet reads `stack` rows back
    )
