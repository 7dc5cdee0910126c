"""``RankDataLoader``: the train loader over a ``RankDataset``'s shares, epoch after epoch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainkit.config import ConfigError
from trainkit.data.loading.loader import TrainLoader
from trainkit.data.mapping.record_mapper import RecordMapper
from trainkit.data.records.rank_dataset import RankDataset, RankStream
from trainkit.data.spec import TrainDataSpec

__all__ = ["RankDataLoader"]


class RankDataLoader(TrainLoader):
    """The infinite, resumable train loader over a :class:`RankDataset`, built once.

    A :class:`~trainkit.data.loading.loader.TrainLoader` over its :class:`RankStream`: a loader over
    the same file with the same ``num_workers`` that loads its state continues with the next
    batch; a state saved with another seed, rank, world size or ``mini_epochs`` is refused
    (the shares would differ). ``build_train_loader(cfg)`` builds the same loader for a
    ``DatasetCatalog`` entry that returns a ``RankDataset``.
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
        """Load batches of ``batch_size`` samples of ``dataset`` from ``start_epoch`` on.

        Args:
            dataset, batch_size: this rank's :class:`RankDataset` and its samples per batch.
            mapper: record -> sample (may use ``trainkit.data.sample_rng()``).
            start_epoch: the first (mini-)epoch.
            loader_kwargs: as for :func:`~trainkit.data.build.build_batch_data_loader`.

        Raises:
            ConfigError: A ``ValueError``: if ``batch_size`` is not positive.
        """
        if batch_size < 1:
            raise ConfigError(f"batch size per rank must be >= 1, got {batch_size}")
        self.dataset = dataset
        mapper = None if mapper is None else RecordMapper(mapper, name=dataset.meta_file)
        super().__init__(
            TrainDataSpec.from_arguments(
                RankStream(dataset, start_epoch),
                None,
                None,
                mapper=mapper,
                single_gpu_batch_size=batch_size,
                seed=dataset.seed,
                **loader_kwargs,
            )
        )
