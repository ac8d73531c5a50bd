"""trainer.compile: compiled updates give eager's results (losses and parameters, from the same seed), without a
recompilation per step; cudagraphs is refused off CUDA; the fused in-place target updates; the config and the
training loop hand the mode to the agent, end to end (packets -> memory -> batch -> compiled step)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from netrl.agents.base import TrainingAgent
from netrl.agents.cnn import CNNActorCritic
from netrl.agents.compiled import check_compile, polyak_
from netrl.agents.dqn import DQNAgent
from netrl.agents.ppo import PPOAgent
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.config.load import config_from_dict
from netrl.errors import ConfigError
from netrl.memory.replay import ReplayMemory
from netrl.pipelines.make import make_pipeline
from netrl.samples import Batch, Buffer
from netrl.trainer.trainer import Trainer
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from tests.fakes import ListSource

OBS = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gymnasium.spaces.Box(-2.0, 2.0, (1,), np.float32)
SMALL_SAC = partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(8, 8)))
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _batches(n: int, size: int = 16, weighted: bool = False, seed: int = 1, device: str = "cpu") -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        b = Batch(torch.randn(size, 3, generator=g), torch.rand(size, 1, generator=g) * 4 - 2,
                  torch.randn(size, generator=g), torch.randn(size, 3, generator=g),
                  (torch.rand(size, generator=g) < 0.2).float(), torch.zeros(size),
                  torch.rand(size, generator=g) if weighted else None)
        out.append(Batch(*(t.to(device) if t is not None else None for t in b)))
    return out


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().cpu() for p in module.parameters()])


def _sac_state(agent: SACAgent) -> list[torch.Tensor]:
    """Parameters, target critics, log alpha, and each optimiser's Adam moments and step count (the compiled step
    moves them itself)."""
    state = [_flat(agent.model), _flat(agent.critic_target), agent.log_alpha.detach().cpu().clone()]
    for optimizer in (agent.q_optimizer, agent.pi_optimizer, agent.alpha_optimizer):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state += [torch.stack([optimizer.state[p]["step"].cpu().float() for p in params])]
        state += [torch.cat([optimizer.state[p][k].detach().flatten().cpu() for p in params])
                  for k in ("exp_avg", "exp_avg_sq")]
    return state


def _run_sac(mode: str, batches: list[Batch], device: str = "cpu") -> tuple[list[dict[str, float]], list[torch.Tensor]]:
    torch.manual_seed(0)
    agent = SMALL_SAC(OBS, ACT, device=device, compile=mode)
    before = _flat(agent.model)
    metrics = [agent.train(b) for b in batches]
    state = _sac_state(agent)
    assert not torch.equal(state[0], before), "nothing trained: the comparison would prove nothing"
    return metrics, state


def _assert_same(eager: tuple[list[dict[str, float]], list[torch.Tensor]],
                 other: tuple[list[dict[str, float]], list[torch.Tensor]]) -> None:
    for step, (e, c) in enumerate(zip(eager[0], other[0], strict=True)):
        assert e.keys() == c.keys()
        for k in e:
            assert c[k] == pytest.approx(e[k], rel=1e-4, abs=1e-5), f"step {step}: {k} eager {e[k]}, compiled {c[k]}"
    for i, (e_t, c_t) in enumerate(zip(eager[1], other[1], strict=True)):  # parameters, target networks, ...
        torch.testing.assert_close(c_t, e_t, rtol=1e-4, atol=1e-5, msg=lambda m, i=i: f"state tensor {i}: {m}")


@pytest.fixture
def graph_capture_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile with the aot_eager backend: the same graph capture, guards and compiled backward as inductor,
    without generating C++ kernels (half a minute of gcc on a cold cache); the slow tests run inductor itself."""
    monkeypatch.setattr(torch, "compile", partial(torch.compile, backend="aot_eager"))


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_sac_matches_eager_losses_and_parameters_without_recompiling_each_step(
        backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if backend != "inductor":
        monkeypatch.setattr(torch, "compile", partial(torch.compile, backend=backend))
    # fallback_random: compiled kernels draw the policy's noise from eager's generator, in the same order
    with torch._inductor.config.patch(fallback_random=True):
        eager = _run_sac("none", _batches(3))
        graphs: list[int] = []
        batches = _batches(3)

        def counted(mode: str, bs: list[Batch]) -> Any:  # the graph count after each step
            torch.manual_seed(0)
            agent = SMALL_SAC(OBS, ACT, compile=mode)
            before = _flat(agent.model)
            metrics = []
            for b in bs:
                metrics.append(agent.train(b))
                graphs.append(counters["stats"]["unique_graphs"])
            state = _sac_state(agent)
            assert not torch.equal(state[0], before)
            return metrics, state

        compiled = counted("compile", batches)
    _assert_same(eager, compiled)
    assert graphs[0] > 0 and graphs[1] == graphs[0] == graphs[2], f"graphs compiled after each step: {graphs}"


def test_compiled_sac_resumes_from_a_checkpoint_as_eager_does(graph_capture_only: None) -> None:
    """load_state_dict replaces the optimisers' state tensors and restores the parameters in place: the compiled
    step must read the new state, and train on exactly as an eager agent resumed from the same checkpoint."""
    with torch._inductor.config.patch(fallback_random=True):
        batches = _batches(4, seed=3)
        results = []
        for mode in ("none", "compile"):
            torch.manual_seed(0)
            first = SMALL_SAC(OBS, ACT, compile=mode)
            for b in batches[:2]:
                first.train(b)
            checkpoint = first.state_dict()
            torch.manual_seed(1)
            resumed = SMALL_SAC(OBS, ACT, compile=mode)
            resumed.load_state_dict(checkpoint)
            torch.manual_seed(2)
            metrics = [resumed.train(b) for b in batches[2:]]
            state = _sac_state(resumed)
            assert state[3].tolist() == [4.0] * len(state[3]), f"{mode}: Adam step counts {state[3].tolist()}"
            results.append((metrics, state))
    _assert_same(results[0], results[1])


def test_compiled_sac_with_a_shared_encoder_updates_it_by_the_critic_only_as_eager_does(
        graph_capture_only: None) -> None:
    """CNNActorCritic's actor and critics share one encoder, which eager SAC trains by the critic loss alone (frozen
    with the critics during the policy's backward): the compiled step must neither let the policy's gradient reach
    it through the critics nor step it with the policy's optimiser."""
    frames = gymnasium.spaces.Box(0, 255, (2, 16, 16), np.uint8)
    # head "linear": the keypoint head's softmax ignores a channel's constant, so its convolution's bias gets a zero
    # gradient plus rounding noise, which Adam magnifies differently in two correct implementations
    cnn_sac = partial(SACAgent, model_cls=partial(CNNActorCritic, hidden_sizes=(8, 8), features=8, head="linear"))
    g = torch.Generator().manual_seed(4)
    batches = [Batch(torch.randint(0, 256, (8, 2, 16, 16), generator=g, dtype=torch.uint8),
                     torch.rand(8, 1, generator=g) * 4 - 2, torch.randn(8, generator=g),
                     torch.randint(0, 256, (8, 2, 16, 16), generator=g, dtype=torch.uint8), torch.zeros(8),
                     torch.zeros(8), None) for _ in range(3)]
    results = []
    with torch._inductor.config.patch(fallback_random=True):
        for mode in ("none", "compile"):
            torch.manual_seed(0)
            agent = cnn_sac(frames, ACT, compile=mode)
            encoder = list(agent.model.critic.encoder.parameters())
            metrics = [agent.train(b) for b in batches]
            assert not any(agent.pi_optimizer.state[p] for p in encoder), f"{mode}: the policy's Adam stepped it"
            results.append((metrics, [_flat(agent.model.critic.encoder), _flat(agent.model),
                                      _flat(agent.critic_target)]))
    _assert_same(results[0], results[1])


@pytest.mark.slow
def test_compiled_sac_and_dqn_match_eager_on_weighted_batches() -> None:
    with torch._inductor.config.patch(fallback_random=True):
        batches = _batches(3, weighted=True, seed=2)  # prioritised replay's batches carry weights
        _assert_same(_run_sac("none", batches), _run_sac("compile", batches))
        acts = gymnasium.spaces.Discrete(3)
        results = []
        for mode in ("none", "compile"):
            torch.manual_seed(0)
            agent = DQNAgent(OBS, acts, hidden_sizes=(8, 8), target_update_interval=2, compile=mode)  # type: ignore[arg-type]
            metrics = []
            for b in batches:
                metrics.append(agent.train(b._replace(act=torch.randint(0, 3, (16, 1)))))
            results.append((metrics, [_flat(agent.actor.q), _flat(agent.q_target)]))
        _assert_same(results[0], results[1])


@CUDA
def test_cudagraphs_sac_matches_eager_on_cuda() -> None:
    with torch._inductor.config.patch(fallback_random=True):
        batches = _batches(4, device="cuda")
        _assert_same(_run_sac("none", batches, "cuda"), _run_sac("cudagraphs", batches, "cuda"))


def test_cudagraphs_and_unknown_modes_are_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"SACAgent\(compile=...\) 'cudagraphs' captures CUDA graphs, but the "
                                         r"training device is 'cpu' \(trainer.device\): use 'compile' on a cpu"):
        SMALL_SAC(OBS, ACT, device="cpu", compile="cudagraphs")
    with pytest.raises(ValueError, match=r"DQNAgent\(compile=...\) must be one of 'none', 'compile', 'cudagraphs' "
                                         r"\(got 'fast'\)"):
        DQNAgent(OBS, gymnasium.spaces.Discrete(2), compile="fast")  # type: ignore[arg-type]
    training = TrainingOffline(env_cls=(OBS, ACT), training_agent_cls=SMALL_SAC, device="cpu", compile="cudagraphs",
                               memory_size=100, batch_size=8)
    with pytest.raises(ValueError, match=r"trainer.compile 'cudagraphs' captures CUDA graphs"):
        training.build()
    check_compile("compile", "cpu")  # compile itself runs anywhere


