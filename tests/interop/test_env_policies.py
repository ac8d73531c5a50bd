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

import torch  # noqa: E402
import zmq  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.envs import GymEnv, StepCounter, TransformedEnv  # noqa: E402

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
from tests.interop.nets import tanh_normal_policy  # noqa: E402

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
