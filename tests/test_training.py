"""The training loop in single-process mode: pacing holds the update-to-data ratio and learning runs."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from netrl.agents.cnn import CNNActorCritic
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.config.sections import Config
from netrl.envs.gym import GenericGymEnv
from netrl.errors import ConfigError
from netrl.local import run_local
from netrl.memory.frames import FrameStackMemory, encode_frame, encoded_capacity
from netrl.memory.replay import ReplayMemory
from netrl.monitor.metrics import MetricsLogger, format_round
from netrl.samples import Buffer, EpisodeStats
from netrl.storage import checkpoint
from netrl.storage.weight_files import read_weights_file
from netrl.trainer.trainer import Trainer
from netrl.training import TrainingSettings
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.fakes import ACT, OBS, ListSource


def pendulum_training(**kw: object) -> tuple[TrainingOffline, RolloutWorker]:
    env_cls = partial(GenericGymEnv, id="Pendulum-v1")
    training = TrainingOffline(env_cls=env_cls, memory_cls=ReplayMemory,
                               training_agent_cls=partial(SACAgent, model_cls=partial(MLPActorCritic,
                                                                                      hidden_sizes=(16,))),
                               epochs=1, rounds=2, steps=50, update_model_interval=10, update_buffer_interval=5,
                               start_training=64, worker_lead=8, memory_size=1000, batch_size=16, seed=0,
                               **kw)  # type: ignore[arg-type]
    worker = RolloutWorker(env_cls, partial(MLPActor, hidden_sizes=(16,)), min_samples_per_worker_packet=4,
                           max_samples_per_episode=30, seed=0)
    return training, worker


def test_local_training_holds_the_update_to_data_ratio() -> None:
    training, worker = pendulum_training(max_training_steps_per_env_step=2.0)
    rounds: list[dict] = []
    run_local(training, worker, threading.Event(), rounds.append)
    assert training.total_updates == 100
    # at most 2 updates per sample, and no more samples than the lead allows beyond that
    assert training.total_updates <= 2.0 * training.total_samples
    assert training.total_samples <= max(64, training.total_updates / 2) + 8 + 4
    assert sum(r["episodes"] for r in rounds) >= 1 and rounds[0]["lag_max"] is not None
    assert training.publisher is not None
    assert worker.version == training.publisher.version  # published weights reached the worker
    assert np.isfinite(rounds[-1]["loss_critic"])


def test_forced_truncation_is_not_terminal() -> None:
    training, worker = pendulum_training()
    run_local(training, worker, threading.Event())
    assert training.memory is not None
    ends = [training.memory.get_transition(i)[4:6] for i in range(len(training.memory))]
    assert (False, True) in ends  # max_samples_per_episode=30 truncated, Pendulum never terminates
    assert not any(term for term, _ in ends)


def test_trainer_accepts_spaces_instead_of_an_env() -> None:
    obs = gymnasium.spaces.Box(-1, 1, (3,), np.float32)
    act = gymnasium.spaces.Box(-2, 2, (1,), np.float32)
    training = TrainingOffline(env_cls=(obs, act), memory_size=100, batch_size=8)
    training.build()
    assert training.agent is not None and training.agent.observation_space == obs


def test_every_publish_numbers_above_what_the_source_says_is_taken() -> None:
    class Source:  # a SampleSource whose server knows an earlier trainer session's v40
        taken, published = 40, []

        def taken_version(self) -> int:
            return self.taken

        def publish(self, actor: object, version: int, trained_steps: int) -> None:
            self.published.append(version)

    obs = gymnasium.spaces.Box(-1, 1, (3,), np.float32)
    act = gymnasium.spaces.Box(-2, 2, (1,), np.float32)
    training = TrainingOffline(env_cls=(obs, act), memory_size=100, batch_size=8)
    training.build()
    source = Source()
    training.publish(source)  # type: ignore[arg-type]  (only the two methods publish uses)
    training.publish(source)  # type: ignore[arg-type]
    assert source.published == [41, 42]  # even from a run_epoch override that never calls _renumber


def test_the_round_line_tells_the_entropy_coefficient_from_its_loss() -> None:
    stats = {"epoch": 0, "round": 3, "trained_steps": 400, "steps_per_s": 80.0, "samples": 1400, "round_samples": 100,
             "return_mean": -812.5, "episodes": 2, "test_return_mean": None, "loss_actor": 19.7, "loss_critic": 1.56,
             "loss_entropy_coef": -2.83, "entropy_coef": 0.1319, "lag_min": 0, "lag_mean": 0.4, "lag_max": 2,
             "policy_version": 21, "memory_len": 1400}
    line = format_round(stats)
    assert "| loss actor 19.7 critic 1.56 entropy_coef -2.83 | alpha 0.132 |" in line
    assert "return -812.5 over 2 eps, test -" in line and "lag 0/0.4/2" in line and line.endswith("memory 1400")


def test_wandb_online_without_a_key_is_a_config_error_that_says_what_to_do(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a key from `wandb login`
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    with pytest.raises(ConfigError, match=r'wandb\.mode is "online", but wandb cannot start \(.*\): set WANDB_API_KEY '
                                          r"\(or run `wandb login`\), or use --wandb offline"):
        MetricsLogger(tmp_path / "run", "x", "online")


def test_the_trainer_reports_its_progress_at_least_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before training starts in earnest, the samples the trainer wants stay put; the server's --status still needs
    # the training steps (without them it shows 0 while the trainer runs at 48 steps/s)
    class Source:
        def __init__(self) -> None:
            self.reports: list[tuple[int, int, int]] = []

        def progress(self, trained_steps: int, samples: int, wanted: int) -> None:
            self.reports.append((trained_steps, samples, wanted))

    training = TrainingOffline(env_cls=(gymnasium.spaces.Box(-1, 1, (3,)), gymnasium.spaces.Box(-1, 1, (1,))),
                               start_training=1000, worker_lead=100)
    clock = [100.0]
    monkeypatch.setattr("netrl.training.loop.time.monotonic", lambda: clock[0])
    source = Source()
    for step in range(1, 6):
        training.total_updates = step
        training._report(source)  # type: ignore[arg-type]
        clock[0] += 0.3
    assert [r[0] for r in source.reports] == [1, 5]  # the first, then 1.2 s later; the wish never moved


def image_packet(payload_byte: int | None) -> Buffer:
    """A packet of 6 PNG-encoded 16x16 frames, as FrameStackCompressor("png") sends them; with ``payload_byte``,
    each frame's 20 bytes are that byte instead (no PNG or JPEG decodes them)."""
    n, cap = 6, encoded_capacity(16, 16)
    payload, nbytes = np.zeros((n, cap), np.uint8), np.zeros(n, np.int32)
    for i in range(n):
        data = (encode_frame(np.full((16, 16), i, np.uint8), "png") if payload_byte is None
                else bytes([payload_byte]) * 20)
        payload[i, :len(data)], nbytes[i] = np.frombuffer(data, np.uint8), len(data)
    return Buffer(act=np.zeros((n, 2), np.float32), obs=(payload, nbytes), rew=np.zeros(n, np.float32),
                  terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), reset=np.arange(n) == 0,
                  context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64), worker="w", seq=1,
                  recv_version=1)


