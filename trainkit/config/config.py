"""detectron2's import path (``detectron2.config.config``) for the package's names."""

from trainkit.config.cfg_node import CfgNode, ConfigError
from trainkit.config.configurable import configurable
from trainkit.config.defaults import get_cfg

__all__ = ["CfgNode", "ConfigError", "configurable", "get_cfg"]
