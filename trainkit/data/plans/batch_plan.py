"""Batch plans: which records make each batch, decided from indices before anything is loaded.

A plan runs in the training process: it reads dataset indices from a sampler, groups them by
aspect-ratio bucket when asked (:class:`~trainkit.data.plans.grouping.Buckets`) and yields each
batch as ``[dataset index, global position]`` pairs with the loader's position after it
(:mod:`trainkit.data.plans.loader_state`). Loader workers load whole batches, so grouping costs no
throughput and the batches are the same for any ``NUM_WORKERS``.

:class:`GlobalBatchPlan`, over a trainkit training sampler, is computed by every rank alone
and does not depend on the number of processes ``W`` or on ``k = SOLVER.ACCUMULATE_STEPS``:

1. The *global stream* is what a world-size-1 sampler yields: positions 0, 1, 2, ... and the
   dataset index at each (an O(1) keyed permutation per epoch).
2. Optimizer step ``s`` owns the next ``B = SOLVER.IMS_PER_BATCH`` records of it: positions
   ``[s*B, (s+1)*B)``, or, with grouping, the first bucket to reach ``B`` records (each record
   joins its bucket in stream order; the others wait for a later step).
3. The batch is dealt to ``W x k`` slots (:func:`deal`): micro-batch ``j`` of rank ``r`` is
   slot ``q = j*W + r`` and takes elements ``q, q + W*k, ...``. With ``k = 1`` and no
   grouping this is detectron2's rank-strided split (rank ``r`` gets positions ``r, r + W, ...``).

Steps 1-2 are :meth:`GlobalBatchPlan.step_batches` (which does not move the plan). So a step's
records are the same for every ``W`` and ``k``, and the position after a step is valid for any
topology; each rank computes the whole global stream (a few microseconds per record).
:class:`RankBatchPlan` batches this rank's draws from any other sampler, or of a per-rank size.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Union

import numpy as np

from trainkit.config import ConfigError
from trainkit.data.plans.global_stream import GlobalStreamSampler, global_position
from trainkit.data.plans.grouping import Buckets, LazyBucketIds
from trainkit.data.plans.loader_state import copy_state, load_state, new_state
from trainkit.utils import comm

__all__ = [
    "BatchPlan",
    "GlobalBatchPlan",
    "RankBatchPlan",
    "deal",
    "micro_batch_size",
    "split_batch",
]

# Indices are read from the sampler in blocks that grow from the first (a resumed loader
# starts fast) to the largest: each read is a few dozen numpy calls whatever its length,
# which per batch cost ~15-25 us per record; a block of thousands costs ~0.3 us per record.
_FIRST_BLOCK = 256
_MAX_BLOCK = 4096

# Each dataset index's aspect-ratio bucket: all known (an array) or found as the plan goes.
BucketIds = Union[np.ndarray, LazyBucketIds]


def split_batch(
    total: int | None, world_size: int, accumulate_steps: int = 1, *, key: str = ""
) -> int:
    """Return the records of one micro-batch of one rank: ``total / (world_size x k)``.

    Args:
        total: records of one optimizer step over all ranks (``SOLVER.IMS_PER_BATCH``).
        world_size, accumulate_steps: the ranks and micro-batches (``SOLVER.ACCUMULATE_STEPS``).
        key: what ``total`` is called in messages (default ``SOLVER.IMS_PER_BATCH``).

    Raises:
        ConfigError: A ``ValueError``, unless ``total`` splits evenly.
    """
    if accumulate_steps < 1:
        raise ConfigError(
            f"SOLVER.ACCUMULATE_STEPS must be >= 1, got {accumulate_steps}; use 1 for no "
            "gradient accumulation."
        )
    parts = world_size * accumulate_steps
    if not total or total < 1 or total % parts:
        split = f"the world size ({world_size})"
        if accumulate_steps > 1:
            split = f"world size x SOLVER.ACCUMULATE_STEPS ({world_size} x {accumulate_steps})"
        raise ConfigError(
            f"{key or 'SOLVER.IMS_PER_BATCH'}={total} is not a positive multiple of {split}; "
            f"pick a positive multiple of {parts} or change --num-gpus."
        )
    return total // parts


def deal(batch: list[Any], slot: int, num_slots: int) -> list[Any]:
    """Return slot ``slot`` of a step's ``batch`` dealt to ``num_slots = W x k`` (step 3 above)."""
    return batch[slot::num_slots]


