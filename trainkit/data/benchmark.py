"""Where a training loader's time goes (detectron2's ``DataLoaderBenchmark``).

Each method times one stage of the loader built from a dataset, a mapper and a sampler: the
dataset alone, the mapper in this process, the ``DataLoader`` with 0, 1 and ``num_workers``
workers, the workers without sending their samples back (inter-process cost), and every rank
at once. Each logs a line and returns a :class:`LoaderTiming`, so a script can compare the
stages instead of reading the log.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset, Sampler

from trainkit.data.build import build_batch_data_loader
from trainkit.data.common import DatasetFromList, MapDataset
from trainkit.data.samplers import TrainingSampler
from trainkit.utils import comm

__all__ = ["DataLoaderBenchmark", "LoaderTiming", "iter_benchmark"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoaderTiming:
    """The timed items of one benchmark: what was timed and the seconds each item took.

    An item is a record, a mapped sample or a batch, as ``name`` says.
    """

    name: str
    seconds: tuple[float, ...]

    @property
    def mean(self) -> float:
        """Mean seconds per item."""
        return float(np.mean(self.seconds))

    @property
    def items_per_second(self) -> float:
        """Items per second, from the mean."""
        return 1.0 / self.mean

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0-100) of the seconds per item, an observed value."""
        return float(np.percentile(self.seconds, q, method="nearest"))

    def __str__(self) -> str:
        p1, p5, p95, p99 = (self.percentile(q) for q in (1, 5, 95, 99))
        return (
            f"{self.name}: {self.items_per_second:.1f} it/s over {len(self.seconds)} items, "
            f"p1={p1:.2g}s p5={p5:.2g}s p95={p95:.2g}s p99={p99:.2g}s"
        )


def iter_benchmark(
    iterator: Iterable[Any], num_iter: int, warmup: int = 5, max_time_seconds: float = 60
) -> tuple[float, list[float]]:
    """Time ``num_iter`` items of ``iterator`` after ``warmup`` untimed ones.

    Stops early, after the item that passes ``max_time_seconds`` of timed items.

    Returns:
        The mean seconds per timed item, and the seconds of each.

    Raises:
        ValueError: If ``num_iter < 1``, or if the iterator ends before ``warmup + num_iter``
            items.
    """
    if num_iter < 1:
        raise ValueError(f"iter_benchmark needs num_iter >= 1, got {num_iter}")
    items = iter(iterator)
    seconds: list[float] = []
    warmed = 0
    try:
        for _ in range(warmup):
            next(items)
            warmed += 1
        start = time.perf_counter()
        for _ in range(num_iter):
            before = time.perf_counter()
            next(items)
            seconds.append(time.perf_counter() - before)
            if time.perf_counter() - start > max_time_seconds:
                break
    except StopIteration:
        raise ValueError(
            f"the benchmarked iterator ended after {warmed} warm-up and {len(seconds)} timed "
            f"items of the {warmup + num_iter} asked for; time fewer, or give the loader an "
            "infinite sampler (TrainingSampler)"
        ) from None
    return float(np.mean(seconds)), seconds


class _Discarded:
    """A mapper whose samples are replaced by ``0``: the workers map, but send nothing back."""

    def __init__(self, mapper: Callable[[Any], Any]) -> None:
        self._mapper = mapper

    def __call__(self, record: Any) -> Any:
        # Not None: a None sample makes MapDataset try another record.
        return 0 if self._mapper(record) is not None else None


