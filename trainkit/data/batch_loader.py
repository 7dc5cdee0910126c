"""``build_batch_data_loader``: the train loader from plain arguments (no config).

:func:`trainkit.data.build.build_detection_train_loader` is the config adapter over it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, IterableDataset, Sampler

from trainkit.data.batch_plan import BatchPlan, GlobalBatchPlan, RankBatchPlan, split_batch
from trainkit.data.common import DatasetFromList, MapDataset
from trainkit.data.grouping import BucketOf, aspect_ratio_bucket_ids, record_aspect_ratios
from trainkit.data.loader import TrainLoader, trivial_batch_collator
from trainkit.data.mapping import RecordMapper, as_record_mapper
from trainkit.data.samplers.global_stream import GlobalStreamSampler
from trainkit.data.stream_batches import StreamBatches
from trainkit.utils import comm

logger = logging.getLogger(__name__)

__all__ = ["build_batch_data_loader", "records_and_mapper"]


def build_batch_data_loader(
    dataset: Dataset | Sequence[Any],
    sampler: Sampler | Iterable[int] | None,
    total_batch_size: int | None,
    *,
    mapper: Callable[[Any], Any] | None = None,
    aspect_ratio_grouping: bool = False,
    num_workers: int = 0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    drop_last: bool = True,
    single_gpu_batch_size: int | None = None,
    prefetch_factor: int = 2,
    persistent_workers: bool = False,
    pin_memory: bool = False,
    seed: int | None = None,
    aspect_ratio_bins: Sequence[float] = (1.0,),
    aspect_ratios: np.ndarray | Sequence[float] | None = None,
    accumulate_steps: int = 1,
    **kwargs: Any,
) -> TrainLoader:
    """Build this rank's resumable loader of ``total_batch_size / (world size x k)`` samples.

    ``total_batch_size`` is the batch of one optimizer step over all ranks and
    ``k = accumulate_steps`` micro-batches. A ``MapDataset`` is taken apart once into its
    records and its mapper; the records' facts (aspect ratios) are read from the unmapped
    records. Then, for a map-style dataset and a trainkit training sampler, each step's batch
    is composed from the global stream and dealt to the ranks
    (:class:`~trainkit.data.composer.StepBatchComposer`): the same records per step for any
    world size, ``k`` and ``num_workers``. With any other sampler (or
    ``single_gpu_batch_size``) batches are composed from this rank's stream. An
    ``IterableDataset`` is read as a stream: its workers read disjoint shares and form the
    batches (:mod:`trainkit.data._stream_batches`).

    Args:
        dataset: records (list), a map-style dataset (``MapDataset`` for mapped records), or
            an ``IterableDataset``.
        sampler: a training sampler (or any sampler of this rank's indices); ``None`` only
            for an ``IterableDataset``.
        total_batch_size: samples of one optimizer step summed over ranks.
        mapper: record -> sample, applied by the loader (a ``RecordMapper`` or any
            callable); ``None`` maps nothing, or takes the mapper of a ``MapDataset``.
        aspect_ratio_grouping: batch only samples of the same aspect-ratio bucket.
        num_workers: loader worker processes per rank.
        collate_fn: list of samples -> batch (default: the list itself).
        drop_last: drop incomplete batches at the end of a finite sampler.
        single_gpu_batch_size: per-rank batch size instead of ``total_batch_size``.
        prefetch_factor: batches each worker loads ahead.
        persistent_workers: keep workers across iterations.
        pin_memory: copy batches to page-locked memory.
        seed: key of ``sample_rng()`` in mappers and of the workers' base seeds; default:
            the sampler's seed, else 0.
        aspect_ratio_bins: bucket boundaries (``DATALOADER.ASPECT_RATIO_BINS``); ``(1.0,)`` is
            detectron2's tall/wide split.
        aspect_ratios: ``width / height`` per dataset index; default: read from the records,
            which then need ``width`` and ``height``.
        accumulate_steps: micro-batches per optimizer step (``SOLVER.ACCUMULATE_STEPS``).
        **kwargs: further ``torch.utils.data.DataLoader`` arguments (e.g. ``timeout``).

    Returns:
        A :class:`~trainkit.data.loader.TrainLoader`.

    Raises:
        ConfigError: A ``ValueError``: if the batch does not split evenly over the ranks and
            micro-batches, or grouping lacks record sizes.
        ValueError: If a map-style dataset has no sampler or a stream has one.
    """
    if mapper is None:
        records, mapper = records_and_mapper(dataset)
    else:
        records = DatasetFromList(dataset, copy=False) if isinstance(dataset, list) else dataset
        mapper = as_record_mapper(mapper)
    stream = isinstance(records, IterableDataset)
    if stream and sampler is not None:
        raise ValueError("an IterableDataset yields its own order: pass sampler=None")
    if not stream and sampler is None:
        raise ValueError(
            "a map-style dataset needs a sampler, e.g. TrainingSampler(len(dataset), seed=seed)"
        )
    if seed is None:
        seed = sampler.seed if isinstance(sampler, GlobalStreamSampler) else 0
    loader_kwargs = {
        "num_workers": num_workers,
        "prefetch_factor": prefetch_factor,
        "persistent_workers": persistent_workers and not stream,
        "pin_memory": pin_memory,
        **kwargs,  # the caller's DataLoader arguments win
    }
    collate = collate_fn or trivial_batch_collator
    if stream:
        batch_size = _micro_batch_size(total_batch_size, single_gpu_batch_size, accumulate_steps)
        bucket_of = BucketOf(aspect_ratio_bins) if aspect_ratio_grouping else None
        batches = StreamBatches(
            records,
            mapper,
            batch_size,
            bucket_of=bucket_of,
            collate_fn=collate,
            seed=seed,
            drop_last=drop_last,
        )
        logger.info("Stream loader: batches of %d formed in the workers", batch_size)
        return TrainLoader(records, mapper, batches, seed=seed, loader_kwargs=loader_kwargs)
    bucket_ids = None
    if aspect_ratio_grouping:
        if aspect_ratios is None:
            # The unmapped records, one at a time.
            aspect_ratios = record_aspect_ratios(records[i] for i in range(len(records)))
        bucket_ids = aspect_ratio_bucket_ids(np.asarray(aspect_ratios), aspect_ratio_bins)
    plan = _batch_plan(
        sampler, total_batch_size, single_gpu_batch_size, accumulate_steps, bucket_ids, drop_last
    )
    return TrainLoader(
        records, mapper, plan, seed=seed, collate_fn=collate, loader_kwargs=loader_kwargs
    )


def records_and_mapper(dataset: Any) -> tuple[Any, RecordMapper | None]:
    """Take a mapped dataset apart, once: ``(unmapped records, their RecordMapper or None)``.

    A list becomes a :class:`DatasetFromList`; a ``MapDataset`` (or its iterable twin) gives
    its records and mapper; anything else is records with no mapper.
    """
    if isinstance(dataset, list):
        return DatasetFromList(dataset, copy=False), None
    mapper = getattr(dataset, "mapper", None)
    if isinstance(dataset, (MapDataset, IterableDataset)) and isinstance(mapper, RecordMapper):
        return dataset.dataset, mapper  # MapDataset, or its iterable twin
    return dataset, None


def _micro_batch_size(
    total_batch_size: int | None, single_gpu_batch_size: int | None, accumulate_steps: int
) -> int:
    if not single_gpu_batch_size:
        return split_batch(total_batch_size, comm.get_world_size(), accumulate_steps)
    if total_batch_size:
        raise ValueError("give either total_batch_size or single_gpu_batch_size, not both")
    return split_batch(single_gpu_batch_size, 1, accumulate_steps, key="single_gpu_batch_size")


def _batch_plan(
    sampler: Any,
    total_batch_size: int | None,
    single_gpu_batch_size: int | None,
    accumulate_steps: int,
    bucket_ids: np.ndarray | None,
    drop_last: bool,
) -> BatchPlan:
    if isinstance(sampler, GlobalStreamSampler) and not single_gpu_batch_size:
        # The sampler's own rank and world size: tests and custom sharding set them.
        return GlobalBatchPlan(
            sampler,
            total_batch_size or 0,
            rank=sampler.rank,
            world_size=sampler.world_size,
            accumulate_steps=accumulate_steps,
            bucket_ids=bucket_ids,
        )
    batch_size = _micro_batch_size(total_batch_size, single_gpu_batch_size, accumulate_steps)
    return RankBatchPlan(sampler, batch_size, bucket_ids=bucket_ids, drop_last=drop_last)
