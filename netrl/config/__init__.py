"""Configuration: the sections of config.json as frozen dataclasses (:mod:`netrl.config.sections`),
loaded and checked with every problem reported at once (:mod:`netrl.config.load`), from field
checks (:mod:`netrl.config.checks`) by a generic builder (:mod:`netrl.config.build`). The ``agent``
section and each algorithm's own keys are in :mod:`netrl.config.agent`; the rules between the agent
and the rest, read off the algorithm table, in :mod:`netrl.config.algorithms`; keys that were
renamed in :mod:`netrl.config.renamed`; the command line's flags, which override keys, in
:mod:`netrl.config.flags`.
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
