"""The global stream: its position arithmetic, its keyed permutation and its samplers.

Every trainkit training sampler reads the *global stream*, what a world-size-1 sampler yields. A
*global position* indexes it; a *local position* ``k`` is a rank's ``k``-th draw: rank ``r`` of
``W`` draws global positions ``r, r + W, r + 2W, ...`` (:class:`GlobalStreamSampler`, in vectorised
blocks). :class:`TrainingSampler` (detectron2's name, exported from :mod:`trainkit.data.samplers`)
makes each epoch another permutation of the dataset. One module, because a batch plan calls all of
it for every block of indices. The position arithmetic is pure (``rank``, ``world_size`` and worker
ids are arguments), so it is tested for many world sizes without starting a process.

The permutation of ``range(n)`` is computed, never stored: :func:`permute` maps each offset through
a Feistel network over the smallest power of two >= n (a bijection whatever its round function),
re-applying it to values outside ``range(n)`` ("cycle walking", fewer than two passes on average:
the domain is < 2n). So every epoch is an exact permutation, memory stays O(block) and any position
is reached in O(1). The round function is the splitmix64 finaliser, on numpy uint64 arrays (which
wrap on overflow without warnings, unlike numpy scalars: everything here stays an array).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from trainkit.config import ConfigError
from trainkit.utils import comm

__all__ = [
    "NUM_ROUNDS",
    "PURPOSE_MIX",
    "PURPOSE_RANK_SHARES",
    "PURPOSE_REPEAT",
    "PURPOSE_SHUFFLE",
    "PURPOSE_SUBSET",
    "GlobalStreamSampler",
    "TrainingSampler",
    "check_rank",
    "checked_size",
    "global_position",
    "global_positions",
    "permute",
    "round_keys",
    "shard_range",
    "split_positions",
    "worker_local_positions",
]


def check_rank(rank: int, world_size: int) -> None:
    """Raise if ``rank`` is not a valid rank of a world of ``world_size`` processes.

    Raises:
        ValueError: If ``world_size < 1`` or ``rank`` is outside ``[0, world_size)``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")


def global_position(local_position: int, rank: int, world_size: int) -> int:
    """Return the global stream position of rank ``rank``'s ``local_position``-th draw."""
    return local_position * world_size + rank


