"""Samplers: training samplers (the global stream), exact inference shards, grouped batches."""

from __future__ import annotations

from trainkit.data.samplers.distributed_sampler import (
    InferenceSampler,
    RandomSubsetTrainingSampler,
    RepeatFactorTrainingSampler,
    TrainingSampler,
)
from trainkit.data.samplers.grouped_batch_sampler import GroupedBatchSampler

__all__ = [
    "GroupedBatchSampler",
    "InferenceSampler",
    "RandomSubsetTrainingSampler",
    "RepeatFactorTrainingSampler",
    "TrainingSampler",
]
