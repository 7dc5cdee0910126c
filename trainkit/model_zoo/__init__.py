"""trainkit's configs by name (detectron2's ``model_zoo``): its own, and the common LazyConfigs.

``get_config("shapes/cnn_small.yaml")``, ``get_config("common/optim.py").AdamW``. The
configs are package data, so an installed trainkit has them. trainkit publishes no trained
weights: ``trained=True`` and :func:`get_checkpoint_url` say so.
"""

from trainkit.model_zoo.model_zoo import get, get_checkpoint_url, get_config, get_config_file

__all__ = ["get", "get_checkpoint_url", "get_config", "get_config_file"]
