"""Double DQN: finite steps, the double-DQN target under the next state's mask, masked and branched actions, the
epsilon that travels with the weights, checkpoints, a masked env end to end, and a little learning on CartPole."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from netrl.agents.common.masks import MASK_KEY
from netrl.agents.dqn import DQNActor, DQNAgent
from netrl.config.load import config_from_dict
from netrl.local import run_local
from netrl.memory.replay import ReplayMemory
from netrl.pipelines.base import Pipeline
from netrl.pipelines.make import make_pipeline
from netrl.samples import Batch
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker

Discrete, MultiDiscrete, MultiBinary, Box, Dict = (gymnasium.spaces.Discrete, gymnasium.spaces.MultiDiscrete,
                                                   gymnasium.spaces.MultiBinary, gymnasium.spaces.Box,
                                                   gymnasium.spaces.Dict)
OBS = Box(-1, 1, (3,), np.float32)
MASKED = Dict({"obs": OBS, MASK_KEY: MultiBinary(4)})


def make_agent(obs: gymnasium.Space = OBS, act: gymnasium.Space = Discrete(4), **kw: object) -> DQNAgent:
    torch.manual_seed(0)
    return DQNAgent(obs, act, "cpu", hidden_sizes=(16, 16), **kw)  # type: ignore[arg-type]


def batch(n: int = 8, terminated: float = 0.0, truncated: float = 0.0, act: torch.Tensor | None = None) -> Batch:
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 4, (n,), generator=g) if act is None else act
    return Batch(torch.randn(n, 3, generator=g), a.to(torch.uint8), torch.randn(n, generator=g),
                 torch.randn(n, 3, generator=g), torch.full((n,), terminated), torch.full((n,), truncated))


def masked_obs(n: int, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"obs": torch.randn(n, 3), MASK_KEY: mask.to(torch.uint8)}


def test_one_training_step_gives_finite_losses_moves_the_weights_and_decays_epsilon() -> None:
    agent = make_agent(exploration_steps=10, exploration_initial_eps=1.0, exploration_final_eps=0.1)
    before = {k: v.clone() for k, v in agent.actor.state_dict().items()}
    metrics = agent.train(batch())
    assert set(metrics) == {"loss_q", "q", "epsilon", "grad_norm", "dead_units"}
    assert all(np.isfinite(v) for v in metrics.values())
    after = agent.actor.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if k != "epsilon")
    # epsilon is in the actor's state_dict: the workers get it with each weight version
    assert after["epsilon"].item() == pytest.approx(0.91)
    for _ in range(20):
        agent.train(batch())
    assert agent.actor.state_dict()["epsilon"].item() == pytest.approx(0.1)


def test_dead_units_and_the_gradient_norm_are_reported() -> None:
    """A last hidden layer at zero for every sample (dying ReLUs) shows as dead_units 1: Q then no
    longer depends on the observation, the greedy policy is one action everywhere."""
    agent = make_agent()
    metrics = agent.train(batch(64))
    assert 0.0 <= metrics["dead_units"] < 1.0 and metrics["grad_norm"] > 0.0
    last = [m for m in agent.actor.q.trunk if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.bias.fill_(-1e3)  # every unit of the last hidden layer below zero for any input
    assert agent.train(batch(64))["dead_units"] == 1.0
    q = agent.actor.q(torch.randn(32, 3))
    assert torch.allclose(q, q[:1].expand_as(q))  # the same Q for every observation


def test_truncation_bootstraps_but_termination_does_not() -> None:
    def loss(**flags: float) -> float:
        return make_agent().train(batch(**flags))["loss_q"]

    assert loss(truncated=1.0) == loss()
    assert loss(terminated=1.0) != loss()


def test_the_target_values_the_online_argmax_among_the_actions_the_next_state_allows() -> None:
    agent = make_agent(MASKED)
    agent.gamma = 0.9
    with torch.no_grad():  # a target network that differs from the online one, as it does between copies
        for p in agent.q_target.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    n = 64
    g = torch.Generator().manual_seed(2)
    o, a, r = masked_obs(n, torch.ones(n, 4)), torch.randint(0, 4, (n,), generator=g), torch.randn(n, generator=g)
    mask2 = torch.zeros(n, 4, dtype=torch.uint8)
    mask2[torch.arange(n), torch.randint(0, 4, (n,), generator=g)] = 1
    mask2[torch.arange(n), torch.randint(0, 4, (n,), generator=g)] = 1  # one or two allowed actions per state
    o2 = masked_obs(n, mask2)
    with torch.no_grad():
        q_online, q_target = agent.actor.q(o2), agent.q_target(o2)
        a2 = q_online.masked_fill(mask2 == 0, -torch.inf).argmax(-1)
        y = r + 0.9 * q_target.gather(1, a2[:, None]).squeeze(1)
        expected = F.smooth_l1_loss(agent.actor.q(o).gather(1, a[:, None]).squeeze(1), y).item()
        # what the test tells apart: the unmasked argmax, and plain DQN's max of the target over allowed actions
        unmasked = r + 0.9 * q_target.gather(1, q_online.argmax(-1, keepdim=True)).squeeze(1)
        plain = r + 0.9 * q_target.masked_fill(mask2 == 0, -torch.inf).max(-1).values
    assert not torch.allclose(y, unmasked) and not torch.allclose(y, plain)
    got = agent.train(Batch(o, a.to(torch.uint8), r, o2, torch.zeros(n), torch.zeros(n)))["loss_q"]
    assert got == pytest.approx(expected, rel=1e-5)


def test_the_actor_never_picks_a_masked_action_greedy_or_exploring() -> None:
    actor = DQNActor(MASKED, Discrete(4, start=1), hidden_sizes=(8,))
    g = torch.Generator().manual_seed(3)
    for epsilon in (0.0, 1.0, 0.5):
        actor.epsilon.fill_(epsilon)
        for test in (False, True):
            mask = (torch.rand(256, 4, generator=g) < 0.4).to(torch.uint8)
            mask[mask.sum(-1) == 0, 2] = 1
            actions = actor.act_batch(masked_obs(256, mask), test=test)
            assert actions.shape == (256,) and actions.dtype == np.int64
            assert mask[torch.arange(256), torch.as_tensor(actions) - 1].all()  # Discrete(4, start=1): 1..4
    actor.epsilon.fill_(1.0)  # exploring samples every allowed action, not only the first
    wide = actor.act_batch(masked_obs(400, torch.tensor([[1, 0, 1, 1]] * 400)))
    assert set(wide.tolist()) == {1, 3, 4}
    one = actor.act_({"obs": np.zeros(3, np.float32), MASK_KEY: np.array([0, 0, 1, 0], np.int8)}, test=False)
    assert one.shape == () and int(one) == 3


def test_test_episodes_act_greedily_and_training_ones_explore() -> None:
    actor = DQNActor(OBS, Discrete(5), hidden_sizes=(8,))
    obs = torch.zeros(200, 3)
    actor.epsilon.fill_(1.0)
    assert len(set(actor.act_batch(obs, test=True).tolist())) == 1
    assert len(set(actor.act_batch(obs, test=False).tolist())) == 5


def test_bad_masks_are_refused_naming_the_mask() -> None:
    with pytest.raises(ValueError, match=r'observation_space\["action_mask"\] is MultiBinary\(3\); it must be a '
                                         r"MultiBinary\(4\) or a Box of shape \(4,\)"):
        DQNActor(Dict({"obs": OBS, MASK_KEY: MultiBinary(3)}), Discrete(4))
    actor = DQNActor(MASKED, Discrete(4), hidden_sizes=(8,))
    mask = torch.ones(3, 4)
    mask[1] = 0
    with pytest.raises(ValueError, match=r'the "action_mask" of observation 1 allows no action in action dimension 0'):
        actor.act_batch(masked_obs(3, mask))


def test_multidiscrete_and_multibinary_actions_train_as_branches() -> None:
    space = MultiDiscrete([3, 2, 4], start=[-1, 0, 5])
    obs = Dict({"x": OBS, MASK_KEY: MultiBinary(9)})
    agent = make_agent(obs, space)
    mask = torch.tensor([[0, 1, 0, 1, 1, 0, 0, 1, 1]] * 64)  # allows -1.. : {0}, {0, 1}, {7, 8}
    o = {"x": torch.randn(64, 3), MASK_KEY: mask}
    agent.actor.epsilon.fill_(1.0)
    acts = agent.actor.act_batch(o)
    assert acts.shape == (64, 3) and all(space.contains(a) for a in acts)
    assert set(acts[:, 0].tolist()) == {0} and set(acts[:, 1].tolist()) == {0, 1} and set(acts[:, 2].tolist()) == {7, 8}
    m = agent.train(Batch(o, torch.as_tensor(acts, dtype=torch.int8), torch.randn(64), o, torch.zeros(64),
                          torch.zeros(64)))
    assert np.isfinite(m["loss_q"])
    binary = make_agent(OBS, MultiBinary(3))
    acts = binary.actor.act_batch(torch.randn(32, 3))
    assert acts.shape == (32, 3) and set(np.unique(acts).tolist()) <= {0, 1}
    assert np.isfinite(binary.train(Batch(torch.randn(32, 3), torch.as_tensor(acts), torch.randn(32),
                                          torch.randn(32, 3), torch.zeros(32), torch.zeros(32)))["loss_q"])


def test_discrete_observation_leaves_are_one_hot_and_unencodable_leaves_are_named() -> None:
    obs = gymnasium.spaces.Tuple((Discrete(3, start=2), MultiDiscrete([2, 2]), Box(0, 255, (2, 2), np.uint8)))
    agent = make_agent(obs, Discrete(2))
    assert agent.actor.q.encoder.dim == 3 + 4 + 4
    o = (torch.tensor([2, 4], dtype=torch.uint8), torch.tensor([[0, 1], [1, 1]], dtype=torch.uint8),
         torch.zeros(2, 2, 2, dtype=torch.uint8))
    feats = agent.actor.q.encoder(o)
    assert feats[:, :3].tolist() == [[1, 0, 0], [0, 0, 1]]
    assert np.isfinite(agent.train(Batch(o, torch.tensor([0, 1]), torch.zeros(2), o, torch.zeros(2),
                                         torch.zeros(2)))["loss_q"])
    with pytest.raises(ValueError, match=r"observation_space\['b'\]\[1\] is a Text, which DQN cannot encode"):
        make_agent(Dict({"a": OBS, "b": gymnasium.spaces.Tuple((OBS, gymnasium.spaces.Text(5)))}))
    with pytest.raises(ValueError, match=r"DQN needs Discrete, MultiDiscrete or MultiBinary actions \(got Box"):
        make_agent(OBS, Box(-1, 1, (2,)))


def test_state_dict_round_trip_resumes_identically() -> None:
    a = make_agent(target_update_interval=2)
    for _ in range(3):
        a.train(batch())
    saved = io.BytesIO()
    torch.save(a.state_dict(), saved)
    saved.seek(0)
    b = make_agent(target_update_interval=2)
    b.load_state_dict(torch.load(saved, weights_only=True))
    assert int(b.steps) == 3 and b.actor.epsilon.item() == a.actor.epsilon.item()
    for _ in range(2):  # the fourth step copies the target in both
        assert a.train(batch()) == b.train(batch())


def local_run(tmp_path: Path, pipeline: Pipeline, **sections: dict[str, Any]) -> tuple[TrainingOffline, RolloutWorker]:
    """Train in single-process mode: worker -> packets -> replay memory -> batches -> agent, with no network."""
    data: dict[str, Any] = {"run_name": "t", "weights_folder": str(tmp_path), "seed": 0, "security": "none",
                            "wandb": {"mode": "disabled"}, "worker": {"test_episode_interval": 0, "worker_id": "w"}}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    cfg = config_from_dict(data)
    worker = RolloutWorker.from_config(cfg, pipeline)
    training = Trainer.from_config(cfg, pipeline).training_cls()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matmuls: more threads only contend on a loaded machine (several times slower)
    try:
        run_local(training, worker, threading.Event())
    finally:
        torch.set_num_threads(threads)
    return training, worker


class MaskedChoice(gymnasium.Env[dict[str, np.ndarray], np.int64]):
    """Three actions, a random non-empty subset allowed each step; reward 1 for action 2 when it is allowed. A masked
    action is counted (the test asserts there is none) and ends the episode."""

    observation_space = Dict({"x": Box(0, 1, (3,), np.float32), MASK_KEY: MultiBinary(3)})
    action_space = Discrete(3)
    masked_actions = 0

    def __init__(self) -> None:
        self.mask = np.ones(3, np.int8)
        self.t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        self.mask = self.np_random.integers(0, 2, 3).astype(np.int8)
        self.mask[self.np_random.integers(0, 3)] = 1
        return {"x": self.mask.astype(np.float32), MASK_KEY: self.mask.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: np.int64) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        allowed = bool(self.mask[int(action)])
        MaskedChoice.masked_actions += not allowed
        self.t += 1
        return self._obs(), float(int(action) == 2), not allowed, self.t >= 20, {}


def test_a_masked_env_trains_end_to_end_and_no_masked_action_is_ever_taken(tmp_path: Path) -> None:
    MaskedChoice.masked_actions = 0
    pipeline = Pipeline(env_cls=MaskedChoice, actor_module_cls=partial(DQNActor, hidden_sizes=(16,)),
                        memory_cls=ReplayMemory, training_agent_cls=partial(
                            DQNAgent, hidden_sizes=(16,), exploration_steps=100, exploration_final_eps=0.5))
    training, worker = local_run(tmp_path, pipeline, memory={"batch_size": 16}, trainer={
        "epochs": 1, "rounds": 1, "steps": 150, "start_training": 100, "persist_samples": False})
    assert int(training.agent.steps) == 150 and worker.produced >= 200  # the masked batches trained the agent
    assert MaskedChoice.masked_actions == 0


def test_the_gym_pipeline_learns_cartpole_in_single_process_mode(tmp_path: Path) -> None:
    """Random play scores about 22 on CartPole; 3,000 env steps of DQN clearly beat it."""
    cfg_agent = {"hidden_sizes": [64, 64], "dqn": {"lr": 2.3e-3, "target_update_interval": 100,
                                                   "exploration_steps": 800}}
    pipeline = make_pipeline(config_from_dict({"env": {"id": "CartPole-v1"}, "agent": cfg_agent}))
    torch.manual_seed(0)
    training, _ = local_run(tmp_path, pipeline, agent=cfg_agent, memory={"batch_size": 64}, trainer={
        "epochs": 1, "rounds": 1, "steps": 1250, "start_training": 500, "max_training_steps_per_env_step": 0.5,
        "persist_samples": False})
    actor = training.agent.get_actor()
    env = gymnasium.make("CartPole-v1")
    returns = []
    for k in range(5):
        o, _ = env.reset(seed=100 + k)
        done, ret = False, 0.0
        while not done:
            o, r, terminated, truncated, _ = env.step(int(actor.act_(o, test=True)))
            ret, done = ret + float(r), terminated or truncated
        returns.append(ret)
    assert np.mean(returns) > 75, returns  # about 120 here; random play about 22
