"""The records of each optimizer step, for every rank and micro-batch, without a loader.

Every optimizer step's records are a pure function of the data seed and the step
(:mod:`trainkit.data.batch_plan`), so one process can list what every rank of any job reads
in any step: :func:`build_train_plan` builds the plan a train loader would use for a config
and a world size (the same checks, catalog, sampler and buckets), and :func:`steps_records`
lets that plan compose each step's whole batch once and deals it to the ``W x k``
(rank, micro-batch) slots with the loader's own rule
(:func:`~trainkit.data.batch_plan.deal`), so listing a step for thousands of ranks costs
what one rank's loader pays for it. :class:`RecordIds` turns a dataset index into a
printable id: the ``DATASETS.TRAIN`` name it came from, its index there, and its
``image_id`` or ``file_name``.

It starts from any loader position of the plan (a fresh run's, or one a checkpoint's run
state holds), so the steps after a resume can be listed too.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torch.utils.data import IterableDataset

from trainkit.config import CfgNode, ConfigError
from trainkit.data.batch_plan import BatchPlan, GlobalBatchPlan, deal
from trainkit.data.build import build_train_sampler, check_train_loader_config
from trainkit.data.catalog import dataset_sizes, joined_names, load_catalog_dataset
from trainkit.data.common import records_and_mapper
from trainkit.data.grouping import record_bucket_ids
from trainkit.data.mixed_plan import make_train_plan
from trainkit.data.mixed_sets import mixed_sampler, mixed_sets

__all__ = [
    "RecordIds",
    "RecordsNotPlannedError",
    "StepRecords",
    "build_train_plan",
    "steps_records",
]

# A record's own ids, shown after its dataset and index (the first it has).
_RECORD_KEYS = ("image_id", "file_name")


class RecordsNotPlannedError(ConfigError):
    """No plan knows a step's records before the run (a stream dataset, or ``SEED < 0``)."""


@dataclass(frozen=True)
class StepRecords:
    """One optimizer step's records: its whole batch and how it is dealt to the ranks.

    Attributes:
        step: the optimizer step (0-based; the iteration of a run whose stream started at 0).
        batch: the step's ``(dataset index, global position)`` pairs, in dealing order.
        world_size, accumulate_steps: the ``W`` processes and ``k`` micro-batches it is
            dealt to.
    """

    step: int
    batch: tuple[tuple[int, int], ...]
    world_size: int
    accumulate_steps: int

    def records(self, rank: int, micro_batch: int = 0) -> list[tuple[int, int]]:
        """Return the ``(dataset index, global position)`` pairs of one rank's micro-batch.

        Raises:
            ValueError: If ``rank`` or ``micro_batch`` is out of range.
        """
        if not (0 <= rank < self.world_size and 0 <= micro_batch < self.accumulate_steps):
            raise ValueError(
                f"rank {rank}, micro-batch {micro_batch} is not a slot of a job of "
                f"{self.world_size} processes x {self.accumulate_steps} micro-batches"
            )
        num_slots = self.world_size * self.accumulate_steps
        return list(deal(self.batch, micro_batch * self.world_size + rank, num_slots))

    def slots(self) -> Iterator[tuple[int, int, list[tuple[int, int]]]]:
        """Yield ``(rank, micro_batch, records)`` of every slot: by rank, then micro-batch."""
        for rank in range(self.world_size):
            for micro_batch in range(self.accumulate_steps):
                yield rank, micro_batch, self.records(rank, micro_batch)


def steps_records(
    plan: BatchPlan,
    num_steps: int,
    *,
    state: dict[str, Any] | None = None,
    first_step: int | None = None,
) -> list[StepRecords]:
    """Return the records of ``num_steps`` optimizer steps, for every rank and micro-batch.

    The plan composes each step once (:meth:`GlobalBatchPlan.step_batches`); it does not
    move, so the plan of a live loader can be asked too. Steps come in order; with grouping a
    step depends on the ones before (records wait in their buckets), so listing step ``s``
    composes the steps between ``state`` and ``s``.

    Args:
        plan: a plan over a trainkit training sampler's global stream (its world size and
            ``SOLVER.ACCUMULATE_STEPS`` are the slots), e.g. from :func:`build_train_plan`.
        num_steps: how many steps to list.
        state: the loader position to start from (``TrainLoader.state_dict()``, or a rank's
            ``"data"`` in a checkpoint's run state; default: the plan's own). One taken in the
            middle of a step starts with that whole step.
        first_step: list from this step on (default: the state's step).

    Raises:
        TypeError: If ``plan`` is not a :class:`GlobalBatchPlan` (a per-rank plan's steps
            depend on the rank's own sampler).
        ValueError: If ``first_step`` is before the state's step.
        ConfigError: A ``ValueError``: for a state of another plan (as ``load_state_dict``).
    """
    if not isinstance(plan, GlobalBatchPlan):
        raise TypeError(
            f"the records of a step are known only for a plan over a trainkit training "
            f"sampler's global stream, not for a {type(plan).__name__}"
        )
    found: list[StepRecords] = []
    if num_steps <= 0:
        return found
    for step, batch, _ in plan.step_batches(state):
        if first_step is not None and step > first_step and not found:
            raise ValueError(f"the state starts at step {step}, after step {first_step}")
        if first_step is None or step >= first_step:
            pairs = tuple((int(index), int(position)) for index, position in batch)
            found.append(StepRecords(step, pairs, plan.world_size, plan.accumulate_steps))
            if len(found) == num_steps:
                break
    return found


