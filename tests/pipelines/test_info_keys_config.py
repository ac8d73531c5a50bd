"""config.json's env.info_keys: checked with the rest of the config, added to any pipeline's own info keys, and
given to the worker and the trainer the CLI builds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from netrl.config.load import config_from_dict
from netrl.errors import ConfigError
from netrl.pipelines.base import Pipeline
from netrl.pipelines.make import make_pipeline
from netrl.samples.info import InfoKey
from netrl.trainer.trainer import Trainer
from netrl.worker.settings import WorkerSettings

ENTRIES = [{"name": "is_success", "dtype": "bool", "default": False}, {"name": "x_position"},
           {"name": "contacts", "dtype": "int64", "shape": [2]}]


def cfg(tmp_path: Path, **env: Any) -> Any:
    return config_from_dict({"weights_folder": str(tmp_path), "security": "none", "env": env})


def test_the_gym_pipeline_takes_its_info_keys_from_the_config_and_the_roles_get_them(tmp_path: Path) -> None:
    config = cfg(tmp_path, id="Pendulum-v1", info_keys=ENTRIES)
    pipeline = make_pipeline(config)
    assert pipeline.info_keys == (InfoKey("is_success", "bool", (), False), InfoKey("x_position", "float32", (), None),
                                  InfoKey("contacts", "int64", (2,), None))
    assert WorkerSettings.from_config(config, pipeline, "w1").info_keys == pipeline.info_keys
    assert Trainer.from_config(config, pipeline).info_keys == pipeline.info_keys
    assert make_pipeline(cfg(tmp_path)).info_keys == ()  # none by default


@pytest.mark.parametrize(("entries", "message"), [
    ([{"name": "X"}], "env.info_keys must list info keys (the list names an info key 'X'"),
    ([{"name": "x", "dtype": "str"}], "entry 'x' has dtype <U0"),
    ([{"name": "x", "size": 2}], "is not an info key"),
    ([{"name": "x"}, {"name": "x"}], "names the info key 'x' twice"),
])
def test_a_bad_entry_is_a_config_error_naming_the_key(tmp_path: Path, entries: list[Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        cfg(tmp_path, info_keys=entries)
    assert message in str(caught.value)


def own(cfg: Any) -> Pipeline:
    return Pipeline(env_cls=object, actor_module_cls=object, memory_cls=object, training_agent_cls=object,
                    info_keys=(InfoKey("x_position"),))


def test_a_key_the_pipeline_declares_already_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    module = types.ModuleType("info_pipe")
    module.own = own  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "info_pipe", module)
    assert make_pipeline(cfg(tmp_path, pipeline="info_pipe:own", info_keys=ENTRIES[:1])).info_keys == (
        InfoKey("x_position"), InfoKey("is_success", "bool", (), False))  # the pipeline's, then the config's
    with pytest.raises(ConfigError, match=r"env.info_keys: Pipeline.info_keys names the info key 'x_position' twice "
                                          r"\(env.pipeline \"info_pipe:own\" declares \['x_position'\]\)"):
        make_pipeline(cfg(tmp_path, pipeline="info_pipe:own", info_keys=ENTRIES[1:2]))
