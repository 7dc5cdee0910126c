"""Samplers: infinite resumable training streams and exact inference shards."""

from __future__ import annotations

from trainkit.data.samplers.distributed_sampler import (
    InferenceSampler,
    RandomSubsetTrainingSampler,
    RepeatFactorTrainingSampler,
    TrainingSampler,
)

__all__ = [
    "InferenceSampler",
    "RandomSubsetTrainingSampler",
    "RepeatFactorTrainingSampler",
    "TrainingSampler",
]
