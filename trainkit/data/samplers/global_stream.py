"""The base of every training sampler: the global stream, read rank-strided and resumably."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from trainkit.config import ConfigError
from trainkit.data.samplers.positions import check_rank, global_positions, worker_local_positions
from trainkit.utils import comm

__all__ = ["GlobalStreamSampler"]

_FIRST_BLOCK = 256  # small first block: a resumed or re-created iterator starts fast
_MAX_BLOCK = 1 << 16  # large steady-state blocks amortise numpy's per-call overhead


class GlobalStreamSampler(Sampler[int]):
    """Base of the training samplers: an infinite sequence of dataset indices.

    A subclass defines the *global* stream (what a world-size-1 sampler yields) in
    :meth:`_indices_at`; this class takes rank ``r`` of ``W`` through global positions
    ``r, r + W, r + 2W, ...`` in vectorised blocks and counts the draws: the whole resumable
    state, with no per-index state (subclasses that need O(N) memory say so). As in
    detectron2 every ``iter()`` starts afresh, here from the position given to
    :meth:`load_state_dict` (0 if none); :meth:`state_dict` describes the iterator advanced
    most recently, so save states with one iterator at a time.
    """

    def __init__(
        self, seed: int | None, *, rank: int | None = None, world_size: int | None = None
    ) -> None:
        # Collective (only when seed is None): shared_random_seed() all-gathers rank 0's draw.
        self._seed = int(comm.shared_random_seed() if seed is None else seed)
        if self._seed < 0:
            raise ValueError(f"sampler seed must be >= 0, got {self._seed}")
        self._world_size = comm.get_world_size() if world_size is None else int(world_size)
        self._rank = comm.get_rank() if rank is None else int(rank)
        check_rank(self._rank, self._world_size)
        self._start = 0  # where a new iterator begins: 0, or what load_state_dict set
        self._num_drawn = 0

    @property
    def seed(self) -> int:
        """The seed shared by all ranks."""
        return self._seed

    @property
    def rank(self) -> int:
        """The rank whose share of the global stream this sampler yields."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The number of ranks the global stream is split over."""
        return self._world_size

    @property
    def num_drawn(self) -> int:
        """Local stream position after the last index yielded by the latest iterator."""
        return self._num_drawn

    @property
    def start_position(self) -> int:
        """Local stream position a new iterator starts from (0, or the loaded one)."""
        return self._start

    def _indices_at(self, positions: np.ndarray) -> np.ndarray:
        """Return the dataset indices at sorted, non-negative global ``positions``."""
        raise NotImplementedError

    def _identity(self) -> dict[str, Any]:
        """Plain-data identity of the stream, checked when a state is loaded."""
        return {"type": type(self).__name__, "seed": self._seed, "world_size": self._world_size}

    def global_indices(self, start: int, count: int) -> np.ndarray:
        """Return the int64 indices at global positions ``start .. start + count - 1`` (O(1) jump).

        Whatever this sampler's rank and world size: every rank can compute the whole stream.
        """
        return self._indices_at(np.arange(start, start + count, dtype=np.int64))

    def global_stream_key(self) -> dict[str, Any]:
        """Plain-data identity of the global stream (independent of rank and world size)."""
        key = self._identity()
        key.pop("world_size", None)
        return key

    def indices_at_local(self, local_positions: np.ndarray) -> np.ndarray:
        """Return the int64 indices this rank yields at sorted local positions (O(1) jump)."""
        return self._indices_at(global_positions(local_positions, self._rank, self._world_size))

    def __iter__(self) -> Iterator[int]:
        position = self._start
        self._num_drawn = position
        block = _FIRST_BLOCK
        while True:
            local = np.arange(position, position + block, dtype=np.int64)
            for index in self.indices_at_local(local).tolist():
                # Count before yielding: a state taken while the consumer holds this index
                # must say it was drawn.
                position += 1
                self._num_drawn = position
                yield index
            block = min(2 * block, _MAX_BLOCK)

    def iter_worker_share(
        self, worker_id: int, num_workers: int, chunk_size: int = 1
    ) -> Iterator[int]:
        """Yield only a loader worker's chunks of this rank's draws, from :attr:`start_position`.

        Chunks of ``chunk_size`` local positions are dealt round-robin to the workers
        (:func:`~trainkit.data.samplers.positions.worker_local_positions`); each worker computes
        its own share instead of drawing and discarding the others'.
        """
        rounds = max(1, _MAX_BLOCK // (chunk_size * num_workers))
        first_round = 0
        while True:
            local = worker_local_positions(first_round, rounds, worker_id, num_workers, chunk_size)
            yield from self.indices_at_local(local + self._start).tolist()
            first_round += rounds

    def state_dict(self) -> dict[str, Any]:
        """Return ``{"num_drawn": k, "type": ..., "seed": ..., "world_size": ...}``.

        Plain data: it loads with ``torch.load(weights_only=True)``.
        """
        return {"num_drawn": self._num_drawn, **self._identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make new iterators continue after the ``state["num_drawn"]`` indices already drawn.

        Raises:
            ConfigError: A ``ValueError``: if the state belongs to another stream (sampler
                type, seed, world size or dataset size).
        """
        expected = self._identity()
        found = {key: state.get(key) for key in expected}
        if found != expected:
            raise ConfigError(
                f"sampler state does not match this sampler: saved {found}, this one is "
                f"{expected}; build the sampler with the same arguments as the saved run (from "
                "a config: resume with its SEED, DATALOADER.SAMPLER_TRAIN and datasets, or "
                "start in a new OUTPUT_DIR)."
            )
        self._start = self._num_drawn = int(state["num_drawn"])
