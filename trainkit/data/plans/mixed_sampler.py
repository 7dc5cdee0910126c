"""Weighted mixing of several training sets: each set's own stream and each step's share.

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
a large one need not be seen whole.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from trainkit.config import ConfigError
from trainkit.data.plans.global_stream import PURPOSE_MIX, TrainingSampler, check_rank, round_keys
from trainkit.utils import comm

__all__ = ["MixedTrainingSampler", "mix_counts", "mix_weights"]


def mix_weights(weights: Sequence[float], names: Sequence[str]) -> list[int]:
    """Return ``DATASETS.TRAIN_WEIGHTS`` as the smallest exact integer weights.

    Each float counts as the decimal it prints as (``repr``): ``0.1`` is ``1/10``.

    Args:
        weights: one positive weight per dataset.
        names: the datasets (``DATASETS.TRAIN``), named in messages.

    Raises:
        ConfigError: A ``ValueError``: for a wrong number of weights or a weight that is not
            a positive finite number.
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
    """Return how many records of each set step ``step`` holds (the module docstring's rule).

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
    concatenated records (``DATASETS.TRAIN`` in order), its stream a
    :class:`~trainkit.data.samplers.TrainingSampler` of ``sizes[i]`` records.
    :class:`~trainkit.data.plans.mixed_plan.MixedBatchPlan` takes :meth:`counts` records of
    each set per optimizer step; it never ends and holds no per-record state.
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
            seed: shared by all ranks; ``None`` draws one with ``comm.shared_random_seed()``
                (a collective).
            names: the sets' names (default ``set0``, ``set1``, ...): metric names and
                messages.
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
