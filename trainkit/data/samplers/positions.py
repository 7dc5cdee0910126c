"""Pure position arithmetic of the global stream: ranks, epochs, shards and worker shares.

Nothing here reads the process group: ``rank`` / ``world_size`` (or a worker id) are
arguments, so the arithmetic is tested for many world sizes without starting a process. A
*global position* indexes the global stream (what a world-size-1 sampler yields); a *local
position* ``k`` is a rank's ``k``-th draw: rank ``r`` of ``W`` draws global positions
``r, r + W, r + 2W, ...``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "check_rank",
    "global_position",
    "global_positions",
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

    This rank's local positions are cut into chunks of ``chunk_size`` (>= 1) and chunk ``j``
    belongs to worker ``j % num_workers``, so the workers together own every local position
    once; a *round* is one chunk for every worker. Returns ``num_rounds * chunk_size`` sorted
    int64 local positions.
    """
    check_rank(worker_id, num_workers)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    rounds = np.arange(first_round, first_round + num_rounds, dtype=np.int64)
    chunk_starts = (rounds * num_workers + worker_id) * chunk_size
    return (chunk_starts[:, None] + np.arange(chunk_size, dtype=np.int64)[None, :]).ravel()
