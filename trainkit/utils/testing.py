"""detectron2's test helpers for user code, at its path: ``reload_lazy_config``.

Its other helpers build detection models, boxes and instances, which are detection-only.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

__all__ = ["reload_lazy_config"]


def reload_lazy_config(cfg: Any) -> Any:
    """Save ``cfg`` with ``LazyConfig.save`` and return what ``LazyConfig.load`` reads back.

    A test of a config (or of code that takes one) can then check that it works the same
    after the round trip a run's ``config.yaml`` makes.

    Args:
        cfg: a LazyConfig (an omegaconf ``DictConfig``, e.g. made with ``LazyCall``).

    Returns:
        The reloaded config: ``_target_`` callables come back as their import paths.

    Raises:
        ConfigError: If ``cfg`` holds a value that cannot be saved (see ``LazyConfig.save``).
    """
    # The one upward import of utils (an exception in pyproject.toml's layers contract):
    # a test helper of configs, imported when called so that trainkit.utils stays light.
    from trainkit.config import LazyConfig

    with tempfile.TemporaryDirectory(prefix="trainkit_reload_") as directory:
        path = os.path.join(directory, "config.yaml")
        LazyConfig.save(cfg, path)
        return LazyConfig.load(path)
