"""Configuration: the strict ``CfgNode``, the defaults schema, ``get_cfg`` and ``configurable``."""

from trainkit.config.cfg_node import CfgNode, ConfigError
from trainkit.config.configurable import configurable
from trainkit.config.defaults import get_cfg

__all__ = ["CfgNode", "ConfigError", "configurable", "get_cfg"]
