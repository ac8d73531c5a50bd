"""WorkerSettings: one frozen object from config.json or from keywords, and the keyword constructor."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import gymnasium
import pytest

from netrl.agents.sac import MLPActor
from netrl.config.load import config_from_dict
from netrl.envs.gym import GenericGymEnv
from netrl.pipelines.make import make_pipeline
from netrl.util import partial
from netrl.worker.settings import VECTOR_GYMNASIUM, WorkerSettings
from netrl.worker.worker import RolloutWorker

ENV = partial(GenericGymEnv, id="Pendulum-v1")


def test_an_unknown_keyword_is_refused_by_name_with_the_nearest_setting() -> None:
    with pytest.raises(TypeError, match=r"RolloutWorker\(\) got an unexpected keyword argument "
                                        r"'trottle' \(did you mean \"throttle\"\?\)"):
        RolloutWorker(ENV, MLPActor, trottle=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'zzz'; its settings are"):
        WorkerSettings.from_keywords(zzz=1)


def test_keywords_fold_into_the_settings_and_replace_a_given_settings_object() -> None:
    base = WorkerSettings(throttle=True, num_envs=2, worker_id="a")
    worker = RolloutWorker(ENV, MLPActor, None, "cpu", "10.0.0.2", 7, settings=base, num_envs=3,
                           run_dir=None)
    s = worker.settings
    assert (s.throttle, s.num_envs, s.worker_id) == (True, 3, "a")
    assert (s.network.server_ip, s.min_samples_per_worker_packet) == ("10.0.0.2", 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.throttle = False  # type: ignore[misc]
    # tmrl's nine by position and name, then settings, models and the other settings by name
    assert len(inspect.signature(RolloutWorker.__init__).parameters) - 1 == 12


def test_settings_from_config_match_the_worker_the_cli_builds(tmp_path: Path) -> None:
    cfg = config_from_dict({"weights_folder": str(tmp_path), "security": "none",
                            "worker": {"worker_id": "w1", "num_envs": 2, "throttle": True}})
    worker = RolloutWorker.from_config(cfg, make_pipeline(cfg))
    try:
        s = worker.settings
        assert s == WorkerSettings.from_config(cfg, make_pipeline(cfg), "w1")
        assert (s.num_envs, s.throttle, s.worker_id) == (2, True, "w1")
        assert s.model_path == str(cfg.run_dir / "worker_policy_w1.pt")
        assert s.episode_log == str(cfg.run_dir / "episodes_w1.csv")
    finally:
        worker.close()


@pytest.mark.parametrize(("keywords", "message"), [
    ({"num_envs": 0}, "num_envs must be an integer >= 1 (got 0)"),
    ({"vectorization": "threads"}, 'vectorization must be "sync" or "async"'),
    ({"max_packet_delay_s": 0}, "max_packet_delay_s must be > 0"),
    ({"init_random_frames": -1}, "init_random_frames must be >= 0 (got -1)"),
])
def test_bad_settings_are_refused_naming_the_setting(keywords: dict[str, object],
                                                     message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        WorkerSettings.from_keywords(**keywords)


def test_vector_workers_on_a_gymnasium_without_autoreset_modes_are_told_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # gymnasium 1.0 has no vector.AutoresetMode: a vector worker once died on an AttributeError
    # when it built its env, though pyproject.toml allowed 1.0
    monkeypatch.delattr(gymnasium.vector, "AutoresetMode")
    monkeypatch.setattr(gymnasium, "__version__", "1.0.0")
    with pytest.raises(ValueError, match=r"num_envs > 1 needs gymnasium >= 1\.1, .*gymnasium 1\.0\.0 is "
                                         r"installed: pip install 'gymnasium>=1\.1', or set worker\.num_envs to 1"):
        WorkerSettings.from_keywords(num_envs=2)
    assert WorkerSettings.from_keywords(num_envs=1).num_envs == 1  # one env needs no vector env


def test_pyproject_requires_the_gymnasium_that_vector_workers_need() -> None:
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert re.search(r'"gymnasium>=([0-9.]+)"', text)[1] == VECTOR_GYMNASIUM  # type: ignore[index]
