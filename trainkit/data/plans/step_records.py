"""The records of each optimizer step, for every rank and micro-batch, without a loader.

A step's records are a pure function of the data seed and the step
(:mod:`trainkit.data.plans.batch_plan`), so one process can list what every rank of any job
reads in any step, from any loader position (a resume's too): :func:`steps_records` has a
plan compose each step's batch once and deals it to the ``W x k`` slots with the loader's
rule (:func:`~trainkit.data.plans.batch_plan.deal`), so listing a step for thousands of ranks
costs what one rank's loader pays. :class:`RecordIds` turns a dataset index into a printable
id (dataset name, index there, ``image_id`` or ``file_name``).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from trainkit.config import ConfigError
from trainkit.data.plans.batch_plan import BatchPlan, GlobalBatchPlan, deal

__all__ = ["RecordIds", "RecordsNotPlannedError", "StepRecords", "record_label", "steps_records"]

# A record's own ids, shown after its dataset and index (the first it has).
_RECORD_KEYS = ("image_id", "file_name")


class RecordsNotPlannedError(ConfigError):
    """No plan knows a step's records before the run (a stream, a per-rank plan, ``SEED < 0``)."""


@dataclass(frozen=True)
class StepRecords:
    """One optimizer step's records: its whole batch and how it is dealt to the ranks.

    Attributes:
        step: the optimizer step (0-based; the iteration of a run whose stream started at 0).
        batch: the step's ``(dataset index, global position)`` pairs, in dealing order.
        world_size, accumulate_steps: the ``W`` processes and ``k`` micro-batches it is dealt to.
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

    The plan composes each step once (:meth:`GlobalBatchPlan.step_batches`) and does not move
    (a live loader's plan can be asked too). With grouping a step depends on the ones before,
    so listing step ``s`` composes the steps between ``state`` and ``s``.

    Args:
        plan: a plan over a trainkit training sampler's global stream (its world size and
            ``SOLVER.ACCUMULATE_STEPS`` are the slots), e.g. ``TrainDataSpec.plan()``.
        num_steps: how many steps to list.
        state: the loader position to start from (``TrainLoader.state_dict()`` or a
            checkpoint's; default: the plan's own); one inside a step starts with that step.
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


class RecordIds:
    """Printable ids of the train records: ``NAME[i] image_id=...`` (or ``file_name=...``).

    ``NAME`` is the ``DATASETS.TRAIN`` name a dataset index came from and ``i`` its index in
    that dataset (after ``DATALOADER.FILTER_EMPTY_ANNOTATIONS``, as the loader sees it).

    Args:
        records: the joined records (indexed by dataset index; read only for the ids shown).
        names: the dataset names, in order.
        sizes: how many records each adds (:func:`~trainkit.data.catalog.load_catalog_parts`).

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

    def info(self, index: int) -> dict[str, Any]:
        """Return ``{"dataset", "index"}`` of ``index`` and its record's ``image_id``/``file_name``.

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
        return record_label(info, f"{info['dataset']}[{info['index']}]")


def record_label(record: Any, name: str) -> str:
    """Return ``name`` followed by the record's own id: ``name image_id=...`` (or ``file_name``).

    ``name`` alone for a record without either (or that is not a dict).
    """
    own = next((key for key in _RECORD_KEYS if isinstance(record, dict) and key in record), None)
    return name if own is None else f"{name} {own}={record[own]}"