def global_positions(local_positions: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Vectorised :func:`global_position` (int64 in, int64 out)."""
    return np.asarray(local_positions, dtype=np.int64) * world_size + rank


def split_positions(positions: np.ndarray, epoch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return int64 ``(epochs, offsets)`` with ``positions == epochs * epoch_size + offsets``."""
    return np.divmod(np.asarray(positions, dtype=np.int64), epoch_size)


def shard_range(total: int, rank: int, world_size: int) -> range:
    """Return rank ``rank``'s contiguous share of ``range(total)``.

    The first ``total % world_size`` ranks get one extra element, so shard sizes differ by at
    most one, every index is in exactly one shard, and nothing is padded.
    """
    check_rank(rank, world_size)
    base, extra = divmod(total, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def worker_local_positions(
    first_round: int, num_rounds: int, worker_id: int, num_workers: int, chunk_size: int = 1
) -> np.ndarray:
    """Return the local positions a loader worker owns in rounds ``first_round ...``.

    This rank's local positions are cut into chunks of ``chunk_size`` (>= 1) and chunk ``j`` belongs
    to worker ``j % num_workers``, so the workers together own every local position once; a *round*
    is one chunk for every worker. Returns ``num_rounds * chunk_size`` sorted int64 local positions.
    """
    check_rank(worker_id, num_workers)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    rounds = np.arange(first_round, first_round + num_rounds, dtype=np.int64)
    chunk_starts = (rounds * num_workers + worker_id) * chunk_size
    return (chunk_starts[:, None] + np.arange(chunk_size, dtype=np.int64)[None, :]).ravel()


# ---- the keyed permutation -----------------------------------------------------------------

NUM_ROUNDS = 6  # Luby-Rackoff needs >= 4 for a strong PRP; 2 more for the tiny unbalanced halves

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

# Purpose tags keep the keys of different uses of one seed independent.
PURPOSE_SHUFFLE = 1
PURPOSE_SUBSET = 2
PURPOSE_REPEAT = 3
PURPOSE_RANK_SHARES = 4
PURPOSE_MIX = 5  # the seed of each mixed training set's stream


def _mix64(values: np.ndarray) -> np.ndarray:
    z = values + _GOLDEN
    z = (z ^ (z >> _S30)) * _MUL1
    z = (z ^ (z >> _S27)) * _MUL2
    return z ^ (z >> _S31)


def round_keys(seed: int, purpose: int, epochs: np.ndarray) -> np.ndarray:
    """Return the Feistel round keys for each epoch, shape ``(NUM_ROUNDS, len(epochs))``.

    ``seed`` is any Python int (reduced to 64 bits), ``purpose`` a ``PURPOSE_*`` tag (so that,
    e.g., subset and shuffle keys differ), ``epochs`` int64 epoch numbers.
    """
    base = _mix64(np.array([(seed & _MASK64) ^ ((purpose << 56) & _MASK64)], dtype=np.uint64))
    k = _mix64(np.asarray(epochs, dtype=np.int64).astype(np.uint64) ^ base)
    keys = np.empty((NUM_ROUNDS, k.shape[0]), dtype=np.uint64)
    for i in range(NUM_ROUNDS):
        k = _mix64(k)
        keys[i] = k
    return keys


def _feistel(x: np.ndarray, left_bits: int, right_bits: int, keys: np.ndarray) -> np.ndarray:
    # Unbalanced Feistel: (L, R) -> (R, L ^ F(R)); the half widths swap every round, which
    # lets the domain be any power of two, not only even ones.
    for r in range(NUM_ROUNDS):
        left = x >> np.uint64(right_bits)
        right = x & np.uint64((1 << right_bits) - 1)
        mixed = _mix64(right ^ keys[r]) & np.uint64((1 << left_bits) - 1)
        x = (right << np.uint64(left_bits)) | (left ^ mixed)
        left_bits, right_bits = right_bits, left_bits
    return x


def permute(offsets: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """Map int64 ``offsets`` (in ``range(n)``) through the permutation ``keys`` selects.

    ``keys`` is :func:`round_keys`' output with one column (shared) or one per offset. For a
    fixed key, ``permute(arange(n))`` is a permutation of ``range(n)``.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    if n <= 1:
        return np.zeros_like(offsets)
    bits = max(2, (n - 1).bit_length())
    left_bits, right_bits = bits // 2, bits - bits // 2
    per_element = keys.shape[1] > 1
    y = _feistel(offsets.astype(np.uint64), left_bits, right_bits, keys)
    pending = np.flatnonzero(y >= np.uint64(n))
    while pending.size:
        sub_keys = keys[:, pending] if per_element else keys
        y[pending] = _feistel(y[pending], left_bits, right_bits, sub_keys)
        pending = pending[y[pending] >= np.uint64(n)]
    return y.astype(np.int64)


# ---- the samplers -------------------------------------------------------------------------

_FIRST_BLOCK = 256  # small first block: a resumed or re-created iterator starts fast
_MAX_BLOCK = 1 << 16  # large steady-state blocks amortise numpy's per-call overhead


class GlobalStreamSampler(Sampler[int]):
    """Base of the training samplers: an infinite sequence of dataset indices.

    A subclass defines the global stream in :meth:`_indices_at`; this class draws this rank's
    positions of it in vectorised blocks and counts the draws: the whole resumable state
    (subclasses that need O(N) memory say so). As in detectron2 every ``iter()`` starts afresh,
    here from the position :meth:`load_state_dict` gave (0 if none); :meth:`state_dict`
    describes the iterator advanced most recently: save states with one iterator at a time.
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
        """Return the int64 indices at global positions ``start`` .. ``start + count - 1``."""
        return self._indices_at(np.arange(start, start + count, dtype=np.int64))

    def global_stream_key(self) -> dict[str, Any]:
        """Plain-data identity of the global stream (independent of rank and world size)."""
        return {key: value for key, value in self._identity().items() if key != "world_size"}

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
        (:func:`worker_local_positions`): each computes its share, discarding none.
        """
        rounds = max(1, _MAX_BLOCK // (chunk_size * num_workers))
        first_round = 0
        while True:
            local = worker_local_positions(first_round, rounds, worker_id, num_workers, chunk_size)
            yield from self.indices_at_local(local + self._start).tolist()
            first_round += rounds

    def state_dict(self) -> dict[str, Any]:
        """Return ``{"num_drawn": k, "type": ..., "seed": ..., ...}`` (``weights_only`` data)."""
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


def checked_size(sampler_name: str, size: Any) -> int:
    try:
        size = operator.index(size)  # any integer, numpy's included; not 3.0
    except TypeError:
        raise TypeError(
            f"{sampler_name}(size=...) expects an int (the dataset size), got "
            f"{type(size).__name__} {size!r}"
        ) from None
    if size <= 0:
        raise ValueError(f"{sampler_name} needs a dataset size > 0, got {size}")
    return size


class TrainingSampler(GlobalStreamSampler):
    """Yield an infinite sequence of indices of a dataset of ``size`` records.

    Each epoch (``size`` consecutive global positions) is another permutation of ``range(size)``,
    computed by a keyed bijection instead of stored: O(1) memory in ``size`` (4e8 works) and O(1)
    jumps to any position, so resume and worker sharding cost nothing. The order differs from
    detectron2's ``torch.randperm``. Rank ``r`` of ``W`` yields global positions ``r, r + W, ...``,
    without padding or end: for one exact pass over a dataset use :class:`InferenceSampler`.
    """

    def __init__(
        self,
        size: int,
        shuffle: bool = True,
        seed: int | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        """Create the sampler.

        Args:
            size: dataset size (> 0).
            shuffle: permute every epoch; ``False`` yields ``0, 1, ..., size - 1`` repeatedly.
            seed: shared by all ranks; ``None`` draws one with ``comm.shared_random_seed()``
                (a collective: every rank must construct the sampler together).
            rank, world_size: this rank and the rank count (default: ``comm``'s), to test or shard.

        Raises:
            TypeError: If ``size`` is not an integer.
            ValueError: If ``size`` is not positive.
        """
        size = checked_size(type(self).__name__, size)
        super().__init__(seed, rank=rank, world_size=world_size)
        self._size = self._epoch_size = size
        self._shuffle = shuffle

    def _identity(self) -> dict[str, Any]:
        return {**super()._identity(), "size": self._size, "shuffle": self._shuffle}

    def _indices_at(self, positions: np.ndarray) -> np.ndarray:
        epochs, offsets = split_positions(positions, self._epoch_size)
        if not self._shuffle:
            return offsets
        # Positions come sorted, so a block usually lies in one epoch: one key column then.
        one_epoch = epochs[0] == epochs[-1]
        keys = round_keys(self._seed, PURPOSE_SHUFFLE, epochs[:1] if one_epoch else epochs)
        return permute(offsets, self._epoch_size, keys)
