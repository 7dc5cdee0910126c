"""What the train loader reads from a config: checks, batch sizes and the training sampler.

Re-exported by :mod:`trainkit.data.build`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from trainkit.config import CfgNode, ConfigError
from trainkit.data.grouping import aspect_ratio_bucket_ids
from trainkit.data.samplers import (
    RandomSubsetTrainingSampler,
    RepeatFactorTrainingSampler,
    TrainingSampler,
)
from trainkit.utils import comm

logger = logging.getLogger(__name__)

__all__ = [
    "build_train_sampler",
    "check_train_loader_config",
    "per_rank_batch_size",
]

TRAIN_SAMPLERS = ("TrainingSampler", "RepeatFactorTrainingSampler", "RandomSubsetTrainingSampler")


def check_train_loader_config(cfg: CfgNode, world_size: int | None = None) -> None:
    """Check the ``DATALOADER`` and batch settings the train loader uses, without data.

    Args:
        cfg: the config.
        world_size: the job's process count; ``None`` means the current job's.

    Raises:
        ConfigError: A ``ValueError`` naming the first setting that is out of range and its
            valid range.
    """
    check_total_batch(cfg.SOLVER.IMS_PER_BATCH, world_size, cfg.SOLVER.ACCUMULATE_STEPS)
    loader = cfg.DATALOADER
    if loader.NUM_WORKERS < 0:
        raise ConfigError(
            f"DATALOADER.NUM_WORKERS must be >= 0, got {loader.NUM_WORKERS}; use 0 to load in "
            "the training process."
        )
    if loader.NUM_WORKERS > 0 and loader.PREFETCH_FACTOR < 1:
        raise ConfigError(
            f"DATALOADER.PREFETCH_FACTOR must be >= 1 with workers, got {loader.PREFETCH_FACTOR}"
        )
    if loader.MAX_CONSECUTIVE_FAILURES < 1:
        raise ConfigError(
            "DATALOADER.MAX_CONSECUTIVE_FAILURES must be >= 1, got "
            f"{loader.MAX_CONSECUTIVE_FAILURES}"
        )
    _check_sampler_settings(loader)
    if loader.ASPECT_RATIO_GROUPING:
        aspect_ratio_bucket_ids(np.ones(1), loader.ASPECT_RATIO_BINS)  # validates the bins


def _check_sampler_settings(loader: CfgNode) -> None:
    """Check DATALOADER.SAMPLER_TRAIN and the settings of the sampler it names."""
    if loader.SAMPLER_TRAIN not in TRAIN_SAMPLERS:
        raise ConfigError(
            f"unknown DATALOADER.SAMPLER_TRAIN {loader.SAMPLER_TRAIN!r}; choose one of "
            f"{', '.join(TRAIN_SAMPLERS)}"
        )
    if loader.SAMPLER_TRAIN == "RandomSubsetTrainingSampler":
        if not 0.0 < loader.RANDOM_SUBSET_RATIO <= 1.0:
            raise ConfigError(
                f"DATALOADER.RANDOM_SUBSET_RATIO must be in (0, 1], got "
                f"{loader.RANDOM_SUBSET_RATIO}; use 1.0 to train on every record."
            )
    if loader.SAMPLER_TRAIN == "RepeatFactorTrainingSampler" and loader.REPEAT_THRESHOLD < 0:
        raise ConfigError(
            f"DATALOADER.REPEAT_THRESHOLD must be >= 0, got {loader.REPEAT_THRESHOLD}; use 0 "
            "to repeat no record."
        )


def check_total_batch(total: int | None, world_size: int | None, accumulate_steps: int = 1) -> None:
    """Raise unless ``total`` splits evenly over ``world_size`` ranks x ``accumulate_steps``.

    Args:
        total: images per optimizer step over all ranks (``SOLVER.IMS_PER_BATCH``).
        world_size: the job's process count; ``None`` means the current job's.
        accumulate_steps: micro-batches per step (``SOLVER.ACCUMULATE_STEPS``).

    Raises:
        ConfigError: A ``ValueError`` naming ``SOLVER.IMS_PER_BATCH``, the divisor and the fix.
    """
    world_size = comm.get_world_size() if world_size is None else world_size
    if accumulate_steps < 1:
        raise ConfigError(
            f"SOLVER.ACCUMULATE_STEPS must be >= 1, got {accumulate_steps}; use 1 for no "
            "gradient accumulation."
        )
    parts = world_size * accumulate_steps
    if not total or total < 1 or total % parts:
        split = (
            f"the world size ({world_size})"
            if accumulate_steps == 1
            else f"world size x SOLVER.ACCUMULATE_STEPS ({world_size} x {accumulate_steps})"
        )
        raise ConfigError(
            f"SOLVER.IMS_PER_BATCH={total} is not a positive multiple of {split}; pick a "
            f"positive multiple of {parts} or change --num-gpus."
        )


def per_rank_batch_size(total_batch_size: int | None, single_gpu_batch_size: int | None) -> int:
    """Return the batch size of this rank, from the total or given directly.

    Raises:
        ValueError: If both are given.
        ConfigError: A ``ValueError``: if neither is given or the total does not divide
            evenly.
    """
    if single_gpu_batch_size:
        if total_batch_size:
            raise ValueError("give either total_batch_size or single_gpu_batch_size, not both")
        return single_gpu_batch_size
    world_size = comm.get_world_size()
    check_total_batch(total_batch_size, world_size)
    return total_batch_size // world_size  # type: ignore[operator]


def build_train_sampler(
    cfg: CfgNode, records: Sequence[dict[str, Any]], size: int, seed: int
) -> Sampler:
    """Build the sampler named by ``DATALOADER.SAMPLER_TRAIN`` with the shared ``seed``.

    Args:
        cfg: the config.
        records: the unmapped records (read only by ``RepeatFactorTrainingSampler``).
        size: the dataset size.
        seed: the seed shared by all ranks.

    Raises:
        ConfigError: A ``ValueError``: for an unknown sampler name or an invalid setting
            of the sampler.
    """
    _check_sampler_settings(cfg.DATALOADER)
    name = cfg.DATALOADER.SAMPLER_TRAIN
    logger.info("Using training sampler %s with seed %d", name, seed)
    if name == "TrainingSampler":
        return TrainingSampler(size, seed=seed)
    if name == "RandomSubsetTrainingSampler":
        return RandomSubsetTrainingSampler(
            size, cfg.DATALOADER.RANDOM_SUBSET_RATIO, seed_shuffle=seed, seed_subset=seed
        )
    if name == "RepeatFactorTrainingSampler":
        factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(
            records, cfg.DATALOADER.REPEAT_THRESHOLD
        )
        return RepeatFactorTrainingSampler(factors, seed=seed)
    raise ConfigError(
        f"unknown DATALOADER.SAMPLER_TRAIN {name!r}; choose one of {', '.join(TRAIN_SAMPLERS)}"
    )
