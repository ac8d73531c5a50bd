"""A sample compressor and a memory written as in tmrl's tutorial still plug into netrl's drone pipeline.

The compressor is the tutorial's (``obs[:4]``) with netrl's 6-tuple signature; the memory is the tutorial's
list-based ``MyMemoryDataloading``, which reads ``buffer.memory`` and rebuilds the action buffer in
``get_transition``, with the edits docs/tmrl.md lists only: rows and transitions carry ``terminated`` and ``truncated``
where tmrl had ``done``. Batches come from the base class's per-item ``sample()``, as in tmrl.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.config.sections import Config
from netrl.envs.gym import GenericGymEnv
from netrl.errors import SampleRejected
from netrl.memory.base import MemoryDataloading
from netrl.nn import copy_shared, no_grad
from netrl.pipelines.drone import drone_pipeline
from netrl.protocol.schema import SampleSchema
from netrl.protocol.wire import decode, encode, samples_message
from netrl.samples import Batch
from netrl.server.server import Server
from netrl.trainer.trainer import Trainer
from netrl.training import TrainingOffline
from netrl.util import cached_property, partial
from netrl.worker.worker import RolloutWorker
from tests.recording import local_packets, over_the_wire, recorded

pytestmark = [pytest.mark.filterwarnings("ignore:Time-step timed out"),
              pytest.mark.filterwarnings("ignore:.*share an object")]


def my_sample_compressor(prev_act: Any, obs: Any, rew: float, terminated: bool, truncated: bool,
                         info: dict[str, Any]) -> tuple[Any, Any, float, bool, bool, dict[str, Any]]:
    """The tutorial's compressor: remove the action buffer from observations."""
    prev_act_mod, obs_mod, rew_mod, terminated_mod, truncated_mod, info_mod = (prev_act, obs, rew, terminated,
                                                                               truncated, info)
    obs_mod = obs_mod[:4]  # here we remove the action buffer from observations
    return prev_act_mod, obs_mod, rew_mod, terminated_mod, truncated_mod, info_mod


class MyMemoryDataloading(MemoryDataloading):
    """The tutorial's memory, with its signature (no ``seed``)."""

    def __init__(self, act_buf_len: int, device: str, nb_steps: int, obs_preprocessor: Any = None,
                 sample_preprocessor: Any = None, memory_size: int = 1000000, batch_size: int = 256,
                 dataset_path: str = "") -> None:
        self.act_buf_len = act_buf_len  # length of the action buffer
        super().__init__(device=device, nb_steps=nb_steps, obs_preprocessor=obs_preprocessor,
                         sample_preprocessor=sample_preprocessor, memory_size=memory_size, batch_size=batch_size,
                         dataset_path=dataset_path)

    def append_buffer(self, buffer: Any) -> None:
        list_action = [b[0] for b in buffer.memory]
        list_x_position = [b[1][0] for b in buffer.memory]
        list_y_position = [b[1][1] for b in buffer.memory]
        list_x_target = [b[1][2] for b in buffer.memory]
        list_y_target = [b[1][3] for b in buffer.memory]
        list_reward = [b[2] for b in buffer.memory]
        list_terminated = [b[3] for b in buffer.memory]
        list_truncated = [b[4] for b in buffer.memory]
        list_info = [b[5] for b in buffer.memory]
        if self.__len__() > 0:  # the tutorial's test: it starts new lists until the first packet is long enough
            self.data[0] += list_action
            self.data[1] += list_x_position
            self.data[2] += list_y_position
            self.data[3] += list_x_target
            self.data[4] += list_y_target
            self.data[5] += list_reward
            self.data[6] += list_terminated
            self.data[7] += list_truncated
            self.data[8] += list_info
        else:
            self.data = [list_action, list_x_position, list_y_position, list_x_target, list_y_target, list_reward,
                         list_terminated, list_truncated, list_info]
        to_trim = len(self.data[0]) - self.memory_size
        if to_trim > 0:
            self.data = [column[to_trim:] for column in self.data]

    def __len__(self) -> int:
        if len(self.data) == 0:
            return 0
        return max(0, len(self.data[0]) - self.act_buf_len - 1)

    def get_transition(self, item: int) -> tuple[Any, ...]:
        idx_last = item + self.act_buf_len - 1
        idx_now = item + self.act_buf_len
        actions = self.data[0][item:(item + self.act_buf_len + 1)]
        last_act_buf = actions[:-1]
        new_act_buf = actions[1:]
        last_obs = (self.data[1][idx_last], self.data[2][idx_last], self.data[3][idx_last], self.data[4][idx_last],
                    *last_act_buf)
        new_obs = (self.data[1][idx_now], self.data[2][idx_now], self.data[3][idx_now], self.data[4][idx_now],
                   *new_act_buf)
        new_act = self.data[0][idx_now]
        rew = np.float32(self.data[5][idx_now])
        return last_obs, new_act, rew, new_obs, self.data[6][idx_now], self.data[7][idx_now], self.data[8][idx_now]