def test_the_config_refuses_cudagraphs_on_a_cpu_trainer_device() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict({"trainer": {"compile": "cudagraphs", "device": "cpu"}}, "config.json")
    assert ('trainer.compile "cudagraphs" captures CUDA graphs, but trainer.device is "cpu": use "compile" there, or '
            'a CUDA trainer.device') in str(info.value)
    with pytest.raises(ConfigError, match=r'trainer.compile must be "none" or "compile" or "cudagraphs" \(got "max"\)'):
        config_from_dict({"trainer": {"compile": "max"}}, "config.json")


class TmrlStyleAgent(TrainingAgent):
    """An agent written for tmrl: it knows nothing of compilation."""

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space, device: str) -> None:
        super().__init__(observation_space, action_space, device)
        self.actor = MLPActor(observation_space, action_space, (8,))

    def train(self, batch: Batch) -> dict[str, float]:
        return {}

    def get_actor(self) -> MLPActor:
        return self.actor


def test_an_agent_without_a_compile_argument_is_refused_by_name() -> None:
    training = TrainingOffline(env_cls=(OBS, ACT), training_agent_cls=TmrlStyleAgent, device="cpu",
                               compile="compile", memory_size=100, batch_size=8)
    with pytest.raises(ValueError, match=r"trainer.compile is 'compile', but TmrlStyleAgent takes no compile argument"):
        training.build()
    plain = TrainingOffline(env_cls=(OBS, ACT), training_agent_cls=TmrlStyleAgent, device="cpu", memory_size=100,
                            batch_size=8)
    plain.build()  # "none" asks nothing of the agent


