"""A Trainer that cannot be poisoned: packets with extreme values are refused on arrival, non-finite state is never
checkpointed nor saved as the policy, a poisoned checkpoint from an older netrl gives way to the one before, and
training that keeps going non-finite stops the CLI with exit code 1 and advice.

:class:`QuietLink` is the real TrainerLink without a socket or a thread: before each fetch of the training loop it
receives a bundle of one packet from ``make`` (the packet number -> the packet's buffer), and it keeps what it sends.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

import netrl.__main__
from netrl.agents.sac import MLPActorCritic, SACAgent
from netrl.errors import CheckpointError
from netrl.protocol.messages import Message, MsgType
from netrl.protocol.wire import decode, encode, samples_message
from netrl.samples import Buffer
from netrl.storage import checkpoint
from netrl.storage.weight_files import torch_save
from netrl.trainer.delivery import SampleLog
from netrl.trainer.link import TrainerLink
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from tests.fakes import small_config

OBS = gymnasium.spaces.Box(-1, 1, (3,), np.float32)  # the CLI's default pipeline: Pendulum's layout
ACT = gymnasium.spaces.Box(-2, 2, (1,), np.float32)


def honest(seq: int, rows: int = 12) -> Buffer:
    rng = np.random.default_rng(seq)
    return Buffer(act=rng.uniform(-2, 2, (rows, 1)).astype(np.float32),
                  obs=rng.uniform(-1, 1, (rows, 3)).astype(np.float32), rew=rng.normal(size=rows).astype(np.float32),
                  terminated=np.zeros(rows, bool), truncated=np.zeros(rows, bool), reset=np.arange(rows) == 0,
                  context=np.zeros(rows, bool), policy_version=np.zeros(rows, np.int64))


def poisoned(seq: int) -> Buffer:
    """Every third packet: a reward of 3e38, an observation of -3e38 or an action of 3e38 in row 5."""
    buf = honest(seq)
    if seq % 3 == 0:
        [buf.rew, buf.obs[:, 1], buf.act[:, 0]][seq // 3 % 3][5] = 3e38 * (-1) ** seq
    return buf


class QuietLink(TrainerLink):
    make: Callable[[int], Buffer] = staticmethod(honest)  # type: ignore[assignment]
    made: list[QuietLink] = []

    def start(self) -> None:
        self.sent: list[Message] = []
        self.bundles = 0
        self.link.ready = True
        self.link.send = self._send  # type: ignore[method-assign]
        self.link.send_tracked = self._send_tracked  # type: ignore[method-assign]
        self.made.append(self)

    def _send(self, frames: Sequence[Any]) -> bool:
        self.sent.append(decode(frames))
        return True

    def _send_tracked(self, frames: Sequence[Any]) -> Any:
        self._send(frames)
        return types.SimpleNamespace(done=True)

    def fetch(self) -> list[Buffer]:
        if self.error is None:
            self.bundles += 1
            part = [bytes(f) for f in encode(samples_message(type(self).make(self.bundles), "robot-1", "s1",
                                                             self.bundles, self.bundles * 11))]
            self.on_message(Message(MsgType.BUNDLE, "server", seq=self.bundles, parts=[part]))
        return super().fetch()


@pytest.fixture
def links(monkeypatch: pytest.MonkeyPatch) -> type[QuietLink]:
    class Link(QuietLink):
        made: list[QuietLink] = []

    monkeypatch.setattr("netrl.trainer.trainer.TrainerLink", Link)
    return Link


def make_trainer(run_dir: Path, epochs: int, **agent: Any) -> Trainer:
    training_cls = partial(TrainingOffline, env_cls=(OBS, ACT), epochs=epochs, rounds=2, steps=10,
                           training_agent_cls=partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(16,)),
                                                      **agent),
                           update_model_interval=5, update_buffer_interval=2, start_training=10, worker_lead=10,
                           memory_size=1000, batch_size=8, seed=0, sleep_between_buffer_retrieval_attempts=0.01)
    return Trainer(training_cls, "127.0.0.1", run_dir=run_dir, wandb_mode="disabled")


def finite(state: Any) -> bool:
    if isinstance(state, dict):
        return all(finite(v) for v in state.values())
    return not isinstance(state, torch.Tensor) or not state.is_floating_point() or bool(torch.isfinite(state).all())


def test_packets_with_extreme_values_are_refused_on_arrival_acknowledged_and_never_logged(
        tmp_path: Path, links: type[QuietLink], caplog: pytest.LogCaptureFixture) -> None:
    links.make = staticmethod(poisoned)  # type: ignore[assignment]
    trainer = make_trainer(tmp_path, epochs=2)
    with caplog.at_level(logging.WARNING):
        trainer.run()
    (link,) = links.made
    refused = [seq for seq in range(1, link.bundles + 1) if seq % 3 == 0]
    assert link.stats["rejected"] == len(refused) > 3
    assert "'robot-1' (via the server): rew row 5 is -3e+38, beyond trainer.max_abs_reward (1e+06)" in caplog.text
    assert "obs row 5, element 1 is 3e+38, outside observation_space's bounds [-1, 1]" in caplog.text
    acked = [seq for m in link.sent if m.type is MsgType.ACK for seq in m.body["seqs"]]
    assert acked == list(range(1, link.bundles + 1))  # delivered, refused: nobody sends them again
    assert trainer.training is not None and trainer.training.total_samples == 11 * (link.bundles - len(refused))
    log = SampleLog(tmp_path / "samples", keep_rows=10_000)
    assert [rec.meta["seq"] for rec in log.read()] == [s for s in range(1, link.bundles + 1) if s not in refused]
    log.close()
    assert link.schema is not None  # what the link sends the server, which checks the same limits
    limits = link.schema.to_wire()["limits"]
    assert limits["max_abs_reward"] == 1e6 and [b[0] for b in limits["bounds"]] == ["act", "obs"]
    agent_state, _ = checkpoint.load_checkpoint(tmp_path) or ({}, {})
    assert agent_state and finite(agent_state)


def test_nonfinite_agent_state_is_never_checkpointed(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"not saving a checkpoint: the agent's model.w hold NaN or infinity; "
                                              r"the previous checkpoint in .* is intact"):
        checkpoint.save_checkpoint(tmp_path, {"model": {"w": torch.tensor([1.0, float("nan")])}}, {"epoch": 1})
    assert not checkpoint.exists(tmp_path)


def test_a_poisoned_checkpoint_an_older_netrl_saved_gives_way_to_the_one_before(
        tmp_path: Path, links: type[QuietLink], caplog: pytest.LogCaptureFixture) -> None:
    make_trainer(tmp_path, epochs=1).run()
    folder = tmp_path / "checkpoint"
    agent_state = torch.load(folder / "agent_000001.pt", weights_only=True)
    agent_state["model"]["critic.weights.0"].fill_(float("nan"))
    torch_save(agent_state, folder / "agent_000002.pt")  # as the defect's trainer saved it, after epoch 2
    state = checkpoint.load_state(tmp_path)
    assert state is not None
    (folder / "state_000002.json").write_text((folder / "state_000001.json").read_text().replace(
        '"agent_file": "agent_000001.pt"', '"agent_file": "agent_000002.pt"').replace('"epoch": 1', '"epoch": 2'))
    (folder / "CURRENT").write_text('{"number": 2}')
    with caplog.at_level(logging.WARNING):
        trainer = make_trainer(tmp_path, epochs=3)
        trainer.run()
    assert "checkpoint 2 holds NaN or infinity in the agent's model.critic.weights.0: resuming from checkpoint 1" \
        in caplog.text
    assert trainer.training is not None and trainer.training.epoch == 3
    assert trainer.training.agent is not None and finite(trainer.training.agent.state_dict())


def test_a_nonfinite_actor_is_not_saved_as_the_policy(tmp_path: Path, links: type[QuietLink]) -> None:
    trainer = make_trainer(tmp_path, epochs=1)
    trainer.run()
    saved = (tmp_path / "policy.pt").read_bytes()
    assert trainer.training is not None and trainer.training.agent is not None
    with torch.no_grad():
        trainer.training.agent.get_actor().mu.bias.fill_(float("inf"))  # type: ignore[union-attr]
    trainer.training.total_updates += 1  # as if trained since
    with pytest.raises(CheckpointError, match=r"not saving the policy: the actor's mu.bias hold NaN or infinity"):
        trainer.save_policy()
    assert (tmp_path / "policy.pt").read_bytes() == saved


def test_training_that_stays_nonfinite_stops_the_trainer_with_exit_code_1_and_advice(
        tmp_path: Path, links: type[QuietLink], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    config = small_config(tmp_path, trainer={"epochs": 1, "rounds": 2, "steps": 150, "update_buffer_interval": 2,
                                             "start_training": 10, "worker_lead": 10, "max_training_steps_per_env_step":
                                             100.0},
                          # no network survives
                          agent={"sac": {"lr_actor": 1e30, "lr_critic": 1e30},
                                 "hidden_sizes": [16]})
    monkeypatch.setattr(netrl.__main__, "install_stop_signals", lambda stop: None)  # keep pytest's SIGINT
    monkeypatch.setattr(netrl.__main__, "configure_torch", lambda cfg, role: None)  # keep this process's torch threads
    assert netrl.__main__.main(["--trainer", "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "Traceback" not in out
    assert "netrl: 100 training steps in a row were not finite" in out
    # worker/session
    assert "Their batches held samples from robot-1/s1." in out and "agent.sac.lr_critic" in out
    run = tmp_path / "weights" / "test"
    assert not checkpoint.exists(run) or finite(checkpoint.load_checkpoint(run)[0])  # type: ignore[index]
