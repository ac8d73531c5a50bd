"""Long learning runs of the drone and image pipelines through the three processes (opt-in: ``-m slow``).

They call ``benchmarks/learning/pipelines.py`` and check its evaluation of the trained policy
against random actions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.learning.pipelines import run

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Time-step timed out"),
              pytest.mark.filterwarnings("ignore:.*share an object")]


@pytest.mark.timeout(1200)
def test_drone_learns_to_reach_the_target(tmp_path: Path) -> None:
    result = run("drone", minutes=8, out=tmp_path, seed=1, eval_episodes=10)
    trained, random_policy = result["trained_policy"], result["random_policy"]
    assert result["exit_codes"] == [0, 0, 0]
    assert trained["reached_0.05"] >= 0.8, trained  # the drone gets within 0.05 of the target...
    assert trained["mean_distance"] < 0.5 * random_policy["mean_distance"], (trained, random_policy)  # ...and stays


@pytest.mark.timeout(1200)
def test_image_pipeline_learns_to_reach_the_target(tmp_path: Path) -> None:
    result = run("image", minutes=8, out=tmp_path, seed=1, eval_episodes=20)
    trained, random_policy = result["trained_policy"], result["random_policy"]
    assert result["exit_codes"] == [0, 0, 0]
    assert trained["success"] >= 0.8, trained
    assert trained["return"] > 0.5 * random_policy["return"], (trained, random_policy)  # returns are negative