def test_tutorial_compressor_and_memory_plug_into_worker_wire_and_sac() -> None:
    torch.manual_seed(0)
    pipe = drone_pipeline(Config(agent=dataclasses.replace(Config().agent, hidden_sizes=[32])), time_step=0.005,
                          ep_max_length=15)
    env_cls, recorders = recorded(pipe.env_cls)
    worker = RolloutWorker(env_cls, pipe.actor_module_cls, my_sample_compressor, min_samples_per_worker_packet=10,
                           seed=0)
    memory = MyMemoryDataloading(act_buf_len=4, device="cpu", nb_steps=2, memory_size=200, batch_size=16)
    for buf in local_packets(worker, [False] * 16):
        memory.append_buffer(over_the_wire(buf))
    assert len(memory.data[0]) == 200 and len(memory) == 195  # 16 x 16 rows, trimmed to memory_size
    env = pipe.env_cls()
    agent = SACAgent(env.observation_space, env.action_space, model_cls=lambda o, a: MLPActorCritic(o, a, (32,)))
    for batch in memory:  # the base class collates get_transition items
        assert [leaf.shape for leaf in batch.obs] == [(16, 1)] * 4 + [(16, 2)] * 4
        metrics = agent.train(batch)
        assert all(np.isfinite(v) for v in metrics.values())
    # Within an episode, the tutorial's rebuild matches what the env produced.
    truth = recorders[0].truth
    matched = 0
    for item in range(len(memory)):
        last_obs, new_act, _, new_obs, *_ = memory.get_transition(item)
        window = memory.data[8][item:item + memory.act_buf_len + 1]
        if any(i["reset"] for i in window):
            continue  # an episode starts inside the window: tmrl's tutorial memory does not handle it
        prev, now = truth[np.asarray(new_act).tobytes()]
        assert all(np.array_equal(a, b) for a, b in zip(new_obs, now, strict=True))
        assert all(np.array_equal(a, b) for a, b in zip(last_obs, prev, strict=True))
        matched += 1
    assert matched > len(memory) // 2


# -- what the tutorial's port ran into (each test fails without its fix) ------------------------------------------
OBS_SPACE = gymnasium.spaces.Box(-1, 1, (3,), np.float32)
ACT_SPACE = gymnasium.spaces.Box(-1, 1, (2,), np.float32)


def test_every_documented_batch_unpacking_works() -> None:
    guide = (Path(__file__).parents[1] / "docs" / "tmrl.md").read_text()
    snippets = re.findall(r"`([^`\n]*= batch)`", guide) + re.findall(r"``([^`]*= batch)``", Batch.__doc__ or "")
    assert len(snippets) >= 2  # the tmrl guide and the docstring both show one
    batch = Batch(*(torch.zeros(2) for _ in range(7)))
    for snippet in snippets:
        exec(snippet, {"batch": batch})  # raises if the names do not match the fields


class SeededTutorialMemory(MyMemoryDataloading):
    """The tutorial's memory with a catch-all ``**kwargs``, which takes ``seed`` too."""

    def __init__(self, act_buf_len: int, **kwargs: Any) -> None:
        self.kwargs = kwargs
        super().__init__(act_buf_len, kwargs["device"], kwargs["nb_steps"], memory_size=kwargs.get("memory_size", 7),
                         batch_size=kwargs.get("batch_size", 3))


def training(memory_cls: Any, **kw: Any) -> TrainingOffline:
    return TrainingOffline(env_cls=(OBS_SPACE, ACT_SPACE), memory_cls=memory_cls, device="cpu", steps=10,
                           training_agent_cls=partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(8,))),
                           **kw)


def test_a_memory_with_the_tutorials_signature_is_built_without_seed() -> None:
    t = training(partial(MyMemoryDataloading, act_buf_len=4), seed=3)
    t.build()  # the tutorial's __init__ has no seed argument: passing one would raise a TypeError
    assert isinstance(t.memory, MyMemoryDataloading) and t.memory.nb_steps == 10
    t = training(partial(SeededTutorialMemory, act_buf_len=4), seed=3)
    t.build()
    assert isinstance(t.memory, SeededTutorialMemory) and t.memory.kwargs["seed"] == 3  # **kwargs takes it