def test_target_networks_move_in_place_in_one_fused_call() -> None:
    targets, sources = [torch.ones(3), torch.zeros(2, 2)], [torch.full((3,), 3.0), torch.ones(2, 2)]
    ptrs = [t.data_ptr() for t in targets]
    polyak_(targets, sources, 0.75)
    torch.testing.assert_close(targets[0], torch.full((3,), 1.5))  # 0.75 * 1 + 0.25 * 3
    torch.testing.assert_close(targets[1], torch.full((2, 2), 0.25))
    assert [t.data_ptr() for t in targets] == ptrs

    agent = SMALL_SAC(OBS, ACT)
    target = [p for p in agent.critic_target.parameters()]
    old = [p.detach().clone() for p in target]
    online = [p.detach().clone() for p in agent.model.critic.parameters()]
    agent.train(_batches(1)[0])
    new_online = list(agent.model.critic.parameters())
    for t, o, on, non in zip(target, old, online, new_online, strict=True):
        torch.testing.assert_close(t, agent.polyak * o + (1 - agent.polyak) * non.detach())  # after the critic step
        assert not torch.equal(on, non.detach())
    assert [p.data_ptr() for p in agent.critic_target.parameters()] == [p.data_ptr() for p in target]

    dqn = DQNAgent(OBS, gymnasium.spaces.Discrete(3), hidden_sizes=(8,), target_update_interval=2)
    ptrs = [t.data_ptr() for t in dqn.q_target.state_dict().values()]
    b = _batches(1)[0]._replace(act=torch.randint(0, 3, (16, 1)))
    dqn.train(b)
    assert not torch.equal(_flat(dqn.q_target), _flat(dqn.actor.q))  # no copy before the interval
    dqn.train(b)
    assert torch.equal(_flat(dqn.q_target), _flat(dqn.actor.q))
    assert [t.data_ptr() for t in dqn.q_target.state_dict().values()] == ptrs