def test_a_packet_the_memory_cannot_store_is_skipped_and_counted_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    obs = gymnasium.spaces.Box(0, 255, (4, 16, 16), np.uint8)
    act = gymnasium.spaces.Box(-1, 1, (2,), np.float32)
    training = TrainingOffline(env_cls=(obs, act), memory_cls=partial(FrameStackMemory, stack=4),
                               training_agent_cls=partial(SACAgent, model_cls=CNNActorCritic), memory_size=100,
                               batch_size=4, device="cpu")
    training.build()
    assert training.memory is not None
    with caplog.at_level(logging.ERROR, logger="netrl.training"):
        assert training.add(image_packet(7)) == 0  # passes the schema check, but no frame decodes
    assert training.ingester is not None and training.ingester.unstored == 1
    assert len(training.memory) == 0 and training.total_samples == 0
    assert "packet 1 of worker w (5 samples) could not be stored and is skipped" in caplog.text
    assert "neither valid PNG nor JPEG" in caplog.text
    assert training.add(image_packet(None)) == 5 and len(training.memory) == 5  # the next one is stored


def vector_packet(n: int = 50, seq: int = 1) -> Buffer:
    return Buffer(act=np.zeros((n, 1), np.float32), obs=np.random.default_rng(seq).random((n, 3), np.float32),
                  rew=np.ones(n, np.float32), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                  reset=np.arange(n) == 0, context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64),
                  recv_version=1, worker="w", seq=seq)


def vector_training(**kw: Any) -> TrainingOffline:
    obs, act = gymnasium.spaces.Box(-1, 1, (3,), np.float32), gymnasium.spaces.Box(-1, 1, (1,), np.float32)
    return TrainingOffline(env_cls=(obs, act), epochs=1, update_model_interval=4, max_training_steps_per_env_step=100,
                           memory_size=100, batch_size=8, seed=0, device="cpu", **kw)