def test_memory_size_and_batch_size_come_from_the_memory_partial_as_in_tmrl(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="netrl.memory.build"):
        t = training(partial(SeededTutorialMemory, act_buf_len=4, memory_size=5000, batch_size=32))
        t.build()
    assert t.memory is not None and (t.memory.memory_size, t.memory.batch_size) == (5000, 32)
    # what the trainer sizes its sample log by
    assert (t.settings.memory_size, t.settings.batch_size) == (5000, 32)
    assert ("replay memory SeededTutorialMemory: memory_size=5000 (from partial(SeededTutorialMemory)), "
            "batch_size=32 (from partial(SeededTutorialMemory))") in caplog.text
    # what the partial leaves out comes from TrainingOffline, else from the memory's own default
    t = training(partial(MyMemoryDataloading, act_buf_len=4, memory_size=5000), batch_size=16)
    t.build()
    assert t.memory is not None and (t.memory.memory_size, t.memory.batch_size) == (5000, 16)
    t = training(partial(SeededTutorialMemory, act_buf_len=4))
    t.build()
    assert (t.settings.memory_size, t.settings.batch_size) == (7, 3)
    # the same value twice is fine; two different values name both places
    training(partial(MyMemoryDataloading, act_buf_len=4, memory_size=5000), memory_size=5000).build()
    with pytest.raises(ValueError, match=re.escape("memory_size is set twice, to different values: "
                                                   "partial(MyMemoryDataloading, memory_size=5000) and "
                                                   "TrainingOffline(memory_size=1000)")):
        training(partial(MyMemoryDataloading, act_buf_len=4, memory_size=5000), memory_size=1000).build()


def test_the_tutorials_five_argument_compressor_is_refused_with_the_new_signature() -> None:
    def old_compressor(prev_act: Any, obs: Any, rew: float, done: bool, info: dict[str, Any]) -> tuple[Any, ...]:
        return prev_act, obs[:4], rew, done, info

    message = r"must take 6 arguments, \(act, obs, rew, terminated, truncated, info\).*tmrl before 0\.5"
    with pytest.raises(TypeError, match=message):
        RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), MLPActor, old_compressor)
    with pytest.raises(TypeError, match=message):
        Trainer(training, sample_compressor=old_compressor)
    RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), MLPActor, my_sample_compressor)  # the 6-argument one


def test_a_workers_packets_wait_for_min_samples_as_in_tmrl(monkeypatch: pytest.MonkeyPatch) -> None:
    """The class's default has no packet delay: on a slow env (here, a clock that moves a second per step) a packet
    still holds min_samples_per_worker_packet rows, which the tutorial's memory needs (its first packet must be longer
    than the action buffer, or its __len__ stays 0 for good). A set delay cuts packets short."""
    import types

    import netrl.worker.packets

    clock = iter(range(10**6))
    monkeypatch.setattr(netrl.worker.packets, "time", types.SimpleNamespace(monotonic=lambda: float(next(clock))))

    def packet_rows(**kw: Any) -> list[int]:
        worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                               min_samples_per_worker_packet=50, max_samples_per_episode=60, seed=0, **kw)
        return [len(buf.memory) for buf in local_packets(worker, [False] * 3)]

    assert packet_rows()[:3] == [50, 50, 50]
    assert max(packet_rows(max_packet_delay_s=0.5)) <= 2
    with pytest.raises(ValueError, match="max_packet_delay_s must be > 0, or None"):
        RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), MLPActor, max_packet_delay_s=0.0)


def test_a_packet_leaves_at_min_samples_mid_episode_where_tmrl_waits_for_the_episode_end() -> None:
    """docs/tmrl.md: tmrl hands rows over at episode ends only; netrl cuts a packet once it holds
    min_samples_per_worker_packet rows, inside an episode too, and loses no row at the cut."""
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           min_samples_per_worker_packet=8, max_samples_per_episode=30, seed=0)
    bufs = list(local_packets(worker, [False]))
    fresh = [int(np.count_nonzero(~buf.context)) for buf in bufs]
    assert fresh == [8, 8, 8]  # of 31 rows (the reset row and 30 steps); 7 wait for the next packet
    assert not any(buf.terminated[-1] or buf.truncated[-1] for buf in bufs)  # each left mid-episode
    assert all(buf.context[0] for buf in bufs[1:])  # each later one repeats the row its transition starts from


