"""Configuration: the sections of config.json as frozen dataclasses (:mod:`netrl.config.sections`), loaded and
checked with every problem reported at once (:mod:`netrl.config.load`), from field checks
(:mod:`netrl.config.checks`) by a generic builder (:mod:`netrl.config.build`).
"""

from netrl.config.load import check_value, config_from_dict, config_to_dict, load_config
from netrl.config.sections import (
    AgentConfig,
    Config,
    EnvConfig,
    MemoryConfig,
    NetworkConfig,
    ServerConfig,
    TrainerConfig,
    WandbConfig,
    WorkerConfig,
    describe_fields,
)

__all__ = ["AgentConfig", "Config", "EnvConfig", "MemoryConfig", "NetworkConfig", "ServerConfig", "TrainerConfig",
           "WandbConfig", "WorkerConfig", "check_value", "config_from_dict", "config_to_dict", "describe_fields",
           "load_config"]
