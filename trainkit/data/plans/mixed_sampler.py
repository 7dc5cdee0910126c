"""Weighted mixing of training sets: each set's own stream, each step's share, and its batch.

``DATASETS.TRAIN_WEIGHTS`` gives each entry of ``DATASETS.TRAIN`` a weight ``w_i``. Optimizer
step ``s`` (a batch of ``B = SOLVER.IMS_PER_BATCH`` records) holds exactly ``n_i(s)`` records of
set ``i``, decided by :func:`mix_counts` (*largest remainder with a carry*):

1. The weights become exact integers ``u_i`` (each float read as the decimal it prints as:
   ``0.7, 0.2, 0.1`` is ``7 : 2 : 1``), ``U = sum(u_i)``.
2. Set ``i``'s *quota* for step ``s`` is ``q_i = (s + 1) * B * u_i / U - C_i(s)``, ``C_i(s)``
   the records it gave in steps ``0 .. s-1``: its share of one batch plus the carry.
3. Each set first gets ``floor(q_i)`` records (0 if that is negative); the records left to
   reach ``B`` go one by one to the sets with the largest remainders ``q_i - n_i`` (ties: the
   set listed first). If the floors exceed ``B`` (only possible when a set is ahead), the
   records granted last (smallest remainder, ties: the set listed last) are taken back.

So every step holds exactly ``B`` records, and after every step each set has given its exact
share up to less than one record: the long-run share is exact. Weights ``10 : 5 : 1`` with
``B = 16`` give ``(10, 5, 1)`` at every step; with ``B = 8`` (quotas ``5, 2.5, 0.5``) they give
``(5, 3, 0)``, ``(5, 2, 1)``, ``(5, 3, 0)``, ``(5, 2, 1)``, ...: 10, 5 and 1 records every two
steps. A set whose share of a batch is below one record is in some steps and not in others;
no positive weight leaves a set out of every step.

Each set is read through its own :class:`~trainkit.data.samplers.TrainingSampler` (seeded
from the run's seed and the set's place): O(1) memory per set, and a small set repeats while
a large one need not be seen whole. :class:`MixedBatchPlan` composes step ``s``'s batch and
deals it to ``W x k`` slots as :class:`~trainkit.data.plans.batch_plan.GlobalBatchPlan` does,
so a step's records stay a pure function of (seed, step) on every topology:

a. Set ``i``'s ``n_i(s)`` records are the next ones of its own stream, set 0's first, then set
   1's, ... With aspect-ratio grouping, each set's records wait in its own buckets; the set
   with the largest share leads (its records first), and its first bucket to hold its share
   is the step's bucket. Every other set takes its share from the same bucket, reading ahead
   until that bucket holds it, but keeping at most :data:`LOOK_AHEAD` x buckets x its share
   records waiting; past that it takes its own bucket whose ``n_i(s)``-th record came first.
   A bucket already holding a set's share gives its first records. The share never bends to
   grouping; sets of unlike aspect ratios pad more (``benchmarks/mixing.py`` shows how much).
b. A record's position (which keys its augmentations, ``sample_rng()``) is ``p * S + i`` for
   the ``p``-th record of set ``i``'s stream, ``S`` sets: unique, and the same on every topology.

The position after a step holds each set's (:mod:`trainkit.data.plans.loader_state`), so the
mix resumes exactly on any world size and ``SOLVER.ACCUMULATE_STEPS`` (at a step boundary).
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from trainkit.config import ConfigError
from trainkit.data.plans.batch_plan import BucketIds, GlobalBatchPlan
from trainkit.data.plans.global_stream import PURPOSE_MIX, TrainingSampler, check_rank, round_keys
from trainkit.data.plans.grouping import Buckets
from trainkit.utils import comm

__all__ = ["LOOK_AHEAD", "MixedBatchPlan", "MixedTrainingSampler", "mix_counts", "mix_weights"]


def mix_weights(weights: Sequence[float], names: Sequence[str]) -> list[int]:
    """Return ``DATASETS.TRAIN_WEIGHTS`` as the smallest exact integer weights.

    Each float counts as the decimal it prints as (``repr``): ``0.1`` is ``1/10``.

    Args:
        weights: one positive weight per dataset.
        names: the datasets (``DATASETS.TRAIN``), named in messages.

    Raises:
        ConfigError: A ``ValueError``: for a wrong number of weights, or one not positive finite.
    """
    if len(weights) != len(names):
        raise ConfigError(
            f"DATASETS.TRAIN_WEIGHTS has {len(weights)} weights for {len(names)} datasets in "
            f"DATASETS.TRAIN {list(names)}; give one weight per dataset, or () to concatenate."
        )
    fractions = []
    for name, weight in zip(names, weights):
        try:
            value = float(weight)
        except (TypeError, ValueError):
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(
                f"DATASETS.TRAIN_WEIGHTS gives dataset {name!r} the weight {weight!r}; weights "
                "must be positive finite numbers (to leave a dataset out, remove it from "
                "DATASETS.TRAIN)."
            )
        fractions.append(Fraction(repr(value)))
    denominator = math.lcm(*(f.denominator for f in fractions))
    integers = [int(f * denominator) for f in fractions]
    divisor = math.gcd(*integers)
    return [i // divisor for i in integers]


def mix_counts(
    batch_size: int, weights: Sequence[int], step: int, taken: Sequence[int]
) -> list[int]:
    """Return how many records of each set step ``step`` holds (rules 1-3 of the module docstring).

    Args:
        batch_size: records of one optimizer step (``SOLVER.IMS_PER_BATCH``).
        weights: integer weights (:func:`mix_weights`).
        step: the 0-based optimizer step.
        taken: records each set gave in steps ``0 .. step - 1``.

    Returns:
        One count ``>= 0`` per set; they sum to ``batch_size``.
    """
    total = sum(weights)
    # Quotas scaled by `total`: exact integers, however long the run.
    due = (step + 1) * batch_size
    quotas = [due * w - c * total for w, c in zip(weights, taken)]
    counts = [q // total if q > 0 else 0 for q in quotas]
    left = batch_size - sum(counts)
    if not left:  # the usual case when the weights divide the batch: nothing to hand out
        return counts
    sets = range(len(counts))
    while left > 0:  # at most len(weights) - 1 times
        i = max(sets, key=lambda i: (quotas[i] - counts[i] * total, -i))
        counts[i] += 1
        left -= 1
    while left < 0:
        i = min(
            (i for i in sets if counts[i]), key=lambda i: (quotas[i] - (counts[i] - 1) * total, -i)
        )
        counts[i] -= 1
        left += 1
    return counts


# The longest cycle of per-step counts kept (one tuple per step); a longer one (weights whose
# integers sum to a large U) is computed step by step.
_MAX_CYCLE = 4096


def _count_cycle(batch_size: int, weights: Sequence[int]) -> list[tuple[int, ...]]:
    """The counts of steps ``0 .. P-1`` (:meth:`MixedTrainingSampler.counts`; [] if too long)."""
    total = sum(weights)
    period = total // math.gcd(batch_size, total)
    if period > _MAX_CYCLE:
        return []
    cycle, taken = [], [0] * len(weights)
    for step in range(period):
        counts = mix_counts(batch_size, weights, step, taken)
        cycle.append(tuple(counts))
        taken = [c + n for c, n in zip(taken, counts)]
    return cycle


class MixedTrainingSampler:
    """Several training sets, each with its own global stream, mixed by weight per step.

    Set ``i`` is the dataset indices ``offsets[i] .. offsets[i] + sizes[i] - 1`` of the
    concatenated records (``DATASETS.TRAIN`` in order), its stream a ``TrainingSampler`` of
    ``sizes[i]`` records. :class:`MixedBatchPlan` takes :meth:`counts` records of each set per
    optimizer step; it never ends and holds no per-record state.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        weights: Sequence[float],
        seed: int | None = None,
        *,
        names: Sequence[str] | None = None,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        """Mix sets of ``sizes`` records by ``weights`` (one per set, > 0).

        Args:
            sizes: records of each set (> 0).
            weights: the sets' weights (``DATASETS.TRAIN_WEIGHTS``; :func:`mix_weights`).
            seed: shared by all ranks (``None``: ``comm.shared_random_seed()``, a collective).
            names: the sets' names (default ``set0``, ``set1``, ...): metric names and messages.
            shuffle: permute every epoch of every set.
            rank, world_size: this rank and the number of ranks (default: ``comm``'s).

        Raises:
            ConfigError: A ``ValueError``: as :func:`mix_weights`.
            ValueError: For an empty set (as :class:`TrainingSampler`).
        """
        self.names = [f"set{i}" for i in range(len(sizes))] if names is None else list(names)
        self.weights = mix_weights(weights, self.names)
        self.seed = int(comm.shared_random_seed() if seed is None else seed)
        self.world_size = comm.get_world_size() if world_size is None else int(world_size)
        self.rank = comm.get_rank() if rank is None else int(rank)
        check_rank(self.rank, self.world_size)
        # Each set's stream of its own indices (rank and world size do not matter: the plan
        # reads every stream whole).
        self.samplers = [
            TrainingSampler(size, shuffle, set_seed(self.seed, i), rank=0, world_size=1)
            for i, size in enumerate(sizes)
        ]
        self.sizes = [int(size) for size in sizes]
        self.offsets = [0, *np.cumsum(self.sizes)[:-1].tolist()]
        self._cycles: dict[int, list[tuple[int, ...]]] = {}  # batch size -> counts of a cycle

    def __len__(self) -> int:
        """Records of all sets together (the concatenated dataset's size)."""
        return sum(self.sizes)

    def counts(self, batch_size: int, step: int, taken: Sequence[int]) -> Sequence[int]:
        """Return each set's records in step ``step`` (:func:`mix_counts` with these weights).

        ``taken`` must be what the steps before gave (as the plan's position holds it). The
        counts repeat every ``P = U / gcd(B, U)`` steps (each set has then given its exact
        share, and the carry is zero again): for ``P <=`` :data:`_MAX_CYCLE` they are computed
        once and read by ``step % P``, so the result is shared: do not change it.
        """
        cycle = self._cycles.get(batch_size)
        if cycle is None:
            cycle = self._cycles[batch_size] = _count_cycle(batch_size, self.weights)
        if cycle:
            return cycle[step % len(cycle)]
        return mix_counts(batch_size, self.weights, step, taken)

    def indices(self, set_index: int, start: int, count: int) -> np.ndarray:
        """Return the dataset indices at positions ``start ..`` of set ``set_index``'s stream."""
        return self.samplers[set_index].global_indices(start, count) + self.offsets[set_index]

    def global_stream_key(self) -> dict[str, Any]:
        """Plain-data identity of the mix (the weights, and each set's name and stream)."""
        sets = [
            {"name": name, **sampler.global_stream_key()}
            for name, sampler in zip(self.names, self.samplers)
        ]
        return {"type": type(self).__name__, "weights": list(self.weights), "sets": sets}


def set_seed(seed: int, set_index: int) -> int:
    """Return the seed of set ``set_index``'s stream: keyed by the run's seed, >= 0."""
    key = round_keys(seed, PURPOSE_MIX, np.array([set_index], dtype=np.int64))[0, 0]
    return operator.index(int(key) >> 1)


# Rule a's bound on a set's records waiting (what also makes most steps one bucket when the
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
            else:  # rule a: the set with the largest share leads
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
    ``target`` as rule a of the module docstring says. Returns the records, the bucket taken
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
