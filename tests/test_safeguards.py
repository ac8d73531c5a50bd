"""Training that cannot be poisoned: packets with extreme values are refused whole, a training step that goes
non-finite is undone exactly, a non-finite actor is never published, and steps that keep going non-finite stop the
trainer with a message naming the workers and the settings to look at."""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from netrl.actor import ActorModule
from netrl.agents.base import TrainingAgent
from netrl.agents.sac import MLPActorCritic, SACAgent
from netrl.errors import NetrlError
from netrl.samples import Batch, Buffer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from tests.fakes import ListSource

OBS = gymnasium.spaces.Box(-1, 1, (3,), np.float32)
ACT = gymnasium.spaces.Box(-1, 1, (1,), np.float32)


def packet(seq: int, worker: str = "w", n: int = 40, field: str | None = None, value: float = 3e38) -> Buffer:
    """``n`` rows of a worker's honest samples, or, with ``field``, ones whose ``field`` holds ``value`` in row 7."""
    rng = np.random.default_rng(seq)
    obs, act = rng.uniform(-1, 1, (n, 3)).astype(np.float32), rng.uniform(-1, 1, (n, 1)).astype(np.float32)
    rew = rng.normal(size=n).astype(np.float32)
    if field is not None:
        {"obs": obs, "act": act, "rew": rew}[field].reshape(n, -1)[7, -1] = value
    return Buffer(act=act, obs=obs, rew=rew, terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                  reset=np.arange(n) == 0, context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64),
                  recv_version=1, worker=worker, seq=seq)


def training(agent: Any = SACAgent, **kw: Any) -> TrainingOffline:
    t = TrainingOffline(env_cls=(OBS, ACT), training_agent_cls=partial(agent, model_cls=partial(
                        MLPActorCritic, hidden_sizes=(16,))) if agent is SACAgent else agent,
                        epochs=1, rounds=1, update_model_interval=5, max_training_steps_per_env_step=100,
                        memory_size=1000, batch_size=16, seed=0, device="cpu", **kw)
    t.build()
    return t


def finite(module: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in module.state_dict().values() if t.is_floating_point())


@pytest.mark.parametrize(("field", "value", "named"), [
    ("rew", 3e38, "rew row 7 is 3e+38, beyond trainer.max_abs_reward (1e+06)"),
    ("rew", -3e38, "rew row 7 is -3e+38"),
    ("obs", 3e38, "obs row 7, element 2 is 3e+38, outside observation_space's bounds [-1, 1]"),
    ("act", -3e38, "act row 7, element 0 is -3e+38, outside action_space's bounds [-1, 1]"),
    ("obs", float("nan"), "obs row 7, element 2 is nan: values must be finite"),
])
def test_packets_with_extreme_values_are_refused_named_counted_and_training_stays_finite(
        field: str, value: float, named: str, caplog: pytest.LogCaptureFixture) -> None:
    t = training(steps=40, start_training=0)
    bufs = [packet(1), *(packet(seq, "robot-2", field=field, value=value) for seq in range(2, 7)), packet(7)]
    with caplog.at_level(logging.WARNING, logger="netrl.training.safeguards"):
        rounds = list(t.run_epoch(ListSource(bufs), threading.Event()))  # type: ignore[arg-type]
    assert t.total_samples == 2 * 39 and t.memory is not None and len(t.memory) == 2 * 39  # none of robot-2's
    assert t.safeguards is not None and t.safeguards.refused == 5
    assert f"refused packet 2 of worker robot-2 (40 rows): {named}" in caplog.text
    assert rounds[-1]["refused_packets"] == 5 and t.total_updates == 40
    assert t.agent is not None and finite(t.agent.model) and finite(t.agent.critic_target)
    assert all(np.isfinite(v) for k, v in rounds[-1].items() if k.startswith("loss_"))


