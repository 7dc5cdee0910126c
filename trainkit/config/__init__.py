"""Configuration: the strict ``CfgNode``, the defaults schema and ``get_cfg``."""

from trainkit.config.config import CfgNode, ConfigError, get_cfg

__all__ = ["CfgNode", "ConfigError", "get_cfg"]
