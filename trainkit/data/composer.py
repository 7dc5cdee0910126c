"""Optimizer-step batches composed from the global sample stream, then dealt to the ranks.

The rule, which every rank computes by itself and which does not depend on the number of
processes ``W`` or on the micro-batches per step ``k`` (``SOLVER.ACCUMULATE_STEPS``):

1. The *global stream* is what a world-size-1 training sampler yields: global positions
   0, 1, 2, ... and the dataset index at each (an O(1) keyed permutation per epoch).
2. Optimizer step ``s`` owns the next ``B = SOLVER.IMS_PER_BATCH`` records of it. Without
   aspect-ratio grouping those are positions ``[s*B, (s+1)*B)``. With grouping each record
   goes, in stream order, to the bucket of its aspect ratio, and the first bucket to reach
   ``B`` records is step ``s``'s batch; records left in the other buckets wait for a later
   step.
3. Step ``s``'s batch is dealt to ``W x k`` slots: micro-batch ``j`` of rank ``r`` is slot
   ``q = j*W + r`` and takes elements ``q, q + W*k, q + 2*W*k, ...`` of the batch. With
   ``k = 1`` and no grouping this is exactly the rank-strided split of detectron2's samplers
   (rank ``r`` gets positions ``r, r + W, ...``).

So the records of a step, and the order of steps, are the same for every ``W`` and ``k``; the
loader's position after a step is one global position plus what waits in the buckets, valid
for any topology. Each rank computes the whole global stream (indices, and bucket ids when
grouping): ``W`` times the per-rank work, a few microseconds per record.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from trainkit.config import ConfigError
from trainkit.data.samplers._base import StreamSampler

__all__ = ["GLOBAL_STATE_VERSION", "StepBatchComposer"]

GLOBAL_STATE_VERSION = 2
# The global stream is read in blocks that grow from the first (a resumed loader starts
# fast) to the largest: each read is a few dozen numpy calls whatever its length, which
# per batch cost ~15-25 us per record; a block of thousands costs ~0.3 us per record.
_FIRST_DRAW_BLOCK = 256
_MAX_DRAW_BLOCK = 4096


class _StreamWindow:
    """The global stream's indices (and bucket ids) at positions ``[start, start + len)``.

    A cache of what ``sampler.global_indices`` returned last, as Python lists: the stream
    is a pure function of the position, so serving a batch from it changes nothing.
    """

    def __init__(self) -> None:
        self.start = 0
        self.indices: list[int] = []
        self.bucket_ids: list[int] = []
        self._block = _FIRST_DRAW_BLOCK

    def covers(self, position: int, count: int) -> bool:
        """Whether positions ``position .. position + count - 1`` are held."""
        return self.start <= position and position + count <= self.start + len(self.indices)

    def next_block(self, at_least: int) -> int:
        """How many positions to read next (growing up to the largest block)."""
        block = self._block
        self._block = min(2 * block, _MAX_DRAW_BLOCK)
        return max(block, at_least)

    def hold(self, start: int, indices: np.ndarray, bucket_ids: np.ndarray | None) -> None:
        """Hold ``indices`` (and their bucket ids) read from global position ``start``."""
        self.start = start
        self.indices = indices.tolist()
        self.bucket_ids = [] if bucket_ids is None else bucket_ids.tolist()


class StepBatchComposer:
    """Compose each step's batch from the global stream and yield this rank's micro-batches.

    Iterating yields ``(items, batch_key, state_after)`` for each of this rank's micro-batches
    in order (step 0's ``k`` micro-batches, then step 1's, ...): ``items`` is a list of
    ``[dataset index, global position]``, ``batch_key`` the optimizer step (what
    ``trainkit.data.batch_rng()`` is keyed by, the same on every rank and topology), and
    ``state_after`` the plain-data position after that micro-batch.

    It does not load or map anything, and it is infinite (training samplers are).
    """

    def __init__(
        self,
        sampler: StreamSampler,
        global_batch_size: int,
        *,
        rank: int,
        world_size: int,
        accumulate_steps: int = 1,
        bucket_ids: np.ndarray | None = None,
    ) -> None:
        """Create the composer.

        Args:
            sampler: a trainkit training sampler; only its global stream is read.
            global_batch_size: records per optimizer step over all ranks (``IMS_PER_BATCH``).
            rank: this rank.
            world_size: number of ranks.
            accumulate_steps: micro-batches per optimizer step on each rank.
            bucket_ids: aspect-ratio bucket of each dataset index (grouping), or None.

        Raises:
            ConfigError: If the global batch does not split into ``world_size x
                accumulate_steps`` equal micro-batches.
        """
        slots = world_size * accumulate_steps
        if global_batch_size < 1 or global_batch_size % slots:
            raise ConfigError(
                f"SOLVER.IMS_PER_BATCH={global_batch_size} is not a positive multiple of world "
                f"size x SOLVER.ACCUMULATE_STEPS ({world_size} x {accumulate_steps}); pick a "
                f"multiple of {slots}."
            )
        self._sampler = sampler
        self._batch_size = global_batch_size
        self._rank = rank
        self._world_size = world_size
        self._accumulate = accumulate_steps
        self._bucket_ids = bucket_ids
        self._num_buckets = 1 if bucket_ids is None else int(bucket_ids.max(initial=0)) + 1
        self._window = _StreamWindow()
        self._state: dict[str, Any] = {
            "version": GLOBAL_STATE_VERSION,
            "kind": "global",
            "stream": sampler.global_stream_key(),
            "global_batch_size": global_batch_size,
            "num_buckets": self._num_buckets,
            # Where the current step's batch starts: the next global position and the
            # records waiting in each bucket ([index, position] pairs).
            "position": 0,
            "buckets": [[] for _ in range(self._num_buckets)],
            "steps": 0,  # optimizer steps whose micro-batches this rank has all returned
            "micro": 0,  # micro-batches of step `steps` this rank has returned
            "split": [world_size, accumulate_steps],
        }

    @property
    def micro_batch_size(self) -> int:
        """Records in each micro-batch of this rank."""
        return self._batch_size // (self._world_size * self._accumulate)

    # ---- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Return the position after the micro-batches emitted so far, as plain data."""
        return _copy_state(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the micro-batches recorded in ``state``, for any topology.

        A state taken at a step boundary (every state a trainer checkpoints) loads on any
        world size and accumulation; one taken in the middle of a step only on the same.

        Raises:
            ConfigError: If the state belongs to another stream (seed, sampler, dataset size),
                global batch or set of aspect-ratio buckets, or is mid-step and the split
                changed.
        """
        if state.get("kind") != "global":
            raise ConfigError(
                "this data loader state was saved by a loader that composed batches per rank "
                "(a sampler that is not a trainkit training sampler); resume with the same "
                "sampler, or start in a new OUTPUT_DIR."
            )
        expected = {
            "version": GLOBAL_STATE_VERSION,
            "stream": self._sampler.global_stream_key(),
            "global_batch_size": self._batch_size,
            "num_buckets": self._num_buckets,
        }
        found = {key: state.get(key) for key in expected}
        if found != expected:
            raise ConfigError(
                f"data loader state does not match this loader: saved {found}, this loader is "
                f"{expected}. Resume with the SEED, SOLVER.IMS_PER_BATCH, DATALOADER.* "
                "settings and datasets of the saved run, or start in a new OUTPUT_DIR."
            )
        split = [self._world_size, self._accumulate]
        if state["micro"] and list(state["split"]) != split:
            raise ConfigError(
                f"the data loader state was saved in the middle of an optimizer step by a job "
                f"of {state['split'][0]} processes x {state['split'][1]} micro-batches; resume "
                f"it with that split (this job: {split[0]} x {split[1]})."
            )
        self._state = {**_copy_state(state), "split": split}

    def batches_per_pass(self) -> int:
        """A training sampler's stream has no end.

        Raises:
            TypeError: Always.
        """
        raise TypeError(
            f"an infinite loader ({type(self._sampler).__name__}) has no len(); use a finite "
            "sampler such as InferenceSampler for a loader with a length"
        )

    def at_pass_start(self, state: dict[str, Any]) -> bool:
        """Always True: the global stream is infinite, there is no next pass."""
        del state
        return True

    def next_pass_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Never needed (the stream is infinite); returns ``state``."""
        return state

    # ---- composition ----------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[list[list[int]], int, dict[str, Any]]]:
        state = _copy_state(self._state)
        position, buckets = state["position"], state["buckets"]
        steps, micro = state["steps"], state["micro"]
        slots = self._world_size * self._accumulate
        while True:
            batch, next_position, next_buckets = self._compose(position, buckets)
            for j in range(micro, self._accumulate):
                mine = batch[j * self._world_size + self._rank :: slots]
                if j + 1 == self._accumulate:
                    moved = {"position": next_position, "buckets": next_buckets}
                    after = {**state, **moved, "steps": steps + 1, "micro": 0}
                else:
                    kept = {"position": position, "buckets": buckets}
                    after = {**state, **kept, "steps": steps, "micro": j + 1}
                self._state = after
                yield mine, steps, _copy_state(after)
            position, buckets, steps, micro = next_position, next_buckets, steps + 1, 0

    def _compose(
        self, position: int, buckets: list[list[list[int]]]
    ) -> tuple[list[list[int]], int, list[list[list[int]]]]:
        """Return the batch that starts at ``position`` with ``buckets`` waiting, and after it."""
        size, window = self._batch_size, self._window
        if self._bucket_ids is None:
            if not window.covers(position, size):
                drawn = self._sampler.global_indices(position, window.next_block(size))
                window.hold(position, drawn, None)
            offset = position - window.start
            indices = window.indices[offset : offset + size]
            batch = [[index, position + i] for i, index in enumerate(indices)]
            return batch, position + size, [[]]
        buckets = [[list(item) for item in bucket] for bucket in buckets]
        while True:
            if not window.covers(position, 1):
                drawn = self._sampler.global_indices(position, window.next_block(1))
                window.hold(position, drawn, self._bucket_ids[drawn])
            indices, bucket_ids = window.indices, window.bucket_ids
            for offset in range(position - window.start, len(indices)):
                bucket = buckets[bucket_ids[offset]]
                bucket.append([indices[offset], position])
                position += 1
                if len(bucket) == size:
                    buckets[bucket_ids[offset]] = []
                    return bucket, position, buckets


def _copy_state(state: dict[str, Any]) -> dict[str, Any]:
    return {
        **state,
        "stream": dict(state["stream"]),
        "buckets": [[list(item) for item in bucket] for bucket in state["buckets"]],
        "split": list(state["split"]),
    }