def test_the_first_round_after_a_resume_counts_the_samples_that_arrived_before_it() -> None:
    # A resumed trainer adds the packets it acknowledged after its checkpoint before training again; a round under
    # way that started its statistics afresh would leave them out of metrics.csv's round_samples.
    training = vector_training(rounds=2, steps=5, start_training=0)
    training.build()
    training.add(vector_packet(20, seq=1), new=True)  # from the sample log, after the checkpoint
    rows = list(training.run_epoch(ListSource([vector_packet(30, seq=2)]), threading.Event()))  # type: ignore[arg-type]
    assert [r["round_samples"] for r in rows] == [19 + 29, 0] and rows[-1]["samples"] == 48  # env steps: n - 1 each


def test_the_policy_file_never_labels_weights_with_a_version_that_named_others(tmp_path: Path) -> None:
    source = ListSource([vector_packet()])
    training = vector_training(rounds=1, steps=10)
    training.start(source)  # type: ignore[arg-type]
    for _ in training.run_epoch(source, threading.Event()):  # type: ignore[arg-type]
        pass
    assert sorted(source.published) == [1, 2, 3] and training.total_updates == 10  # trained 2 steps after v3
    trainer = Trainer(lambda: training, run_dir=tmp_path, wandb_mode="disabled")
    trainer.training = training
    trainer.save_policy()  # as after an epoch, or when stopping: here with no network thread to send it
    state, meta = read_weights_file(tmp_path / "policy.pt")
    assert training.agent is not None
    actor = training.agent.get_actor().state_dict()
    assert all(torch.equal(state[k], actor[k]) for k in actor)  # the actor as trained, 2 steps past v3 ...
    assert meta["version"] == 4 and 4 not in source.published  # ... under a number of its own ...
    assert checkpoint.published_version(tmp_path) == 4  # ... noted like a sent one, so it is never reused
    trainer.save_policy()  # nothing trained since: the same number
    assert read_weights_file(tmp_path / "policy.pt")[1]["version"] == 4