def _packet(n: int, seq: int) -> Buffer:
    rng = np.random.default_rng(seq)
    return Buffer(act=rng.uniform(-2, 2, (n, 1)).astype(np.float32), obs=rng.uniform(-1, 1, (n, 3)).astype(np.float32),
                  rew=rng.normal(size=n).astype(np.float32), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                  reset=np.arange(n) == 0, context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64),
                  recv_version=1, worker="w", seq=seq)


def test_the_config_key_reaches_the_agent_and_the_loop_trains_compiled(tmp_path: Path,
                                                                       graph_capture_only: None) -> None:
    cfg = config_from_dict({"trainer": {"compile": "compile", "device": "cpu", "steps": 4, "rounds": 1,
                                        "start_training": 0},
                            "memory": {"batch_size": 16, "memory_size": 200}, "agent": {"hidden_sizes": [8, 8]},
                            "weights_folder": str(tmp_path), "security": "none", "seed": 0}, "config.json")
    training = Trainer.from_config(cfg, make_pipeline(cfg)).training_cls()
    assert training.settings.compile == "compile"
    source = ListSource([_packet(40, 1), _packet(40, 2)])
    training.start(source)  # type: ignore[arg-type]
    assert isinstance(training.agent, SACAgent) and training.agent.compile == "compile"
    assert training.agent._compiled_step is not training.agent.compiled_step  # the compiled wrapper, not the method
    rows = list(training.run_epoch(source, threading.Event()))  # type: ignore[arg-type]
    assert rows[-1]["trained_steps"] == 4 and np.isfinite(rows[-1]["loss_critic"])
    assert isinstance(training.memory, ReplayMemory)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_ppo_matches_eager_with_a_short_last_minibatch_and_an_annealed_clip(
        backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if backend != "inductor":
        monkeypatch.setattr(torch, "compile", partial(torch.compile, backend=backend))
    g = torch.Generator().manual_seed(3)
    n = 12
    obs = torch.rand(n, 3, generator=g) * 2 - 1
    batch = Batch(obs, torch.rand(n, 1, generator=g) * 4 - 2, torch.randn(n, generator=g), obs.roll(-1, 0),
                  torch.zeros(n), torch.zeros(n),
                  extra={"action_log_prob": torch.randn(n, generator=g) - 1, "state_value": torch.randn(n, generator=g),
                         "traj_ids": torch.zeros(n, dtype=torch.int64)})
    runs = []
    for mode in ("none", "compile"):
        torch.manual_seed(0)
        agent = PPOAgent(OBS, ACT, hidden_sizes=(8, 8), n_epochs=2, minibatch_size=5, anneal_frames=100,
                         clip_range_vf=0.2, compile=mode)  # type: ignore[arg-type]
        before = _flat(agent.actor)
        metrics = [agent.train(batch) for _ in range(2)]  # minibatches of 5, 5 and 2; the clip range falls between
        runs.append((metrics, [_flat(agent.actor)]))
        assert not torch.equal(runs[-1][1][0], before)
    _assert_same(runs[0], runs[1])
