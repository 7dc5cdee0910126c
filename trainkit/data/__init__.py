"""Datasets, samplers and loaders: the reproducible, resumable data path."""

from __future__ import annotations

from trainkit.data.build import (
    build_batch_data_loader,
    build_detection_test_loader,
    build_detection_train_loader,
    build_test_loader,
    build_train_loader,
    get_detection_dataset_dicts,
    trivial_batch_collator,
    worker_init_reset_seed,
)
from trainkit.data.catalog import DatasetCatalog, MetadataCatalog
from trainkit.data.common import DatasetFromList, MapDataset, ToIterableDataset
from trainkit.data.dataset_mapper import DatasetMapper
from trainkit.data.loading.loader import RankDataLoader
from trainkit.data.mapping.record_mapper import batch_rng, sample_rng, sample_seed
from trainkit.data.records.metafile import MetaFileDataset
from trainkit.data.records.rank_dataset import RankDataset, RankStream
from trainkit.data.samplers import (
    InferenceSampler,
    RandomSubsetTrainingSampler,
    RepeatFactorTrainingSampler,
    TrainingSampler,
)
from trainkit.data.spec import TrainDataSpec

__all__ = [
    "DatasetCatalog",
    "DatasetFromList",
    "DatasetMapper",
    "InferenceSampler",
    "MapDataset",
    "MetaFileDataset",
    "MetadataCatalog",
    "RandomSubsetTrainingSampler",
    "RankDataLoader",
    "RankDataset",
    "RankStream",
    "RepeatFactorTrainingSampler",
    "ToIterableDataset",
    "TrainDataSpec",
    "TrainingSampler",
    "batch_rng",
    "build_batch_data_loader",
    "build_detection_test_loader",
    "build_detection_train_loader",
    "build_test_loader",
    "build_train_loader",
    "get_detection_dataset_dicts",
    "sample_rng",
    "sample_seed",
    "trivial_batch_collator",
    "worker_init_reset_seed",
]

# Imported last, for its side effect: registers the built-in shapes_train / shapes_val.
from trainkit.data import (
    datasets,  # noqa: E402,F401
    transforms,  # noqa: E402,F401  (detectron2's data.transforms as T)
)