def test_an_honest_packet_at_the_bounds_passes_and_a_placeholder_action_need_not_fit() -> None:
    t = training()
    edge = packet(1)
    edge.obs[3] = np.nextafter(np.float32(1), np.float32(2))  # float rounding at the bound
    edge.act[0] = 5.0  # the reset row's action is a placeholder (an env's default action): finite is enough
    assert t.add(edge) == 39
    edge.act[0] = np.inf
    assert t.add(edge) == 0 and t.safeguards is not None and t.safeguards.refused == 1


class PoisonedSAC(SACAgent):
    """SAC whose calls in ``poison`` train on NaN rewards; it keeps its state before the last poisoned call."""

    poison: set[int] = set()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0
        self.before: dict[str, Any] = {}

    def train(self, batch: Batch) -> dict[str, float]:
        self.calls += 1
        if self.calls in self.poison:
            self.before = cloned(self.state_dict())
            batch = batch._replace(rew=torch.full_like(batch.rew, float("nan")))
        return super().train(batch)


def cloned(state: Any) -> Any:
    """A copy of nested state dicts (copy.deepcopy may give two small tensors one storage: its memo is keyed by the
    id of a storage wrapper made per call)."""
    if isinstance(state, dict):
        return {k: cloned(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(cloned(v) for v in state)
    return state.detach().clone() if isinstance(state, torch.Tensor) else copy.copy(state)


def same(a: Any, b: Any) -> bool:
    """Nested state dicts hold equal tensors and values."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return bool(torch.equal(a, b))
    return bool(a == b)


def test_a_step_with_a_nonfinite_loss_is_undone_exactly_and_counted_with_the_batchs_workers(
        caplog: pytest.LogCaptureFixture) -> None:
    # The poisoned call is the last of the epoch, so the state after it is what the guard put back; it follows a check
    # of the whole state (every KEEP_EVERY = 10 steps: after step 10, the 11th call), so nothing else is undone.
    agent = partial(PoisonedSAC, model_cls=partial(MLPActorCritic, hidden_sizes=(16,)))
    PoisonedSAC.poison = {1, 12}  # the first step too: the optimisers' state does not exist before it
    t = training(agent, steps=12, start_training=0)
    with caplog.at_level(logging.WARNING, logger="netrl.training.safeguards"):
        list(t.run_epoch(ListSource([packet(1, "robot-1"), packet(2, "robot-2")]), threading.Event()))  # type: ignore[arg-type]
    assert isinstance(t.agent, PoisonedSAC) and t.agent.calls == 12
    assert same(t.agent.state_dict(), t.agent.before)  # parameters, targets, Adam moments and steps, log_alpha
    assert t.total_updates == 10 and t.safeguards is not None and t.safeguards.nonfinite_steps == 2
    assert int(t.agent.q_optimizer.state_dict()["state"][0]["step"]) == 10  # the undone steps left no count
    assert "training step 11 was not finite (loss_critic=nan" in caplog.text  # the 11th it would have made
    assert ("with samples from robot-1, robot-2: the agent and its optimisers are back at their last finite state, "
            "undoing this step (2 times so far, 1 in a row;") in caplog.text


class TutorialAgent(TrainingAgent):
    """A tmrl-style agent with no state_dict: one linear actor and its optimiser. Poisoned, its gradient is
    infinite while its loss is finite."""

    def __init__(self, observation_space: Any, action_space: Any, device: str = "cpu") -> None:
        super().__init__(observation_space, action_space, device)
        self.actor = Actor(observation_space, action_space)
        self.opt = torch.optim.SGD(self.actor.parameters(), lr=0.1, momentum=0.9)
        self.calls, self.poison = 0, {4}

    def train(self, batch: Batch) -> dict[str, float]:
        self.calls += 1
        loss = (self.actor.lin(batch.obs) - batch.act).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        if self.calls in self.poison:
            self.actor.lin.weight.grad.fill_(float("inf"))  # type: ignore[union-attr]
        self.opt.step()
        return {"loss": loss.item()}

    def get_actor(self) -> ActorModule:
        return self.actor


class Actor(ActorModule):
    def __init__(self, observation_space: Any, action_space: Any) -> None:
        super().__init__(observation_space, action_space)
        self.lin = torch.nn.Linear(3, 1)

    def act(self, obs: Any, test: bool = False) -> np.ndarray:
        return self.lin(obs)[0].detach().numpy()


def test_a_user_agent_without_state_dict_is_undone_too_when_only_its_gradient_goes_infinite(
        caplog: pytest.LogCaptureFixture) -> None:
    t = TrainingOffline(env_cls=(OBS, ACT), training_agent_cls=TutorialAgent, epochs=1, rounds=1, steps=4,
                        max_training_steps_per_env_step=100, memory_size=1000, batch_size=16, seed=0, device="cpu",
                        start_training=0, update_model_interval=100)
    t.build()
    agent = t.agent
    assert isinstance(agent, TutorialAgent)
    initial = agent.actor.lin.weight.detach().clone()
    source = ListSource([packet(1)])
    with caplog.at_level(logging.WARNING, logger="netrl.training.safeguards"):
        list(t.run_epoch(source, threading.Event()))  # type: ignore[arg-type]
    # The 4th call's loss is finite, so only the check of the whole state at the round's end sees its weights:
    # back to the state last checked, the start, undoing the 4 steps since.
    assert agent.calls == 4 and torch.equal(agent.actor.lin.weight, initial)
    assert t.safeguards is not None and t.safeguards.nonfinite_steps == 1
    assert ("the agent's state after training step 4 was not finite (actor.lin.weight, opt.state[0].momentum_buffer) "
            "(packets came lately from w): the agent and its optimisers are back at their last finite state, undoing "
            "the last 4 training steps (1 time so far") in caplog.text
    assert not agent.opt.state[agent.actor.lin.weight]["momentum_buffer"].any()  # as a new optimiser's: zeros
    agent.poison = set()
    t.epoch, t.epochs = 0, 2
    list(t.run_epoch(source, threading.Event()))  # type: ignore[arg-type]
    assert not torch.equal(agent.actor.lin.weight, initial) and bool(torch.isfinite(agent.actor.lin.weight).all())


def test_a_nonfinite_actor_is_never_published(caplog: pytest.LogCaptureFixture) -> None:
    t = training()
    source = ListSource([])
    t.publish(source)  # type: ignore[arg-type]
    assert list(source.published) == [1]
    assert t.agent is not None
    with torch.no_grad():
        t.agent.get_actor().mu.weight[0, 0] = float("nan")  # type: ignore[index, union-attr]
    with caplog.at_level(logging.ERROR, logger="netrl.training.safeguards"):
        t.publish(source)  # type: ignore[arg-type]
    assert t.publisher is not None
    assert list(source.published) == [1] and t.publisher.version == 1  # the workers keep v1
    assert "not publishing the actor: mu.weight is not finite" in caplog.text


def test_steps_that_stay_nonfinite_stop_training_naming_the_workers_and_what_to_look_at() -> None:
    # A learning rate no network survives: every step makes the weights or the losses overflow.
    agent = partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(16,)), lr_critic=1e30, lr_actor=1e30)
    t = training(agent, steps=150, start_training=0)  # trainer.max_nonfinite_steps: 100 by default
    with pytest.raises(NetrlError, match=r"100 training steps in a row were not finite .* each undone; nothing "
                                         r"non-finite was published or saved. Their batches held samples from "
                                         r"robot-9\. .*trainer.max_abs_reward \(1e\+06\)"
                                         r".*agent.sac.lr_critic"):
        list(t.run_epoch(ListSource([packet(1, "robot-9")]), threading.Event()))  # type: ignore[arg-type]
    assert t.safeguards is not None and t.safeguards.nonfinite_steps == 100 and t.total_updates == 0
    assert t.agent is not None and finite(t.agent.model)  # what the last finite step left
