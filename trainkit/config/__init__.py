"""Configuration: the strict ``CfgNode``, the defaults schema, ``get_cfg`` and ``configurable``.

Also detectron2's new-style configs: ``LazyConfig``, ``LazyCall`` and ``instantiate``, on
omegaconf, which is imported only when one of them is used.
"""

from trainkit.config.cfg_node import CfgNode, ConfigError
from trainkit.config.compat import downgrade_config, upgrade_config
from trainkit.config.configurable import configurable
from trainkit.config.defaults import get_cfg
from trainkit.config.instantiate import instantiate
from trainkit.config.lazy import LazyCall, LazyConfig

__all__ = [
    "CfgNode",
    "ConfigError",
    "LazyCall",
    "LazyConfig",
    "configurable",
    "downgrade_config",
    "get_cfg",
    "instantiate",
    "upgrade_config",
]