class DataLoaderBenchmark:
    """Time the stages of a training loader made of ``dataset``, ``mapper`` and ``sampler``.

    Args:
        dataset: the records (a list is held as a ``DatasetFromList``, as the train loader
            holds it) or a map-style dataset of records.
        mapper: record -> sample, as given to ``build_detection_train_loader``.
        sampler: the indices to read; default ``TrainingSampler(len(dataset), seed=seed)``.
        total_batch_size: samples of one step over all ranks; each rank loads its share.
        num_workers: the loader workers to try besides 0 and 1.
        max_time_seconds: the most time each benchmark spends timing.
        seed: the seed of the default sampler and of the loaders' per-sample randomness.
    """

    def __init__(
        self,
        dataset: Dataset | Sequence[Any],
        *,
        mapper: Callable[[Any], Any],
        sampler: Sampler | Iterable[int] | None = None,
        total_batch_size: int,
        num_workers: int = 0,
        max_time_seconds: float = 90,
        seed: int = 0,
    ) -> None:
        if isinstance(dataset, list):
            dataset = DatasetFromList(dataset, copy=False)
        self.dataset = dataset
        self.mapper = mapper
        self.sampler = sampler if sampler is not None else TrainingSampler(len(dataset), seed=seed)
        self.total_batch_size = total_batch_size
        self.num_workers = num_workers
        self.max_time_seconds = max_time_seconds
        self.seed = seed
        self.per_gpu_batch_size = total_batch_size // comm.get_world_size()

    def _indices(self) -> Iterator[int]:
        # A finite sampler is read again from its start: the benchmark may outlast it.
        return itertools.chain.from_iterable(itertools.repeat(self.sampler))

    def _time(self, name: str, items: Iterable[Any], num_iter: int, warmup: int) -> LoaderTiming:
        _, seconds = iter_benchmark(items, num_iter, warmup, self.max_time_seconds)
        timing = LoaderTiming(name, tuple(seconds))
        logger.info("%s", timing)
        return timing

    def _loader(self, mapper: Callable[[Any], Any], num_workers: int) -> Iterable[Any]:
        return build_batch_data_loader(
            self.dataset,
            self.sampler,
            self.total_batch_size,
            mapper=mapper,
            num_workers=num_workers,
            seed=self.seed,
        )

    def benchmark_dataset(self, num_iter: int, warmup: int = 5) -> LoaderTiming:
        """Time reading records from the dataset alone (items: records)."""
        records = (self.dataset[i] for i in self._indices())
        return self._time("dataset alone (s/record)", records, num_iter, warmup)

    def benchmark_mapper(self, num_iter: int, warmup: int = 5) -> LoaderTiming:
        """Time reading and mapping records in this process (items: samples).

        The mapper runs as the loader runs it (``MapDataset``), so it may call
        ``trainkit.data.sample_rng()``.
        """
        mapped = MapDataset(self.dataset, self.mapper)
        samples = (mapped[i] for i in self._indices())
        return self._time("mapper in one process (s/sample)", samples, num_iter, warmup)

    def benchmark_workers(self, num_iter: int, warmup: int = 10) -> list[LoaderTiming]:
        """Time the loader with 0, 1 and ``num_workers`` workers (items: batches).

        With ``n`` workers, ``num_iter * n`` batches are timed (and ``warmup * n`` skipped),
        so that every worker contributes.
        """
        timings = []
        for n in dict.fromkeys([0, 1, self.num_workers]):
            loader = self._loader(self.mapper, n)
            name = f"loader, {n} workers, batch {self.per_gpu_batch_size} (s/batch)"
            timings.append(self._time(name, loader, num_iter * max(n, 1), warmup * max(n, 1)))
            del loader
        return timings

    def benchmark_IPC(self, num_iter: int, warmup: int = 10) -> LoaderTiming:
        """Time the loader whose workers map but send back nothing (items: batches).

        Compared with :meth:`benchmark_workers` at the same ``num_workers``, the difference is
        the cost of moving samples between processes (large numpy arrays and Python objects
        are pickled; tensors go through shared memory).
        """
        n = self.num_workers
        loader = self._loader(_Discarded(self.mapper), n)
        name = f"loader, {n} workers, batch {self.per_gpu_batch_size}, samples dropped (s/batch)"
        return self._time(name, loader, num_iter * max(n, 1), warmup * max(n, 1))

    def benchmark_distributed(self, num_iter: int, warmup: int = 10) -> list[LoaderTiming]:
        """Time the loader on every rank at once; rank 0 logs every rank's figures.

        Also logs how long the first batch took (the loader's start-up).

        Collective:
            Every rank must call it: it synchronises, then gathers the timings.

        Returns:
            Every rank's timing, by rank (on every rank).
        """
        n = self.num_workers
        start = time.perf_counter()
        batches = iter(self._loader(self.mapper, n))
        next(batches)
        logger.info("loader start-up (first batch): %.2f s", time.perf_counter() - start)
        comm.synchronize()
        _, seconds = iter_benchmark(
            batches, num_iter * max(n, 1), warmup * max(n, 1), self.max_time_seconds
        )
        name = f"loader, {n} workers, total batch {self.total_batch_size} (s/batch)"
        timings = [
            LoaderTiming(f"rank {rank} {name}", tuple(rank_seconds))
            for rank, rank_seconds in enumerate(comm.all_gather(seconds))
        ]
        if comm.is_main_process():
            for timing in timings:
                logger.info("%s", timing)
        return timings