def test_buffer_memory_lists_each_row_once_across_packets() -> None:
    """tmrl's per-row view leaves out the context rows that start every packet after the first, so a memory that
    appends buffer.memory packet after packet (the tutorial's) holds each env step once and in order."""
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           min_samples_per_worker_packet=7, max_samples_per_episode=20, overlap=3, seed=0)
    rows = [r for buf in local_packets(worker, [False] * 2) for r in over_the_wire(buf).memory]
    assert len(rows) == 2 * 21  # per episode: its first observation, then 20 steps
    assert [info["reset"] for *_, info in rows] == ([True] + [False] * 20) * 2
    actions = [np.asarray(act).tobytes() for act, *_ in rows if not _[-1]["reset"]]
    assert len(set(actions)) == len(actions)  # no step twice


def test_a_trainer_without_the_workers_compressor_says_to_pass_it() -> None:
    pipe = drone_pipeline(Config(agent=dataclasses.replace(Config().agent, hidden_sizes=[8])), time_step=0.005,
                          ep_max_length=5)
    worker = RolloutWorker(pipe.env_cls, pipe.actor_module_cls, my_sample_compressor, min_samples_per_worker_packet=4,
                           seed=0)
    buf = next(local_packets(worker, [False]))
    msg = decode(encode(samples_message(buf, "w", "s", 1, len(buf))))
    env = pipe.env_cls()
    SampleSchema.from_spaces(env.observation_space, env.action_space, my_sample_compressor).check(
        msg.body, msg.arrays, "worker w")  # the trainer given the compressor takes it
    with pytest.raises(SampleRejected, match=re.escape("give the Trainer the workers' compressor: "
                                                       "Trainer(..., sample_compressor=...))")):
        SampleSchema.from_spaces(env.observation_space, env.action_space).check(msg.body, msg.arrays, "worker w")


def test_run_episode_starts_the_worker_and_refuses_tmrls_episode_length() -> None:
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           max_samples_per_episode=5, standalone=True, seed=0)
    try:
        with pytest.raises(TypeError, match=r"run_episode\(test\) takes True .* not 1000; the episode length is "
                                            r"RolloutWorker\(max_samples_per_episode=...\)"):
            worker.run_episode(1000)  # type: ignore[arg-type]  # tmrl's run_episode(max_samples_per_episode)
        stats = worker.run_episode(test=True)  # not started yet: it starts itself, as tmrl's worker is ready at once
        assert stats is not None and stats.length == 5
    finally:
        worker.close()


def test_tmrls_nn_helpers_give_a_gradient_free_view_that_follows_training() -> None:
    class Agent:  # the tutorial agent's pattern, with cached_property in the class body
        model_nograd = cached_property(lambda self: no_grad(copy_shared(self.model)))

        def __init__(self) -> None:
            self.model = MLPActorCritic(OBS_SPACE, ACT_SPACE, (8,))

    agent = Agent()
    actor = agent.model_nograd.actor
    assert agent.model_nograd is agent.model_nograd  # built once
    assert not any(p.requires_grad for p in actor.parameters())
    assert all(p.requires_grad for p in agent.model.parameters())  # the trained model keeps its gradients
    with torch.no_grad():
        for p in agent.model.parameters():
            p.add_(1.0)  # an optimiser step
    for shared, trained in zip(actor.state_dict().values(), agent.model.actor.state_dict().values(), strict=True):
        assert torch.equal(shared, trained)


