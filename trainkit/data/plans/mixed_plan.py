"""The batch plan of a weighted mix of training sets: each step's exact share of every set.

:class:`MixedBatchPlan` composes optimizer step ``s``'s batch of ``B = SOLVER.IMS_PER_BATCH``
records from several sets (:class:`~trainkit.data.plans.mixed_sampler.MixedTrainingSampler`) and
deals it to ``W x k`` slots exactly as :class:`~trainkit.data.plans.batch_plan.GlobalBatchPlan`
does, so a step's records stay a pure function of (seed, step) on every topology:

1. Step ``s`` holds ``n_i(s)`` records of set ``i`` (the sampler's :meth:`counts`: largest
   remainder with a carry), set 0's first, then set 1's, ... (with grouping, the leading
   set's first, see 2.)
2. Set ``i``'s records are the next ones of its own stream, in order. With aspect-ratio
   grouping, each set's records wait in its own buckets; the set with the largest share
   leads, and its first bucket to hold its share is the step's bucket. Every other set
   takes its share from the same bucket, reading ahead until that bucket holds it, but
   keeping at most :data:`LOOK_AHEAD` x buckets x its share records waiting; past that it
   takes its own bucket whose ``n_i(s)``-th record came first. A bucket already holding a
   set's share gives its first records. The share never bends to grouping; sets of unlike
   aspect ratios pad more (``benchmarks/mixing.py`` shows how much).
3. A record's position (which keys its augmentations, ``sample_rng()``) is
   ``p * S + i`` for the ``p``-th record of set ``i``'s stream, ``S`` sets: unique, and the
   same on every topology.

The position after a step holds each set's (:mod:`trainkit.data.plans.loader_state`), so the
mix resumes exactly on any world size and ``SOLVER.ACCUMULATE_STEPS`` (at a step boundary).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

from trainkit.data.plans.batch_plan import BucketIds, GlobalBatchPlan
from trainkit.data.plans.grouping import Buckets
from trainkit.data.plans.mixed_sampler import MixedTrainingSampler

__all__ = ["LOOK_AHEAD", "MixedBatchPlan"]

# Rule 2's bound on a set's records waiting (what also makes most steps one bucket when the
# sets' aspect ratios look alike).
LOOK_AHEAD = 4


class MixedBatchPlan(GlobalBatchPlan):
    """Compose each step from several sets' streams by weight; deal it as the global plan does.

    The rule is the module docstring's; batches come as :class:`GlobalBatchPlan`'s do.
    """

    def __init__(
        self,
        sampler: MixedTrainingSampler,
        global_batch_size: int,
        *,
        rank: int,
        world_size: int,
        accumulate_steps: int = 1,
        bucket_ids: BucketIds | None = None,
    ) -> None:
        """Plan ``global_batch_size`` records per optimizer step from ``sampler``'s sets.

        As :class:`GlobalBatchPlan` (``bucket_ids`` indexed as the concatenated sets).
        """
        super().__init__(
            sampler,  # type: ignore[arg-type]  # read through its own methods below
            global_batch_size,
            rank=rank,
            world_size=world_size,
            accumulate_steps=accumulate_steps,
            bucket_ids=bucket_ids,
        )
        num_buckets = len(self._state["buckets"])
        self._state["sets"] = [
            {"position": 0, "taken": 0, "records": 0, "buckets": [[] for _ in range(num_buckets)]}
            for _ in sampler.sizes
        ]

    _STEP_KEYS = ("position", "sets")

    def _compose(
        self, state: dict[str, Any]
    ) -> Iterator[tuple[int, list[list[int]], dict[str, Any]]]:
        sampler: MixedTrainingSampler = self._sampler
        batch_size, num_sets = self._batch_size, len(sampler.sizes)
        sets = state["sets"]
        positions = [part["position"] for part in sets]
        taken = [part["taken"] for part in sets]
        waiting = [Buckets.from_lists(batch_size, part["buckets"]).waiting for part in sets]
        # Per set: (its record's position, dataset index, bucket), from where it stopped.
        readers = [
            self._read(functools.partial(sampler.indices, i), positions[i], num_sets, i)
            for i in range(num_sets)
        ]
        # With grouping, the order the sets fill a step in when set `leader` leads.
        orders = [[lead, *(i for i in range(num_sets) if i != lead)] for lead in range(num_sets)]
        steps = state["steps"]
        while True:
            counts = sampler.counts(batch_size, steps, taken)
            batch: list[list[int]] = []
            if self._bucket_ids is None:  # each set's next records, in stream order
                for i, count in enumerate(counts):
                    batch += [[index, p] for p, index, _ in itertools.islice(readers[i], count)]
                    positions[i] += count
            else:
                # The set with the largest share leads: its first bucket to fill is the
                # step's bucket, which the other sets fill too where they can.
                leader = counts.index(max(counts))
                target = None
                for i in orders[leader]:
                    if counts[i]:
                        part, target, last = _fill(readers[i], waiting[i], counts[i], target)
                        if last is not None:  # the last record read: p * num_sets + i
                            positions[i] = last // num_sets + 1
                        batch += part
            taken = [c + n for c, n in zip(taken, counts)]
            # Every bucket has its list, in bucket order (Buckets.from_lists).
            after = [
                {"position": p, "taken": t, "records": n, "buckets": list(map(list, w.values()))}
                for p, t, n, w in zip(positions, taken, counts, waiting)
            ]
            # "position": the records of the steps composed.
            yield steps, batch, {"position": (steps + 1) * batch_size, "sets": after}
            steps += 1


def _fill(
    reader: Iterator[tuple[int, int, int]],
    waiting: dict[Any, list[list[int]]],
    count: int,
    target: int | None,
) -> tuple[list[list[int]], int, int | None]:
    """Take ``count`` records of one set from ``waiting`` (a list per bucket), reading on.

    From the first bucket to hold ``count`` (the leading set, no ``target``), else from
    ``target`` as rule 2 of the module docstring says. Returns the records, the bucket taken
    and the position of the last record read (None: none was read).
    """
    position = None
    if target is None:
        target = _first_full(waiting, count)
        if target is None:
            # The first bucket to reach `count` as the stream goes is the one whose
            # `count`-th record came first: no bucket held so many before.
            for position, index, bucket in reader:
                items = waiting[bucket]
                items.append([index, position])
                if len(items) >= count:
                    target = bucket
                    break
    elif len(waiting[target]) < count:
        room = LOOK_AHEAD * len(waiting) * count - sum(map(len, waiting.values()))
        for position, index, bucket in itertools.islice(reader, max(room, 0)):
            items = waiting[bucket]
            items.append([index, position])
            if bucket == target and len(items) >= count:
                break
    if len(waiting[target]) < count:
        target = _first_full(waiting, count)
    items = waiting[target]
    part = items[:count]
    del items[:count]
    return part, target, position


def _first_full(waiting: dict[Any, list[list[int]]], count: int) -> Any:
    """The bucket whose ``count``-th record came first in the stream (None: none holds so many)."""
    if max(map(len, waiting.values()), default=0) < count:  # the usual case: cheap
        return None
    full = [b for b, items in waiting.items() if len(items) >= count]
    return min(full, key=lambda b: waiting[b][count - 1][1], default=None)
