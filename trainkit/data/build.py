"""Build train loaders from plain arguments or from a config (detectron2's builders).

``build_detection_train_loader`` and ``build_detection_test_loader`` (from
:mod:`trainkit.data.loading.inference_loader`; detectron2 imports it from here) are
:func:`~trainkit.config.configurable` with detectron2's signatures; a config gives the train loader
what :func:`~trainkit.data.train_config.train_loader_arguments` reads. A train loader loads the
:class:`~trainkit.data.spec.TrainDataSpec` of its arguments, as :func:`build_batch_data_loader`
does. ``build_train_loader`` / ``build_test_loader`` are the same functions.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import Dataset, IterableDataset, Sampler

from trainkit.config import configurable, instantiate
from trainkit.config.run_config import RunConfig
from trainkit.data.catalog import get_detection_dataset_dicts
from trainkit.data.loading.inference_loader import build_detection_test_loader, build_test_loader
from trainkit.data.loading.loader import TrainLoader, trivial_batch_collator
from trainkit.data.loading.loader_workers import worker_init_reset_seed
from trainkit.data.plans.step_records import RecordsNotPlannedError
from trainkit.data.spec import TrainDataSpec
from trainkit.data.train_config import train_loader_arguments
from trainkit.utils.registry import locate

logger = logging.getLogger(__name__)

__all__ = [
    "build_batch_data_loader",
    "build_detection_test_loader",
    "build_detection_train_loader",
    "build_test_loader",
    "build_train_loader",
    "get_detection_dataset_dicts",
    "train_data_spec",
    "trivial_batch_collator",
    "worker_init_reset_seed",
]

Mapper = Callable[[Any], Any]


@configurable(from_config=train_loader_arguments)
def build_detection_train_loader(
    dataset: Dataset | Sequence[Any],
    *,
    mapper: Mapper | None,
    sampler: Sampler | None = None,
    total_batch_size: int,
    aspect_ratio_grouping: bool = True,
    num_workers: int = 0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    **kwargs: Any,
) -> TrainLoader:
    """Build this rank's train loader; callable with a config or with explicit arguments.

    Config form: ``build_detection_train_loader(cfg, mapper=None, *, dataset=None,
    sampler=None)`` reads ``DATASETS.TRAIN`` (unless ``dataset`` is given; a ``RankDataset``
    is read as its stream of shares), ``SOLVER.IMS_PER_BATCH``, ``SEED`` (if < 0, a shared
    seed is drawn here on every rank) and ``DATALOADER.*``; explicit keyword arguments (e.g.
    ``aspect_ratio_grouping=False``) override it. ``mapper=None`` maps with
    ``DatasetMapper(cfg, True)`` (records need a ``file_name``), unless ``dataset`` is a
    ``MapDataset`` with its own mapper. The result is :func:`build_batch_data_loader`'s.

    Args:
        dataset, mapper, total_batch_size, aspect_ratio_grouping, num_workers, collate_fn: as
            in :func:`build_batch_data_loader` (in this explicit form ``mapper=None`` maps
            nothing, as in detectron2).
        sampler: default :class:`TrainingSampler` (of ``kwargs["seed"]``); ``None`` for a stream.
        **kwargs: :func:`build_batch_data_loader`'s (``seed``, ``drop_last``, ...).

    Raises:
        ConfigError: A ``ValueError``: for an out-of-range ``DATALOADER``/``SOLVER`` setting
            (an indivisible batch size, an unknown sampler, ...), a record with neither a size
            nor a ``file_name`` under grouping, or an empty dataset.
        ValueError: For a sampler given with an ``IterableDataset``.
        UnknownNameError: A ``KeyError``: for an unregistered dataset name.

    Collective:
        Config form: ``comm.shared_random_seed()`` when ``cfg.SEED < 0``. Explicit form
        without a sampler and without ``seed``: ``TrainingSampler``'s shared random seed.
        Every rank calls it. Loading the catalog's records involves no collective.
    """
    return TrainLoader(
        TrainDataSpec.from_arguments(
            dataset,
            sampler,
            total_batch_size,
            mapper=mapper,
            aspect_ratio_grouping=aspect_ratio_grouping,
            num_workers=num_workers,
            collate_fn=collate_fn,
            **kwargs,
        )
    )


def build_batch_data_loader(
    dataset: Dataset | Sequence[Any],
    sampler: Sampler | None,
    total_batch_size: int | None,
    *,
    aspect_ratio_grouping: bool = False,
    num_workers: int = 0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    drop_last: bool = True,
    single_gpu_batch_size: int | None = None,
    seed: int | None = None,
    **kwargs: Any,
) -> TrainLoader:
    """Build this rank's resumable loader of ``total_batch_size / (world size x k)`` samples.

    ``k = accumulate_steps`` micro-batches. The loader loads the
    :meth:`TrainDataSpec.from_arguments <trainkit.data.spec.TrainDataSpec.from_arguments>` of these
    arguments (``loader.spec``): a map-style dataset in the batches of a batch plan (over a trainkit
    training sampler the same records per step for any world size, ``k`` and ``num_workers``); an
    ``IterableDataset`` is a stream dataset whose loader workers form the batches
    (:mod:`trainkit.data.loading.stream_batches`; it resumes with the same ``num_workers``).

    Args:
        dataset: records (list), a map-style dataset (``MapDataset`` for mapped records, taken
            apart once into its records and its mapper), or an ``IterableDataset``.
        sampler: this rank's indices (any sampler); ``None`` only for an ``IterableDataset``.
        total_batch_size: samples of one optimizer step summed over ranks.
        aspect_ratio_grouping: batch only samples of one bucket of ``width / height``, read
            from each record (its ``width``/``height``, else its image's header) when the
            plan first reaches it, between ``aspect_ratio_bins``.
        num_workers: the ``DataLoader``'s, per rank.
        collate_fn: list of samples -> batch (default: the list itself).
        drop_last: drop incomplete batches at the end of a finite sampler.
        single_gpu_batch_size: per-rank batch size instead of ``total_batch_size``.
        seed: key of ``sample_rng()`` and the workers' seeds (default: the sampler's, else 0).
        **kwargs: trainkit's ``mapper`` (record -> sample, applied by the loader: a ``RecordMapper``
            or any callable, which may return ``None`` or raise to skip a record),
            ``accumulate_steps`` (``SOLVER.ACCUMULATE_STEPS``), ``aspect_ratio_bins`` (``(1.0,)``:
            detectron2's tall/wide split), ``aspect_ratios`` (per dataset index, instead of reading
            the records), ``prefetch_factor``, ``persistent_workers``, ``pin_memory`` (the
            ``DataLoader``'s; workers never persist for a stream) and ``dataset_sizes`` (printable
            record ids); further ``DataLoader`` arguments (e.g. ``timeout``).

    Raises:
        ConfigError: A ``ValueError``: if the batch does not split evenly over the ranks and
            micro-batches, or grouping finds a first record with neither a size nor a
            ``file_name`` (a later one: when the plan reaches it).
        ValueError: If a map-style dataset has no sampler or a stream has one.
    """
    if sampler is None and not isinstance(dataset, IterableDataset):
        raise ValueError(
            "a map-style dataset needs a sampler, e.g. TrainingSampler(len(dataset), seed=seed)"
        )
    return TrainLoader(
        TrainDataSpec.from_arguments(
            dataset,
            sampler,
            total_batch_size,
            aspect_ratio_grouping=aspect_ratio_grouping,
            num_workers=num_workers,
            collate_fn=collate_fn,
            drop_last=drop_last,
            single_gpu_batch_size=single_gpu_batch_size,
            seed=seed,
            **kwargs,
        )
    )


build_train_loader = build_detection_train_loader


def train_data_spec(run: RunConfig, *, world_size: int, rank: int, seed: int) -> TrainDataSpec:
    """Return the spec a run's train loader would load, without building the loader.

    A ``CfgNode`` gives :meth:`TrainDataSpec.from_config`'s; a LazyConfig the spec of its
    ``dataloader.train`` arguments, when that call is one of the builders above (a loader
    of another making has no spec before it is built).

    Args:
        run: the run's config (:func:`~trainkit.config.run_config.run_config`).
        world_size, rank: the job's processes and whose share.
        seed: the data seed.

    Raises:
        RecordsNotPlannedError: For a LazyConfig whose loader another callable builds.
    """
    node = run.train_loader
    if node is None:
        return TrainDataSpec.from_config(run.cfg, world_size=world_size, rank=rank, seed=seed)
    target = node.get("_target_")
    target = locate(target) if isinstance(target, str) else target
    if target not in (build_detection_train_loader, build_batch_data_loader):
        raise RecordsNotPlannedError(
            f"dataloader.train is built by {target!r}, not by build_detection_train_loader or "
            "build_batch_data_loader, so its records are not known without building it."
        )
    arguments = {k: instantiate(v) for k, v in node.items() if k != "_target_"}
    bound = inspect.signature(target).bind(**{**arguments, "seed": seed})
    bound.apply_defaults()
    extra = bound.arguments.pop("kwargs", {})  # popped first: it is not a loader argument
    spec = TrainDataSpec.from_arguments(**bound.arguments, **extra)
    return dataclasses.replace(spec, world_size=world_size, rank=rank)