def test_tmrls_positional_order_fails_instead_of_shifting_values_after_crc_debug(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # tmrl has crc_debug between obs_preprocessor and model_path_history: in its positional order, netrl would take
    # standalone=10 and model_history=<a path>, and the worker would send nothing.
    env_cls = partial(GenericGymEnv, id="Pendulum-v1")
    with pytest.raises(TypeError, match=re.escape(
            "RolloutWorker() takes 9 arguments by position (env_cls, actor_module_cls, sample_compressor, device, "
            "server_ip, min_samples_per_worker_packet, max_samples_per_episode, model_path, obs_preprocessor), but "
            "got 12: tmrl has crc_debug next, which netrl does not take, so netrl takes none of the later ones by "
            "position (taken one place early, each value would land in the wrong parameter); pass the arguments "
            "after obs_preprocessor by name")):
        RolloutWorker(env_cls, MLPActor, None, "cpu", "127.0.0.1", 100, 200, str(tmp_path / "w.pt"), None, False,
                      str(tmp_path / "hist"), 10)  # type: ignore[misc]
    worker = RolloutWorker(env_cls, MLPActor, model_path=str(tmp_path / "w.pt"), model_history=2, standalone=True)
    assert worker.settings.model_path_history == str(tmp_path / "w_history")  # model_history works unnamed
    with caplog.at_level(logging.WARNING, logger="netrl.worker.worker"):
        worker.start()  # deployment with a path that does not exist says so
    worker.close()
    assert f"{tmp_path / 'w.pt'} does not exist: this standalone worker runs its actor as initialised" in caplog.text


def test_tmrls_keywords_say_what_netrl_takes_instead(tmp_path: Path) -> None:
    env_cls = partial(GenericGymEnv, id="Pendulum-v1")
    with pytest.raises(TypeError) as crc:
        RolloutWorker(env_cls, MLPActor, crc_debug=False)  # type: ignore[call-arg]  # the tutorial's CRC_DEBUG
    assert str(crc.value) == (
        "RolloutWorker() got tmrl's argument crc_debug=False, which netrl does not take: tmrl's switch to checksum "
        "samples while debugging a pipeline: netrl checks every packet (layout, dtypes, shapes and values) always, "
        "and python -m netrl --check-env runs an env through those checks; remove it")
    with pytest.raises(TypeError, match=r"RolloutWorker\(\) got tmrl's argument password='pswd', which netrl does not "
                                        r"take: netrl encrypts and authenticates with CURVE keys, not a password or "
                                        r"TLS: make them with python -m netrl --keygen and pass "
                                        r"keys=client_keys\(keys_dir, role, name\)"):
        RolloutWorker(env_cls, MLPActor, password="pswd")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"Trainer\(\) got tmrl's argument checkpoint_path='t.tcpt', which netrl does "
                                        r"not take: netrl checkpoints into run_dir after every epoch and resumes"):
        Trainer(TrainingOffline, checkpoint_path="t.tcpt")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"Server\(\) got tmrl's argument port=55555, which netrl does not take: "
                                        r"netrl's server listens on two ports: give trainer_port=\.\.\. and "
                                        r"worker_port=\.\.\. instead"):
        Server(port=55555)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument 'nonsense'"):  # Python's, for the rest
        RolloutWorker(env_cls, MLPActor, nonsense=1)  # type: ignore[call-arg]


def test_todays_tmrl_positional_order_is_refused_at_the_first_value_that_does_not_fit(tmp_path: Path) -> None:
    env_cls = partial(GenericGymEnv, id="Pendulum-v1")
    # today's tmrl: (env_cls, actor_module_cls, sample_compressor, device, max_samples_per_episode, model_path, ...)
    with pytest.raises(TypeError) as worker:
        RolloutWorker(env_cls, MLPActor, None, "cpu", 1000, str(tmp_path / "w.pt"))  # type: ignore[arg-type]
    assert str(worker.value) == (
        "RolloutWorker(): argument 5 by position is server_ip, which takes a string or None, not 1000; tmrl's order "
        "has max_samples_per_episode there. netrl's order by position is (env_cls, actor_module_cls, "
        "sample_compressor, device, server_ip, min_samples_per_worker_packet, max_samples_per_episode, model_path, "
        "obs_preprocessor): pass the arguments by name to be sure")
    with pytest.raises(TypeError, match=r"argument 8 by position is model_path, which takes a path or None, not "
                                        r"False; tmrl's order has crc_debug there"):
        RolloutWorker(env_cls, MLPActor, None, "cpu", "127.0.0.1", 10, 1000, False)  # type: ignore[arg-type]
    # today's tmrl Trainer: (training_cls, server_ip, server_port, password, ...)
    with pytest.raises(TypeError, match=r"Trainer\(\): argument 3 by position is model_path, which takes a path or "
                                        r"None, not 55555; tmrl's order has server_port there"):
        Trainer(TrainingOffline, "127.0.0.1", 55555)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Server\(\) takes 1 argument by position \(min_samples_per_server_packet\), "
                                        r"but got 2: tmrl's Server takes its port and password there"):
        Server(55555, "pswd")  # type: ignore[misc]
    # netrl's own order (older tmrl's) still works by position
    worker = RolloutWorker(env_cls, MLPActor, None, "cpu", "127.0.0.1", 10, 1000, str(tmp_path / "w.pt"), None)
    settings = worker.settings
    assert (settings.network.server_ip, settings.min_samples_per_worker_packet) == ("127.0.0.1", 10)
    assert worker.model_path == str(tmp_path / "w.pt")
