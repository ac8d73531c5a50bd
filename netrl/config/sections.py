"""The sections of config.json as frozen dataclasses: every setting, its default, its
``help`` line and its check.

Loaded once in ``__main__`` (:func:`netrl.config.load.load_config`) and passed down. The field
checks live in :mod:`netrl.config.checks`; turning parsed JSON into the dataclasses (type
conversion, unknown keys) in :mod:`netrl.config.build`; reading the file and the rules between
fields in :mod:`netrl.config.load`.

Secrets (CURVE secret keys, the wandb API key) never live here: they come from
files or environment variables.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from netrl.config.agent import AgentConfig
from netrl.config.build import setting as _f
from netrl.config.checks import (
    between,
    env_transforms,
    file_name,
    folder,
    ge,
    gt,
    hidden_indices,
    home,
    host,
    info_keys,
    nonempty,
    optional,
    optional_folder,
    pipeline_name,
    port,
    torch_device,
)
from netrl.config.memory import MemoryConfig
from netrl.envs.transform_config import synced_obs_norm
from netrl.protocol.codecs import Codec
from netrl.protocol.messages import MAX_SECONDS, MIN_MESSAGE_BYTES, PEER_NAME, PEER_NAME_RULE

__all__ = [
    "FLAG_KEYS",
    "AgentConfig",
    "Config",
    "EnvConfig",
    "MemoryConfig",
    "NetworkConfig",
    "ServerConfig",
    "TrainerConfig",
    "WandbConfig",
    "WorkerConfig",
    "describe_fields",
    "flag_for",
]

CONFIG_VERSION = 1
Problem = tuple[tuple[str, ...], str]  # (the key paths involved, the message)

# The command-line flags that set a config key (argparse's name for each flag -> the key it
# sets). Messages that tell the user to change one of these keys name the flag too: the
# user may have set it either way.
FLAG_KEYS = {"server_ip": "network.server_ip", "bind_ip": "server.bind_ip", "trainer_port": "network.trainer_port",
             "worker_port": "network.worker_port", "status_port": "server.status_port", "run_name": "run_name",
             "worker_id": "worker.worker_id", "wandb": "wandb.mode", "epochs": "trainer.epochs",
             "total_frames": "trainer.total_frames", "keys_dir": "keys_dir"}


def flag_for(key: str) -> str | None:
    """The command-line flag that sets config key ``key`` (``--worker-port``), or
    None if no flag does."""
    return next((f"--{dest.replace('_', '-')}" for dest, k in FLAG_KEYS.items() if k == key), None)


@dataclass(frozen=True)
class EnvConfig:
    pipeline: str = _f(
        "gym", 'ready-made pipeline: gym (any Gymnasium id: SAC for continuous '
               'actions, DQN for discrete ones), drone, image; or your own, as '
               '"module:function" (see docs/configuration.md)', pipeline_name)
    id: str = _f("Pendulum-v1", "Gymnasium env id used by the gym pipeline", nonempty)
    kwargs: dict[str, Any] = _f({}, "keyword arguments passed to gymnasium.make")
    hide_obs: list[int] = _f([], "gym pipeline: indices of the flat observation left out (a "
                                 "partially observed env, e.g. [2] hides Pendulum-v1's "
                                 "angular velocity; see netrl.envs.pomdp)", hidden_indices)
    info_keys: list[dict[str, Any]] = _f(
        [], "entries of the env's info the trainer's batches carry as "
            'batch.extra["info/<name>"], each {"name", "dtype", "shape", "default"} (all but '
            "name optional: float32, [], none; see docs/pipelines.md), added to the pipeline's",
        info_keys)
    normalize_obs: bool = _f(False, "normalise each float Box leaf of the observation by "
                                    "running statistics of the samples the trainer receives, "
                                    "published to the workers as the model obs_norm "
                                    "(docs/weights.md); the memory keeps raw observations")
    normalize_obs_clip: float = _f(10.0, "normalised observations are clipped to [-clip, clip]",
                                   gt(0))
    normalize_obs_every: int = _f(0, "training steps between publications of the observation "
                                     "statistics (0: with every policy publication)", ge(0))
    transforms: list[dict[str, Any]] = _f(
        [], 'transforms around every env, in order, with TorchRL\'s names: objects such as '
            '{"name": "Resize", "w": 84, "h": 84}; Resize, PermuteTransform, GrayScale, '
            'CatFrames, FrameSkipTransform, '
            'RewardScaling, RewardClipping, ObservationNorm (without loc and scale: the synced '
            'statistics, turns normalize_obs on), StepCounter (see docs/transforms.md)',
        env_transforms)

    def __post_init__(self) -> None:
        # an ObservationNorm of the synced statistics is env.normalize_obs, which the worker
        # and the trainer read (frozen: set once, here)
        if synced_obs_norm(self.transforms) and not self.normalize_obs:
            object.__setattr__(self, "normalize_obs", True)


def seconds(v: float) -> str | None:
    """An interval, delay or timeout: ZeroMQ takes some as 32-bit milliseconds, and a
    wait beyond threading.TIMEOUT_MAX (a worker's flush_timeout_s of 1e12) would stop a
    role with OverflowError."""
    return None if 0 < v <= MAX_SECONDS else f"must be > 0 and at most {MAX_SECONDS:g} (a day)"


def seconds_or_zero(v: float) -> str | None:
    """As :func:`seconds`, where 0 means none (no wait, no status lines)."""
    return None if 0 <= v <= MAX_SECONDS else f"must be >= 0 and at most {MAX_SECONDS:g} (a day)"


# (netrl.protocol.wire.FORMAT_NAME; checked at start)
_WEIGHT_FORMAT = re.compile(r"[a-z][a-z0-9_]{0,31}")


@dataclass(frozen=True)
class NetworkConfig:
    server_ip: str = _f("127.0.0.1", "address the worker and the trainer connect to", host)
    trainer_port: int = _f(55555, "server port the trainer connects to", port)
    worker_port: int = _f(55556, "server port the workers connect to", port)
    heartbeat_interval_s: float = _f(0.5, "seconds between heartbeats in both directions", seconds)
    heartbeat_liveness: int = _f(6, "missed heartbeats before a peer is declared lost", ge(2))
    reconnect_initial_s: float = _f(0.25, "first reconnect delay; doubles up to reconnect_max_s",
                                    seconds)
    reconnect_max_s: float = _f(8.0, "longest reconnect delay", seconds)
    max_message_bytes: int = _f(256 * 2**20, "largest message any socket accepts (a sample packet "
                                             "may use all but 32 KiB of it: the room for the "
                                             "server's bundle header)", ge(MIN_MESSAGE_BYTES))
    handshake_timeout_s: float = _f(10.0, "seconds a new connection has to finish "
                                          "its handshake before it is closed (bounds "
                                          "what half-open connections hold)", seconds)
    weight_format: str = _f("adaptive", "how the trainer sends weights: float32 (exact), float16, "
                                        "bfloat16, int8, delta (float32 plus the difference to "
                                        "the version before, compressed: exact), auto (float32, "
                                        "float16 and int8, each with deltas; the server picks "
                                        "per worker by its link rate), adaptive (float32 alone, "
                                        "as fast as float32 on a fast link, and auto's formats "
                                        "while the server measures a worker's link too slow to "
                                        "carry float32 within weight_budget_s: what a lossy link "
                                        "behind a loss-based TCP needs, docs/benchmarks/links.md), "
                                        "or a format registered with "
                                        "netrl.protocol.weight_formats.register_format",
                            lambda v: None if _WEIGHT_FORMAT.fullmatch(v) else
                            "must be float32, float16, bfloat16, int8, "
                            "delta, auto, adaptive or a registered format's name")
    weight_budget_s: float = _f(0.0, "weight_format auto and adaptive: the time one version may "
                                     "take to reach a worker (the server sends each worker the "
                                     "most exact format its measured link rate allows in it); 0: "
                                     "the time between publications of the model, so that "
                                     "workers keep up (1 s until it is known)",
                                between(0.0, 3600))


@dataclass(frozen=True)
class ServerConfig:
    bind_ip: str = _f("127.0.0.1", "interface the server binds (0.0.0.0 for all)", host)
    min_samples_per_server_packet: int = _f(100, "samples the server bundles before "
                                                 "sending to the trainer", ge(1))
    max_bundle_bytes: int = _f(4 * 2**20, "beyond min_samples_per_server_packet, a bundle takes "
                                          "packets already waiting up to this size (fewer "
                                          "messages and acknowledgements under load)", ge(1))
    max_packet_delay_s: float = _f(0.05, "longest a sample waits at the server "
                                         "for a bundle to fill", seconds)
    max_queue_bytes: int = _f(64 * 2**20, "sample data the server holds in "
                                          "memory before spooling to disk", ge(1))
    spool_after_s: float = _f(2.0, "if the trainer takes nothing for this "
                                   "long, waiting packets are spooled",
                               seconds)
    spool_dir: str | None = _f(None, "where the server spools packets "
                                     "(null: <weights_folder>/server-spool)",
                               optional_folder, home)
    spool_max_bytes: int = _f(2**30, "spool size cap; beyond it workers are told to hold "
                                     "their packets (the folder may also keep up to a "
                                     "quarter more in emptied 64 MB files for reuse)", ge(0))
    fsync: bool = _f(False, "fsync every spooled packet (survives "
                            "power loss, not just a crash; slower)")
    status_port: int = _f(55557, "loopback-only port that answers python -m netrl --status", port)
    max_weights_bytes: int = _f(2**30, "largest weight version the server caches and relays "
                                       "(an actor of 10M float32 parameters is 40 MB; two "
                                       "versions may be held while a new one arrives)", ge(1))
    max_workers: int = _f(1000, "workers connected at once; a new worker beyond it is "
                                "refused with a message naming this key (a connected "
                                "worker saying HELLO again keeps its place)", ge(1))
    max_rows_per_packet: int = _f(65_536, "most rows a sample packet may hold, whatever a "
                                          "worker declares at HELLO (a worker's own bound is "
                                          "its worker.min_samples_per_worker_packet plus a few "
                                          "context rows); the trainer applies it too", ge(1))
    unpaced_workers: list[str] = _f([], "worker keys exempt from the trainer's pacing (without "
                                        "CURVE: worker names): real-time workers whose env "
                                        "cannot wait (a robot, the drone pipeline); a HELLO "
                                        "saying paced false is honoured for these alone (the "
                                        "shared key's name, \"worker\", names every worker "
                                        "using it)", lambda v: None if all(
                                            PEER_NAME.fullmatch(n) for n in v) else
                                        f"must list worker key names ({PEER_NAME_RULE})")


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: str | None = _f(None, "name of this worker in logs, status and its "
                                     "file names (default: the host name; <host>-2, "
                                     "-3... for more workers on one machine)",
                               optional(lambda v: None if PEER_NAME.fullmatch(v) else f"must be {PEER_NAME_RULE}"))
    device: str = _f("cpu", "inference device of the worker's policy", torch_device)
    min_samples_per_worker_packet: int = _f(20, "samples the worker gathers "
                                                "before sending a packet", ge(1))
    max_packet_delay_s: float = _f(0.5, "longest a sample waits at the worker "
                                        "for its packet to fill", seconds)
    max_samples_per_episode: int | None = _f(None, "truncate episodes longer than this "
                                                   "(null: never)", optional(ge(1)))
    test_episode_interval: int = _f(10, "run a test episode every N training episodes (0: never)",
                                    ge(0))
    throttle: bool = _f(True, "pace a simulated env to the trainer's update-to-data ratio")
    model_history: int = _f(0, "also keep every N-th received weight version on disk (0: never)",
                            ge(0))
    max_backlog_bytes: int = _f(256 * 2**20, "unacknowledged packets kept for "
                                             "resending; oldest dropped beyond",
                                ge(1))
    send_window_bytes: int = _f(32 * 2**20, "unacknowledged packets in flight (acknowledged "
                                            "once the trainer has them: image packets at "
                                            "full speed need about 32 MB)", ge(1))
    flush_timeout_s: float = _f(2.0, "on stop, how long to wait for the "
                                     "last packets to be acknowledged",
                                 seconds_or_zero)
    env_timeout_factor: float = _f(50.0, "an env call (reset or step) running longer than "
                                         "this multiple of the mean of earlier ones (and "
                                         "env_timeout_min_s) is reported, and the worker stops "
                                         "with exit code 1; a thread of the env that dies "
                                         "stops it at once (time the process could not run "
                                         "the call, stopped or starved of CPU, does not count; "
                                         "0: no limit and no watchdog)",
                                   between(0.0, 1e6))
    env_timeout_min_s: float = _f(5.0, "no env call is declared hung sooner; the first reset "
                                       "and the first step may take env_timeout_factor times "
                                       "this (a game loading, a robot homing)", seconds)
    compression: Codec = _f("zstd", "packet codec for integer arrays such as images: "
                                    "zstd (fewest bytes), lz4 (less CPU, but "
                                    "finds little in noisy camera frames) or none")
    num_envs: int = _f(1, "copies of the pipeline's env one worker runs, stepped "
                          "together with one batched act() per step (each env keeps "
                          "its own episodes, test episodes and packet segments)", ge(1))
    vectorization: Literal["sync", "async"] = _f("sync", "how a worker with num_envs > 1 steps "
                                                         "its envs: sync (one after another in "
                                                         "the worker) or async (a process per "
                                                         "env, for envs whose step is slow)")
    init_random_frames: int = _f(0, "act uniformly at random from the action space until "
                                    "the trainer holds this many samples (TorchRL's "
                                    "collectors' name; SB3's learning_starts), then with the "
                                    "policy for good; never in test episodes (0: off, as "
                                    "random actions can be unsafe on real hardware)", ge(0))


@dataclass(frozen=True)
class TrainerConfig:
    epochs: int | None = _f(None, "epochs to train, a checkpoint written after each (null: until "
                                  "stopped, or until total_frames); an epoch is rounds x steps "
                                  "training steps", optional(ge(1)))
    rounds: int = _f(4, "rounds per epoch; metrics are logged after each", ge(1))
    steps: int = _f(1000, "training steps per round", ge(1))
    update_model_interval: int = _f(20, "training steps between weight publications", ge(1))
    update_buffer_interval: int = _f(20, "training steps between pulls of new samples into memory",
                                     ge(1))
    max_training_steps_per_env_step: float = _f(1.0, "update-to-data ratio: training "
                                                     "pauses above it", gt(0))
    start_training: int = _f(1000, "samples in memory before training starts", ge(0))
    worker_lead: int = _f(100, "samples workers may run ahead of the update-to-data ratio", ge(1))
    device: str | None = _f(None, "training device (null: cuda if available, else cpu)",
                            optional(torch_device))
    resume: bool = _f(True, "resume from the run's checkpoint when one exists")
    persist_samples: bool = _f(True, "log received packets to disk so a "
                                     "restart rebuilds the replay memory")
    fsync: bool = _f(False, "fsync the sample log and checkpoints (survives power loss; slower)")
    max_policy_lag: int | None = _f(None, "samples older than this many weight "
                                          "versions are stale (null: off); throttled "
                                          "workers are asked for none that would be",
                                    optional(ge(0)))
    stale_sample_weight: float = _f(0.0, "loss weight of stale samples (0: drop them)",
                                    between(0.0, 1.0))
    credit_window: int = _f(8, "bundles the server may send ahead of the training loop", ge(1))
    max_abs_reward: float | None = _f(None, "packets with a reward beyond this magnitude are "
                                            "refused (named and counted); null: the env's "
                                            "declared reward_range where it has one, else 1e6, "
                                            "and trainer.implausible judges rewards by what "
                                            "the workers send", optional(gt(0)))
    implausible: Literal["warn", "quarantine", "refuse"] = _f(
        "quarantine", "what a worker's packet of valid but implausible values gets (beyond "
                      "trainer.implausible_factor, or outside the env's declared reward_range; "
                      "counted and logged per worker): warn (trained on), quarantine (that "
                      "worker's rows kept aside, never sampled, until lifted or the run ends), "
                      "refuse (the trainer has the server revoke the worker's key)")
    implausible_factor: float = _f(200.0, "a reward or small observation value is implausible "
                                          "beyond this many robust scales (1.4826 MAD, at least "
                                          "a tenth of the median's magnitude and 1) from the "
                                          "median of recent rows", gt(1))
    max_nonfinite_steps: int = _f(100, "training steps in a row whose losses or weights are "
                                       "not finite (each one skipped and undone) before the "
                                       "trainer stops with exit code 1 (0: no such guard, "
                                       "and no copy of the agent's state each step)", ge(0))
    total_frames: int | None = _f(None, "training stops once this many env steps (samples) "
                                        "have arrived from all workers together, with a final "
                                        "checkpoint and policy and exit code 0 (TorchRL's "
                                        "collectors' name; null: no limit)",
                                  optional(ge(1)))
    collection: Literal["async", "sync"] = _f("async",
                                              "async: workers stream samples and the "
                                              "trainer trains from a replay memory as they "
                                              "arrive; sync: every batch is collected "
                                              "under one weight version, which the workers "
                                              "wait for (on-policy algorithms such as PPO)")
    frames_per_batch: int = _f(2048, "sync collection: env steps per batch, "
                                     "all under one weight version", ge(1))
    rollout_fragment_length: int = _f(256, "sync collection: env steps each env of a worker "
                                           "collects per version before it waits for the next one",
                                      ge(1))
    batch_mode: Literal["truncate_episodes", "complete_episodes"] = _f(
        "truncate_episodes", "sync collection: truncate_episodes (fragments of "
                             "rollout_fragment_length steps) or complete_episodes "
                             "(each env runs on to the end of its episode)")
    sync_timeout_s: float = _f(30.0, "sync collection: a batch is trained with what "
                                     "arrived after this long (the shortfall and the "
                                     "workers that did not deliver are logged)", gt(0))
    prefetch: bool = _f(True, "gather the next batch (and copy it to a CUDA device) "
                              "while the agent trains on this one; on a CPU trainer "
                              "only where a core is free beside torch_threads")
    compile: Literal["none", "compile", "cudagraphs"] = _f(
        "none", "how the agent's updates run: none (eager PyTorch), compile (torch.compile of "
                "SAC's whole update, or of DQN's and PPO's losses with their backward; "
                "the first steps take a while to compile) or cudagraphs (compile, plus "
                "CUDA graph capture: CUDA training devices only). The built-in SAC, DQN "
                "and PPO take it; results match eager within floating-point tolerance")


@dataclass(frozen=True)
class WandbConfig:
    mode: Literal["auto", "offline", "online", "disabled"] = _f(
        "auto", "wandb mode; auto is online when WANDB_API_KEY is set, offline otherwise")
    project: str = _f("netrl", "wandb project", nonempty)
    entity: str | None = _f(None, "wandb entity (team or user)")


@dataclass(frozen=True)
class Config:
    config_version: int = _f(CONFIG_VERSION, "version of this file's layout")
    run_name: str = _f("pendulum-sac", "name of the run; outputs go to "
                                       "<weights_folder>/<run_name>/", file_name)
    weights_folder: str = _f("weights", "folder for weights, checkpoints and metrics", folder, home)
    torch_threads: int = _f(1, "torch.set_num_threads in every netrl process", between(1, 1024))
    status_interval_s: float = _f(10.0, "seconds between each role's status lines (0: none)",
                                seconds_or_zero)
    # gymnasium and numpy refuse seeds < 0
    seed: int | None = _f(None, "random seed (null: random); each worker adds a number "
                                "made from its worker_id, so workers explore differently, "
                                "and each the same way every run", optional(ge(0)))
    security: Literal["curve", "none"] = _f("curve",
                                            "CurveZMQ encryption and key "
                                            "authentication; none is unsafe")
    keys_dir: str = _f("keys", "folder of CURVE keys (python -m netrl --keygen writes it)",
                       folder, home)
    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.weights_folder) / self.run_name

    @property
    def server_spool_dir(self) -> Path:
        """The folder a server started with this config spools into."""
        return Path(self.server.spool_dir) if self.server.spool_dir else Path(self.weights_folder) / "server-spool"


def describe_fields(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key path, default, help) for every field, used for docs/configuration.md and ``--help``."""
    rows: list[tuple[str, str, str]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            rows += describe_fields(typing.cast(type, hints[f.name]), key + ".")
            continue
        factory = f.default_factory
        default = factory() if callable(factory) else f.default
        rows.append((key, json.dumps(default), f.metadata.get("help", "")))
    return rows
