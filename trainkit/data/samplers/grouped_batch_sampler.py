"""Batches of indices that never mix groups (detectron2's ``GroupedBatchSampler``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import BatchSampler, Sampler

from trainkit.data.plans.grouping import Buckets

__all__ = ["GroupedBatchSampler"]


class GroupedBatchSampler(BatchSampler):
    """Wrap a sampler and yield batches whose indices all belong to one group.

    It groups with :class:`~trainkit.data.plans.grouping.Buckets`, as the train loader does: batches
    follow the sampler's order as closely as grouping allows, and indices still waiting when the
    sampler ends join the next pass, as in detectron2. It records no position: for a resumable,
    grouped train loader use ``build_batch_data_loader(..., aspect_ratio_grouping=True)``. ``len()``
    is undefined (it depends on the order).
    """

    def __init__(
        self, sampler: Sampler[int], group_ids: Sequence[int] | np.ndarray, batch_size: int
    ) -> None:
        """Batch ``sampler``'s indices (in ``[0, len(group_ids))``) by ``group_ids[index]``.

        Raises:
            ValueError: If ``sampler`` is not a ``torch.utils.data.Sampler``, ``group_ids``
                is not one-dimensional or ``batch_size`` is not positive.
        """
        # Deliberately not BatchSampler.__init__: it validates drop_last, which this lacks.
        if not isinstance(sampler, Sampler):
            raise ValueError(
                f"sampler should be a torch.utils.data.Sampler, got {type(sampler).__name__}"
            )
        group_ids = np.asarray(group_ids)
        if group_ids.ndim != 1:
            raise ValueError(f"group_ids must be one-dimensional, got shape {group_ids.shape}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.sampler, self.group_ids = sampler, group_ids
        self.batch_size, self.drop_last = batch_size, False
        self._buckets = Buckets(batch_size, {group: [] for group in np.unique(group_ids).tolist()})
        self.buffer_per_group: dict[Any, list[int]] = self._buckets.waiting

    def __iter__(self) -> Iterator[list[int]]:
        for idx in self.sampler:
            batch = self._buckets.add(self.group_ids[idx].item(), idx)
            if batch is not None:
                yield batch

    def __len__(self) -> int:
        # TypeError (not NotImplementedError as in detectron2): list() and torch treat it
        # as "no length" instead of failing.
        raise TypeError("len() of GroupedBatchSampler is undefined: it depends on the order")