class TmrlTutorialAgent(SACAgent):
    """A ported tmrl agent that still unpacks the tutorial's five values, or fails in some other way."""

    def __init__(self, *args: Any, failure: str = "unpack", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failure = failure

    def train(self, batch: Any) -> dict[str, float]:
        if self.failure == "other":
            raise ValueError("a loss went NaN")
        o, a, r, o2, d = batch  # the tutorial's line
        return {"loss": float(r.mean() + d.float().mean()), "o": float(o.sum() + a.sum() + o2.sum())}


@pytest.mark.parametrize("failure", ["unpack", "other"])
def test_a_ported_train_that_unpacks_five_values_is_told_the_batch_has_seven(failure: str) -> None:
    source = ListSource([vector_packet()])
    training = vector_training(rounds=1, steps=3, training_agent_cls=partial(TmrlTutorialAgent, failure=failure))
    training.start(source)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as caught:
        list(training.run_epoch(source, threading.Event()))  # type: ignore[arg-type]
    notes = getattr(caught.value, "__notes__", [])
    if failure == "other":
        assert str(caught.value) == "a loss went NaN" and notes == []  # only an unpacking in train gets the hint
    else:
        assert "too many values to unpack" in str(caught.value)
        assert len(notes) == 1 and "TmrlTutorialAgent.train, a Batch has 7 fields" in notes[0]
        assert "`o, a, r, o2, d, _, _ = batch`" in notes[0]


class PhaseAgent(SACAgent):
    """Reports a constant metric, ``phase``, and sets ``stop`` after ``stop_after`` training steps."""

    def __init__(self, *args: Any, phase: float, stop: threading.Event | None = None, stop_after: int = 0,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.phase, self.stop, self.stop_after, self.trained = phase, stop, stop_after, 0

    def train(self, batch: Any) -> dict[str, float]:
        self.trained += 1
        if self.stop is not None and self.trained == self.stop_after:
            self.stop.set()
        return {"phase": self.phase}


def lagged_packet(n: int, seq: int, lag: int, episode_return: float | None) -> Buffer:
    buf = vector_packet(n, seq)
    buf.policy_version, buf.recv_version = np.full(n, 2, np.int64), 2 + lag
    buf.episodes = [EpisodeStats(episode_return, n - 1, False, 2)] if episode_return is not None else []
    return buf


def test_a_round_cut_short_by_a_stop_reports_all_of_itself_after_the_resume() -> None:
    # A checkpoint that kept where in the round a stopped trainer was, but not what the round had counted, would
    # make the resumed round's metrics.csv row cover only the part after the resume (samples, episodes, losses, lag).
    stop = threading.Event()
    before = vector_training(rounds=1, steps=10, start_training=0,
                             training_agent_cls=partial(PhaseAgent, phase=1.0, stop=stop, stop_after=4))
    source = ListSource([lagged_packet(30, 1, lag=3, episode_return=-5.0)])
    before.start(source)  # type: ignore[arg-type]
    assert list(before.run_epoch(source, stop)) == []  # type: ignore[arg-type]
    assert before.round_steps == 4
    time.sleep(0.3)  # time passes on purpose: the round's time so far, which its row must count
    state = json.loads(json.dumps(before.state()))  # as the checkpoint's state file holds it

    after = vector_training(rounds=1, steps=10, start_training=0, update_buffer_interval=1,
                            training_agent_cls=partial(PhaseAgent, phase=0.0))
    after.build()
    after.load_state(state)
    after.add(lagged_packet(20, 2, lag=1, episode_return=None), new=True)  # from the sample log, after the checkpoint
    time.sleep(2.0)  # rebuilding a large memory takes a while: not the round's time
    rows = list(after.run_epoch(ListSource([lagged_packet(40, 3, lag=2, episode_return=7.0)]),  # type: ignore[arg-type]
                                threading.Event()))
    assert len(rows) == 1 and rows[0]["trained_steps"] == 10
    row = rows[0]
    assert row["round_samples"] == 29 + 19 + 39 and row["samples"] == 29 + 19 + 39
    assert row["phase"] == pytest.approx(0.4)  # 4 steps at 1.0 before the stop, 6 at 0.0 after
    assert row["episodes"] == 2 and row["return_mean"] == pytest.approx(1.0) and row["return_max"] == 7.0
    assert (row["lag_min"], row["lag_max"]) == (1, 3)
    assert row["lag_mean"] == pytest.approx((29 * 3 + 19 * 1 + 39 * 2) / (29 + 19 + 39))
    assert 0.3 <= row["wall_s"] < 2.0  # the round's time up to the checkpoint counts, the rebuild's does not


@pytest.mark.parametrize("stale_weight", [0.0, 0.25])
def test_stale_samples_are_dropped_or_down_weighted(stale_weight: float) -> None:
    training = TrainingOffline(env_cls=(OBS, ACT), memory_size=100, batch_size=64, max_policy_lag=2,
                               stale_sample_weight=stale_weight, seed=0)
    training.build()
    n = 9  # a reset row, then 8 steps chosen by policies v10, v10, v9, v8, v7, v6, v5, v3
    versions = np.array([0, 10, 10, 9, 8, 7, 6, 5, 3])
    buf = Buffer(act=np.zeros((n, 1), np.float32), obs=np.arange(n, dtype=np.float32)[:, None],
                 rew=np.zeros(n, np.float32), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                 reset=np.arange(n) == 0, context=np.zeros(n, bool), policy_version=versions, recv_version=10)
    assert training.add(buf) == 8  # every env step counts as received, stale or not
    assert training._round.stale == 4  # lag 3, 4, 5 and 7 exceed max_policy_lag=2
    memory = training.memory
    assert isinstance(memory, ReplayMemory)
    batch = memory.sample()
    next_obs = batch.next_obs.numpy()[:, 0].astype(int)
    if stale_weight == 0.0:
        assert len(memory) == 4 and set(next_obs) <= {1, 2, 3, 4} and batch.weight is None
    else:
        assert len(memory) == 8 and batch.weight is not None
        expected = np.where(versions[next_obs] < 8, stale_weight, 1.0)
        np.testing.assert_allclose(batch.weight.numpy(), expected)


def test_local_training_sends_the_observation_statistics_to_the_worker() -> None:
    # the worker must normalise with the statistics the trainer's batches use, in one process as over the network
    training, _ = pendulum_training(normalize_obs=True)
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(16,)),
                           min_samples_per_worker_packet=4, max_samples_per_episode=30, seed=0, normalize_obs=True)
    run_local(training, worker, threading.Event())
    assert training.obs_norm is not None and worker.obs_norm is not None
    assert worker.models.versions["obs_norm"] > 0
    assert float(training.obs_norm.count) > 0
    got = worker.model("obs_norm").state_dict()
    assert worker.obs_norm is worker.model("obs_norm")  # what policy_obs uses
    # the worker holds the version published last; the trainer may have learnt from packets since
    assert set(got) == set(training.obs_norm.state_dict())
    assert 0 < float(got["count"]) <= float(training.obs_norm.count)


