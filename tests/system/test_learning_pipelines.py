"""Long learning runs of the drone and image pipelines through the three processes (opt-in: ``-m slow``).

They call ``scripts/learn_pipelines.py`` and check its evaluation of the trained policy against random actions.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Time-step timed out"),
              pytest.mark.filterwarnings("ignore:.*share an object")]


def learn_script() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "scripts" / "learn_pipelines.py"
    spec = importlib.util.spec_from_file_location("learn_pipelines", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(1200)
def test_drone_learns_to_reach_the_target(tmp_path: Path) -> None:
    result = learn_script().run("drone", minutes=8, out=tmp_path, seed=1, eval_episodes=10)
    trained, random_policy = result["trained_policy"], result["random_policy"]
    assert result["exit_codes"] == [0, 0, 0]
    assert trained["reached_0.05"] >= 0.8, trained  # the drone gets within 0.05 of the target...
    assert trained["mean_distance"] < 0.5 * random_policy["mean_distance"], (trained, random_policy)  # ...and stays


@pytest.mark.timeout(1200)
def test_image_pipeline_learns_to_reach_the_target(tmp_path: Path) -> None:
    result = learn_script().run("image", minutes=8, out=tmp_path, seed=1, eval_episodes=20)
    trained, random_policy = result["trained_policy"], result["random_policy"]
    assert result["exit_codes"] == [0, 0, 0]
    assert trained["success"] >= 0.8, trained
    assert trained["return"] > 0.5 * random_policy["return"], (trained, random_policy)  # returns are negative
