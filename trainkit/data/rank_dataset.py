"""RankDataset: each rank loads only its own share of a metadata file, epoch by epoch.

For a metadata file of ``M`` records, (mini-)epoch ``e`` of ``mini_epochs`` per epoch is
defined by a seeded permutation of ``range(M)`` for full epoch ``e // mini_epochs``, the
same on every rank (a keyed bijection, never materialised): the permutation is cut into
``mini_epochs`` contiguous parts, part ``e % mini_epochs`` into ``world_size`` contiguous
shares, and rank ``r`` loads the records of share ``r`` only. Every record is thus in
exactly one share per epoch, and a rank holds ``M / (world_size * mini_epochs)`` records.

Records are read through the metadata file's memory-mapped line index (see
:mod:`trainkit.data.metafile`) in file order and kept as raw lines in one shared-memory
segment (forked or spawned loader workers read the same pages); each access parses one.

:class:`RankStream` reads the same shares as an endless stream for the train loader, epoch
after epoch, shuffled within each share and read record by record from the file (O(1)
memory); it shards itself across the loader's workers, so one loader serves every epoch.
:class:`RankDataLoader` is that loader.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from trainkit.config import ConfigError
from trainkit.data.metafile import LineIndex
from trainkit.data.samplers._permutation import PURPOSE_RANK_SHARES, permute, round_keys
from trainkit.data.samplers.positions import check_rank, shard_range
from trainkit.data.shared_segments import SegmentWriter, SharedSegment
from trainkit.utils import comm

logger = logging.getLogger(__name__)

__all__ = ["RankDataset", "rank_share"]

_PERMUTE_BLOCK = 1 << 20  # positions permuted per numpy call (bounds the temporaries)
_GATHER_BLOCK = 1 << 14  # records copied per numpy gather (~16 B of temporaries per byte)


def rank_share(
    num_records: int, *, seed: int, epoch: int, mini_epochs: int, rank: int, world_size: int
) -> np.ndarray:
    """Return the record indices rank ``rank`` holds in (mini-)epoch ``epoch``, sorted.

    Pure: the same arguments give the same share on any process. For a fixed full epoch
    (``epoch // mini_epochs``), the shares of all ranks and mini-epochs partition
    ``range(num_records)``, and their sizes differ by at most one within a mini-epoch.

    Args:
        num_records: records in the metadata file.
        seed: shared by all ranks.
        epoch: the (mini-)epoch, counting mini-epochs from 0.
        mini_epochs: mini-epochs per full epoch.
        rank: this rank.
        world_size: number of ranks.

    Returns:
        Sorted int64 record indices.
    """
    check_rank(rank, world_size)
    if mini_epochs < 1:
        raise ConfigError(f"mini_epochs must be >= 1, got {mini_epochs}; use 1 for whole epochs.")
    full_epoch, part = divmod(epoch, mini_epochs)
    part_range = shard_range(num_records, part, mini_epochs)
    mine = shard_range(len(part_range), rank, world_size)
    begin = part_range.start + mine.start
    keys = round_keys(seed, PURPOSE_RANK_SHARES, np.array([full_epoch], dtype=np.int64))
    out = np.empty(len(mine), dtype=np.int64)
    for lo in range(0, len(mine), _PERMUTE_BLOCK):
        positions = np.arange(begin + lo, begin + min(lo + _PERMUTE_BLOCK, len(mine)))
        out[lo : lo + positions.size] = permute(positions, num_records, keys)
    out.sort()  # file order: the reads below move forward through the file
    return out


class RankDataset(Dataset):
    """A map-style dataset holding only this rank's share of the current (mini-)epoch.

    ``len(dataset)`` is the share's size; ``dataset[i]`` parses the ``i``-th record of the
    share (in file order: shuffle with a sampler, or use :class:`RankDataLoader`).
    :meth:`set_epoch` moves to another (mini-)epoch; the share is (re)loaded on first use.
    ``epoch`` counts mini-epochs: full epoch ``epoch // mini_epochs``, part
    ``epoch % mini_epochs``.
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
            meta_file: one record per line (JSON lines by default).
            parse: line (str, without the newline) -> record.
            seed: the shuffle seed, equal on every rank.
            mini_epochs: split each epoch into this many parts loaded one after another.
            world_size: number of ranks (default ``comm.get_world_size()``).
            rank: this rank (default ``comm.get_rank()``).
            index_dir: folder for the line index (default: next to ``meta_file``).

        Raises:
            MissingFileError: A ``FileNotFoundError``: if ``meta_file`` does not exist.
            ConfigError: A ``ValueError``: if the file has fewer records than
                ``world_size * mini_epochs`` (some share would be empty) or ``mini_epochs``
                is not positive.
            ValueError: If ``rank`` or ``world_size`` is out of range.
        """
        self.meta_file = str(meta_file)
        self._parse = parse
        self.seed = int(seed)
        self.mini_epochs = int(mini_epochs)
        self.world_size = comm.get_world_size() if world_size is None else int(world_size)
        self.rank = comm.get_rank() if rank is None else int(rank)
        check_rank(self.rank, self.world_size)
        if self.mini_epochs < 1:
            raise ConfigError(
                f"mini_epochs must be >= 1, got {mini_epochs}; use 1 for whole epochs."
            )
        self._index_dir = index_dir
        self._index: LineIndex | None = LineIndex(self.meta_file, index_dir=index_dir)
        self.num_records = len(self._index)
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
        """The full epoch the current mini-epoch belongs to."""
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
        return rank_share(
            self.num_records,
            seed=self.seed,
            epoch=self._epoch,
            mini_epochs=self.mini_epochs,
            rank=self.rank,
            world_size=self.world_size,
        )

    def _load(self) -> SharedSegment:
        if self._segment is not None:
            return self._segment
        if self._index is None:
            self._index = LineIndex(self.meta_file, index_dir=self._index_dir, progress=False)
        offsets = self._index.offsets
        indices = self.share_indices()
        writer = SegmentWriter("trainkit-rank-share")
        total = 0
        try:
            ends = array("q")
            with open(self.meta_file, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                # The file's pages come from the page cache (shared, not private memory);
                # the share is gathered block by block with numpy, never per record.
                file_bytes = np.frombuffer(
                    mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b"",
                    dtype=np.uint8,
                )
            for lo in range(0, indices.size, _GATHER_BLOCK):
                block = indices[lo : lo + _GATHER_BLOCK]
                starts, stops = offsets[block], offsets[block + 1]
                lengths = stops - starts
                block_ends = np.cumsum(lengths)
                # Byte j of the block's output comes from file byte j + (start - dst_start)
                # of its record: one repeat + one arange instead of a Python loop.
                shift = np.repeat(starts - (block_ends - lengths), lengths)
                writer.write(file_bytes[shift + np.arange(shift.size, dtype=np.int64)])
                ends.extend((block_ends + total).tolist())
                total += int(block_ends[-1]) if block_ends.size else 0
            del file_bytes
            self._segment = writer.finish(ends)
        except BaseException:
            writer.abort()
            raise
        logger.info(
            "RankDataset rank %d/%d: epoch %d (full epoch %d, mini-epoch %d/%d) holds %d of %d "
            "records (%.1f MiB)",
            self.rank,
            self.world_size,
            self._epoch,
            self.full_epoch,
            self._epoch % self.mini_epochs + 1,
            self.mini_epochs,
            len(ends),
            self.num_records,
            total / 2**20,
        )
        return self._segment

    def __len__(self) -> int:
        return int(self._load().ends.size)

    def line(self, idx: int) -> bytes:
        """Return the raw bytes of the share's record ``idx`` (without trailing newlines)."""
        segment = self._load()
        idx = range(segment.ends.size)[idx]
        start = int(segment.ends[idx - 1]) if idx > 0 else 0
        return segment.data[start : int(segment.ends[idx])].tobytes().rstrip(b"\r\n")

    def __getitem__(self, idx: int) -> Any:
        return self._parse(self.line(idx).decode("utf-8"))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_index"] = None  # a memmap would pickle by value; reopened when needed
        return state