# -- netrl's settings: one frozen object, from config or as keywords ------------------------------
# every setting with a value other than its default, and where config.json keeps it
SET = {"trainer": {"worker_lead": 7, "max_policy_lag": 3, "stale_sample_weight": 0.5,
                   "max_abs_reward": 5.0, "max_nonfinite_steps": 4, "total_frames": 999,
                   "collection": "sync", "frames_per_batch": 64, "rollout_fragment_length": 16,
                   "batch_mode": "complete_episodes", "sync_timeout_s": 2.5, "prefetch": False,
                   "compile": "compile", "implausible": "refuse", "implausible_factor": 50.0},
       "memory": {"memory_size": 123, "batch_size": 9, "device": "cuda", "max_worker_share": 0.5,
                  "min_worker_share": 0.2, "storage": "disk", "storage_folder": "/replay/here",
                  "storage_resident_mib": 64},
       "env": {"normalize_obs": True, "normalize_obs_clip": 3.0, "normalize_obs_every": 5}}
SETTINGS = {**SET["trainer"], "memory_size": 123, "batch_size": 9, "memory_device": "cuda",
            "max_worker_share": 0.5, "min_worker_share": 0.2, "memory_storage": "disk",
            "memory_folder": "/replay/here", "memory_resident_mib": 64, **SET["env"], "seed": 42}


def test_every_setting_comes_from_its_config_key_and_goes_with_tmrls_parameters() -> None:
    assert set(SETTINGS) == {f.name for f in dataclasses.fields(TrainingSettings)}
    default = TrainingSettings()
    assert all(getattr(default, k) != v for k, v in SETTINGS.items())  # none read from elsewhere
    cfg = Config()
    sections = {name: dataclasses.replace(getattr(cfg, name), **keys) for name, keys in SET.items()}
    cfg = dataclasses.replace(cfg, seed=42, security="none", **sections)
    assert TrainingSettings.from_config(cfg) == TrainingSettings(**SETTINGS)
    pipeline = SimpleNamespace(env_cls=(OBS, ACT), memory_cls=ReplayMemory,
                               training_agent_cls=SACAgent, sample_compressor=None)
    training = Trainer.from_config(cfg, pipeline).training_cls()
    assert training.settings == TrainingSettings(**SETTINGS)
    t = cfg.trainer
    assert (training.env_cls, training.memory_cls, training.training_agent_cls) == (
        (OBS, ACT), ReplayMemory, SACAgent)
    assert (training.epochs, training.rounds, training.steps, training.update_model_interval,
            training.update_buffer_interval, training.max_training_steps_per_env_step,
            training.start_training, training.device) == (
        math.inf if t.epochs is None else t.epochs,  # none set: until stopped, tmrl's np.inf
        t.rounds, t.steps, t.update_model_interval, t.update_buffer_interval,
        t.max_training_steps_per_env_step, t.start_training, t.device)


def test_netrls_keywords_are_folded_into_the_settings_and_an_unknown_one_is_named() -> None:
    by_keyword = TrainingOffline(env_cls=(OBS, ACT), epochs=2, **SETTINGS)
    assert by_keyword.settings == TrainingSettings(**SETTINGS) and by_keyword.epochs == 2
    assert by_keyword.sync is not None and by_keyword.sync.frames_per_batch == 64  # built from them
    base = TrainingSettings(worker_lead=7, seed=1)
    over = TrainingOffline(env_cls=(OBS, ACT), settings=base, seed=2)  # a keyword wins
    assert over.settings == TrainingSettings(worker_lead=7, seed=2) and base.seed == 1
    assert TrainingOffline(settings=base).settings is base
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.seed = 3  # type: ignore[misc]
    for given, named in [("memory_sise", "memory_size"), ("python_profiling", "profiling"),
                         ("epoch", "epochs")]:
        with pytest.raises(TypeError, match=(
                rf"^TrainingOffline\(\) got an unexpected keyword argument '{given}' "
                rf'\(did you mean "{named}"\?\); it takes tmrl\'s parameters and the fields of '
                r"netrl\.training\.TrainingSettings$")):
            TrainingOffline(env_cls=(OBS, ACT), **{given: 1})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'zzz'; it takes"):
        TrainingOffline(zzz=1)
    with pytest.raises(TypeError, match=r"takes a netrl\.training\.TrainingSettings, not dict"):
        TrainingOffline(settings={"seed": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r'collection must be "async" or "sync" \(got \'both\'\)'):
        TrainingSettings(collection="both")  # type: ignore[arg-type]
