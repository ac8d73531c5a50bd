"""The layout's boundaries hold: no import cycles, the roles never import each other, the RL half never reaches the
network, and the server never loads torch.

The rules are read off the source with ``ast`` (every import, including those inside functions and under
``TYPE_CHECKING``), so a lazy import cannot hide an arrow; the zmq/msgpack/torch rules are also checked in a fresh
interpreter, where what a module really loads is visible.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "netrl"
ROLES = ("netrl.server", "netrl.worker", "netrl.trainer")
# packages, so that a module added to one is guarded with it; nothing of the RL half sits loose at the top level
RL_HALF = ("netrl.agents", "netrl.memory", "netrl.envs", "netrl.training", "netrl.samples")
# what may sit loose at netrl/ top level: anything else belongs in a package (docs/development.md's module map)
TOP_LEVEL = ["__init__", "__main__", "actor", "errors", "launch", "local", "nn", "util"]
NETWORK = ("netrl.net", "netrl.protocol", *ROLES)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _nodes(tree: ast.AST, runtime_only: bool) -> Iterable[ast.AST]:
    """Every node of ``tree``; with ``runtime_only``, none under ``if TYPE_CHECKING:`` (imports for type hints)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if runtime_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
            continue
        todo += ast.iter_child_nodes(node)


