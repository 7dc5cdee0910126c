"""The training-data spec: the records, mapper, sampler and plan of a run, assembled once.

A :class:`TrainDataSpec` is what a train loader loads (``TrainLoader(spec)``, kept as
``loader.spec``) and what the dry run, the failing-step capture and the replay read each
step's records from. It is built from a config (:meth:`TrainDataSpec.from_config`) or from a
train loader builder's explicit arguments (:meth:`TrainDataSpec.from_arguments`). Building
one reads no record (a record's aspect-ratio bucket is read when a plan first reaches it:
:class:`~trainkit.data.plans.grouping.LazyBucketIds`), so listing ``K`` steps of 4e8 records
reads only the records those steps draw and those waiting in buckets.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from trainkit.config import CfgNode, ConfigError
from trainkit.data.common import records_and_mapper
from trainkit.data.mapping.record_mapper import RecordMapper
from trainkit.data.plans.batch_plan import (
    BatchPlan,
    BucketIds,
    GlobalBatchPlan,
    RankBatchPlan,
    micro_batch_size,
)
from trainkit.data.plans.global_stream import GlobalStreamSampler
from trainkit.data.plans.grouping import BucketOf, aspect_ratio_bucket_ids, record_bucket_ids
from trainkit.data.plans.mixed_sampler import MixedBatchPlan, MixedTrainingSampler
from trainkit.data.plans.step_records import RecordIds, RecordsNotPlannedError, StepRecords
from trainkit.data.plans.step_records import steps_records as _steps_records
from trainkit.data.samplers import TrainingSampler
from trainkit.data.train_config import train_loader_arguments
from trainkit.utils import comm

__all__ = ["LoaderSettings", "TrainDataSpec"]


@dataclass(frozen=True)
class LoaderSettings:
    """How the torch ``DataLoader`` runs a spec's batches on each rank.

    Attributes:
        num_workers, prefetch_factor, persistent_workers, pin_memory: the ``DataLoader``'s
            (workers never persist for a stream dataset).
        collate_fn: list of samples -> batch (``None``: the list itself).
        drop_last: drop the incomplete batches at the end of a finite sampler.
        dataloader_kwargs: further ``DataLoader`` arguments (e.g. ``timeout``); they win.
    """

    num_workers: int = 0
    prefetch_factor: int = 2
    persistent_workers: bool = False
    pin_memory: bool = False
    collate_fn: Callable[[list[Any]], Any] | None = None
    drop_last: bool = True
    dataloader_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def torch_kwargs(self) -> dict[str, Any]:
        """Return the ``DataLoader`` arguments, ``dataloader_kwargs`` winning."""
        own = {key: getattr(self, key) for key in ("num_workers", *_LOADER_EXTRAS)}
        return {**own, **self.dataloader_kwargs}


# The fields of TrainDataSpec and LoaderSettings build_batch_data_loader takes in **kwargs
# (beside mapper, aspect_ratio_bins and aspect_ratios); the other ones are the DataLoader's.
_SPEC_EXTRAS = ("accumulate_steps", "dataset_sizes")
_LOADER_EXTRAS = ("prefetch_factor", "persistent_workers", "pin_memory")


@dataclass(frozen=True, eq=False)
class TrainDataSpec:
    """One rank's training data: what its loader reads, maps, and batches in which order.

    It loads nothing itself (``TrainLoader(spec)`` does). ``dataclasses.replace(spec,
    world_size=64, rank=0)`` is the same data for a job of 64 processes: over a trainkit
    sampler each step's records do not depend on the world size, only how a step is dealt.

    Attributes:
        records: the unmapped records by dataset index, or the stream (an ``IterableDataset``).
        mapper: record -> sample, applied by the loader (``None``: none).
        sampler: this rank's dataset indices (``None`` for a stream).
        seed: the data seed, key of the global stream, ``sample_rng()`` and the workers' seeds.
        world_size, rank: the processes each optimizer step's batch is dealt to, and this one.
        total_batch_size: records of one optimizer step over all ranks.
        accumulate_steps: micro-batches per rank and optimizer step.
        single_gpu_batch_size: records of one batch of this rank instead (a per-rank plan).
        aspect_ratio_bins: the bucket boundaries of aspect-ratio grouping (``None``: none).
        aspect_ratios: each dataset index's ``width / height`` if given (else read as needed).
        loader: how the ``DataLoader`` runs.
        dataset_sizes: each dataset the records join, by name, and how many records it adds,
            in order (printable record ids; ``None``: one dataset, ``"train"``).
    """

    records: Any
    mapper: RecordMapper | None
    sampler: Any
    seed: int
    world_size: int
    rank: int
    total_batch_size: int | None
    accumulate_steps: int = 1
    single_gpu_batch_size: int | None = None
    aspect_ratio_bins: tuple[float, ...] | None = None
    aspect_ratios: np.ndarray | None = None
    loader: LoaderSettings = field(default_factory=LoaderSettings)
    dataset_sizes: Mapping[str, int] | None = None

    @classmethod
    def from_arguments(
        cls,
        dataset: Any,
        sampler: Any,
        total_batch_size: int | None,
        *,
        aspect_ratio_grouping: bool = False,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = True,
        single_gpu_batch_size: int | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> TrainDataSpec:
        """Return the spec of ``build_batch_data_loader``'s arguments (the same signature).

        A ``MapDataset`` is taken apart once into its records and mapper; without a sampler a
        map-style dataset gets ``TrainingSampler(len(records), seed=seed)`` (detectron2's).

        Args:
            dataset: as for :func:`~trainkit.data.build.build_batch_data_loader`, and so are
                ``sampler``, ``total_batch_size``, ``aspect_ratio_grouping``, ``num_workers``,
                ``collate_fn``, ``drop_last``, ``single_gpu_batch_size`` and ``seed``.
            **kwargs: trainkit's ``mapper``, ``accumulate_steps``, ``aspect_ratio_bins``,
                ``aspect_ratios``, ``prefetch_factor``, ``persistent_workers``,
                ``pin_memory`` and ``dataset_sizes`` (the attributes of the same names); the
                rest are ``DataLoader`` arguments.

        Raises:
            ValueError: If a stream dataset is given a sampler.

        Collective:
            ``TrainingSampler``'s shared seed, for a map-style dataset without sampler or seed.
        """
        mapper, bins = kwargs.pop("mapper", None), kwargs.pop("aspect_ratio_bins", (1.0,))
        ratios = kwargs.pop("aspect_ratios", None)
        own = {key: kwargs.pop(key) for key in _SPEC_EXTRAS if key in kwargs}
        settings = {key: kwargs.pop(key) for key in _LOADER_EXTRAS if key in kwargs}
        settings.update(collate_fn=collate_fn, drop_last=drop_last, dataloader_kwargs=kwargs)
        records, mapper = records_and_mapper(dataset, mapper)
        if isinstance(records, IterableDataset) and sampler is not None:
            raise ValueError("an IterableDataset yields its own order: pass sampler=None")
        if sampler is None and not isinstance(records, IterableDataset):
            sampler = TrainingSampler(len(records), seed=seed)
        trainkit_sampler = isinstance(sampler, (GlobalStreamSampler, MixedTrainingSampler))
        if seed is None:
            seed = sampler.seed if trainkit_sampler else 0
        return cls(
            records,
            mapper,
            sampler,
            seed,
            # A trainkit sampler knows whose share it is (tests and custom sharding set it).
            world_size=sampler.world_size if trainkit_sampler else comm.get_world_size(),
            rank=sampler.rank if trainkit_sampler else comm.get_rank(),
            total_batch_size=total_batch_size,
            single_gpu_batch_size=single_gpu_batch_size,
            aspect_ratio_bins=tuple(bins) if aspect_ratio_grouping else None,
            aspect_ratios=None if ratios is None else np.asarray(ratios, dtype=np.float64),
            loader=LoaderSettings(num_workers, **settings),
            **own,
        )

    @classmethod
    def from_config(
        cls,
        cfg: CfgNode,
        *,
        mapper: Callable[[Any], Any] | None = None,
        dataset: Any = None,
        sampler: Any = None,
        world_size: int | None = None,
        rank: int | None = None,
        seed: int | None = None,
    ) -> TrainDataSpec:
        """Return the spec ``build_detection_train_loader(cfg, mapper, ...)`` loads.

        The config is read by :func:`~trainkit.data.train_config.train_loader_arguments`
        (checked before any data is loaded); the data seed is ``seed``, else the config's
        (:func:`~trainkit.data.train_config.resolve_data_seed`).

        Args:
            cfg: the config, scaled to the job's world size.
            mapper, dataset, sampler: what the caller gives instead of the config's.
            world_size, rank: the job's processes and this one (default: this process's).
            seed: the data seed (a dry run or a replay gives the run's).

        Raises:
            ConfigError: A ``ValueError``: for an out-of-range setting, an empty dataset, ...
            UnknownNameError: A ``KeyError``: for an unregistered dataset name.

        Collective:
            ``comm.shared_random_seed()`` on every rank when ``seed`` is None and ``cfg.SEED < 0``.
        """
        arguments = train_loader_arguments(
            cfg, mapper, dataset=dataset, sampler=sampler, world_size=world_size, rank=rank,
            seed=seed,
        )  # fmt: skip
        spec = cls.from_arguments(**arguments)
        # A stream has no sampler to carry them.
        world_size = spec.world_size if world_size is None else world_size
        rank = spec.rank if rank is None else rank
        return dataclasses.replace(spec, world_size=world_size, rank=rank)

    @property
    def is_stream(self) -> bool:
        """Whether the records are a stream dataset (whose loader workers form the batches)."""
        return isinstance(self.records, IterableDataset)

    @property
    def micro_batch_size(self) -> int:
        """Records of one batch of this rank's loader.

        Raises:
            ConfigError: A ``ValueError``: unless the batch splits over ranks and micro-batches.
        """
        return micro_batch_size(
            self.total_batch_size, self.single_gpu_batch_size, self.accumulate_steps,
            self.world_size,
        )  # fmt: skip

    @functools.cached_property
    def bucket_ids(self) -> BucketIds | None:
        """Each dataset index's aspect-ratio bucket (``None`` without grouping), found lazily.

        From ``aspect_ratios`` at once, else each when a plan first reaches it (the first record
        now: a dataset without sizes or images fails here); the spec's plans share what was read.
        """
        if self.aspect_ratio_bins is None or self.is_stream:
            return None
        if self.aspect_ratios is not None:
            return aspect_ratio_bucket_ids(self.aspect_ratios, self.aspect_ratio_bins)
        return record_bucket_ids(self.records, self.aspect_ratio_bins)

    @property
    def bucket_of(self) -> BucketOf | None:
        """A stream element's aspect-ratio bucket (``None`` without grouping)."""
        return None if self.aspect_ratio_bins is None else BucketOf(self.aspect_ratio_bins)

    def plan(self) -> BatchPlan | None:
        """Return a new batch plan of this rank's loader, at its start (``None`` for a stream).

        Over a trainkit training sampler the global stream's (a ``MixedBatchPlan`` for a mix
        of sets), unless batches have a per-rank size; else this rank's (``RankBatchPlan``).

        Raises:
            ConfigError: A ``ValueError``: if the batch does not split evenly, or a mix of
                sets is given ``single_gpu_batch_size`` (a mix composes whole steps).
        """
        if self.is_stream:
            return None
        sampler, single = self.sampler, self.single_gpu_batch_size
        split = {"rank": self.rank, "world_size": self.world_size}
        split.update(accumulate_steps=self.accumulate_steps, bucket_ids=self.bucket_ids)
        if isinstance(sampler, MixedTrainingSampler):
            if single:
                raise ConfigError(
                    "a MixedTrainingSampler (DATASETS.TRAIN_WEIGHTS) composes whole optimizer "
                    "steps: give total_batch_size (SOLVER.IMS_PER_BATCH), not "
                    "single_gpu_batch_size."
                )
            return MixedBatchPlan(sampler, self.total_batch_size or 0, **split)
        if isinstance(sampler, GlobalStreamSampler) and not single:
            return GlobalBatchPlan(sampler, self.total_batch_size or 0, **split)
        return RankBatchPlan(
            sampler,
            self.micro_batch_size,
            bucket_ids=self.bucket_ids,
            drop_last=self.loader.drop_last,
        )

    def steps_records(
        self, num_steps: int, *, state: dict[str, Any] | None = None, first_step: int | None = None
    ) -> list[StepRecords]:
        """Return the records of ``num_steps`` optimizer steps, for every rank and micro-batch.

        As :func:`~trainkit.data.plans.step_records.steps_records` with this spec's plan: from
        loader position ``state`` (default: the start), from step ``first_step`` on.

        Raises:
            RecordsNotPlannedError: A ``ConfigError``: for a stream or a per-rank plan,
                whose steps no plan composes before the loader runs.
            ValueError, ConfigError: As ``steps_records``.
        """
        plan = self.plan()
        if not isinstance(plan, GlobalBatchPlan):
            what = "a stream dataset" if plan is None else f"a {type(self.sampler).__name__}"
            raise RecordsNotPlannedError(
                f"the train data is {what}: its loader forms each rank's batches itself, so "
                "no plan lists a step's records for every rank."
            )
        return _steps_records(plan, num_steps, state=state, first_step=first_step)

    def record_ids(self) -> RecordIds:
        """Return the printable ids of the records: ``NAME[i] image_id=...``.

        Raises:
            TypeError: For a stream (its elements have no dataset index).
        """
        sizes = self.dataset_sizes or {"train": len(self.records)}
        return RecordIds(self.records, list(sizes), list(sizes.values()))
