"""The built-in shapes dataset and ImageClassifier as the benchmarks use them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainkit.config import CfgNode, get_cfg
from trainkit.data import DatasetCatalog, build_train_loader
from trainkit.data.mapping.mappers import ClassificationDatasetMapper

BATCH = 16  # images per batch in the data benchmarks

# Longest image side: what configs/Base-Shapes.yaml trains at (a CNN on 2 CPU cores).
MAX_SIZE = 64


def shapes_cfg(batch_size: int = 16, num_workers: int = 0) -> CfgNode:
    """Return the config of a shapes ImageClassifier run on the CPU."""
    cfg = get_cfg()
    cfg.MODEL.META_ARCHITECTURE = "ImageClassifier"
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.NUM_CLASSES = 6
    cfg.DATASETS.TRAIN = ("shapes_train",)
    cfg.DATASETS.TEST = ("shapes_val",)
    cfg.SOLVER.IMS_PER_BATCH = batch_size
    cfg.DATALOADER.NUM_WORKERS = num_workers
    cfg.SEED = 0
    # Older configs have no training cap; then images keep their size (up to ~200 px).
    if "MAX_SIZE_TRAIN" in cfg.INPUT:
        cfg.INPUT.MAX_SIZE_TRAIN = MAX_SIZE
    cfg.INPUT.MAX_SIZE_TEST = MAX_SIZE
    return cfg


def train_loader(
    num_workers: int,
    grouping: bool,
    bins: Sequence[float] | None = None,
    scale_per_batch: bool | None = None,
    batch_size: int = BATCH,
) -> Any:
    """Return ``build_train_loader`` on ``shapes_train`` with the built-in mapper."""
    cfg = shapes_cfg(batch_size, num_workers)
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = grouping
    if bins is not None:
        cfg.DATALOADER.ASPECT_RATIO_BINS = list(bins)
    if scale_per_batch is not None:
        cfg.INPUT.RANDOM_SCALE_PER_BATCH = scale_per_batch
    return build_train_loader(cfg, ClassificationDatasetMapper(cfg, is_train=True))


def mapped_samples(split: str, count: int, cfg: CfgNode) -> list[dict[str, Any]]:
    """Map the first ``count`` records of ``shapes_<split>`` without randomness.

    Training samples skip the random flip and rescale (they need the loader's sample
    context); they are capped like test samples, so the sizes stay those of the data set.
    """
    records = DatasetCatalog.get(f"shapes_{split}")[:count]
    if split == "train":
        mapper = ClassificationDatasetMapper(
            cfg, is_train=True, flip_prob=0.0, scale_range=(1.0, 1.0)
        )
    else:
        mapper = ClassificationDatasetMapper(cfg, is_train=False)
    samples = [mapper(r) for r in records]
    return [s for s in samples if s is not None]


def batches_of(samples: list[Any], batch_size: int) -> list[list[Any]]:
    """Split ``samples`` into full batches (the rest is dropped)."""
    return [
        samples[i : i + batch_size] for i in range(0, len(samples) - batch_size + 1, batch_size)
    ]
