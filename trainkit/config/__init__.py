"""Configuration: the strict ``CfgNode``, the defaults schema, ``get_cfg`` and ``configurable``."""

from trainkit.config.config import CfgNode, ConfigError, get_cfg
from trainkit.config.configurable import configurable

__all__ = ["CfgNode", "ConfigError", "configurable", "get_cfg"]
