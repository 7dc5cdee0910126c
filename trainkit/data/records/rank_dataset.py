"""RankDataset: each rank reads only its own share of a metadata file, epoch by epoch.

For a metadata file of ``M`` records, (mini-)epoch ``e`` (``mini_epochs`` per full epoch)
takes a seeded permutation of ``range(M)`` for full epoch ``e // mini_epochs``, the same on
every rank (a keyed bijection, never materialised), cuts it into ``mini_epochs`` contiguous
parts, part ``e % mini_epochs`` into ``world_size`` contiguous shares, and rank ``r`` reads
share ``r`` only (:class:`_Shares`): every record is in exactly one share per epoch, and a
rank holds ``M / (world_size * mini_epochs)`` records. :class:`RankDataset` is the current
share (map-style) and :class:`RankStream` the shares as an endless stream
(:class:`~trainkit.data.loading.loader.RankDataLoader` is the train loader over it).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from trainkit.config import ConfigError
from trainkit.data.plans.global_stream import (
    PURPOSE_RANK_SHARES,
    check_rank,
    permute,
    round_keys,
    shard_range,
)
from trainkit.data.records.metafile import MetaFileDataset
from trainkit.data.records.shared_segments import SegmentWriter, SharedSegment
from trainkit.utils import comm

logger = logging.getLogger(__name__)

__all__ = ["RankDataset", "RankStream", "rank_share"]

_PERMUTE_BLOCK = 1 << 20  # positions permuted per numpy call (bounds the temporaries)
_STREAM_BLOCK = 1 << 14  # a stream's records whose file positions are computed per call


class _Shares:
    """Which records rank ``rank`` reads in each (mini-)epoch, in which order (pure)."""

    def __init__(
        self, num_records: int, *, seed: int, mini_epochs: int, rank: int, world_size: int
    ) -> None:
        check_rank(rank, world_size)
        if mini_epochs < 1:
            raise ConfigError(
                f"mini_epochs must be >= 1, got {mini_epochs}; use 1 for whole epochs."
            )
        self.num_records, self.seed, self.mini_epochs = num_records, seed, mini_epochs
        self.rank, self.world_size = rank, world_size

    def bounds(self, epoch: int) -> tuple[int, int]:
        """(first position in the full epoch's permutation, length) of the share."""
        part = shard_range(self.num_records, epoch % self.mini_epochs, self.mini_epochs)
        mine = shard_range(len(part), self.rank, self.world_size)
        return part.start + mine.start, len(mine)

    def records(self, epoch: int, offsets: np.ndarray, *, shuffled: bool) -> np.ndarray:
        """Record indices at ``offsets`` (int64) of the share, in file or shuffled order.

        Shuffled, offset ``i`` is the ``i``-th record of the share in an order keyed by
        (seed, epoch); in file order the caller sorts what it gets.
        """
        begin, length = self.bounds(epoch)
        if shuffled:
            # Keys the in-share shuffle of (mini-)epoch ``epoch``: distinct epochs must not
            # replay the same order.
            seq = np.random.SeedSequence([self.seed, epoch, PURPOSE_RANK_SHARES])
            key = int(seq.generate_state(1)[0] & 0x7FFFFFFF)
            offsets = permute(offsets, length, round_keys(key, PURPOSE_RANK_SHARES, np.zeros(1)))
        full_epoch = np.array([epoch // self.mini_epochs], dtype=np.int64)
        keys = round_keys(self.seed, PURPOSE_RANK_SHARES, full_epoch)
        return permute(begin + offsets, self.num_records, keys)

    def sorted_share(self, epoch: int) -> np.ndarray:
        """The share's record indices in file order."""
        length = self.bounds(epoch)[1]
        out = np.empty(length, dtype=np.int64)
        for lo in range(0, length, _PERMUTE_BLOCK):
            offsets = np.arange(lo, min(lo + _PERMUTE_BLOCK, length), dtype=np.int64)
            out[lo : lo + offsets.size] = self.records(epoch, offsets, shuffled=False)
        out.sort()  # file order: reads move forward through the file
        return out


def rank_share(
    num_records: int, *, seed: int, epoch: int, mini_epochs: int, rank: int, world_size: int
) -> np.ndarray:
    """Return the record indices rank ``rank`` holds in (mini-)epoch ``epoch``, sorted.

    Pure: the same arguments (``seed`` shared by all ranks) give the same share on any process.
    For a fixed full epoch (``epoch // mini_epochs``), the shares of all ranks and mini-epochs
    partition ``range(num_records)``, and their sizes differ by at most one within a mini-epoch.
    """
    return _Shares(
        num_records, seed=seed, mini_epochs=mini_epochs, rank=rank, world_size=world_size
    ).sorted_share(epoch)


class RankDataset(Dataset):
    """A map-style dataset holding only this rank's share of the current (mini-)epoch.

    ``dataset[i]`` parses the ``i``-th record of the share, in file order (shuffle with a
    sampler, or use :class:`RankDataLoader`). On first use the share's raw lines are copied
    into one shared-memory segment, which loader workers map too.
    """

    def __init__(
        self,
        meta_file: str | os.PathLike,
        *,
        parse: Callable[[str], Any] = json.loads,
        seed: int = 0,
        mini_epochs: int = 1,
        world_size: int | None = None,
        rank: int | None = None,
        index_dir: str | os.PathLike | None = None,
    ) -> None:
        """Open ``meta_file`` (building its line index if needed); no record is loaded yet.

        Args:
            meta_file, parse, index_dir: as for :class:`MetaFileDataset`.
            seed: the shuffle seed, equal on every rank.
            mini_epochs: split each epoch into this many parts loaded one after another.
            world_size, rank: the number of ranks and this rank (default: ``comm``'s).

        Raises:
            MissingFileError: A ``FileNotFoundError``: if ``meta_file`` does not exist.
            ConfigError: A ``ValueError``: if ``mini_epochs`` is not positive or the file has fewer
                records than ``world_size * mini_epochs`` (a share would be empty).
            ValueError: If ``rank`` or ``world_size`` is out of range.
        """
        self.meta_file, self.seed, self.mini_epochs = str(meta_file), int(seed), int(mini_epochs)
        self.world_size = comm.get_world_size() if world_size is None else int(world_size)
        self.rank = comm.get_rank() if rank is None else int(rank)
        self.records = MetaFileDataset(meta_file, parse=parse, index_dir=index_dir)
        self.num_records = len(self.records)
        self.shares = _Shares(  # checks rank, world_size and mini_epochs
            self.num_records,
            seed=self.seed,
            mini_epochs=self.mini_epochs,
            rank=self.rank,
            world_size=self.world_size,
        )
        if self.num_records < self.world_size * self.mini_epochs:
            raise ConfigError(
                f"{self.meta_file} has {self.num_records} records, fewer than world_size * "
                f"mini_epochs = {self.world_size} * {self.mini_epochs}; some ranks would get "
                "no record. Use fewer mini_epochs."
            )
        self._epoch = 0
        self._segment: SharedSegment | None = None

    @property
    def epoch(self) -> int:
        """The current (mini-)epoch."""
        return self._epoch

    @property
    def full_epoch(self) -> int:
        """The full epoch of the current mini-epoch."""
        return self._epoch // self.mini_epochs

    def set_epoch(self, epoch: int) -> None:
        """Move to (mini-)epoch ``epoch``; its share is loaded on first use."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self._epoch:
            self._epoch = int(epoch)
            self._segment = None  # drop the old share before the new one is loaded

    def share_indices(self) -> np.ndarray:
        """Return the record indices (file line numbers) of the current share, sorted."""
        return self.shares.sorted_share(self._epoch)

    def as_stream(self, start_epoch: int = 0) -> RankStream:
        """Return this dataset's shares, epoch after epoch, as a stream dataset (training)."""
        return RankStream(self, start_epoch)

    def _load(self) -> SharedSegment:
        if self._segment is not None:
            return self._segment
        with SegmentWriter("trainkit-rank-share") as writer:
            ends = self.records.copy_lines(self.share_indices(), writer.write)
            self._segment = writer.finish(ends)
        part = (self._epoch, self.full_epoch, self._epoch % self.mini_epochs + 1, self.mini_epochs)
        mib = (ends[-1] if ends else 0) / 2**20
        logger.info(
            "RankDataset rank %d/%d: epoch %d (full epoch %d, mini-epoch %d/%d) holds %d of %d "
            "records (%.1f MiB)",
            *(self.rank, self.world_size, *part, len(ends), self.num_records, mib),
        )
        return self._segment

    def __len__(self) -> int:
        return int(self._load().ends.size)

    def line(self, idx: int) -> bytes:
        """Return the raw bytes of the share's record ``idx`` (without trailing newlines)."""
        return self._load().record(idx).tobytes().rstrip(b"\r\n")

    def __getitem__(self, idx: int) -> Any:
        return self.records.parse(self.line(idx))


class RankStream(IterableDataset):
    """A :class:`RankDataset`'s shares as one endless stream, shuffled within each share.

    Epoch after epoch, it yields this rank's share in an order shuffled by (seed, epoch),
    each record read on demand through the line index (only the shared page cache grows with
    the data). Worker ``w`` of ``n`` reads positions ``w, w + n, ...`` of each shuffled share
    (``shards_across_workers``); :meth:`iter_from` jumps in O(1), so a resume is exact.
    """

    shards_across_workers = True

    def __init__(self, dataset: RankDataset, start_epoch: int = 0) -> None:
        """Stream ``dataset``'s shares from (mini-)epoch ``start_epoch`` on."""
        self.dataset, self.start_epoch = dataset, int(start_epoch)

    def position_key(self) -> dict[str, Any]:
        """What a saved position of this stream must match: the shares' seed and layout."""
        keys = ("seed", "rank", "world_size", "mini_epochs")
        return {"type": "RankStream", **{k: getattr(self.dataset, k) for k in keys}}

    def __iter__(self) -> Iterator[Any]:
        return self.iter_from(0)

    def iter_from(self, position: int) -> Iterator[Any]:
        """Yield this loader worker's records after its first ``position`` ones."""
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        shares, records = self.dataset.shares, self.dataset.records
        epoch, remaining = self.start_epoch, int(position)
        while True:
            mine = range(worker, shares.bounds(epoch)[1], num_workers)
            for lo in range(remaining, len(mine), _STREAM_BLOCK):
                offsets = np.asarray(mine[lo : lo + _STREAM_BLOCK], dtype=np.int64)
                for index in shares.records(epoch, offsets, shuffled=True).tolist():
                    yield records[index]
            remaining = max(0, remaining - len(mine))
            epoch += 1
