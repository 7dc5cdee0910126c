"""Training samplers (infinite, shared-seed, rank-strided, resumable) and InferenceSampler.

``TrainingSampler`` is defined with the global stream it reads
(:mod:`trainkit.data.plans.global_stream`) and exported here, detectron2's path.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from trainkit.config import ConfigError
from trainkit.data.plans.global_stream import (
    PURPOSE_REPEAT,
    PURPOSE_SHUFFLE,
    PURPOSE_SUBSET,
    GlobalStreamSampler,
    TrainingSampler,
    checked_size,
    permute,
    round_keys,
    shard_range,
)
from trainkit.utils import comm

logger = logging.getLogger(__name__)

__all__ = [
    "InferenceSampler",
    "RandomSubsetTrainingSampler",
    "RepeatFactorTrainingSampler",
    "TrainingSampler",
    "check_subset_ratio",
]


def check_subset_ratio(subset_ratio: float) -> None:
    """Raise a ``ConfigError`` unless ``DATALOADER.RANDOM_SUBSET_RATIO`` is in ``(0, 1]``."""
    if not 0.0 < subset_ratio <= 1.0:
        raise ConfigError(
            f"DATALOADER.RANDOM_SUBSET_RATIO / subset_ratio must be in (0, 1], got "
            f"{subset_ratio}; use 1.0 to train on every record."
        )


class RandomSubsetTrainingSampler(TrainingSampler):
    """Like :class:`TrainingSampler`, over a fixed random subset of the dataset.

    The subset (``int(size * subset_ratio)`` indices, chosen by ``seed_subset``) is itself
    the first part of a keyed permutation, so nothing is materialised either. As in
    detectron2 it is a :class:`TrainingSampler` (``isinstance`` holds).
    """

    def __init__(
        self,
        size: int,
        subset_ratio: float,
        shuffle: bool = True,
        seed_shuffle: int | None = None,
        seed_subset: int | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        """Create the sampler.

        Args:
            size, shuffle, rank, world_size: as in :class:`TrainingSampler`.
            subset_ratio: fraction of the dataset to train on, in ``(0, 1]``.
            seed_shuffle, seed_subset: seeds of the per-epoch shuffles and of the subset
                choice (``None``: a shared random seed).

        Raises:
            ConfigError: A ``ValueError``: if ``subset_ratio`` is outside ``(0, 1]`` or
                selects no index (``size`` is checked as by :class:`TrainingSampler`).
        """
        size = checked_size(type(self).__name__, size)
        check_subset_ratio(subset_ratio)
        subset_size = int(size * subset_ratio)
        if subset_size < 1:
            raise ConfigError(
                f"DATALOADER.RANDOM_SUBSET_RATIO / subset_ratio={subset_ratio} of a dataset of "
                f"{size} records selects no record; use a larger ratio."
            )
        # The shuffle seed is drawn before the subset seed, in detectron2's order.
        super().__init__(size, shuffle, seed_shuffle, rank=rank, world_size=world_size)
        self._seed_subset = int(comm.shared_random_seed() if seed_subset is None else seed_subset)
        self._epoch_size = subset_size  # epochs shuffle the subset, then map it into the dataset
        logger.info("Training on a random subset of %d of %d records", subset_size, size)

    def _identity(self) -> dict[str, Any]:
        subset = {"subset_size": self._epoch_size, "seed_subset": self._seed_subset}
        return {**super()._identity(), **subset}

    def _indices_at(self, positions: np.ndarray) -> np.ndarray:
        subset_keys = round_keys(self._seed_subset, PURPOSE_SUBSET, np.zeros(1, dtype=np.int64))
        return permute(super()._indices_at(positions), self._size, subset_keys)


class RepeatFactorTrainingSampler(GlobalStreamSampler):
    """Yield each index ``repeat_factors[i]`` times per epoch on average (LVIS-style).

    Epoch ``e`` repeats index ``i`` ``floor(r_i)`` times plus once more with probability
    ``frac(r_i)`` (stochastic rounding keyed by ``(seed, e)``), then shuffles that list with
    a keyed bijection. Epochs have different lengths, so jumping to a position walks the
    epoch lengths from the start (O(N) per epoch passed, once per resume); memory is O(N).
    """

    def __init__(
        self,
        repeat_factors: torch.Tensor | np.ndarray | Sequence[float],
        shuffle: bool = True,
        seed: int | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        """Create the sampler.

        Args:
            repeat_factors: per-record repeat factor (>= 0, not all 0), e.g. from
                :meth:`repeat_factors_from_category_frequency`.
            shuffle, seed, rank, world_size: as in :class:`TrainingSampler`.

        Raises:
            ValueError: If a factor is negative or every record would be repeated 0 times.
        """
        if isinstance(repeat_factors, torch.Tensor):
            repeat_factors = repeat_factors.cpu().numpy()
        factors = np.asarray(repeat_factors, dtype=np.float64)
        if factors.ndim != 1 or factors.size == 0 or (factors < 0).any() or factors.sum() <= 0:
            raise ValueError(
                "repeat_factors must be a non-empty 1-d list of factors >= 0, not all 0"
            )
        super().__init__(seed, rank=rank, world_size=world_size)
        self._int_part = np.floor(factors).astype(np.int64)
        self._frac_part = factors - self._int_part
        self._shuffle = shuffle
        self._epoch_starts: list[int] = [0]  # O(epochs) ints, grown as the positions advance
        self._cached_epoch: tuple[int, np.ndarray] | None = None

    @staticmethod
    def repeat_factors_from_category_frequency(
        dataset_dicts: Sequence[dict[str, Any]], repeat_thresh: float, sqrt: bool = True
    ) -> torch.Tensor:
        """Compute per-record repeat factors from category frequencies (LVIS rule).

        ``f(c)`` is the fraction of records with an annotation of category ``c``, ``r(c) =
        max(1, sqrt(repeat_thresh / f(c)))``, a record's factor the max of its categories' (or 1).

        Args:
            dataset_dicts: records with ``"annotations"``, each holding ``"category_id"``.
            repeat_thresh: frequency below which categories are over-sampled.
            sqrt: take the square root of ``repeat_thresh / f(c)`` (LVIS); ``False`` uses
                the ratio itself, which over-samples rare categories more.

        Returns:
            float32 tensor of one factor per record.
        """
        annotations = [record.get("annotations", []) for record in dataset_dicts]
        freq = Counter(c for anns in annotations for c in {a["category_id"] for a in anns})
        num_records = max(1, len(dataset_dicts))
        ratios = {cat: repeat_thresh / (count / num_records) for cat, count in freq.items()}
        rep = {cat: max(1.0, math.sqrt(ratio) if sqrt else ratio) for cat, ratio in ratios.items()}
        factors = [max((rep[a["category_id"]] for a in anns), default=1.0) for anns in annotations]
        return torch.tensor(factors, dtype=torch.float32)

    def _identity(self) -> dict[str, Any]:
        return {**super()._identity(), "size": int(self._int_part.size), "shuffle": self._shuffle}

    def _epoch_list(self, epoch: int) -> np.ndarray:
        if self._cached_epoch is None or self._cached_epoch[0] != epoch:
            seq = np.random.SeedSequence([self._seed, PURPOSE_REPEAT, epoch])
            draws = np.random.Generator(np.random.PCG64(seq)).random(self._frac_part.size)
            reps = self._int_part + (draws < self._frac_part)
            self._cached_epoch = (epoch, np.repeat(np.arange(reps.size, dtype=np.int64), reps))
        return self._cached_epoch[1]

    def _epoch_start(self, epoch: int) -> int:
        # _epoch_starts[e] is the global position where epoch e starts (cumulative lengths).
        while len(self._epoch_starts) <= epoch:
            e = len(self._epoch_starts) - 1
            self._epoch_starts.append(self._epoch_starts[-1] + int(self._epoch_list(e).size))
        return self._epoch_starts[epoch]

    def _epoch_of(self, position: int) -> int:
        while self._epoch_starts[-1] <= position:
            self._epoch_start(len(self._epoch_starts))
        return bisect.bisect_right(self._epoch_starts, position) - 1

    def _indices_at(self, positions: np.ndarray) -> np.ndarray:
        out = np.empty_like(positions)
        epoch, done = self._epoch_of(int(positions[0])), 0
        while done < positions.size:
            start, end_position = self._epoch_start(epoch), self._epoch_start(epoch + 1)
            end = int(np.searchsorted(positions, end_position, side="left"))
            if end > done:
                offsets = positions[done:end] - start
                if self._shuffle:
                    keys = round_keys(self._seed, PURPOSE_SHUFFLE, np.array([epoch]))
                    offsets = permute(offsets, end_position - start, keys)
                out[done:end] = self._epoch_list(epoch)[offsets]
                done = end
            epoch += 1
        return out


class InferenceSampler(Sampler[int]):
    """Yield this rank's contiguous shard of ``range(size)``, once, in order.

    Shards differ in size by at most one and together hold every index exactly once (no
    padding, unlike ``torch.utils.data.DistributedSampler``), which is what evaluation needs.
    """

    def __init__(
        self, size: int, *, rank: int | None = None, world_size: int | None = None
    ) -> None:
        """Shard ``range(size)`` (``size >= 0``); ``rank``/``world_size`` default to ``comm``'s."""
        if size < 0:
            raise ValueError(f"InferenceSampler needs a dataset size >= 0, got {size}")
        self._size = size
        world_size = comm.get_world_size() if world_size is None else world_size
        rank = comm.get_rank() if rank is None else rank
        self._local_indices = self._get_local_indices(size, world_size, rank)

    @staticmethod
    def _get_local_indices(total_size: int, world_size: int, rank: int) -> range:
        """Return rank ``rank``'s shard (:func:`shard_range`; detectron2's helper name)."""
        return shard_range(total_size, rank, world_size)

    def __iter__(self) -> Iterator[int]:
        yield from self._local_indices

    def __len__(self) -> int:
        return len(self._local_indices)
