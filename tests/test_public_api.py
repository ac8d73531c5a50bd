"""The public surface is small and pinned, importing netrl is cheap, and the source never unpickles or evals."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import netrl
from tests.fakes import imported_modules

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [*sorted((ROOT / "netrl").rglob("*.py")), *sorted((ROOT / "scripts").rglob("*.py")),
           *sorted((ROOT / "benchmarks").rglob("*.py"))]


def test_public_names_are_pinned() -> None:
    assert netrl.__all__ == [
        "__version__", "ActorModule", "Batch", "Buffer", "Config", "GenericGymEnv", "MemoryDataloading", "NetrlError",
        "Pipeline", "ReplayMemory", "RolloutWorker", "Server", "Trainer", "TrainingAgent", "TrainingOffline",
        "load_config", "partial",
    ]
    for name in netrl.__all__:
        assert getattr(netrl, name) is not None


SECOND_LEVEL = {
    "netrl.agents": ["Batch", "CNNActorCritic", "DQNActor", "DQNAgent", "MLPActor", "MLPActorCritic", "ModelSpec",
                     "PPOActor", "PPOAgent", "RecurrentActor", "RecurrentSACAgent", "SACAgent", "TrainingAgent"],
    "netrl.memory": ["ActionBufferCompressor", "ActionBufferMemory", "FrameStackCompressor", "FrameStackMemory",
                     "HistoryMemory", "MemoryDataloading", "ReplayMemory", "View", "last_observations",
                     "prev_actions", "prev_rewards", "read_dataset", "save_dataset"],
    "netrl.envs": ["GenericGymEnv", "ImageReachEnv", "StepTimer", "check_spaces"],
    "netrl.pipelines": ["Pipeline", "drone_pipeline", "gym_pipeline", "image_pipeline", "make_pipeline"],
    "netrl.config": ["AgentConfig", "Config", "EnvConfig", "MemoryConfig", "NetworkConfig", "ServerConfig",
                     "TrainerConfig", "WandbConfig", "WorkerConfig", "check_value", "config_from_dict",
                     "config_to_dict", "describe_fields", "load_config"],
    "netrl.training": ["SampleSource", "TrainingAgent", "TrainingOffline", "TrainingSettings"],
    "netrl.worker": ["RolloutWorker", "WorkerSettings"],
    "netrl.samples": ["Batch", "Buffer", "BufferBuilder", "EpisodeStats", "ExtraSpec", "InfoKey", "Spec",
                      "check_extra_spec", "concat_segments", "flatten", "row", "tree_map", "unflatten"],
    "netrl.errors": ["CheckpointError", "ConfigError", "EnvFailure", "FolderInUse", "MalformedMessage", "NetrlError",
                     "PeerLost", "ProtocolError", "RoleViolation", "SampleRejected", "SecurityError",
                     "TrainingDiverged", "TransportError", "VersionMismatch"],
}


def test_the_key_functions_a_library_user_needs_are_where_the_security_page_says() -> None:
    from netrl.net import keys

    assert {"keygen", "server_keys", "client_keys"} <= set(keys.__all__)
    assert "netrl/net/keys.py" in (ROOT / "docs" / "security.md").read_text()


@pytest.mark.parametrize("package", sorted(SECOND_LEVEL))
def test_second_level_entry_points_are_pinned(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == SECOND_LEVEL[package]
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = module.Nope


def test_the_top_level_names_are_the_ones_their_packages_export() -> None:
    """One class, one object: netrl.ReplayMemory is netrl.memory.ReplayMemory, not a second import of it."""
    for package, names in SECOND_LEVEL.items():
        module = importlib.import_module(package)
        for name in set(names) & set(netrl.__all__):
            assert getattr(netrl, name) is getattr(module, name), (package, name)


@pytest.mark.parametrize("package", ["netrl.envs", "netrl.pipelines"])
def test_lazy_entry_points_import_nothing_heavy_until_a_name_is_used(package: str) -> None:
    code = (f"import sys, {package}; "
            "print([m for m in ('torch', 'cv2', 'gymnasium', 'zmq') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_import_is_cheap_and_has_no_side_effects() -> None:
    code = ("import logging, sys, netrl; "
            "heavy = [m for m in ('torch', 'zmq', 'wandb', 'gymnasium') if m in sys.modules]; "
            "print(heavy, logging.getLogger().handlers)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] []"


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def scan(paths: list[Path]) -> list[str]:
    """Forbidden patterns in ``paths``: pickle-like imports, eval/exec, unsafe torch.load / np.load."""
    problems = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            for name in imported_modules(node) or []:
                if name.split(".")[0] in {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve"}:
                    problems.append(f"{path}:{node.lineno} imports {name}")
        for call in _calls(tree):
            func = call.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
            if name in {"eval", "exec"} and isinstance(func, ast.Name):
                problems.append(f"{path}:{call.lineno} calls {name}()")
            if name in {"recv_pyobj", "send_pyobj"}:
                problems.append(f"{path}:{call.lineno} calls {name} (pickle)")
            if name == "load" and owner == "torch":
                weights_only = [k for k in call.keywords if k.arg == "weights_only"]
                if not weights_only or getattr(weights_only[0].value, "value", None) is not True:
                    problems.append(f"{path}:{call.lineno} calls torch.load without weights_only=True")
            if name == "load" and owner == "np":
                allow = [k for k in call.keywords if k.arg == "allow_pickle"]
                if not allow or getattr(allow[0].value, "value", True) is not False:
                    problems.append(f"{path}:{call.lineno} calls np.load without allow_pickle=False")
    return problems


def test_no_pickle_no_eval_and_torch_load_is_always_weights_only() -> None:
    assert scan(SOURCES) == []


def test_the_scan_catches_what_it_looks_for(tmp_path: Path) -> None:
    """A scan that cannot fail proves nothing: feed it each forbidden pattern."""
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle\nimport torch, numpy as np\ntorch.load('x')\ntorch.load('x', weights_only=False)\n"
                   "np.load('y')\neval('1')\nexec('2')\nsock.recv_pyobj()\n")
    found = "\n".join(scan([bad]))
    for expected in ("imports pickle", "3 calls torch.load without", "4 calls torch.load without",
                     "np.load without allow_pickle", "calls eval()", "calls exec()", "recv_pyobj"):
        assert expected in found
