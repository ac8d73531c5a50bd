"""A TorchRL policy on a TorchRL env, end to end: TensorDictActor (netrl.interop.policies) acting on a worker whose
env is a TorchRL env (netrl.interop.envs), with the real server and a Trainer in threads. The policy's out_keys
beyond the action (a ProbabilisticActor's "action_log_prob", "loc", "scale") arrive at the trainer as batch.extra
columns beside the env's info column, each the value the policy computed for that transition's own action."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

torchrl = pytest.importorskip("torchrl")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import zmq  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402
from torchrl.envs import CatFrames, GymEnv, StepCounter, TransformedEnv  # noqa: E402

from netrl.actor import ActorModule  # noqa: E402
from netrl.agents.base import TrainingAgent  # noqa: E402
from netrl.interop.envs import torchrl_env  # noqa: E402
from netrl.interop.policies import TensorDictActor  # noqa: E402
from netrl.memory.replay import ReplayMemory  # noqa: E402
from netrl.samples import Batch  # noqa: E402
from netrl.samples.info import InfoKey  # noqa: E402
from netrl.server.server import Server  # noqa: E402
from netrl.trainer.trainer import Trainer  # noqa: E402
from netrl.training.loop import TrainingOffline  # noqa: E402
from netrl.util import partial  # noqa: E402
from netrl.worker.worker import RolloutWorker  # noqa: E402
from tests.fakes import NET, wait_until  # noqa: E402
from tests.interop.nets import q_policy, tanh_normal_policy  # noqa: E402
from tests.recording import local_packets  # noqa: E402

STEPS = (InfoKey("step_count", "int64"),)
EXTRAS = {"action_log_prob", "loc", "scale"}


def pendulum() -> Any:
    return TransformedEnv(GymEnv("Pendulum-v1"), StepCounter(max_steps=20))


def same_policy(observation_space: Any, action_space: Any) -> torch.nn.Module:
    """The policy with the same weights wherever it is built: the worker's acts as the trainer's would."""
    torch.manual_seed(7)
    return tanh_normal_policy(observation_space, action_space)


class KeepingAgent(TrainingAgent):
    """Keeps every batch; trains nothing, so the policy that acted is the one that judges."""

    def __init__(self, observation_space: Any, action_space: Any, device: str) -> None:
        super().__init__(observation_space, action_space, device)
        self.actor = TensorDictActor(observation_space, action_space, policy=same_policy)
        self.batches: list[Batch] = []

    def train(self, batch: Batch) -> dict[str, float]:
        self.batches.append(batch)
        return {}

    def get_actor(self) -> ActorModule:
        return self.actor


@pytest.mark.parametrize("num_envs", [1, 2])
def test_a_torchrl_policys_out_keys_reach_the_trainer_as_extra_columns(server: tuple[Server, zmq.Context],
                                                                        tmp_path: Path, num_envs: int) -> None:
    srv, _ = server
    env_cls = torchrl_env(pendulum, info_keys=STEPS)
    actor_cls = partial(TensorDictActor, policy=same_policy)
    training = partial(TrainingOffline, env_cls=env_cls, memory_cls=ReplayMemory, training_agent_cls=KeepingAgent,
                       epochs=1, rounds=1, steps=4, start_training=60, max_training_steps_per_env_step=10.0,
                       memory_size=10_000, batch_size=32, seed=0, sleep_between_buffer_retrieval_attempts=0.01)
    trainer = Trainer(training, "127.0.0.1", server_port=srv.trainer_port, network=NET, run_dir=tmp_path / "run",
                      wandb_mode="disabled", info_keys=STEPS)
    stop = threading.Event()
    trainer_thread = threading.Thread(target=trainer.run, args=(stop,))
    trainer_thread.start()
    try:
        wait_until(lambda: srv.intake.schema is not None, 30, "the trainer's sample layout at the server", poll=0.05)
        assert srv.intake.schema is not None and EXTRAS <= {k.removeprefix("extra/") for k in srv.intake.schema.leaves}
        worker = RolloutWorker(env_cls, actor_cls, server_ip="127.0.0.1", server_port=srv.worker_port, network=NET,
                               min_samples_per_worker_packet=10, num_envs=num_envs, worker_id="w1", seed=0,
                               info_keys=STEPS)
        worker.run(0, nb_episodes=6)  # closes once every packet is acknowledged
        assert worker.samples_unacknowledged == 0
        trainer_thread.join(90)
    finally:
        stop.set()
        trainer_thread.join(20)
    assert not trainer_thread.is_alive()
    assert trainer.net is not None and trainer.net.stats["rejected"] == 0
    agent = trainer.training.agent  # type: ignore[union-attr]
    assert isinstance(agent, KeepingAgent) and len(agent.batches) == 4
    module = agent.actor.module
    for batch in agent.batches:
        assert EXTRAS | {"info/step_count"} <= set(batch.extra)
        td = TensorDict({"observation": batch.obs}, batch_size=[len(batch.obs)])
        with torch.no_grad():
            dist = module.get_dist(module.module[0](td))  # the TanhNormal the worker sampled from
            log_prob = dist.log_prob(batch.act)
        # each transition's extras are those of its own action, chosen from its own observation
        torch.testing.assert_close(batch.extra["loc"], td["loc"])
        torch.testing.assert_close(batch.extra["scale"], td["scale"])
        torch.testing.assert_close(batch.extra["action_log_prob"], log_prob, atol=1e-4, rtol=1e-4)
        assert (batch.extra["info/step_count"] >= 1).all() and (batch.extra["info/step_count"] <= 20).all()


def cartpole(categorical: bool) -> Any:
    return GymEnv("CartPole-v1", categorical_action_encoding=categorical)


@pytest.mark.parametrize("discrete", ["one_hot", "categorical"])
def test_a_q_value_actor_drives_a_gymenv_whose_actions_are_one_hot_or_indices(discrete: str) -> None:
    """GymEnv's OneHot actions (its default) go with a one-hot QValueActor, categorical_action_encoding=True with an
    index-writing one: the worker's Discrete index is encoded back for the env either way."""
    categorical = discrete == "categorical"
    env_cls = torchrl_env(partial(cartpole, categorical))
    actor_cls = partial(TensorDictActor, policy=partial(q_policy, categorical=categorical), discrete=discrete)
    worker = RolloutWorker(env_cls, actor_cls, seed=0, num_envs=2, min_samples_per_worker_packet=8)
    worker.local_packets = []
    worker.start()
    try:
        worker.run(0, nb_episodes=2)
        worker.sink.send()
    finally:
        worker.close()
    bufs = worker.local_packets
    rows = sum(int((~b.reset & ~b.context).sum()) for b in bufs)
    assert rows > 10 and all(set(np.unique(b.act).tolist()) <= {0, 1} for b in bufs)
    for b in bufs:  # the greedy action of training episodes' epsilon-free QValueActor: its action_value's argmax
        step = ~b.reset & ~b.context
        assert b.extra is not None and np.array_equal(b.act[step], b.extra["action_value"][step].argmax(-1))


