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
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from trainkit.config import ConfigError
from trainkit.data._shared_buffer import SegmentWriter, SharedSegment
from trainkit.data.batch_loader import build_batch_data_loader
from trainkit.data.common import MapDataset
from trainkit.data.metafile import LineIndex, MetaFileDataset
from trainkit.data.samplers._permutation import STREAM_RANK_SHARES, permute, round_keys
from trainkit.data.samplers.positions import check_rank, shard_range
from trainkit.utils import comm

logger = logging.getLogger(__name__)

__all__ = ["RankDataLoader", "RankDataset", "RankStream", "rank_share"]

_PERMUTE_BLOCK = 1 << 20  # positions permuted per numpy call (bounds the temporaries)
_GATHER_BLOCK = 1 << 14  # records copied per numpy gather (~16 B of temporaries per byte)
_STATE_VERSION = 2


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
    keys = round_keys(seed, STREAM_RANK_SHARES, np.array([full_epoch], dtype=np.int64))
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


def _epoch_seed(seed: int, epoch: int) -> int:
    # Keys the in-share shuffle of (mini-)epoch ``epoch``: distinct epochs must not replay
    # the same order.
    seq = np.random.SeedSequence([seed, epoch, STREAM_RANK_SHARES])
    return int(seq.generate_state(1)[0] & 0x7FFFFFFF)


def _share_bounds(
    num_records: int, epoch: int, mini_epochs: int, rank: int, world_size: int
) -> tuple[int, int]:
    """(first position in the full epoch's permutation, length) of a rank's share."""
    part = shard_range(num_records, epoch % mini_epochs, mini_epochs)
    mine = shard_range(len(part), rank, world_size)
    return part.start + mine.start, len(mine)


class RankStream(IterableDataset):
    """A :class:`RankDataset`'s shares as one endless stream, shuffled within each share.

    (Mini-)epoch after (mini-)epoch from ``start_epoch``, it yields this rank's share of the
    epoch (the same share :meth:`RankDataset.share_indices` holds) in an order shuffled by
    (seed, epoch). Records are read on demand from the metadata file through its line index,
    so nothing but the file's shared page cache grows with the data.

    It shards itself across loader workers (``shards_across_workers = True``): worker ``w``
    of ``n`` reads positions ``w, w + n, ...`` of each epoch's shuffled share, so together
    they read every record of the share once. ``iter_from(position)`` starts a worker after
    its first ``position`` records, in O(1): the train loader resumes it exactly.
    """

    shards_across_workers = True

    def __init__(self, dataset: RankDataset, start_epoch: int = 0) -> None:
        """Stream ``dataset``'s shares from (mini-)epoch ``start_epoch`` on."""
        self.dataset = dataset
        self.start_epoch = int(start_epoch)
        self._records: MetaFileDataset | None = None

    def _read(self) -> MetaFileDataset:
        if self._records is None:
            self._records = MetaFileDataset(
                self.dataset.meta_file, parse=self.dataset._parse, index_dir=self.dataset._index_dir
            )
        return self._records

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_records": None}  # reopened by path where it is used

    def __iter__(self) -> Iterator[Any]:
        return self.iter_from(0)

    def iter_from(self, position: int) -> Iterator[Any]:
        """Yield this worker's records after its first ``position`` ones."""
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        ds = self.dataset
        epoch, remaining = self.start_epoch, int(position)
        while True:
            begin, length = _share_bounds(
                ds.num_records, epoch, ds.mini_epochs, ds.rank, ds.world_size
            )
            mine = range(worker, length, num_workers)
            if remaining < len(mine):
                yield from self._epoch_records(epoch, begin, length, mine[remaining:])
            remaining = max(0, remaining - len(mine))
            epoch += 1

    def _epoch_records(
        self, epoch: int, begin: int, length: int, positions: range
    ) -> Iterator[Any]:
        ds = self.dataset
        shuffle_keys = round_keys(_epoch_seed(ds.seed, epoch), STREAM_RANK_SHARES, np.zeros(1))
        epoch_keys = round_keys(
            ds.seed, STREAM_RANK_SHARES, np.array([epoch // ds.mini_epochs], dtype=np.int64)
        )
        records = self._read()
        for lo in range(0, len(positions), _GATHER_BLOCK):
            block = np.asarray(positions[lo : lo + _GATHER_BLOCK], dtype=np.int64)
            in_share = permute(block, length, shuffle_keys)  # the shuffle within the share
            file_indices = permute(begin + in_share, ds.num_records, epoch_keys)
            for index in file_indices.tolist():
                yield records[index]


class RankDataLoader:
    """The infinite, resumable train loader over a :class:`RankDataset`, built once.

    A :class:`~trainkit.data.loader.TrainLoader` over :class:`RankStream`: the loader's
    workers read their own parts of each epoch's share, epoch after epoch, without the loader
    being rebuilt. ``state_dict()`` / ``load_state_dict()`` are the loader's (each worker's
    count of records read, and what waits in its batch): a loader over the same file with the
    same ``num_workers`` that loads it continues with the next batch.
    """

    def __init__(
        self,
        dataset: RankDataset,
        batch_size: int,
        *,
        mapper: Callable[[Any], Any] | None = None,
        start_epoch: int = 0,
        **loader_kwargs: Any,
    ) -> None:
        """Create the loader.

        Args:
            dataset: this rank's :class:`RankDataset`.
            batch_size: samples per batch on this rank.
            mapper: record -> sample (may use ``trainkit.data.sample_rng()``).
            start_epoch: the first (mini-)epoch.
            loader_kwargs: ``num_workers``, ``collate_fn``, ``prefetch_factor``... for
                :func:`~trainkit.data.batch_loader.build_batch_data_loader`.

        Raises:
            ConfigError: A ``ValueError``: if ``batch_size`` is not positive.
        """
        if batch_size < 1:
            raise ConfigError(f"batch size per rank must be >= 1, got {batch_size}")
        stream: IterableDataset = RankStream(dataset, start_epoch)
        if mapper is not None:
            stream = MapDataset(stream, mapper, name=dataset.meta_file)
        self.dataset = dataset
        self._loader = build_batch_data_loader(
            stream,
            None,
            None,
            single_gpu_batch_size=batch_size,
            seed=dataset.seed,
            **loader_kwargs,
        )

    def __iter__(self) -> Iterator[Any]:
        return iter(self._loader)

    @property
    def num_skipped_records(self) -> int:
        """Records that failed to map in the batches returned so far."""
        return self._loader.num_skipped_records

    def state_dict(self) -> dict[str, Any]:
        """Return the position after the last returned batch, as plain data."""
        return {
            "version": _STATE_VERSION,
            "loader": self._loader.state_dict(),
            "seed": self.dataset.seed,
            "rank": self.dataset.rank,
            "world_size": self.dataset.world_size,
            "mini_epochs": self.dataset.mini_epochs,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the batches recorded in ``state`` (call before iterating).

        Raises:
            ConfigError: A ``ValueError``: if the state was saved with another seed, rank,
                world size or ``mini_epochs`` (the shares would differ).
        """
        mine = self.state_dict()
        keys = ("version", "seed", "rank", "world_size", "mini_epochs")
        found = {k: state.get(k) for k in keys}
        expected = {k: mine[k] for k in keys}
        if found != expected:
            raise ConfigError(
                f"RankDataLoader state does not match: saved {found}, this loader {expected}. "
                "Resume with the saved run's seed, mini_epochs and world size, or start in a "
                "new OUTPUT_DIR."
            )
        self._loader.load_state_dict(state["loader"])
