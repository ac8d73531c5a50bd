"""The learning rows of the drone and image pipelines by env steps (issue 44's learning claims),
each variant stopped at a fixed env-step budget and judged on its frozen policy at the same env
steps, on its own pipeline's env:

* **drone-pomdp**: rtgym's dummy RC drone at 20 Hz (50 ms steps) with the worker's default packets
  (``worker.min_samples_per_worker_packet`` 20, ``max_packet_delay_s`` 0.5: about 10 rows a
  packet, so a sequence of 16 spans two or three). The drone flies at the velocity it was last
  commanded, obeyed after 20-50 ms and seen after as long again; its observation has no velocity
  leaf, and the drone pipeline's 4-action buffer (the commands in flight) is what tells it. The
  partially observed variants hide that buffer (rtgym's ``act_in_obs`` False: the observation is
  ``(x, y, target_x, target_y)``, position alone), so the velocity must be inferred from past
  positions. Variants: ``full-mlp`` (the drone pipeline as shipped, the MLP SAC, the reference),
  ``pomdp-recurrent`` (the recurrent SAC, a GRU of 64, sequences of 16 with 4 of burn-in, batches
  of 32, judged) and ``pomdp-mlp`` (the MLP SAC without the buffer: what memory adds). Judge:
  every 1,000 env steps (counted by the server), 10 deterministic episodes of 100 steps (5 s)
  at most; done at a mean return >= -15 (a mean distance to the target under 0.15, where random
  actions score about -85). Target: ``pomdp-recurrent``'s median within 2x ``full-mlp``'s env
  steps. Budget 20,000 env steps (about 17 minutes of real time per run).
* **image-nstep-per**: the image pipeline (ImageReach from 4x64x64 frames, the CNN SAC) with
  ``memory.n_step`` 3 and ``memory.prioritized`` (alpha 0.6, beta 0.4 annealed to 1 over 10,000
  training steps) beside plain replay. Judge: every 500 env steps (server), 10 deterministic
  episodes; done at a mean return >= -8 (the minutes-long image row's trained policy: -4.2;
  random actions: -53). Target: the n-step prioritized median at most 1.0x plain replay's env
  steps. Budget 30,000 env steps.

Both take the trainer and memory settings of the minutes-long ``drone`` and ``image`` rows
(benchmarks/learning/pipelines.py), except the drone's update-to-data cap (2 here against 4):
the recurrent SAC cannot train 80 steps a second on a shared core, and every variant gets the
same cap. The drone's worker is exempt from pacing (``server.unpaced_workers``, as a real-time
env must be), so a trainer slower than the cap trains less per env step: each run's result
keeps the trainer's ``steps_per_sample`` to show it.
"""

from __future__ import annotations

from typing import Any

from benchmarks.learning.loop import Judge
from benchmarks.learning.pipelines import SETTINGS
from benchmarks.learning.rows import RECURRENT, Changes, LearningRow, processes
from netrl.config.sections import Config
from netrl.pipelines.base import Pipeline

POMDP_PIPELINE = "benchmarks.learning.replay_rows:drone_pomdp_pipeline"

DRONE: Changes = {
    "env": {"pipeline": "drone"},
    # a real-time env cannot wait: its worker (CURVE key "worker") is not paced by the trainer
    "server": {"unpaced_workers": ["worker"]},
    "trainer": {**SETTINGS["drone"]["trainer"], "max_training_steps_per_env_step": 2.0,
                "epochs": 100_000, "rounds": 1},
    "memory": dict(SETTINGS["drone"]["memory"]),
}
HIDDEN: Changes = {"env": {"pipeline": POMDP_PIPELINE}}
IMAGE: Changes = {
    "env": {"pipeline": "image"},
    "trainer": {**SETTINGS["image"]["trainer"], "epochs": 100_000, "rounds": 1},
    "memory": dict(SETTINGS["image"]["memory"]),
}
NSTEP_PER: Changes = {"memory": {"n_step": 3, "prioritized": True, "priority_alpha": 0.6,
                                 "priority_beta": 0.4, "priority_beta_steps": 10_000}}


def drone_pomdp_pipeline(cfg: Config) -> Pipeline:
    """The drone pipeline without rtgym's action buffer in the observation (``act_in_obs``
    False): ``(x, y, target_x, target_y)``. Nothing to compress away or rebuild, so plain ring
    memory: the MLP SAC, or with ``agent.recurrent`` the recurrent SAC on sequences."""
    from netrl.pipelines.algorithms import recurrent_sac, sac
    from netrl.pipelines.drone import ENV_ID, drone_env, drone_rtgym_config
    from netrl.util import partial

    rtgym_config = {**drone_rtgym_config(), "act_in_obs": False}
    parts = recurrent_sac(cfg) if cfg.agent.recurrent is not None else sac(cfg)
    return Pipeline(env_cls=partial(drone_env, ENV_ID, rtgym_config), **parts._asdict(),
                    realtime=True)


def merged(*changes: Changes) -> dict[str, dict[str, Any]]:
    """The config keys ``changes`` set, in order (what a variant ran with, over the base)."""
    out: dict[str, dict[str, Any]] = {}
    for change in changes:
        for section, keys in change.items():
            out.setdefault(section, {}).update(keys)
    return out


def pipeline_rows(small: Changes) -> dict[str, LearningRow]:
    """The two rows, with ``small`` (the --start-training option) over each variant."""
    drone = {"full-mlp": (DRONE, small), "pomdp-recurrent": (DRONE, HIDDEN, RECURRENT, small),
             "pomdp-mlp": (DRONE, HIDDEN, small)}
    image = {"plain": (IMAGE, small), "nstep3-prioritized": (IMAGE, NSTEP_PER, small)}
    return {
        "drone-pomdp": LearningRow(
            "rtgym drone at 20 Hz, default packets: recurrent SAC without the action buffer "
            "(velocity unobserved) beside the MLP SAC with it, three processes",
            Judge(-15.0, None, 1000, 10),
            {name: processes(*c, count="server") for name, c in drone.items()}, 20_000,
            "full-mlp", judged=("pomdp-recurrent",), target_ratio=2.0,
            params={name: merged(*c) for name, c in drone.items()}),
        "image-nstep-per": LearningRow(
            "ImageReach from 4x64x64 frames, CNN SAC with 3-step returns and prioritized replay "
            "beside plain replay, three processes", Judge(-8.0, None, 500, 10),
            {name: processes(*c, count="server") for name, c in image.items()}, 30_000,
            "plain", judged=("nstep3-prioritized",), target_ratio=1.0,
            params={name: merged(*c) for name, c in image.items()}),
    }
