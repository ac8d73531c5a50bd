"""The algorithm table: each agent declares what it trains with, the table holds those declarations,
it loads without torch, and no agent imports another agent's module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Text

from netrl.agents import registry
from netrl.agents.dqn import DQNActor, DQNAgent
from netrl.agents.ppo import PPOActor, PPOAgent
from netrl.agents.recurrent_sac import RecurrentActor, RecurrentSACAgent
from netrl.agents.registry import ALGORITHMS, NAMES, choose, entries
from netrl.agents.sac import MLPActor, SACAgent

AGENTS = Path(__file__).resolve().parents[2] / "netrl" / "agents"
BOX = Box(-1.0, 1.0, (2,), np.float32)


def test_each_agent_declares_the_tables_entry_for_it() -> None:
    declared = {SACAgent: registry.SAC, RecurrentSACAgent: registry.RECURRENT_SAC,
                DQNAgent: registry.DQN, PPOAgent: registry.PPO}
    assert {agent.supports for agent in declared} == {a.supports for a in ALGORITHMS}
    for agent, supports in declared.items():
        assert agent.supports is supports
    assert NAMES == ("sac", "dqn", "ppo")
    assert registry.PPO.collection == "sync" and registry.PPO.memory == "rollout"
    assert not registry.PPO.random_actions and registry.SAC.random_actions


def test_auto_picks_sac_for_box_and_dqn_for_discrete_actions_and_ppo_only_when_named() -> None:
    for space, name in ((BOX, "sac"), (Discrete(3), "dqn"), (MultiDiscrete([2, 3]), "dqn"),
                        (MultiBinary(4), "dqn")):
        chosen = choose("auto", False, space)
        assert chosen is not None and chosen.name == name
        ppo = choose("ppo", False, space)
        assert ppo is not None and ppo.supports is registry.PPO
    recurrent = choose("auto", True, BOX)
    assert recurrent is not None and recurrent.supports is registry.RECURRENT_SAC
    assert choose("auto", False, Text(4)) is None and choose("dqn", False, BOX) is None
    assert choose("auto", True, Discrete(3)) is None and entries("dqn", True) == []
    assert [a.name for a in entries("auto", False)] == ["sac", "dqn"]


@pytest.mark.parametrize(("actor", "space", "message"), [
    (MLPActor, Discrete(3),
     r"SAC needs Box actions \(got Discrete\(3\)\): DQN and PPO take Discrete actions"),
    (RecurrentActor, MultiBinary(2),
     r"recurrent SAC needs Box actions \(got MultiBinary\(2\)\): DQN and PPO take "
     r"MultiBinary actions"),
    (DQNActor, BOX,
     r"DQN needs Discrete, MultiDiscrete or MultiBinary actions \(got Box.*\): SAC and PPO "
     r"take Box actions"),
    (PPOActor, Text(3),
     r"PPO needs Box, Discrete, MultiDiscrete or MultiBinary actions \(got Text"),
])
def test_an_actor_refuses_actions_its_declaration_lacks_naming_those_that_take_them(
        actor: type, space: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        actor(Dict({"x": BOX}), space)


def test_the_table_loads_without_torch_or_gymnasium() -> None:
    """netrl.config reads it, and the server loads netrl.config."""
    code = ("import sys, netrl.agents, netrl.agents.registry; "
            "print(sorted({'torch', 'gymnasium'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_agent_imports_another_agents_module() -> None:
    """Shared parts live in netrl.agents.common, as SB3's common/; the agents read only it, the
    registry, base, compiled, gae and guard."""
    agent_modules = {"sac", "dqn", "ppo", "recurrent_sac", "cnn"}
    crossings = sorted(f"{name} -> {other}" for name in agent_modules
                       for other in agent_modules - {name}
                       if f"netrl.agents.{other}" in imported(AGENTS / f"{name}.py"))
    assert crossings == []
    common = {f"common/{p.name}" for p in (AGENTS / "common").glob("*.py")
              if any(f"netrl.agents.{m}" in imported(p) for m in agent_modules)}
    assert common == set()