class BatchPlan:
    """What decides a map-style loader's batches; its position is a loader state.

    Iterating yields ``(items, batch_key, state_after)`` per batch: ``items`` are
    ``[dataset index, global position]`` pairs, ``batch_key`` keys ``trainkit.data.batch_rng()``
    (the same for any number of workers and after a resume), and ``state_after`` the plain-data
    position after that batch. A plan loads and maps nothing.
    """

    def __init__(
        self, sampler: Any, batch_size: int, bucket_ids: BucketIds | None, state: dict[str, Any]
    ) -> None:
        self._sampler, self._batch_size = sampler, batch_size
        self._bucket_ids, self._state = bucket_ids, state

    @staticmethod
    def _num_buckets(bucket_ids: BucketIds | None) -> int:
        if isinstance(bucket_ids, LazyBucketIds):
            return bucket_ids.num_buckets  # every bucket the bins make: they are not read yet
        return 1 if bucket_ids is None else int(bucket_ids.max(initial=0)) + 1

    def _read(
        self, read: Callable[[int, int], np.ndarray], start: int, stride: int = 1, offset: int = 0
    ) -> Iterator[tuple[int, int, int]]:
        """``(position, index, bucket)`` of ``read(start, count)``, in growing blocks.

        Record ``n`` read has the position ``n * stride + offset`` (set ``i`` of a mix of ``S``
        interleaves with ``stride=S, offset=i``). Flat triples: this loop is what a step costs.
        """
        block = _FIRST_BLOCK
        while True:
            indices, ids = read(start, block), self._bucket_ids
            if ids is None:
                buckets: Iterable[int] = itertools.repeat(0)
            elif isinstance(ids, LazyBucketIds):
                buckets = ids.buckets_of(indices)  # read as each position is reached
            else:
                buckets = ids[indices].tolist()
            first = start * stride + offset
            positions = range(first, first + block * stride, stride)
            yield from zip(positions, indices.tolist(), buckets)
            start, block = start + block, min(2 * block, _MAX_BLOCK)

    def state_dict(self) -> dict[str, Any]:
        """Return the position after the batches emitted so far, as plain data."""
        return copy_state(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the batches recorded in ``state`` (raises as :func:`load_state`)."""
        self._state = load_state(state, self._state)

    def __iter__(self) -> Iterator[tuple[list[list[int]], int, dict[str, Any]]]:
        raise NotImplementedError

    def batches_per_pass(self) -> int:
        """Batches of one pass; a training sampler has none (``TypeError``: it never ends)."""
        raise TypeError(
            f"an infinite loader ({type(self._sampler).__name__}) has no len(); use a finite "
            "sampler such as InferenceSampler for a loader with a length"
        )

    def at_pass_start(self, state: dict[str, Any]) -> bool:
        """Whether ``state`` starts a pass (always, for an infinite sampler)."""
        return True

    def next_pass_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The state that starts the next pass after ``state`` (an infinite one has none)."""
        return state


class GlobalBatchPlan(BatchPlan):
    """Compose each step's batch from the global stream and yield this rank's micro-batches.

    The rule is the module docstring's. Batches come in order (step 0's ``k`` micro-batches,
    then step 1's, ..., without end); a batch's key is its optimizer step, on every topology.
    """

    def __init__(
        self,
        sampler: GlobalStreamSampler,
        global_batch_size: int,
        *,
        rank: int,
        world_size: int,
        accumulate_steps: int = 1,
        bucket_ids: BucketIds | None = None,
    ) -> None:
        """Plan ``global_batch_size`` records per optimizer step from ``sampler``'s global stream.

        ``bucket_ids``: each dataset index's aspect-ratio bucket (None: no grouping). Raises a
        ``ConfigError`` if the batch does not split evenly (:func:`split_batch`).
        """
        split_batch(global_batch_size, world_size, accumulate_steps)
        state = new_state(
            "global",
            source=sampler.global_stream_key(),
            batch_size=global_batch_size,
            num_buckets=self._num_buckets(bucket_ids),
            split=[world_size, accumulate_steps],
        )
        super().__init__(sampler, global_batch_size, bucket_ids, state)
        self._rank, self._world_size, self._accumulate = rank, world_size, accumulate_steps

    # The state's keys that a composed step moves (``after`` of :meth:`step_batches`).
    _STEP_KEYS: tuple[str, ...] = ("position", "buckets")

    @property
    def world_size(self) -> int:
        """The processes ``W`` each step's batch is dealt to."""
        return self._world_size

    @property
    def accumulate_steps(self) -> int:
        """The micro-batches ``k`` per process and step (``SOLVER.ACCUMULATE_STEPS``)."""
        return self._accumulate

    def step_batches(
        self, state: dict[str, Any] | None = None
    ) -> Iterator[tuple[int, list[list[int]], dict[str, Any]]]:
        """Yield ``(step, batch, after)`` from loader position ``state`` on (default: the plan's).

        ``batch`` is the optimizer step's ``[dataset index, global position]`` pairs in dealing
        order (:func:`deal`), ``after`` the ``position`` and ``buckets`` where the next step
        starts; a state inside a step starts with that whole step. The plan does not move.
        Raises as :meth:`load_state_dict` for a state of another plan.
        """
        state = self.state_dict() if state is None else load_state(state, self._state)
        return self._compose(state)

    def _compose(
        self, state: dict[str, Any]
    ) -> Iterator[tuple[int, list[list[int]], dict[str, Any]]]:
        num_buckets, step = len(state["buckets"]), state["steps"]
        buckets = Buckets.from_lists(self._batch_size, state["buckets"])
        for position, index, bucket in self._read(self._sampler.global_indices, state["position"]):
            batch = buckets.add(bucket, [index, position])
            if batch is not None:
                after = {"position": position + 1, "buckets": buckets.to_lists(num_buckets)}
                yield step, batch, after
                step += 1

    def __iter__(self) -> Iterator[tuple[list[list[int]], int, dict[str, Any]]]:
        state = self.state_dict()
        w, k = self._world_size, self._accumulate
        # Where the current step's batch starts: kept until its last micro-batch is returned.
        start = {key: state[key] for key in self._STEP_KEYS}
        micro = state["micro"]
        for steps, batch, after in self._compose(state):
            for j in range(micro, k):
                last = j + 1 == k
                moved = after if last else start
                self._state = {**state, **moved, "steps": steps + last, "micro": (j + 1) % k}
                # Not copied: a state's lists are new for every step and never changed.
                yield deal(batch, j * w + self._rank, w * k), steps, dict(self._state)
            start, micro = after, 0


class RankBatchPlan(BatchPlan):
    """Cut this rank's draws from its sampler into batches of ``(index, global position)``.

    A batch is the next ``batch_size`` draws, or with ``bucket_ids`` the next full bucket. Positions
    assume a rank-strided sampler (rank ``r`` of ``W`` draws global positions ``r, r + W, ...``), as
    every trainkit training sampler is; another sampler is restarted and fast-forwarded by drawing,
    not jumped. A finite sampler is drawn in passes (:meth:`next_pass_state`) whose positions keep
    growing, so no two samples share one. A batch's key is its smallest position.
    """

    def __init__(
        self,
        sampler: Iterable[int],
        batch_size: int,
        *,
        bucket_ids: BucketIds | None = None,
        drop_last: bool = True,
    ) -> None:
        """Plan batches of ``batch_size`` of ``sampler``'s (this rank's) indices.

        ``bucket_ids`` as for :class:`GlobalBatchPlan`; ``drop_last``: drop incomplete batches.
        """
        trainkit_sampler = isinstance(sampler, GlobalStreamSampler)
        self._rank = sampler.rank if trainkit_sampler else comm.get_rank()
        self._world_size = sampler.world_size if trainkit_sampler else comm.get_world_size()
        state = new_state(
            "rank",
            # The sampler's identity, world size included: its state without the draws.
            source={k: v for k, v in sampler.state_dict().items() if k != "num_drawn"}
            if trainkit_sampler
            else None,
            batch_size=batch_size,
            num_buckets=self._num_buckets(bucket_ids),
            rank=self._rank,
            world_size=self._world_size,
            # Where iter(sampler) would start: 0, or the position its load_state_dict set.
            num_drawn=sampler.start_position if trainkit_sampler else 0,
        )
        super().__init__(sampler, batch_size, bucket_ids, state)
        self._drop_last = drop_last

    def _draws(self, num_drawn: int) -> Iterator[tuple[int, int, int]]:
        """``(draw number, index, bucket)`` of this rank's draws after the first ``num_drawn``."""
        if isinstance(self._sampler, GlobalStreamSampler):  # jump, then read in blocks
            return self._read(self._local_indices, num_drawn)
        ids = self._bucket_ids
        draws = itertools.islice(iter(self._sampler), num_drawn, None)
        return (
            (n, int(i), 0 if ids is None else int(ids[i])) for n, i in enumerate(draws, num_drawn)
        )

    def _local_indices(self, start: int, count: int) -> np.ndarray:
        return self._sampler.indices_at_local(np.arange(start, start + count, dtype=np.int64))

    def __iter__(self) -> Iterator[tuple[list[list[int]], int, dict[str, Any]]]:
        state = self.state_dict()  # work on a copy: yielded states must not change later
        buckets = Buckets.from_lists(self._batch_size, state["buckets"])
        drawn = state["num_drawn"]
        for number, index, bucket in self._draws(drawn):
            position = global_position(state["pass_offset"] + number, self._rank, self._world_size)
            drawn = number + 1
            batch = buckets.add(bucket, [index, position])
            if batch is not None:
                yield self._emit(state, batch, buckets, drawn)
        if not self._drop_last:
            for batch in buckets.rest():
                yield self._emit(state, batch, buckets, drawn)

    def _emit(
        self, state: dict[str, Any], batch: list[list[int]], buckets: Buckets, drawn: int
    ) -> tuple[list[list[int]], int, dict[str, Any]]:
        state["num_batches"] += 1
        state["num_drawn"] = drawn
        state["buckets"] = buckets.to_lists(len(state["buckets"]))
        self._state = dict(state)  # a snapshot: its buckets are new lists, never changed
        return batch, min(position for _, position in batch), self._state

    def at_pass_start(self, state: dict[str, Any]) -> bool:
        """Return whether ``state`` is at the start of a pass (nothing drawn or waiting)."""
        return state["num_drawn"] == 0 and not any(state["buckets"])

    def next_pass_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Return the state that starts a finite sampler's next pass after ``state``.

        Elements still waiting in buckets are dropped, like the tail of a pass with
        ``drop_last``; the batch count and the global positions carry on.
        """
        return {
            **copy_state(state),
            "pass_offset": state["pass_offset"] + state["num_drawn"],
            "num_drawn": 0,
            "buckets": [[] for _ in state["buckets"]],
        }

    def batches_per_pass(self) -> int:
        """Return the batches of one pass over a finite, ungrouped sampler.

        Raises:
            TypeError: For an infinite or unsized sampler, or when grouping (order-dependent).
        """
        if isinstance(self._sampler, GlobalStreamSampler):
            return super().batches_per_pass()
        if self._bucket_ids is not None:
            raise TypeError("len() of an aspect-ratio-grouped loader depends on the order")
        num_indices = len(self._sampler)  # type: ignore[arg-type]  # TypeError if unsized
        full, rest = divmod(num_indices, self._batch_size)
        return full + (1 if rest and not self._drop_last else 0)


def micro_batch_size(
    total_batch_size: int | None,
    single_gpu_batch_size: int | None,
    accumulate_steps: int,
    world_size: int,
) -> int:
    """Records of one micro-batch of a rank, from the total or the per-rank batch size.

    Raises:
        ConfigError: A ``ValueError``: if it does not split evenly (:func:`split_batch`).
        ValueError: If both sizes are given.
    """
    if not single_gpu_batch_size:
        return split_batch(total_batch_size, world_size, accumulate_steps)
    if total_batch_size:
        raise ValueError("give either total_batch_size or single_gpu_batch_size, not both")
    return split_batch(single_gpu_batch_size, 1, accumulate_steps, key="single_gpu_batch_size")