def build_train_plan(
    cfg: CfgNode,
    world_size: int,
    *,
    seed: int | None = None,
    dataset: Any = None,
) -> tuple[Any, GlobalBatchPlan]:
    """Return the train records and rank 0's batch plan of a job of ``world_size`` processes.

    The plan is the one ``build_detection_train_loader(cfg)`` builds (the same checks,
    catalog records, sampler and aspect-ratio buckets), without a loader, a mapper or a
    process group; every rank of the job composes the same steps.

    Args:
        cfg: the config, scaled to ``world_size`` (``auto_scale_config``).
        world_size: the processes of the job.
        seed: the data seed (default ``cfg.SEED``).
        dataset: the train records or map-style dataset (default: ``DATASETS.TRAIN``'s).

    Returns:
        ``(records, plan)``: the unmapped records (indexed by dataset index) and the plan.

    Raises:
        ConfigError: A ``ValueError``: as ``check_train_loader_config`` for ``world_size``
            and as the catalog for the datasets.
        RecordsNotPlannedError: A ``ConfigError``: for a seed < 0 (a run draws it when it
            starts) or a stream dataset (its loader workers form the batches, no plan does).
    """
    check_train_loader_config(cfg, world_size)
    seed = cfg.SEED if seed is None else seed
    if seed < 0:
        raise RecordsNotPlannedError(
            f"SEED={seed}: a run draws its data seed when it starts, so its records are not "
            "known before; set SEED >= 0 to fix them."
        )
    sampler = None
    if cfg.DATASETS.TRAIN_WEIGHTS:
        # The loader's mix: the sets concatenated, one stream each (mixed_sets).
        if dataset is None:
            dataset, sampler = mixed_sets(cfg, seed, rank=0, world_size=world_size)
        else:
            sampler = mixed_sampler(cfg, dataset, seed, rank=0, world_size=world_size)
    elif dataset is None:
        dataset = load_catalog_dataset(
            cfg.DATASETS.TRAIN, filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS
        )
    records, _ = records_and_mapper(dataset)
    if isinstance(records, IterableDataset) or callable(getattr(records, "as_stream", None)):
        raise RecordsNotPlannedError(
            f"DATASETS.TRAIN {joined_names(cfg.DATASETS.TRAIN)!r} is a stream dataset: its "
            "loader workers form the batches, so no plan lists a step's records."
        )
    if sampler is None:
        sampler = build_train_sampler(cfg, records, seed, rank=0, world_size=world_size)
    loader = cfg.DATALOADER
    bucket_ids = (
        record_bucket_ids(records, loader.ASPECT_RATIO_BINS)
        if loader.ASPECT_RATIO_GROUPING
        else None
    )
    plan = make_train_plan(
        sampler, cfg.SOLVER.IMS_PER_BATCH, None, cfg.SOLVER.ACCUMULATE_STEPS, bucket_ids, True
    )
    assert isinstance(plan, GlobalBatchPlan)  # a trainkit sampler and a total batch size
    return records, plan


class RecordIds:
    """Printable ids of the train records: ``NAME[i] image_id=...`` (or ``file_name=...``).

    ``NAME`` is the ``DATASETS.TRAIN`` name a dataset index came from and ``i`` its index in
    that dataset (after ``DATALOADER.FILTER_EMPTY_ANNOTATIONS``, as the loader sees it).

    Args:
        records: the joined records (indexed by dataset index; read only for the ids shown).
        names: the dataset names, in order.
        sizes: how many records each adds (:func:`~trainkit.data.catalog.dataset_sizes`).

    Raises:
        ValueError: If the sizes do not add up to the records' number.
    """

    def __init__(self, records: Sequence[Any], names: Sequence[str], sizes: Sequence[int]):
        if sum(sizes) != len(records) or len(names) != len(sizes):
            raise ValueError(
                f"datasets {list(names)} of sizes {list(sizes)} do not make the "
                f"{len(records)} records"
            )
        self._records, self._names = records, list(names)
        self._starts = list(itertools.accumulate(sizes, initial=0))

    @classmethod
    def from_config(cls, cfg: CfgNode, records: Sequence[Any]) -> RecordIds:
        """Ids for ``records`` loaded from ``cfg.DATASETS.TRAIN`` (its catalog is read again)."""
        names = [cfg.DATASETS.TRAIN] if isinstance(cfg.DATASETS.TRAIN, str) else cfg.DATASETS.TRAIN
        sizes = dataset_sizes(names, filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS)
        return cls(records, names, sizes)

    def info(self, index: int) -> dict[str, Any]:
        """Return ``{"dataset", "index"}`` of dataset index ``index``, plus the record's ids.

        The record's ``image_id`` and ``file_name`` are added when it has them.

        Raises:
            IndexError: If ``index`` is not a dataset index.
        """
        part = self._part(index)
        found: dict[str, Any] = {"dataset": self._names[part], "index": index - self._starts[part]}
        record = self._records[index]
        if isinstance(record, dict):
            found.update({key: record[key] for key in _RECORD_KEYS if key in record})
        return found

    @property
    def names(self) -> list[str]:
        """The dataset names, in ``DATASETS.TRAIN`` order."""
        return list(self._names)

    def dataset(self, index: int) -> str:
        """Return the name of the dataset holding dataset index ``index`` (raises as ``info``)."""
        return self._names[self._part(index)]

    def _part(self, index: int) -> int:
        if not 0 <= index < self._starts[-1]:
            raise IndexError(f"dataset index {index} is not in [0, {self._starts[-1]})")
        return bisect.bisect_right(self._starts, index) - 1

    def __call__(self, index: int) -> str:
        """Return the printable id of dataset index ``index`` (see the class docstring)."""
        info = self.info(index)
        text = f"{info['dataset']}[{info['index']}]"
        own = next((key for key in _RECORD_KEYS if key in info), None)
        return text if own is None else f"{text} {own}={info[own]}"