def test_a_policy_reads_a_dict_observations_entries_under_observation() -> None:
    """Several observation keys make a Dict observation, which TensorDictActor lays out under "observation" (as
    netrl's batches are laid out): the policy reads ("observation", "stacked"), not the env's own "stacked"."""
    def stacked() -> Any:
        return TransformedEnv(GymEnv("Pendulum-v1"), CatFrames(2, dim=-1, in_keys=["observation"],
                                                               out_keys=["stacked"]))

    def policy(observation_space: Any, action_space: Any) -> torch.nn.Module:
        return TensorDictModule(lambda s: s[..., 3:4].clamp(-2, 2), [("observation", "stacked")], ["action"])

    worker = RolloutWorker(torchrl_env(stacked), partial(TensorDictActor, policy=policy), seed=0,
                           max_samples_per_episode=10)
    bufs = list(local_packets(worker, [False]))
    step = np.concatenate([~b.reset & ~b.context for b in bufs])
    acts = np.concatenate([b.act for b in bufs])
    # each action is the first entry of the observation it was chosen from, the row before (clamped to the space)
    seen = np.concatenate([b.obs["stacked"] for b in bufs])
    assert step.sum() == 10 and np.allclose(acts[1:][step[1:]][:, 0], seen[:-1][step[1:]][:, 3].clip(-2, 2))