def imports_of(path: Path, modules: set[str], root: Path = ROOT, runtime_only: bool = False) -> set[str]:
    """What ``path`` imports: netrl modules by full name (``from netrl.x import y`` is netrl.x.y when y is a module),
    other packages by their top-level name."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _nodes(ast.parse(path.read_text(), str(path)), runtime_only):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found |= {t if t.startswith("netrl") else t.split(".")[0] for t in targets}
    found.discard(name)
    return found


def import_graph(root: Path = ROOT, runtime_only: bool = False) -> dict[str, set[str]]:
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    return {name: imports_of(path, set(paths), root, runtime_only) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start] & graph.keys())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child] & graph.keys()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def arrows(graph: dict[str, set[str]], sources: Iterable[str], targets: Iterable[str]) -> list[str]:
    sources, targets = tuple(sources), tuple(targets)
    return sorted(f"{m} -> {t}" for m, deps in graph.items() if within(m, sources)
                  for t in deps if within(t, targets) or t in targets)


GRAPH = import_graph()
RUNTIME_GRAPH = import_graph(runtime_only=True)  # without the imports for type hints


def test_the_graph_sees_every_module_and_resolves_relative_and_module_imports(tmp_path: Path) -> None:
    """A reader that missed arrows would pass every rule below: show it finds each kind of import."""
    pkg = tmp_path / "netrl"
    (pkg / "server").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "server" / "__init__.py").write_text("")
    (pkg / "server" / "a.py").write_text("from . import b\nimport zmq.asyncio\n")
    (pkg / "server" / "b.py").write_text("def f():\n    from netrl.server import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from netrl.server.a import X\n")
    graph = import_graph(pkg)
    assert graph["netrl.server.a"] == {"netrl.server.b", "zmq"}
    assert graph["netrl.server.b"] == {"netrl.server.a"}
    assert graph["netrl.c"] == {"typing", "netrl.server.a"}
    assert import_graph(pkg, runtime_only=True)["netrl.c"] == {"typing"}
    assert cycles(graph) == [["netrl.server.a", "netrl.server.b"]]
    assert arrows(graph, ["netrl.c"], ROLES) == ["netrl.c -> netrl.server.a"]
    assert len(GRAPH) > 70 and "netrl.server.server" in GRAPH and "netrl.protocol.wire" in GRAPH


def test_the_top_level_holds_only_the_listed_modules() -> None:
    assert sorted(p.stem for p in ROOT.glob("*.py")) == TOP_LEVEL


def test_the_rl_half_is_packages() -> None:
    """The RL half is guarded by package: each name above must be a package, or its new modules go unguarded."""
    assert all((ROOT / name.split(".")[1] / "__init__.py").is_file() for name in RL_HALF)


def test_no_import_cycles() -> None:
    assert cycles(GRAPH) == []


def test_the_roles_never_import_each_other() -> None:
    crossing = [a for role in ROLES for a in arrows(GRAPH, [role], [r for r in ROLES if r != role])]
    assert crossing == []


@pytest.mark.parametrize("layer", ["netrl.protocol", "netrl.storage", "netrl.memory", "netrl.agents"])
def test_lower_layers_import_nothing_from_the_roles(layer: str) -> None:
    assert arrows(GRAPH, [layer], ROLES) == []


def test_the_rl_half_never_imports_the_network() -> None:
    assert arrows(GRAPH, RL_HALF, (*NETWORK, "zmq", "msgpack")) == []


# Each entry point of the RL half, imported alone in a fresh interpreter: what it loads, not only what it names.
RL_ENTRY_POINTS = ["netrl.training", "netrl.training.loop", "netrl.memory", "netrl.agents", "netrl.envs.gym",
                   "netrl.envs.image", "netrl.envs.realtime", "netrl.envs.checks", "netrl.samples", "netrl.local"]


def loaded_after_import(module: str) -> list[str]:
    code = (f"import sys, {module}; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'zmq', 'msgpack', 'torch', 'gymnasium', "
            "'tensordict', 'torchrl'}))")
    return ast.literal_eval(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                           check=True).stdout)


@pytest.mark.parametrize("module", [m for m in RL_ENTRY_POINTS if m != "netrl.local"])
def test_the_training_loop_memory_and_agents_load_neither_zmq_nor_msgpack(module: str) -> None:
    assert not set(loaded_after_import(module)) & {"zmq", "msgpack"}


def test_the_check_sees_what_a_module_loads() -> None:
    """netrl.local runs a RolloutWorker in-process, so it does load zmq: the check must say so."""
    assert {"zmq", "msgpack", "torch"} <= set(loaded_after_import("netrl.local"))


def test_the_server_code_never_imports_torch_or_gymnasium() -> None:
    server_side = [m for m in RUNTIME_GRAPH if within(m, ["netrl.server"])]
    reach = set(server_side)
    todo = list(server_side)
    while todo:  # everything the server's modules import, directly or not, and the packages above each of them
        for dep in RUNTIME_GRAPH.get(todo.pop(), set()):
            parents = [".".join(dep.split(".")[:i]) for i in range(1, dep.count(".") + 2)]
            for name in parents:
                if name not in reach and (name in RUNTIME_GRAPH or not name.startswith("netrl")):
                    reach.add(name)
                    todo.append(name)
    for heavy in ("torch", "gymnasium"):
        assert heavy not in reach, sorted(m for m in reach if heavy in RUNTIME_GRAPH.get(m, set()))
    # nor gymnasium: the server checks packets against the trainer's schema, and needs no spaces (10 MiB less)
    assert loaded_after_import("netrl.server.server") == ["msgpack", "zmq"]


# TorchRL interop (netrl/interop/) is optional: only it imports tensordict or torchrl, and only
# its users load them
TORCHRL = ("tensordict", "torchrl")
CORE_ENTRY_POINTS = ["netrl", "netrl.server.server", "netrl.worker", "netrl.trainer",
                     *RL_ENTRY_POINTS]


def test_only_the_interop_package_imports_tensordict_or_torchrl() -> None:
    found = arrows(GRAPH, ["netrl"], TORCHRL)
    assert found and all(a.startswith("netrl.interop.") for a in found), found


@pytest.mark.parametrize("module", CORE_ENTRY_POINTS)
def test_the_core_and_the_roles_load_neither_tensordict_nor_torchrl(module: str) -> None:
    assert not set(loaded_after_import(module)) & set(TORCHRL)


def test_the_torchrl_check_sees_what_the_interop_loads() -> None:
    pytest.importorskip("torchrl")
    assert set(TORCHRL) <= set(loaded_after_import("netrl.interop.policies"))


RUN_WITHOUT_INTEROP = """
import sys, threading
from netrl.agents.sac import MLPActor, MLPActorCritic, SACAgent
from netrl.envs.gym import GenericGymEnv
from netrl.local import run_local
from netrl.memory.replay import ReplayMemory
from netrl.training.loop import TrainingOffline
from netrl.util import partial
from netrl.worker.worker import RolloutWorker
env_cls = partial(GenericGymEnv, id="Pendulum-v1")
agent = partial(SACAgent, model_cls=partial(MLPActorCritic, hidden_sizes=(8,)))
training = TrainingOffline(env_cls=env_cls, memory_cls=ReplayMemory, training_agent_cls=agent, epochs=1,
                           rounds=1, steps=5, update_model_interval=5, update_buffer_interval=5,
                           start_training=20, worker_lead=10, memory_size=100, batch_size=4, seed=0)
worker = RolloutWorker(env_cls, partial(MLPActor, hidden_sizes=(8,)), min_samples_per_worker_packet=4, seed=0)
run_local(training, worker, threading.Event())
assert training.total_samples > 0
print(sorted({m.split('.')[0] for m in sys.modules} & {'tensordict', 'torchrl'}))
"""


def test_a_worker_and_a_training_loop_that_run_without_interop_load_neither() -> None:
    """Not only their imports: a worker stepping an env and a loop training on its samples."""
    out = subprocess.run([sys.executable, "-c", RUN_WITHOUT_INTEROP], capture_output=True, text=True,
                         check=True, timeout=300)
    assert ast.literal_eval(out.stdout.strip().splitlines()[-1]) == []
