"""``RankStream`` and ``RankDataLoader``: a :class:`RankDataset`'s shares as one stream.

One loader serves every (mini-)epoch: the stream yields this rank's share of each epoch in
an order shuffled by (seed, epoch), reading records on demand from the metadata file, and
shards itself across the loader's workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from trainkit.config import ConfigError
from trainkit.data.batch_loader import build_batch_data_loader
from trainkit.data.mapping import RecordMapper
from trainkit.data.metafile import MetaFileDataset
from trainkit.data.rank_dataset import RankDataset
from trainkit.data.samplers._permutation import PURPOSE_RANK_SHARES, permute, round_keys
from trainkit.data.samplers.positions import shard_range

__all__ = ["RankDataLoader", "RankStream"]

_GATHER_BLOCK = 1 << 14  # records whose file positions are computed per numpy call


def _epoch_seed(seed: int, epoch: int) -> int:
    # Keys the in-share shuffle of (mini-)epoch ``epoch``: distinct epochs must not replay
    # the same order.
    seq = np.random.SeedSequence([seed, epoch, PURPOSE_RANK_SHARES])
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

    def position_key(self) -> dict[str, Any]:
        """What a saved position of this stream must match: the shares' seed and layout."""
        ds = self.dataset
        keys = {"seed": ds.seed, "rank": ds.rank, "world_size": ds.world_size}
        return {"type": "RankStream", **keys, "mini_epochs": ds.mini_epochs}

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
        shuffle_keys = round_keys(_epoch_seed(ds.seed, epoch), PURPOSE_RANK_SHARES, np.zeros(1))
        epoch_keys = round_keys(
            ds.seed, PURPOSE_RANK_SHARES, np.array([epoch // ds.mini_epochs], dtype=np.int64)
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
        self.dataset = dataset
        self._loader = build_batch_data_loader(
            RankStream(dataset, start_epoch),
            None,
            None,
            mapper=None if mapper is None else RecordMapper(mapper, name=dataset.meta_file),
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
        return self._loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the batches recorded in ``state`` (call before iterating).

        Raises:
            ConfigError: A ``ValueError``: if the state was saved with another seed, rank,
                world size or ``mini_epochs`` (the shares would differ).
        """
        self._loader.load_state_dict(state)
