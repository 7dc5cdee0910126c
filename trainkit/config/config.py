"""detectron2's import path for ``CfgNode``, ``get_cfg`` and ``configurable``.

``CfgNode`` lives in :mod:`~trainkit.config.cfg_node`, ``get_cfg`` beside the schema in
:mod:`~trainkit.config.defaults` and ``configurable`` in :mod:`~trainkit.config.configurable`;
code written for detectron2 imports them from here (``detectron2.config.config``).
"""

from trainkit.config.cfg_node import CfgNode, ConfigError
from trainkit.config.configurable import configurable
from trainkit.config.defaults import get_cfg

__all__ = ["CfgNode", "ConfigError", "configurable", "get_cfg"]
