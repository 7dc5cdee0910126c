"""What ``default_setup`` does differently for a LazyConfig: its keys, its dump, its origins.

A LazyConfig keeps detectron2's key names for what ``default_setup`` reads
(``train.output_dir``, ``train.seed``, ``train.cudnn_benchmark``, ``train.init_checkpoint``);
it is not rescaled to the world size and stays mutable afterwards, as in detectron2.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from trainkit.config import ConfigError, LazyConfig
from trainkit.config.lazy_provenance import lazy_config_values
from trainkit.config.provenance import format_config_changes
from trainkit.utils.errors import MissingFileError, UsageError
from trainkit.utils.file_io import atomic_write

__all__ = ["check_lazy_weights", "lazy_value", "lazy_values_report", "write_lazy_config"]

logger = logging.getLogger(__name__)


def lazy_value(cfg: Any, keys: tuple[str, ...], default: Any) -> Any:
    """Return the value of the first dotted key of ``keys`` that ``cfg`` has, else ``default``."""
    from omegaconf import OmegaConf

    for key in keys:
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None:
            return value
    return default


def check_lazy_weights(cfg: Any, args: argparse.Namespace | None) -> None:
    """Check ``train.init_checkpoint`` before anything starts.

    Raises:
        MissingFileError: If it names a local file that does not exist.
        UsageError: If ``--eval-only`` has neither weights nor ``--resume``.
    """
    weights = lazy_value(cfg, ("train.init_checkpoint",), "")
    if weights and "://" not in weights and not os.path.isfile(weights):
        raise MissingFileError(f"train.init_checkpoint file not found: {weights}. Check the path.")
    if getattr(args, "eval_only", False) and not weights and not getattr(args, "resume", False):
        raise UsageError(
            "--eval-only needs train.init_checkpoint=PATH (or --resume to use the output "
            "directory's last checkpoint)."
        )


def lazy_values_report(cfg: Any, args: argparse.Namespace | None, header: str) -> str:
    """Return every value of ``cfg`` with its origin (file:line, command line), as YAML text."""
    config_file = getattr(args, "config_file", "") or None
    overrides = getattr(args, "opts", None) or []
    return format_config_changes(lazy_config_values(cfg, config_file, overrides), header=header)


def write_lazy_config(cfg: Any, output_dir: str, args: argparse.Namespace | None) -> None:
    """Write ``config.yaml`` (reloadable with ``LazyConfig.load``) and ``config_origins.yaml``.

    A config that YAML cannot hold (a lambda, a function defined in the config file) is
    logged in one line and ``config.yaml`` is not written; the run goes on, as in detectron2.
    """
    path = os.path.join(output_dir, "config.yaml")
    try:
        LazyConfig.save(cfg, path)
        logger.info("Full config saved to %s", path)
    except ConfigError as e:
        logger.warning("%s; the run goes on without config.yaml.", e)
    header = "Every value of this run's config: the value, then where it came from."
    with atomic_write(os.path.join(output_dir, "config_origins.yaml"), "w") as f:
        f.write(lazy_values_report(cfg, args, header))
