"""What setting up a run reads of its config, the same way for a ``CfgNode`` and a LazyConfig.

``default_setup`` (and the dry run) read a config only through :func:`run_config`. A
LazyConfig keeps detectron2's key names (``train.output_dir``, ``train.seed``,
``train.cudnn_benchmark``, ``train.init_checkpoint``); it is not rescaled to the world size
(detectron2 does not either: its batch is the total over all processes) and stays mutable.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from trainkit.config import CfgNode, ConfigError, LazyConfig, get_cfg
from trainkit.config.detectron2_defaults import unused_detectron2_keys
from trainkit.config.lazy_overrides import flat_config_items
from trainkit.config.provenance import (
    ConfigChange,
    config_changes,
    flat_leaves,
    format_config_changes,
    listed_changes,
    origins_of,
)
from trainkit.config.scaling import SCALED_KEYS, auto_scale_config, check_same_recipe
from trainkit.utils.errors import MissingFileError, UsageError
from trainkit.utils.file_io import atomic_write

__all__ = ["RunConfig", "run_config"]

logger = logging.getLogger(__name__)

# A LazyConfig's recipe: what the keys auto-scaling changes in a yacs config are called there.
_LAZY_RECIPE = (
    "dataloader.train.total_batch_size",
    "dataloader.train.accumulate_steps",
    "optimizer.lr",
    "train.max_iter",
    "train.checkpointer.period",
    "train.eval_period",
)


def run_config(cfg: Any) -> RunConfig:
    """Return the :class:`RunConfig` of ``cfg``: a ``CfgNode`` or a LazyConfig."""
    return _YacsRunConfig(cfg) if isinstance(cfg, CfgNode) else _LazyRunConfig(cfg)


class RunConfig:
    """A run's config as its set-up reads it: directory, seed, weights, scaling and receipts.

    Attributes:
        cfg: the config it wraps.
        output_dir: where the run writes logs, checkpoints and receipts (``""``: nowhere).
        seed: the seed of the run's random numbers; negative draws one.
        cudnn_benchmark: whether cuDNN may benchmark convolution algorithms.
        weights: the weights the run starts from (``""``: the model's initialisation),
            the value of the key ``weights_key``.
        max_iter: the run's last iteration + 1 (``None``: not in the config).
        data_seed: the seed of the training data's order; negative: drawn when it starts.
        train_loader: a LazyConfig's ``dataloader.train`` (the call that builds the loader);
            ``None`` for a ``CfgNode``, whose loader ``build_train_loader(cfg)`` builds.
        rescaled: whether :meth:`scaled` rescales to a world size (a LazyConfig is not).
    """

    weights_key = "MODEL.WEIGHTS"
    rescaled = False
    train_loader: Any = None

    def __init__(
        self, cfg: Any, output_dir: str, seed: int, cudnn_benchmark: bool, weights: str
    ) -> None:
        self.cfg, self.output_dir, self.seed = cfg, output_dir, int(seed)
        self.cudnn_benchmark, self.weights = bool(cudnn_benchmark), weights
        self.max_iter: int | None = None
        self.data_seed = self.seed

    def recipe(self) -> dict[str, Any]:
        """Return the values that make the recipe (those auto-scaling may change), by key."""
        return {}

    def origin(self, key: str) -> str | None:
        """Return where a value :meth:`scaled` changed came from (``None``: it changes none)."""
        return None

    def check_resume(self, saved_world_size: int | None, world_size: int) -> None:
        """Refuse resuming a run of ``saved_world_size`` processes on ``world_size`` if that
        changes the recipe (nothing is rescaled here: never)."""

    def scaled(self, world_size: int) -> RunConfig:
        """Return the config a job of ``world_size`` processes runs (a LazyConfig: this one).

        Raises:
            ScalingError: If the config cannot be scaled to ``world_size``.
        """
        return self

    def scale_in_place(self, world_size: int) -> None:
        """Rescale the config itself to ``world_size`` processes, as :meth:`scaled` would."""

    def changes(self) -> list[ConfigChange]:
        """Return the keys set by a file, the command line or code, with their origins."""
        raise NotImplementedError

    def save(self, path: str) -> None:
        """Write the whole config to ``path``: what the run uses, reloadable."""
        raise NotImplementedError

    def unused_keys(self) -> list[str]:
        """Return the keys set by a file or the command line that trainkit's code ignores."""
        return []

    def freeze(self) -> None:
        """Make the config read-only where its kind allows (a ``CfgNode``)."""

    def check_weights(self, *, eval_only: bool, resume: bool) -> None:
        """Check the weights to start from, before anything starts.

        Raises:
            MissingFileError: If they name a local file (or directory) that does not exist.
            UsageError: If ``eval_only`` has neither weights nor ``resume``.
        """
        key, weights = self.weights_key, self.weights
        # A file, or a sharded checkpoint's directory.
        if weights and "://" not in weights and not os.path.exists(weights):
            raise MissingFileError(f"{key} file not found: {weights}. Check the path.")
        if eval_only and not weights and not resume:
            raise UsageError(
                f"--eval-only needs {key} (or --resume to use the last checkpoint in the "
                "output directory)."
            )

    def report(self, header: str) -> str:
        """Return :meth:`changes` as YAML text, one ``KEY: VALUE  # ORIGIN`` line per key."""
        return format_config_changes(self.changes(), header=header)

    def write_receipts(self, output_dir: str) -> None:
        """Write ``config.yaml`` (:meth:`save`) and ``config_origins.yaml`` to ``output_dir``."""
        self.save(os.path.join(output_dir, "config.yaml"))
        header = (
            "The config keys of this run set by a file, the command line or code (config.yaml "
            "has\nthem all): the value, then where it came from."
        )
        with atomic_write(os.path.join(output_dir, "config_origins.yaml"), "w") as f:
            f.write(self.report(header))


class _LazyRunConfig(RunConfig):
    weights_key = "train.init_checkpoint"

    def __init__(self, cfg: Any) -> None:
        from omegaconf import OmegaConf

        def value(key: str, default: Any) -> Any:
            found = OmegaConf.select(cfg, key, default=None)
            return default if found is None else found

        output_dir = value("train.output_dir", value("output_dir", ""))
        seed, cudnn_benchmark = value("train.seed", -1), value("train.cudnn_benchmark", False)
        super().__init__(cfg, output_dir, seed, cudnn_benchmark, value(self.weights_key, ""))
        self.max_iter = value("train.max_iter", None)
        self.data_seed = int(value("dataloader.train.seed", -1))  # None: the sampler draws one
        self.train_loader = value("dataloader.train", None)

    def recipe(self) -> dict[str, Any]:
        from omegaconf import OmegaConf

        found = {key: OmegaConf.select(self.cfg, key, default=None) for key in _LAZY_RECIPE}
        return {
            key: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
            for key, v in found.items()
            if v is not None
        }

    def changes(self) -> list[ConfigChange]:
        # No defaults to leave out: each key was set by a file, the command line or code.
        return listed_changes(flat_config_items(self.cfg), origins_of(self.cfg))

    def save(self, path: str) -> None:
        try:
            LazyConfig.save(self.cfg, path)
        except ConfigError as e:  # a lambda, a function defined in the config file
            logger.warning("%s; the run goes on without config.yaml.", e)  # as detectron2's
            return
        logger.info("Full config saved to %s", path)


class _YacsRunConfig(RunConfig):
    cfg: CfgNode

    rescaled = True

    def __init__(self, cfg: CfgNode) -> None:
        super().__init__(cfg, cfg.OUTPUT_DIR, cfg.SEED, cfg.CUDNN_BENCHMARK, cfg.MODEL.WEIGHTS)
        self.max_iter = cfg.SOLVER.MAX_ITER

    def scaled(self, world_size: int) -> RunConfig:
        return _YacsRunConfig(auto_scale_config(self.cfg, world_size))

    def recipe(self) -> dict[str, Any]:
        leaves = flat_leaves(self.cfg)
        values = {key: leaves[key] for key in SCALED_KEYS}
        return {k: list(v) if isinstance(v, (tuple, list)) else v for k, v in values.items()}

    def origin(self, key: str) -> str | None:
        return self.cfg.get_origin(key)

    def check_resume(self, saved_world_size: int | None, world_size: int) -> None:
        check_same_recipe(self.cfg, saved_world_size, world_size)

    def scale_in_place(self, world_size: int) -> None:
        # In place: detectron2-style scripts keep using the cfg they passed to default_setup.
        if self.cfg.SOLVER.REFERENCE_WORLD_SIZE not in (0, world_size):  # else: no copy
            scaled = auto_scale_config(self.cfg, world_size)
            self.cfg.defrost()
            self.cfg.merge_from_other_cfg(scaled)  # values and their auto-scaling origins

    def changes(self) -> list[ConfigChange]:
        # The keys that differ from the defaults (one set to its default value is left out).
        return config_changes(self.cfg, get_cfg())

    def save(self, path: str) -> None:
        with atomic_write(path, "w") as f:
            f.write(self.cfg.dump())
        logger.info("Full config saved to %s", path)

    def unused_keys(self) -> list[str]:
        return unused_detectron2_keys(self.cfg)

    def freeze(self) -> None:
        self.cfg.freeze()
