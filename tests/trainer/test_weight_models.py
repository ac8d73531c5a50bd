"""Named models on the trainer's side (issue 34): each extra model published on its own interval under its own
counter, through the link's own outbox per model, numbered after what the server or the run folder says was sent."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
import zmq

from netrl.agents.base import ModelSpec
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.envs.gym import GenericGymEnv
from netrl.errors import CheckpointError
from netrl.memory.replay import ReplayMemory
from netrl.protocol.weight_formats import FormatError
from netrl.protocol.wire import decode
from netrl.samples import Buffer
from netrl.server.server import Server
from netrl.storage import checkpoint
from netrl.trainer.delivery import Deliveries
from netrl.trainer.link import TrainerLink
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
from tests.fakes import NET, PATIENT_NET, wait_until

OBS = gymnasium.spaces.Box(-1, 1, (3,), np.float32)
ACT = gymnasium.spaces.Box(-1, 1, (1,), np.float32)


class Norm(torch.nn.Module):
    """An observation normaliser's shape: float32 statistics and a float64 count."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(3))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))


class NormSAC(SACAgent):
    """SAC with an extra model whose statistics move every training step (as a normaliser's would)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.norm = Norm()

    def train(self, batch: Any) -> dict[str, float]:
        self.norm.count += 1
        return super().train(batch)

    def extra_models(self) -> dict[str, ModelSpec]:
        return {"obs_norm": ModelSpec(self.norm, 5)}


class Source:
    """A SampleSource that hands over packets once and records every publication: (model, version, steps, count)."""

    def __init__(self, bufs: list[Buffer], taken: dict[str, int]) -> None:
        self.bufs, self.taken = bufs, taken
        self.published: list[tuple[str, int, int, float]] = []

    def fetch(self) -> list[Buffer]:
        out, self.bufs = self.bufs, []
        return out

    def wait(self, timeout: float) -> None:
        pass

    def publish(self, module: torch.nn.Module, version: int, trained_steps: int, model: str = "policy") -> None:
        count = float(module.count) if model == "obs_norm" else -1.0  # type: ignore[arg-type]
        self.published.append((model, version, trained_steps, count))

    def progress(self, *args: Any) -> None:
        pass

    def taken_version(self) -> int:
        return -1

    def taken_model_version(self, model: str) -> int:
        return self.taken.get(model, -1)


def rows(n: int) -> Buffer:
    rng = np.random.default_rng(0)
    return Buffer(act=rng.uniform(-1, 1, (n, 1)).astype(np.float32), obs=rng.uniform(-1, 1, (n, 3)).astype(np.float32),
                  rew=rng.normal(size=n).astype(np.float32), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                  reset=np.arange(n) == 0, context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64),
                  episodes=[], worker="w", seq=1)


def training(**kw: Any) -> TrainingOffline:
    return TrainingOffline(env_cls=(OBS, ACT), memory_cls=ReplayMemory,
                           training_agent_cls=partial(NormSAC, model_cls=partial(MLPActorCritic, hidden_sizes=(8,))),
                           epochs=1, rounds=1, steps=20, update_model_interval=1, start_training=1,
                           max_training_steps_per_env_step=100.0, memory_size=100, batch_size=4, seed=0,
                           **kw)


def test_each_extra_model_is_published_on_its_own_interval_under_its_own_counter() -> None:
    loop = training()
    source = Source([rows(40)], {"obs_norm": 7})  # the server holds an earlier session's obs_norm v7
    loop.start(source)  # type: ignore[arg-type]
    for _ in loop.run_epoch(source, threading.Event()):  # type: ignore[arg-type]
        pass
    assert loop.total_updates == 20
    policy = [(v, steps) for model, v, steps, _ in source.published if model == "policy"]
    norm = [(v, steps, count) for model, v, steps, count in source.published if model == "obs_norm"]
    assert policy == [(v, v - 1) for v in range(1, 21)]  # before every step, as before
    # its first version with the policy's, then every 5 steps, numbered after the server's v7; each holds the
    # module as it was then
    assert norm == [(8, 0, 0.0), (9, 5, 5.0), (10, 10, 10.0), (11, 15, 15.0)]
    assert loop.publisher is not None
    assert loop.publisher.model_versions == {"obs_norm": 11} and loop.publisher.version == 20
    state = loop.state()
    assert state["model_versions"] == {"obs_norm": 11}

    again = training()
    again.build()
    again.load_state(json.loads(json.dumps(state)))  # as a checkpoint holds it
    assert again.publisher is not None and again.publisher.model_versions == {"obs_norm": 11}
    old = {k: v for k, v in state.items() if k != "model_versions"}  # a checkpoint from before issue 34
    again = training()
    again.build()
    again.load_state(old)
    assert again.publisher is not None
    assert again.publisher.model_versions == {"obs_norm": 0} and again.publisher.version == 20


@pytest.mark.parametrize(("models", "why"), [
    ({"policy": ModelSpec(Norm(), 1)}, r'"policy" is the actor\'s own name'),
    ({"Obs-Norm": ModelSpec(Norm(), 1)}, r"'Obs-Norm' is not a valid model name \(a lower-case letter"),
    ({"n" * 25: ModelSpec(Norm(), 1)}, r"is not a valid model name"),
    ({f"m{i}": ModelSpec(Norm(), 1) for i in range(8)}, r"8 models besides the policy, and at most 8 models in all"),
])
def test_the_names_of_a_trainers_models_are_checked(models: dict[str, ModelSpec], why: str) -> None:
    with pytest.raises(ValueError, match=r"Trainer\(models=\.\.\.\): .*" + why):
        Trainer(models=models)


def test_a_models_interval_and_module_are_checked_and_a_name_is_published_once() -> None:
    loop = training()
    loop.build()
    with pytest.raises(ValueError, match=r"Trainer\(models=\.\.\.\) declares the model 'obs_norm', which is already "
                                         r"published"):
        loop.publisher.add_models({"obs_norm": ModelSpec(Norm(), 2)}, "Trainer(models=...)")
    with pytest.raises(ValueError, match=r"\['extra'\]\.every must be an integer >= 1: .*\(got 0\)"):
        loop.publisher.add_models({"extra": ModelSpec(Norm(), 0)}, "Trainer(models=...)")
    with pytest.raises(ValueError, match=r"\['extra'\] is 3, not a ModelSpec\(module, every\)"):
        loop.publisher.add_models({"extra": 3}, "Trainer(models=...)")  # type: ignore[dict-item]


class _Tracker:
    done = False


def test_the_link_sends_each_model_from_an_outbox_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # A policy version still being written (a slow link) holds back the policy's next version, not another model's;
    # only the policy's versions carry sync collection's announcement.
    link = TrainerLink(PATIENT_NET, "trainer", "s", 1, 8, Deliveries(), None)
    sent: list[tuple[str, int, bool]] = []  # (model, version, has collect) per part given to the socket
    trackers: list[_Tracker] = []

    def command(frames: list[Any], track: bool = False) -> _Tracker:
        link.on_command([zmq.Frame(bytes(f)) for f in frames])
        return _Tracker()

    def send_tracked(frames: list[Any]) -> _Tracker:
        msg = decode(frames)
        sent.append((msg.body.get("model", "policy"), msg.policy_version, "collect" in msg.body))
        trackers.append(_Tracker())
        return trackers[-1]

    monkeypatch.setattr(link, "command", command)
    monkeypatch.setattr(link.link, "ready", True)
    monkeypatch.setattr(link.link, "send_tracked", send_tracked)
    try:
        link.announce({"mode": "async"})
        link.publish(torch.nn.Linear(3, 2), 1, 0)
        link.publish(Norm(), 1, 0, model="obs_norm")
        link.publish(torch.nn.Linear(3, 2), 2, 1)  # waits: v1's part is not written yet
        link.publish(Norm(), 2, 1, model="obs_norm")  # waits for its own v1 only
        assert sent == [("policy", 1, True), ("obs_norm", 1, False)]
        trackers[1].done = True
        link.on_tick()
        assert sent[2:] == [("obs_norm", 2, False)]
        trackers[0].done = True
        link.on_tick()
        assert sent[3:] == [("policy", 2, True)]
        assert link.weights_version == 2 and link.outboxes["obs_norm"].version == 2
        assert link.version == 2 and link.model_versions == {"obs_norm": 2}
    finally:
        link.halt()


def test_a_welcome_naming_newer_versions_of_a_model_makes_them_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    link = TrainerLink(PATIENT_NET, "trainer", "s", 1, 8, Deliveries(), None)
    try:
        link.model_versions = {"obs_norm": 3}  # this session published obs_norm v3
        monkeypatch.setattr(link.link, "welcome", {"server_session": "a", "weights_version": 0,
                                                   "models": {"obs_norm": 9, "other": 50, "policy": 0}})
        link._note_server_version()
        assert link.taken_model_version("obs_norm") == 9  # a new server process: v9 may be another session's
        assert link.taken_model_version("other") == -1  # not a model this session publishes
        monkeypatch.setattr(link.link, "welcome", {"server_session": "a", "weights_version": 0,
                                                   "models": {"obs_norm": 2}})
        link._note_server_version()  # the same server, behind this session: nothing new is taken
        assert link.taken_model_version("obs_norm") == 9
    finally:
        link.halt()


def test_the_run_folder_notes_each_models_newest_version_and_reads_an_older_note(tmp_path: Path) -> None:
    checkpoint.record_published(tmp_path, 12, models={"obs_norm": 4})
    assert checkpoint.published_version(tmp_path) == 12 and checkpoint.published_models(tmp_path) == {"obs_norm": 4}
    checkpoint.record_published(tmp_path, 13)  # a note without models (as netrl before issue 34 wrote)
    assert checkpoint.published_version(tmp_path) == 13 and checkpoint.published_models(tmp_path) == {}
    (tmp_path / "checkpoint" / "PUBLISHED").write_text('{"version": 3, "models": {"obs_norm": "x"}}')
    with pytest.raises(CheckpointError, match="PUBLISHED is unreadable"):
        checkpoint.published_models(tmp_path)


def test_every_models_newest_version_reaches_a_worker_that_joins_late(server: tuple[Server, zmq.Context],
                                                                      tmp_path: Path) -> None:
    # The policy every step, the agent's obs_norm every 5 steps (its count: the steps trained when published) and a
    # user's module every 7, through a real server; a worker joining after training paused gets the newest of each.
    srv, _ = server
    env_cls = partial(GenericGymEnv, id="Pendulum-v1")
    probe = torch.nn.Linear(2, 2)
    loop = partial(TrainingOffline, env_cls=env_cls, memory_cls=ReplayMemory,
                   training_agent_cls=partial(NormSAC, model_cls=partial(MLPActorCritic, hidden_sizes=(8,))),
                   epochs=1, rounds=1, steps=10_000, update_model_interval=1, start_training=20, memory_size=1000,
                   batch_size=8, seed=0, sleep_between_buffer_retrieval_attempts=0.01)
    trainer = Trainer(loop, "127.0.0.1", server_port=srv.trainer_port, network=NET, run_dir=tmp_path / "run",
                      wandb_mode="disabled", status_interval_s=0, models={"probe": ModelSpec(probe, 7)})
    stop = threading.Event()
    thread = threading.Thread(target=trainer.run, args=(stop,))
    thread.start()

    def worker(name: str) -> RolloutWorker:
        return RolloutWorker(env_cls, partial(MLPActor, hidden_sizes=(8,)), server_ip="127.0.0.1",
                             server_port=srv.worker_port, network=NET, worker_id=name, seed=0,
                             min_samples_per_worker_packet=5, max_samples_per_episode=10,
                             models={"obs_norm": Norm(), "probe": torch.nn.Linear(2, 2)})
    try:
        wait_until(lambda: srv.intake.schema is not None, 20, "the trainer's sample layout", poll=0.05)
        first = worker("first")
        first.run(0, nb_episodes=6)  # 60 transitions: training follows them 1:1, then waits for more
        training = trainer.training
        assert training is not None and first.samples_unacknowledged == 0
        wait_until(lambda: training.total_updates == 60, 30, "60 training steps", poll=0.05)
        late = worker("late")
        late.start()
        assert trainer.net is not None and late.weights is not None
        assert training.publisher is not None
        versions = training.publisher.model_versions
        newest = (trainer.net.version, versions["obs_norm"], versions["probe"])
        assert newest == (60, 12, 9)  # v1 at the start, then before steps 1..59; 0, 5, ..., 55; 0, 7, ..., 56
        receivers = late.models.receivers
        wait_until(lambda: (late.weights.version, receivers["obs_norm"].version, receivers["probe"].version)
                   == newest, 10, "the newest version of each model at the late worker", poll=0.02)
        late.policy.swap()
        assert late.version == 60 and late.models.versions == {"obs_norm": 12, "probe": 9}
        assert float(late.model("obs_norm").count) == 55.0  # as trained when v12 was published
        assert torch.equal(late.model("probe").weight, probe.weight)
        late.close()
        memory = training.memory
        assert memory is not None
        batch = memory.sample()
        assert {"obs_norm_version", "probe_version"} <= set(batch.extra)
        assert batch.extra["obs_norm_version"].dtype == torch.int64
        # -1: a row the first worker made before obs_norm's v1 reached it (it may act on the policy's v1 earlier)
        used = torch.cat([batch.extra["obs_norm_version"], *(memory.sample().extra["obs_norm_version"]
                                                              for _ in range(4))])
        assert -1 <= int(used.min()) and 1 <= int(used.max()) <= 12 and 0 not in used.tolist()
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    saved = checkpoint.load_state(tmp_path / "run")
    assert saved is not None and saved["model_versions"] == {"obs_norm": 12, "probe": 9}
    assert checkpoint.published_models(tmp_path / "run") == {"obs_norm": 12, "probe": 9}


def test_lossy_versions_are_encoded_off_the_training_thread_and_their_error_kept_for_the_metrics(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    link = TrainerLink(PATIENT_NET, "trainer", "s", 1, 8, Deliveries(), None, weight_format="auto")
    # (version, format, base, thread) of each encoding handed over, at its first part (an
    # encoding may go in several parts: part_bytes)
    sent: list[tuple[int, str, int | None, str]] = []

    def command(frames: list[Any], track: bool = False) -> _Tracker:
        msg = decode([bytes(f) for f in frames[1:]])
        if msg.body["part"] == 0:
            sent.append((msg.policy_version, msg.body["format"], msg.body.get("base"),
                         threading.current_thread().name))
        return _Tracker()

    monkeypatch.setattr(link, "command", command)
    try:
        actor = torch.nn.Linear(64, 64)
        with caplog.at_level(logging.DEBUG, logger="netrl.trainer.encoding"):
            for version in (1, 2):
                with torch.no_grad():
                    actor.weight[0, 0] += 1.0
                link.publish(actor, version, version)
                assert link.encoder is not None and link.encoder.wait(5)
        assert {thread for *_, thread in sent} == {"netrl-weight-encoder"}
        order = [(v, f, b) for v, f, b, _ in sent]
        fulls = [(1, "int8", None), (1, "float16", None), (1, "float32", None)]  # the fewest bytes first
        assert order[:3] == fulls
        assert set(order[3:6]) == {(2, "float32", 1), (2, "float16", 1), (2, "int8", 1)}  # deltas first
        assert order[6:] == [(2, f, None) for _, f, _ in fulls]
        metrics = link.weight_metrics()
        assert set(metrics) == {"weights_max_error/float16", "weights_max_error/int8"}
        assert 0 < metrics["weights_max_error/float16"] < metrics["weights_max_error/int8"] < 0.01
        levels = [r.levelno for r in caplog.records if "in int8: max error" in r.getMessage()]
        assert levels == [logging.INFO, logging.DEBUG]  # the first version's at INFO, then DEBUG
    finally:
        link.halt()


def test_an_unknown_weight_format_is_refused_at_start_naming_the_known_ones() -> None:
    with pytest.raises(FormatError, match=r"network.weight_format is 'float8'; choose one of delta, auto, adaptive, "
                                          r"float32, float16, bfloat16, int8"):
        Trainer(weight_format="float8")
    with pytest.raises(ValueError, match=r"weight_budget_s must be between 0 \(the time between publications\) and "
                                         r"3600 s \(got -1\)"):
        Trainer(weight_format="auto", weight_budget_s=-1)


def test_auto_budgets_each_version_the_time_since_the_one_before_and_sends_the_smallest_first() -> None:
    from netrl.protocol.weights import flat_layout, snapshot_into
    from netrl.trainer.encoding import MIN_BUDGET_S, WeightEncoder

    actor = MLPActor(gymnasium.spaces.Box(-1, 1, (8,), np.float32), gymnasium.spaces.Box(-1, 1, (2,), np.float32),
                     (64, 64))
    layout, nbytes = flat_layout(actor)
    flat = np.zeros(nbytes, np.uint8)
    snapshot_into(actor, layout, flat)
    encoder = WeightEncoder("auto", 0.0)  # network.weight_budget_s 0: the time between publications
    first = encoder.encode("policy", 1, flat, layout, None)
    assert all("budget_s" not in e.fields for e in first)  # no interval yet: the server's default applies
    assert [e.fields["format"] for e in first] == ["int8", "float16", "float32"]  # the fewest bytes first
    with torch.no_grad():
        next(actor.parameters()).add_(0.01)
    snapshot_into(actor, layout, flat)
    second = encoder.encode("policy", 2, flat, layout, 0.37)
    assert {e.fields["budget_s"] for e in second} == {0.37}
    kinds = [("base" in e.fields, e.data.nbytes) for e in second]
    assert [k for k, _ in kinds] == [True] * 3 + [False] * 3  # deltas, then full versions, each smallest first
    assert [n for _, n in kinds[:3]] == sorted(n for _, n in kinds[:3])
    assert [n for _, n in kinds[3:]] == sorted(n for _, n in kinds[3:])
    assert {e.fields["budget_s"] for e in encoder.encode("policy", 3, flat, layout, 0.001)} == {MIN_BUDGET_S}
    assert all("budget_s" not in e.fields for e in WeightEncoder("int8", 0.0).encode("policy", 1, flat, layout, 0.5))
    assert {e.fields["budget_s"] for e in WeightEncoder("auto", 2.0).encode("policy", 1, flat, layout, 0.5)} == {2.0}


def test_auto_budgets_by_the_pace_of_publication_not_by_the_warm_up_before_the_second_version(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # v1 at start, v2 12 s later (the trainer's warm-up), then one every 0.3 s: v2's budget of
    # 12 s let the server send it in float16 (135 KB, 2.9 s over a lossy link) in place of int8
    import netrl.trainer.encoding as encoding
    from netrl.protocol.weights import flat_layout, snapshot_into

    actor = MLPActor(gymnasium.spaces.Box(-1, 1, (8,), np.float32), gymnasium.spaces.Box(-1, 1, (2,), np.float32),
                     (64, 64))
    layout, nbytes = flat_layout(actor)
    encoder = encoding.WeightEncoder("auto", 0.0)
    budgets: dict[int, set[float | None]] = {}
    clock = iter([100.0, 112.0, 112.3, 112.5, 130.0])
    monkeypatch.setattr(encoding.time, "monotonic", lambda: next(clock))
    try:
        for version in range(1, 6):
            flat = np.zeros(nbytes, np.uint8)
            snapshot_into(actor, layout, flat)

            def done(out: list[Any], v: int = version) -> None:
                budgets[v] = {e.fields.get("budget_s") for e in out}

            encoder.put("policy", version, 0, flat, layout, done, lambda: None)
            assert encoder.wait(10)
    finally:
        encoder.close()
    # v2: the warm-up alone says nothing of the pace (the server's default applies);
    # then the smaller of the last two intervals, so a pause is no budget either
    assert budgets == {1: {None}, 2: {None}, 3: {0.3}, 4: {0.2}, 5: {0.2}}


def test_adaptive_sends_float32_alone_until_the_server_counts_a_slow_worker_then_auto_s_formats(
        caplog: pytest.LogCaptureFixture) -> None:
    # the default: as fast as float32 on a fast link (auto's encodings cost a 1M-parameter actor's
    # broadcast 145 against 14 ms), the compact formats only where a link needs them
    link = TrainerLink(PATIENT_NET, "trainer", "s", 1, 8, Deliveries(), None, weight_format="adaptive")
    sent: list[tuple[int, str, bool]] = []
    link.sender._send_encoding = (  # type: ignore
        lambda encoded, model, slot, version, *_: sent.append((version, encoded.fields.get("format", "float32"),
                                                                "base" in encoded.fields)))
    actor = torch.nn.Linear(64, 64)
    try:
        with caplog.at_level(logging.INFO, "netrl.trainer.weight_sender"):
            link.publish(actor, 1, 0)
            link.link.server_stats = {"slow_workers": 1}  # as the server's heartbeat says
            link.publish(actor, 2, 0)
            link.publish(actor, 3, 0)
            assert link.encoder is not None and link.encoder.wait(5)
            link.link.server_stats = {"slow_workers": 0}
            link.publish(actor, 4, 0)
    finally:
        link.halt()
    assert sent[0] == (1, "float32", False)  # no worker slow: float32 alone, no encoding
    assert sorted(f for v, f, delta in sent if v == 2) == ["float16", "float32", "int8"]  # all in full
    assert sorted((f, delta) for v, f, delta in sent if v == 3) == sorted(
        (f, d) for f in ("float16", "float32", "int8") for d in (False, True))  # deltas too
    assert [s for s in sent if s[0] == 4] == [(4, "float32", False)]
    said = [r.getMessage() for r in caplog.records]
    assert any("too slow for float32" in m for m in said) and any("float32 alone" in m for m in said)


def test_observation_statistics_travel_in_float32_whatever_the_setting() -> None:
    # the worker and the memory must normalise with the same numbers for one statistics version
    from netrl.envs.normalize import ObsNormalizer

    norm = ObsNormalizer(gymnasium.spaces.Box(-1, 1, (100,), np.float32), 10.0)  # over 64 elements: encodable
    norm.update(np.random.default_rng(0).normal(size=(50, 100)).astype(np.float32))
    link = TrainerLink(PATIENT_NET, "trainer", "s", 1, 8, Deliveries(), None, weight_format="auto")
    sent: list[tuple[str, str]] = []
    link.sender._send_encoding = (  # type: ignore
        lambda encoded, model, *_: sent.append((model, encoded.fields["format"])))
    try:
        link.publish(norm, 1, 0, model="obs_norm")
        link.publish(torch.nn.Linear(64, 64), 1, 0)
        assert link.encoder is not None and link.encoder.wait(5)
    finally:
        link.halt()
    assert sorted(f for m, f in sent if m == "obs_norm") == ["float32"]
    assert sorted(f for m, f in sent if m == "policy") == ["float16", "float32", "int8"]
